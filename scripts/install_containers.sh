#!/usr/bin/env bash
# Containers on the local Slurm cluster (`python -m launcher.localcluster up --containers`): NVIDIA enroot and pyxis
# built from the vendored sources (../shared/vendor, unmodified), and a small image made without any registry.
# Idempotent: each step does nothing when its result is there. As root (or with sudo for apt and the install).
#
#   bash scripts/install_containers.sh install VENDOR_DIR      enroot + pyxis into /usr/local (~30 s, once)
#   bash scripts/install_containers.sh image IMAGE.sqsh        a Debian bookworm image (mmdebstrap + mksquashfs)
#
# The image holds the shared libraries a host Python needs (the launcher mounts the Python itself) and no Python.
set -euo pipefail

PREFIX=/usr/local
PACKAGES=(libslurm-dev squashfs-tools squashfuse fuse-overlayfs libbsd-dev libmd-dev libcap2-bin parallel pigz jq
  zstd curl gcc make mmdebstrap)
IMAGE_LIBS=libstdc++6,libssl3,libffi8,libsqlite3-0,libreadline8,libuuid1,libexpat1,libnsl2,libbz2-1.0,liblzma5,zlib1g,procps,mawk

# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

install_tools() {
  local vendor=$1
  apt_install "${PACKAGES[@]}"
  if [[ -x $PREFIX/bin/enroot && -f $PREFIX/lib/slurm/spank_pyxis.so ]]; then
    echo "enroot and pyxis already installed"
    return 0
  fi
  local build
  build=$(mktemp -d)
  trap 'rm -rf "$build"' RETURN
  for name in enroot-4.1.2 pyxis-0.24.0; do
    [[ -f $vendor/$name-src.tar.gz ]] || { echo "no $vendor/$name-src.tar.gz" >&2; return 1; }
    tar -xzf "$vendor/$name-src.tar.gz" -C "$build"
  done
  make -C "$build/enroot-4.1.2" -j2 install prefix="$PREFIX" > "$build/enroot.log" 2>&1 \
    || { tail -20 "$build/enroot.log" >&2; return 1; }
  make -C "$build/pyxis-0.24.0" install prefix="$PREFIX" > "$build/pyxis.log" 2>&1 \
    || { tail -20 "$build/pyxis.log" >&2; return 1; }
  echo "installed enroot ($PREFIX/bin/enroot) and pyxis ($PREFIX/lib/slurm/spank_pyxis.so)"
}

make_image() {
  local image=$1
  if [[ -s $image ]]; then
    echo "image $image already made"
    return 0
  fi
  apt_install mmdebstrap squashfs-tools
  local rootfs
  rootfs=$(mktemp -d)
  trap 'rm -rf "$rootfs"' RETURN
  mkdir -p "$(dirname "$image")"
  mmdebstrap --quiet --variant=essential --include="$IMAGE_LIBS" bookworm "$rootfs"
  # device nodes in the image make enroot's unpacking fail for users other than root: enroot mounts the host's
  mksquashfs "$rootfs" "$image.tmp" -comp zstd -noappend -quiet -wildcards -e 'dev/*'
  chmod 0644 "$image.tmp"
  mv "$image.tmp" "$image"
  echo "made image $image ($(du -h "$image" | cut -f1))"
}

case "${1:-}" in
  install) install_tools "${2:?usage: install VENDOR_DIR}" ;;
  image) make_image "${2:?usage: image IMAGE.sqsh}" ;;
  *) echo "usage: $0 install VENDOR_DIR | image IMAGE.sqsh" >&2; exit 2 ;;
esac
