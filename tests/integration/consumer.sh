#!/usr/bin/env bash
# Installs Starling into a scratch prefix and builds a project that uses find_package(Starling).
set -euo pipefail
build=$1 src=$2
prefix=$build/consumer-test/prefix
rm -rf "$build/consumer-test"
cmake --install "$build" --prefix "$prefix" > /dev/null
cmake -S "$src/tests/consumer" -B "$build/consumer-test/build" -G Ninja \
  -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release > /dev/null
cmake --build "$build/consumer-test/build" > /dev/null
out=$("$build/consumer-test/build/consumer")
echo "consumer printed: $out"
[[ $out == /ip4/127.0.0.1/tcp/4001/p2p/12D3KooW* ]]
