#!/usr/bin/env bash
# The README's first command: from a fresh Debian machine to code running in
# a sandbox.  Installs packages, builds, starts hutchd on its embedded
# defaults (unless one already answers), creates a sandbox from the default
# template, runs two commands in it, prints their output, deletes it.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" -ne 0 ]; then
  echo "demo: hutchd needs root (namespaces, cgroups, idmapped mounts); re-running with sudo" >&2
  exec sudo -E "$0" "$@"
fi

./scripts/install-deps.sh
make -j"$(nproc)" all >/dev/null
echo "demo: built build/hutchd, build/hutch, build/hutch-shim, build/hutch-init"

HUTCH=./build/hutch
SOCK=${HUTCH_SOCKET:-/run/hutch/hutchd.sock}
if ! $HUTCH --socket "$SOCK" health >/dev/null 2>&1; then
  mkdir -p /var/log/hutch
  echo "demo: starting hutchd (socket $SOCK, data /var/lib/hutch, log /var/log/hutch/hutchd.log)"
  setsid ./build/hutchd --socket "$SOCK" >>/var/log/hutch/hutchd.log 2>&1 < /dev/null &
  for _ in $(seq 1 100); do
    $HUTCH --socket "$SOCK" health >/dev/null 2>&1 && break
    sleep 0.1
  done
  $HUTCH --socket "$SOCK" health >/dev/null || { tail -20 /var/log/hutch/hutchd.log; exit 1; }
fi

ID=$($HUTCH --socket "$SOCK" create --template host)
trap '$HUTCH --socket "$SOCK" rm "$ID" >/dev/null 2>&1 || true' EXIT
echo "demo: sandbox $ID is running"
echo "\$ python3 -c 'print(6*7)'"
$HUTCH --socket "$SOCK" exec "$ID" -- python3 -c 'print(6*7)'
echo "\$ uname -a"
$HUTCH --socket "$SOCK" exec "$ID" -- uname -a
echo "\$ echo v1 > /root/note; hutch snapshot create; hutch fork --count 2"
$HUTCH --socket "$SOCK" exec "$ID" -- sh -c 'echo v1 > /root/note'
SNAP=$($HUTCH --socket "$SOCK" snapshot create "$ID")
KIDS=$($HUTCH --socket "$SOCK" fork --count 2 "$ID")
for K in $KIDS; do
  echo "demo: copy $K reads: $($HUTCH --socket "$SOCK" exec "$K" -- cat /root/note)"
  $HUTCH --socket "$SOCK" rm "$K" >/dev/null
done
$HUTCH --socket "$SOCK" rm "$ID" >/dev/null
$HUTCH --socket "$SOCK" snapshot delete "$SNAP" >/dev/null
trap - EXIT
echo "demo: sandbox $ID deleted"
if $HUTCH --socket "$SOCK" --json health 2>/dev/null | grep -q '"gvisor":{"available":true'; then
  G=$($HUTCH --socket "$SOCK" create --runtime gvisor --template host)
  echo "\$ uname -a   # in a gvisor sandbox ($G)"
  $HUTCH --socket "$SOCK" exec "$G" -- uname -a
  $HUTCH --socket "$SOCK" rm "$G" >/dev/null
fi
echo "demo: hutchd keeps running; stop it with: pkill -TERM -x hutchd"
