#!/usr/bin/env bash
# Installs the js-libp2p interop peer into BUILD_DIR/interop-js.
#
#   tests/interop/setup.sh BUILD_DIR
#
# Copies package.json, package-lock.json, peer.mjs and polyfill.mjs from
# tests/interop/js, runs `npm ci` only when node_modules is missing or the
# lock file changed since the last good install, then checks the install by
# running `peer.mjs versions`. Idempotent and safe to run concurrently (flock).
#
# Exit status: 0 ready (prints the directory on the last line of stdout),
# 77 skip (node/npm missing or too old, or the install failed, e.g. no
# registry; ctest treats 77 as "skipped" with SKIP_RETURN_CODE 77),
# 2 usage error, 1 broken checkout.
# Run the peer afterwards with:
#   cd BUILD_DIR/interop-js && node --import ./polyfill.mjs peer.mjs listen
set -u

skip() {
  echo "interop setup: SKIP: $*" >&2
  exit 77
}

if [ $# -ne 1 ] || [ -z "$1" ]; then
  echo "usage: $0 BUILD_DIR" >&2
  exit 2
fi

src="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/js"
for f in package.json package-lock.json peer.mjs relay.mjs nat.mjs polyfill.mjs; do
  if [ ! -f "$src/$f" ]; then
    echo "interop setup: missing $src/$f" >&2
    exit 1
  fi
done

command -v node >/dev/null 2>&1 || skip "node not found on PATH (install Node.js >= 20.19)"
command -v npm >/dev/null 2>&1 || skip "npm not found on PATH"

# @noble/* (used by the noise package) need Node >= 20.19
node_ver="$(node -p 'process.versions.node' 2>/dev/null)" || skip "node does not run"
node -e '
  const [a, b] = process.versions.node.split(".").map(Number)
  process.exit(a > 20 || (a === 20 && b >= 19) ? 0 : 1)
' || skip "node $node_ver is too old (need >= 20.19)"

mkdir -p "$1" || { echo "interop setup: cannot create $1" >&2; exit 1; }
dst="$(cd "$1" && pwd)/interop-js"
mkdir -p "$dst" || { echo "interop setup: cannot create $dst" >&2; exit 1; }

# One installer at a time; a second caller waits (bounded) and then finds the
# install done.
exec 9>"$dst/.setup.lock"
if command -v flock >/dev/null 2>&1; then
  flock -w 900 9 || skip "timed out waiting for another setup.sh to finish"
fi

for f in package.json package-lock.json peer.mjs relay.mjs nat.mjs polyfill.mjs; do
  if ! cmp -s "$src/$f" "$dst/$f"; then
    cp "$src/$f" "$dst/$f.tmp" && mv -f "$dst/$f.tmp" "$dst/$f" ||
      { echo "interop setup: cannot copy $f to $dst" >&2; exit 1; }
  fi
done

want="$(cat "$src/package.json" "$src/package-lock.json" | sha256sum | cut -d' ' -f1)"
stamp="$dst/node_modules/.starling-install-stamp"
have=""
[ -f "$stamp" ] && have="$(cat "$stamp")"

if [ ! -d "$dst/node_modules" ] || [ "$have" != "$want" ]; then
  echo "interop setup: installing js-libp2p into $dst (npm ci)" >&2
  to=()
  command -v timeout >/dev/null 2>&1 && to=(timeout 600)
  if ! (cd "$dst" && "${to[@]}" npm ci --no-audit --no-fund --prefer-offline \
      --engine-strict=false --fetch-retries=2 --fetch-timeout=60000 >&2); then
    rm -rf "$dst/node_modules"
    skip "npm ci failed in $dst (no npm registry reachable?)"
  fi
  echo "$want" >"$stamp"
fi

if ! out="$(cd "$dst" && node --import ./polyfill.mjs peer.mjs versions 2>&1)"; then
  echo "$out" >&2
  rm -f "$stamp"
  skip "the installed js peer does not load (see above); it will be reinstalled next time"
fi
echo "interop setup: $out" >&2
echo "$dst"
