#!/usr/bin/env bash
# scripts/s3_root.sh: build (once) the root filesystem the local S3 server runs from, and print its path on the last
# line. The server (launcher/localcluster/s3.py, docs/s3-server.md) is a one-node Ceph cluster: a monitor, one OSD
# and radosgw, the S3 gateway, from Debian forky's Ceph 20.2 packages (their binaries need forky's C library, so they
# cannot run on this machine's); each daemon runs from this root with chroot.
#
# Built as scripts/slurm_root.sh builds its roots: with mmdebstrap from Debian's registry, in
# ${SLURM_ROOT_CACHE:-/var/cache/nanotron-launcher}/s3-<hash of the suite and the package list>, in a temporary
# directory renamed into place when complete (a half-built root is never used), under the same lock (two checkouts
# building at once build it once). About a minute and ~560 MB the first time; nothing after. Root only.
set -euo pipefail

suite=forky
# The monitor, the OSD, radosgw (and radosgw-admin), and ceph-common: the `ceph` command that registers the OSD. No
# ceph-mgr: radosgw does not need one, and forky's 20.2.4 loads none of its Python modules (docs/s3-server.md).
PACKAGES=ceph-mon,ceph-osd,radosgw,ceph-common
CACHE=${SLURM_ROOT_CACHE:-/var/cache/nanotron-launcher}
root="$CACHE/s3-$(printf '%s %s' "$suite" "$PACKAGES" | sha256sum | cut -c1-12)"

if [[ ! -x "$root/usr/bin/radosgw" ]]; then
    if [[ $(id -u) -ne 0 ]]; then
        echo "error: building the S3 server's root filesystem needs root (mmdebstrap)" >&2
        exit 1
    fi
    # shellcheck source=scripts/lib.sh
    source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
    apt_install mmdebstrap >&2
    mkdir -p "$CACHE"
    exec 9>"$CACHE/.build.lock"
    flock 9
    if [[ ! -x "$root/usr/bin/radosgw" ]]; then # not built by another checkout while this one waited
        tmp="$root.tmp.$$"
        trap 'rm -rf "$tmp"' EXIT
        echo "building the S3 server's root filesystem in $root (Debian $suite's Ceph, about a minute)" >&2
        # No mirror named: mmdebstrap takes this machine's Debian mirror. A testing suite's Release file carries a
        # Valid-Until a week ahead, which a mirror that is not refreshed (a snapshot) outlives: not checked.
        mmdebstrap --quiet --variant=apt --aptopt='Acquire::Check-Valid-Until "false"' --include="$PACKAGES" \
            "$suite" "$tmp" >&2
        # The server's directory is mounted here, in each daemon's own mount namespace (the root itself is mounted
        # read-only there: no daemon writes to it)
        mkdir -p "$tmp/srv/s3"
        mv "$tmp" "$root"
        trap - EXIT
    fi
    exec 9>&-
fi
echo "$root"
