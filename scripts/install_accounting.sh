#!/usr/bin/env bash
# Install what the local cluster's accounting needs (launcher/localcluster/accounting.py), from Debian's packages:
# slurmdbd (the Slurm release the cluster runs, with its MySQL plugin) and MariaDB's server and client. Idempotent:
# does nothing when all are present. Installing mariadb-server starts no database the cluster uses: each cluster
# runs a mariadbd of its own, in its own directory.
set -euo pipefail

# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
exit_if_present "slurmdbd and mariadb" slurmdbd sacctmgr mariadbd mariadb-install-db mariadb
apt_install slurmdbd mariadb-server mariadb-client
