#!/usr/bin/env bash
# Build (once) a Debian 13 (trixie) root filesystem holding Slurm 24.11 from Debian's packages, for the second
# Slurm target of the local cluster (docs/slurm-versions.md): scripts/slurm24.sh runs a command inside it, with
# this machine's Python and the checkout mounted in. Idempotent and cached: the root lives in
# ${SLURM24_CACHE:-/var/cache/nanotron-launcher}/slurm24-<hash of this script's package list>, built in a
# temporary directory and renamed into place when complete (so a half-built root is never used), under a lock (so
# two checkouts building at once build it once). Prints the root's path on its last line.
set -euo pipefail

# Slurm 24.11 and munge; what the tests and the jobs run (procps: ps/pkill, iproute2: ip, util-linux: unshare,
# mount, runuser, flock; binutils: addr2line for torch's C++ stack traces; tmux: the terminal of the --interactive
# test); the shared libraries the host's Python and its packages load (ssl, ffi, sqlite, lzma, bz2, zlib, readline,
# ncurses, expat).
PACKAGES=slurmctld,slurmd,slurm-client,munge,procps,iproute2,util-linux,hostname,make,git,shellcheck,binutils,tmux
PACKAGES+=,ca-certificates,libssl3t64,libffi8,libsqlite3-0,liblzma5,libbz2-1.0,zlib1g,libreadline8t64,libncursesw6
PACKAGES+=,libexpat1,libstdc++6,libgomp1
CACHE=${SLURM24_CACHE:-/var/cache/nanotron-launcher}
ROOT="$CACHE/slurm24-$(printf '%s' "$PACKAGES" | sha256sum | cut -c1-12)"

if [[ -x "$ROOT/usr/sbin/slurmctld" ]]; then
    echo "Slurm 24.11 root filesystem already built"
    echo "$ROOT"
    exit 0
fi
if [[ $(id -u) -ne 0 ]]; then
    echo "error: building the Slurm 24.11 root filesystem needs root (mmdebstrap, chroot)" >&2
    exit 1
fi
# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
apt_install mmdebstrap
mkdir -p "$CACHE"
exec 9>"$CACHE/.build.lock"
flock 9
if [[ ! -x "$ROOT/usr/sbin/slurmctld" ]]; then  # not built by another checkout while this one waited
    tmp="$ROOT.tmp.$$"
    trap 'rm -rf "$tmp"' EXIT
    echo "building the Slurm 24.11 root filesystem in $ROOT (Debian 13 packages, about a minute)"
    # no mirror named: mmdebstrap takes this machine's Debian mirror
    mmdebstrap --quiet --variant=apt --include="$PACKAGES" trixie "$tmp"
    cp /etc/hosts "$tmp/etc/hosts"
    mv "$tmp" "$ROOT"
    trap - EXIT
fi
chroot "$ROOT" /usr/sbin/slurmctld -V
echo "$ROOT"
