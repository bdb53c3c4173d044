# Third-party dependencies: all from Debian 12 packages (scripts/install-deps.sh).
find_package(Threads REQUIRED)
find_package(PkgConfig REQUIRED)
pkg_check_modules(sodium REQUIRED IMPORTED_TARGET GLOBAL libsodium)
find_package(OpenSSL 3 REQUIRED COMPONENTS Crypto)  # ChaCha20-Poly1305 for Noise transport
find_package(Protobuf REQUIRED)
find_package(fmt REQUIRED)
find_package(spdlog REQUIRED)
find_package(Boost 1.74 REQUIRED)
find_package(ZLIB REQUIRED)  # gzip datasets, compressed checkpoints (training)
find_package(nlohmann_json REQUIRED)
find_package(CLI11 QUIET)
if(NOT CLI11_FOUND)
  find_path(CLI11_INCLUDE_DIR CLI/CLI.hpp REQUIRED)
  add_library(CLI11::CLI11 INTERFACE IMPORTED)
  target_include_directories(CLI11::CLI11 INTERFACE ${CLI11_INCLUDE_DIR})
endif()
find_path(ASIO_INCLUDE_DIR asio.hpp REQUIRED)
# Port mapping through home routers (net/portmap): NAT-PMP and UPnP IGD clients. Linked by
# name (plain -l flags also in the installed package), found here for a clear error.
find_path(NATPMP_INCLUDE_DIR natpmp.h REQUIRED)           # libnatpmp-dev
find_library(NATPMP_LIBRARY natpmp REQUIRED)
find_path(MINIUPNPC_INCLUDE_DIR miniupnpc/miniupnpc.h REQUIRED)  # libminiupnpc-dev
find_library(MINIUPNPC_LIBRARY miniupnpc REQUIRED)
if(STARLING_WITH_TORCH)
  find_package(Torch QUIET)
  if(NOT Torch_FOUND)
    message(WARNING "libtorch not found: building without optim/moe/training")
    set(STARLING_WITH_TORCH OFF)
  endif()
endif()
