#!/usr/bin/env bash
# Install what the local Slurm cluster (launcher/localcluster.py) and the tests need, from Debian's packages:
# slurmctld, slurmd, the Slurm client commands, munge, and shellcheck. Idempotent: does nothing when all are present.
set -euo pipefail

export PATH="$PATH:/usr/sbin:/sbin"
missing=()
for cmd in sbatch slurmctld slurmd munged shellcheck; do
    command -v "$cmd" >/dev/null || missing+=("$cmd")
done
if [[ ${#missing[@]} -eq 0 ]]; then
    echo "slurm, munge and shellcheck already installed"
    exit 0
fi
echo "installing (missing: ${missing[*]})"

sudo=()
if [[ $(id -u) -ne 0 ]]; then
    sudo=(sudo)
fi
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update
"${sudo[@]}" apt-get install -y --no-install-recommends slurmctld slurmd slurm-client munge shellcheck
