# Helpers for netlab runs with js-libp2p peers (sourced after lib.sh): the "public" address
# block js accepts, and js peers (tests/interop/js/nat.mjs) on netlab hosts.
#
# js-libp2p treats 10/8 (netlab's own addresses) as private: it leaves such addresses out of
# DCUtR and AutoNAT (see tests/interop/README.md). public_block gives every public host
# 11.77.1.<i>/16 and every NAT router's WAN 11.77.2.<i>/16 beside netlab's 10.77 addresses
# (netlab already routes 11.77.0.0/16 on-link everywhere for its upnp routers; the block exists
# only inside the run's namespaces). netlab's on-link route to the block has no source address,
# so sockets would leave from 10.77.1.<i>: it is replaced by the new address's own route, and
# traffic to 11.77.x then leaves from, and is masqueraded to, the 11.77 address.

JS_PUB=11.77

# public_block: adds the addresses (call right after `up`)
public_block() {
  local h i ns dev a
  for h in $(nl hosts); do
    i=${h#h}
    if [[ $(nl addr "$h") == "$(nl addr "$h" --outside)" ]]; then
      ns=$(nl ns "$h") dev=eth0 a="$JS_PUB.1.$i"
    elif [[ $(nl addr "$h" --outside) != "$JS_PUB.2.$i" ]]; then  # upnp routers have it
      ns=$(nl ns "r$i") dev=wan a="$JS_PUB.2.$i"
    else
      continue
    fi
    ip -n "$ns" route del "$JS_PUB.0.0/16" dev "$dev" proto boot 2>/dev/null || true
    ip -n "$ns" addr add "$a/16" dev "$dev"
  done
}
# pub_addr HOST: the host's address in the block as the internet sees it
pub_addr() {
  local i=${1#h}
  if [[ $(nl addr "$1") == "$(nl addr "$1" --outside)" ]]; then echo "$JS_PUB.1.$i"; else echo "$JS_PUB.2.$i"; fi
}

# js_setup: installs the js peers (exit 77 when node/npm/packages are unavailable); sets JS_DIR
js_setup() {
  local build rc=0
  build=$(cd "$(dirname "$STARLING")/.." && pwd)
  JS_DIR=$("$T_SRC/tests/interop/setup.sh" "$build" 2>"$T_TMP/js-setup.err" | tail -1) || rc=$?
  ((rc == 77)) && skip "js-libp2p unavailable: $(tail -1 "$T_TMP/js-setup.err")"
  ((rc == 0)) || { cat "$T_TMP/js-setup.err"; exit 1; }
}

# js_on HOST NAME ARGS...: `nat.mjs ARGS` on HOST in the background; JSON events in
# $T_TMP/NAME.json, js-libp2p's debug log (DCUtR, AutoNAT, relay) in $T_TMP/NAME.err
js_on() {
  local h=$1 name=$2
  shift 2
  "$NETLAB" --name "$T_RUN" exec "$h" -- env DEBUG="${JS_DEBUG:-libp2p:dcutr*,libp2p:auto-nat*}" \
    node --import "$JS_DIR/polyfill.mjs" "$JS_DIR/nat.mjs" "$@" \
    >"$T_TMP/$name.json" 2>"$T_TMP/$name.err" </dev/null &
  T_PIDS+=("$!")
}
# js_field NAME EVENT JQ: JQ of the first EVENT line of NAME's events (empty if none)
js_field() {
  { grep -F "\"event\":\"$2\"" "$T_TMP/$1.json" || true; } | head -1 | jq -r "$3 // empty"
}
