#!/usr/bin/env bash
# scripts/slurm24.sh CMD [ARG...]: run CMD in this checkout against Slurm 24.11 (docs/slurm-versions.md).
#
# CMD runs inside the Debian 13 root filesystem that scripts/install_slurm24.sh builds (once; this calls it), so
# every Slurm command it starts, and the local cluster's daemons (`python -m launcher.localcluster up`), are 24.11's.
# The root sees this machine's Python (its installation, read-only, at the same path), the checkout (read-write,
# at the same path), /tmp and /etc/hosts. It runs in namespaces of its own: mounts (nothing shows outside), a
# network with only its own loopback (its clusters' ports never meet this machine's), and processes (whatever CMD
# leaves running, a daemon included, ends with it). The local cluster lives in .slurm-24.11 (not .slurm), so the
# 22.05 cluster of the same checkout is never taken for it. Root only (namespaces, chroot).
#
#   bash scripts/slurm24.sh python3 -m pytest -m slurm -n 2 --dist loadfile   # the Slurm tests on 24.11
#   bash scripts/slurm24.sh python3 -m launcher.localcluster up && ...           # (one shell: see above)
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ $# -eq 0 ]]; then
    echo "usage: $0 CMD [ARG...]" >&2
    exit 2
fi
checkout=$PWD
root=$(bash scripts/install_slurm24.sh | tail -n 1)
export PATH="$PATH:/usr/sbin:/sbin"

# The host's Python: PATH's first entry (where python3 and its scripts are), then the paths to mount: its
# installation(s) (a virtual environment's and its base's), or where it is the system's (/usr) just the
# interpreter and its module directories, which Debian 13's root (no Python of its own) does not hold.
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
root=$1 checkout=$2 pybin=$3 count=$4
shift 4
ro=("${@:1:count}")
shift "$count"
# 24.11 slurmd resolves its address with AI_ADDRCONFIG: the loopback needs one IPv4 address besides 127.0.0.1
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
rc=0
chroot "$root" /usr/bin/env -i HOME=/root LANG=C.UTF-8 PATH="$pybin:/usr/sbin:/usr/bin:/sbin:/bin" \
    CI="${CI:-}" PYTHONPATH="${PYTHONPATH:-}" LAUNCHER_LOCALCLUSTER_DIR="$checkout/.slurm-24.11" \
    /bin/bash -c "cd \"\$0\" && exec \"\$@\"" "$checkout" "$@" || rc=$?
exit "$rc"
'
ro=("${python_paths[@]:1}" "${extra[@]}")
exec unshare --mount --propagation private --net --pid --fork \
    bash -c "$inside" - "$root" "$checkout" "${python_paths[0]}" "${#ro[@]}" "${ro[@]}" "$@"
