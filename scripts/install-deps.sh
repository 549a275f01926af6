#!/usr/bin/env bash
# Install every Debian package hutch needs to build, run and test.
# Idempotent; safe to run again.  Used by the README's first command and by CI.
set -euo pipefail

PKGS=(
  build-essential pkg-config make      # toolchain (gcc, libc.a for the static hutch-init)
  libmicrohttpd-dev                    # HTTP server (hutchd)
  libjansson-dev                       # JSON
  libsqlite3-dev sqlite3               # state database
  libseccomp-dev                       # seccomp filters
  libcap-dev                           # capabilities
  libcurl4-openssl-dev                 # HTTP client (hutch CLI)
  libssl-dev                           # SHA-256 for API keys; TLS for the gateway later
  btrfs-progs libbtrfsutil-dev         # storage pool: mkfs.btrfs once, subvolume ioctls, send/receive
  libzstd-dev zlib1g-dev               # snapshot export streams; OCI layers (gzip, zstd)
  busybox-static debootstrap           # the `busybox` and `debian` templates
  nftables libnftables-dev libmnl-dev  # egress: one nftables ruleset, veth pairs over rtnetlink
  openssl curl dnsutils                # the egress tests' own network: test CA, clients, dig
  python3 python3-pytest               # integration tests
  iproute2 procps util-linux           # ip, ps, unshare: used by tests
  ca-certificates                      # CA bundle copied into the `host` template
  bubblewrap runsc gnuplot-nox         # benchmark baselines (bwrap, gVisor) and the chart
  clang libclang-rt-14-dev             # libFuzzer smoke runs of the parsers (make fuzz)
)

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PKGS[@]} packages present"
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "install-deps: need root to install: ${missing[*]}" >&2
  exit 1
fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q --no-install-recommends "${missing[@]}"
