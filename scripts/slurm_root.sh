#!/usr/bin/env bash
# scripts/slurm_root.sh RELEASE [CMD [ARG...]]: run CMD in this checkout against a newer Slurm release than Debian
# 12's 22.05 (docs/slurm-versions.md). RELEASE is one of
#   24.11   Debian 13 (trixie)'s slurm-wlm 24.11
#   26.05   Debian's next release (forky)'s slurm-wlm 26.05
# Without CMD it only builds the release's root filesystem (once) and prints its path on its last line.
#
# The root: a Debian root filesystem holding the release's Slurm and munge from Debian's packages (its binaries need
# that release's C library, so they cannot run on this machine's), built once with mmdebstrap in
# ${SLURM_ROOT_CACHE:-/var/cache/nanotron-launcher}/slurm-RELEASE-<hash of the suite and the package list>, in a
# temporary directory renamed into place when complete (a half-built root is never used), under a lock (two
# checkouts building at once build it once).
#
# CMD runs inside that root, so every Slurm command it starts, and the local cluster's daemons (`python -m
# launcher.localcluster up`), are the release's. The root sees this machine's Python (its installation, read-only, at
# the same path), the checkout (read-write, at the same path), /tmp and /etc/hosts. It runs in namespaces of its own:
# mounts (nothing shows outside), a network with only its own loopback (its clusters' ports never meet this
# machine's), and processes (whatever CMD leaves running, a daemon included, ends with it). The local cluster lives in
# .slurm-RELEASE (not .slurm), so the 22.05 cluster of the same checkout is never taken for it. Root only
# (mmdebstrap, namespaces, chroot).
#
#   bash scripts/slurm_root.sh 26.05 python3 -m pytest -m slurm -n 4 --dist loadfile   # the Slurm tests on 26.05
#   bash scripts/slurm_root.sh 24.11 bash -c 'python3 -m launcher.localcluster up && ...'  # (one shell: see above)
set -euo pipefail
cd "$(dirname "$0")/.."
release=${1:-}
case "$release" in
    24.11) suite=trixie ;;
    26.05) suite=forky ;;
    *)
        echo "usage: $0 24.11|26.05 [CMD [ARG...]]" >&2
        exit 2
        ;;
esac
shift

# Slurm and munge; what the tests and the jobs run (procps: ps/pkill, iproute2: ip, util-linux: unshare, runuser,
# flock; mount, which forky's util-linux no longer pulls in; binutils: addr2line for torch's C++ stack traces; tmux:
# the terminal of the --interactive test); the shared libraries the host's Python and its packages load (ssl, ffi,
# sqlite, lzma, bz2, zlib, readline, ncurses, expat); slurmdbd and MariaDB, for the accounting tests (their MariaDB
# client library: see the mounts below).
PACKAGES=slurmctld,slurmd,slurm-client,munge,procps,iproute2,util-linux,mount,hostname,make,git,shellcheck,binutils
PACKAGES+=,tmux,slurmdbd,mariadb-server,mariadb-client
PACKAGES+=,ca-certificates,libssl3t64,libffi8,libsqlite3-0,liblzma5,libbz2-1.0,zlib1g,libreadline8t64,libncursesw6
PACKAGES+=,libexpat1,libstdc++6,libgomp1
CACHE=${SLURM_ROOT_CACHE:-/var/cache/nanotron-launcher}
root="$CACHE/slurm-$release-$(printf '%s %s' "$suite" "$PACKAGES" | sha256sum | cut -c1-12)"

build_root() {
    if [[ -x "$root/usr/sbin/slurmctld" ]]; then
        echo "Slurm $release root filesystem already built"
        return 0
    fi
    if [[ $(id -u) -ne 0 ]]; then
        echo "error: building the Slurm $release root filesystem needs root (mmdebstrap, chroot)" >&2
        exit 1
    fi
    # shellcheck source=scripts/lib.sh
    source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
    apt_install mmdebstrap
    mkdir -p "$CACHE"
    exec 9>"$CACHE/.build.lock"
    flock 9
    if [[ ! -x "$root/usr/sbin/slurmctld" ]]; then  # not built by another checkout while this one waited
        tmp="$root.tmp.$$"
        trap 'rm -rf "$tmp"' EXIT
        echo "building the Slurm $release root filesystem in $root (Debian $suite packages, about a minute)"
        # No mirror named: mmdebstrap takes this machine's Debian mirror. A testing suite's Release file carries a
        # Valid-Until a week ahead, which a mirror that is not refreshed (a snapshot) outlives: not checked.
        mmdebstrap --quiet --variant=apt --aptopt='Acquire::Check-Valid-Until "false"' --include="$PACKAGES" \
            "$suite" "$tmp"
        cp /etc/hosts "$tmp/etc/hosts"
        mv "$tmp" "$root"
        trap - EXIT
    fi
    exec 9>&-
    chroot "$root" /usr/sbin/slurmctld -V
}

if [[ $# -eq 0 ]]; then
    build_root
    echo "$root"
    exit 0
fi
build_root >&2
checkout=$PWD
export PATH="$PATH:/usr/sbin:/sbin"

# The host's Python: PATH's first entry (where python3 and its scripts are), then the paths to mount: its
# installation(s) (a virtual environment's and its base's), or where it is the system's (/usr) just the
# interpreter and its module directories, which the root (no Python of its own) does not hold.
mapfile -t python_paths < <("${PYTHON:-python3}" - "$checkout" <<'EOF'
import os, sys
checkout = os.path.realpath(sys.argv[1])
print(os.path.dirname(sys.executable))
prefixes = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix)}
system = {"/", "/usr", "/usr/local"}
paths = {p for p in prefixes if p not in system}
if prefixes & system:
    paths |= {os.path.realpath(sys.executable)}
    paths |= {os.path.realpath(p) for p in sys.path if p and os.path.isdir(p)}
paths = {p for p in paths if not (p + "/").startswith(checkout + "/") and p not in system}
for p in sorted(paths):  # a path inside another one listed is mounted with it
    if not any(p.startswith(q + "/") for q in paths):
        print(p)
EOF
)
# A worktree's git directory lives in the main checkout: mount it too (the bundle records the commit).
git_dir=$(git rev-parse --path-format=absolute --git-common-dir 2>/dev/null || true)
extra=()
if [[ -n "$git_dir" && "$git_dir/" != "$checkout/"* ]]; then
    extra+=("$git_dir")
fi
if [[ -d "$checkout/../shared" ]]; then
    extra+=("$(cd "$checkout/.." && pwd)/shared")  # vendored sources some tests use (read-only; a link's target)
fi

# Run inside the new namespaces (PID 1 there: it reaps what its command leaves, and all of it ends with it).
# shellcheck disable=SC2016  # (expanded by the bash that runs it, from its arguments)
inside='
set -euo pipefail
root=$1 checkout=$2 pybin=$3 release=$4 count=$5
shift 5
ro=("${@:1:count}")
shift "$count"
# slurmd (24.11 on) resolves its address with AI_ADDRCONFIG: the loopback needs one IPv4 address besides 127.0.0.1
ip link set lo up
ip addr add 10.254.0.1/32 dev lo
mount --bind "$root" "$root"  # / must be a mount point for the tests that unshare mounts themselves
mount -t proc proc "$root/proc"
mount --rbind /sys "$root/sys"
mount --rbind /dev "$root/dev"
mount --bind /tmp "$root/tmp"
mount --bind /etc/hosts "$root/etc/hosts"
for path in "${ro[@]}"; do
    if [[ -d "$path" ]]; then mkdir -p "$root$path"; else mkdir -p "$(dirname "$root$path")" && touch "$root$path"; fi
    mount --bind "$path" "$root$path"
    mount -o remount,bind,ro "$root$path"
done
mkdir -p "$root$checkout"
mount --bind "$checkout" "$root$checkout"
# slurmdbd 24.11 and 26.05 stop at their start with the MariaDB client library of their release (Connector/C 3.4,
# of MariaDB 11.8): their first query fails "5027 Number of columns in result (=1) set execeeds maxmimum allowed
# number of columns (=0)". Debian 12 has Connector/C 3.3 (of MariaDB 10.11; scripts/setup.sh installs it for the
# slurmdbd of 22.05), which serves the MariaDB 11.8 server of the root: it is mounted over the one of the root,
# read-only.
lib=usr/lib/x86_64-linux-gnu/libmariadb.so.3
if [[ -f "/$lib" && -f "$root/$lib" ]]; then
    mount --bind "/$lib" "$root/$lib"
    mount -o remount,bind,ro "$root/$lib"
fi
rc=0
chroot "$root" /usr/bin/env -i HOME=/root LANG=C.UTF-8 PATH="$pybin:/usr/sbin:/usr/bin:/sbin:/bin" \
    CI="${CI:-}" PYTHONPATH="${PYTHONPATH:-}" LAUNCHER_LOCALCLUSTER_DIR="$checkout/.slurm-$release" \
    LAUNCHER_TEST_TIMELINE="${LAUNCHER_TEST_TIMELINE:-}" \
    /bin/bash -c "cd \"\$0\" && exec \"\$@\"" "$checkout" "$@" || rc=$?
exit "$rc"
'
ro=("${python_paths[@]:1}" "${extra[@]}")
exec unshare --mount --propagation private --net --pid --fork \
    bash -c "$inside" - "$root" "$checkout" "${python_paths[0]}" "$release" "${#ro[@]}" "${ro[@]}" "$@"
