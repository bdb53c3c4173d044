#!/usr/bin/env bash
# `starling run-key`: the organiser's commands for a private run (docs/security.md). A run key,
# a certificate for a peer (checked against the right and a wrong run key), revocation lists
# (the second keeps the first's entries, sequence + 1), and the refusals: an existing key file,
# a bad peer id, a file that is neither a certificate nor a list, a tampered certificate.
set -euo pipefail
bin=$(realpath "$1")
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cd "$dir"

run=$("$bin" run-key new --out run.key 2> /dev/null)
[[ $run == 12D3KooW* ]] || { echo "bad run key '$run'"; exit 1; }
[[ $(stat -c %a run.key) == 600 ]] || { echo "run.key is not 0600"; exit 1; }
peer=$("$bin" id -i peer.key 2> /dev/null)
other=$("$bin" id -i other.key 2> /dev/null)
"$bin" run-key sign --key run.key --peer "$peer" --days 2 --out peer.cert 2> /dev/null
[[ $(stat -c %s peer.cert) == 149 ]] || { echo "certificate of $(stat -c %s peer.cert) bytes"; exit 1; }
"$bin" run-key show peer.cert --run-key "$run" | tee show.txt
grep -q "member:  $peer" show.txt
grep -q "check:   member" show.txt

# Another run's key: the certificate does not admit (exit 1).
wrong=$("$bin" run-key new --out wrong.key 2> /dev/null)
set +e
"$bin" run-key show peer.cert --run-key "$wrong" > wrong.txt
rc=$?
set -e
[[ $rc == 1 ]] && grep -q "check:   wrong run key" wrong.txt || { echo "wrong key: rc $rc"; exit 1; }

# Tampered: one byte of the expiry changed.
cp peer.cert bad.cert
printf '\xff' | dd of=bad.cert bs=1 seek=80 conv=notrunc 2> /dev/null
set +e
"$bin" run-key show bad.cert --run-key "$run" > bad.txt
rc=$?
set -e
[[ $rc == 1 ]] && grep -q "check:   bad signature" bad.txt || { echo "tampered: rc $rc"; cat bad.txt; exit 1; }

"$bin" run-key revoke --key run.key --peer "$peer" --out l1 2> /dev/null
"$bin" run-key revoke --key run.key --peer "$other" --list l1 --out l2 2> /dev/null
"$bin" run-key show l2 --run-key "$run" | tee l2.txt
grep -q "revocation list 2" l2.txt
grep -q "check:   valid" l2.txt
grep -q "revoked: $peer" l2.txt
grep -q "revoked: $other" l2.txt
# A list extended with another authority's key is refused.
set +e
"$bin" run-key revoke --key wrong.key --peer "$peer" --list l2 --out l3 2> err.txt
rc=$?
set -e
[[ $rc != 0 ]] && grep -q "not signed by this run key" err.txt || { echo "foreign list: rc $rc"; exit 1; }

for args in "new --out run.key" "sign --key run.key --peer nonsense --out x" "show run.key"; do
  set +e
  # shellcheck disable=SC2086
  "$bin" run-key $args > out.txt 2> err.txt
  rc=$?
  set -e
  [[ $rc == 2 ]] && grep -q "^error: " err.txt || { echo "run-key $args: rc $rc"; cat err.txt; exit 1; }
done
echo "run-key: ok"
