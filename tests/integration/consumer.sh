#!/usr/bin/env bash
# Installs Starling into a scratch prefix and builds a project that uses find_package(Starling).
set -euo pipefail
build=$1 src=$2
prefix=$build/consumer-test/prefix
rm -rf "$build/consumer-test"
cmake --install "$build" --prefix "$prefix" > /dev/null
launcher=()
command -v ccache > /dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
cmake -S "$src/tests/consumer" -B "$build/consumer-test/build" -G Ninja \
  -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release "${launcher[@]}" > /dev/null
cmake --build "$build/consumer-test/build" > "$build/consumer-test/build.log" 2>&1 ||
  { cat "$build/consumer-test/build.log"; exit 1; }
# The consumer's own -Wall warning shows (its flags are in force) and did not fail the build.
grep -q "unused_on_purpose" "$build/consumer-test/build.log" ||
  { echo "the consumer's deliberate warning was not reported"; cat "$build/consumer-test/build.log"; exit 1; }
out=$("$build/consumer-test/build/consumer")
echo "consumer printed: $out"
[[ $out == /ip4/127.0.0.1/tcp/4001/p2p/12D3KooW* ]]
# Built with libtorch: the installed starling::torch trains a model with starling::Optimizer.
if grep -q "Starling_HAS_TORCH ON" "$prefix"/lib*/cmake/Starling/StarlingConfig.cmake; then
  [[ -x $build/consumer-test/build/consumer_torch ]] || { echo "consumer_torch was not built"; exit 1; }
  out=$("$build/consumer-test/build/consumer_torch")
  echo "consumer_torch printed: $out"
  [[ $out == "epochs 2" ]]
fi
