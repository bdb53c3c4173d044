#!/usr/bin/env bash
# Installs the exact Debian 12 packages Starling needs to build, test, benchmark and demo.
# Idempotent and non-interactive: it installs only what is missing. Run as root (or with sudo).
# `--dev` adds the developer tools of `make format` and `make tidy`.
set -euo pipefail

PACKAGES=(
  # toolchain
  build-essential cmake make ninja-build ccache pkg-config git
  clang-16 libclang-rt-16-dev lld-16
  # libraries
  libasio-dev libsodium-dev libssl-dev protobuf-compiler libprotobuf-dev libboost-dev
  libspdlog-dev libfmt-dev libcli11-dev nlohmann-json3-dev
  libgtest-dev libgmock-dev libbenchmark-dev zlib1g-dev
  libtorch-dev
  # port mapping through home routers (NAT-PMP, UPnP IGD)
  libnatpmp-dev libminiupnpc-dev
  # a fast BLAS for libtorch (replaces the reference libblas through the alternatives system:
  # ~8x the training throughput here); the OpenMP build follows torch::set_num_threads
  libopenblas0-openmp
  # anchors measured beside Starling in benchmarks
  iperf3 jq libgloo-dev libopendht-dev
  # the run dashboard: HTTP server, charts served locally, and the browser its test drives
  libcpp-httplib-dev libjs-chart.js chromium
  # data for the training demos (Fashion-MNIST; WordNet's glosses for the language model)
  dataset-fashion-mnist wordnet-base
  # emulated internet (netlab) and interop test
  iproute2 iptables procps psmisc nodejs npm
  # netlab's port-mapping gateway (--nat-type upnp): UPnP IGD + NAT-PMP daemon, nft for its tables
  miniupnpd-nftables nftables
  # test scripts (stdlib only)
  python3
  # the Python module (python/): pybind11 and the python3 that imports the same libtorch
  pybind11-dev python3-dev python3-torch
)
if [[ ${1:-} == --dev ]]; then PACKAGES+=(clang-format clang-tidy-16); fi

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

# node/npm may come from outside Debian (e.g. a newer Node already on PATH): accept that.
if command -v node >/dev/null && command -v npm >/dev/null; then
  tmp=()
  for p in "${missing[@]}"; do [[ "$p" == nodejs || "$p" == npm ]] || tmp+=("$p"); done
  missing=("${tmp[@]}")
fi

if ((${#missing[@]} == 0)); then
  echo "install-deps: all ${#PACKAGES[@]} packages present"
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
