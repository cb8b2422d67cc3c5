#!/usr/bin/env bash
# Install what the local Slurm cluster (launcher/localcluster.py) and the tests need, from Debian's packages:
# slurmctld, slurmd, the Slurm client commands, munge, shellcheck and tmux. Idempotent: does nothing when all are
# present.
set -euo pipefail

# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
exit_if_present "slurm, munge, shellcheck and tmux" sbatch slurmctld slurmd munged shellcheck tmux
apt_install slurmctld slurmd slurm-client munge shellcheck tmux  # tmux: the terminal of the --interactive tests
