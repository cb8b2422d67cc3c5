#!/usr/bin/env bash
# Install what the local cluster's accounting needs (launcher/localcluster/accounting.py), from Debian's packages:
# slurmdbd (the Slurm release the cluster runs, with its MySQL plugin) and MariaDB's server and client. Idempotent:
# does nothing when all are present. Installing mariadb-server starts no database the cluster uses: each cluster
# runs a mariadbd of its own, in its own directory.
set -euo pipefail

export PATH="$PATH:/usr/sbin:/sbin"
missing=()
for cmd in slurmdbd sacctmgr mariadbd mariadb-install-db mariadb; do
    command -v "$cmd" >/dev/null || missing+=("$cmd")
done
if [[ ${#missing[@]} -eq 0 ]]; then
    echo "slurmdbd and mariadb already installed"
    exit 0
fi
echo "installing (missing: ${missing[*]})"

sudo=()
if [[ $(id -u) -ne 0 ]]; then
    sudo=(sudo)
fi
export DEBIAN_FRONTEND=noninteractive
apt=("${sudo[@]}" apt-get -o DPkg::Lock::Timeout=900)
packages=(slurmdbd mariadb-server mariadb-client)
if ! "${apt[@]}" install -y --no-install-recommends "${packages[@]}"; then
    "${apt[@]}" update  # only when a package was not found
    "${apt[@]}" install -y --no-install-recommends "${packages[@]}"
fi
