#!/bin/bash
# Run golden-every-option, node side: what every node of the job runs, one task per node, started by srun from the batch
# script (/project/logs/slurm_scripts/golden-every-option/20260101-000000.sbatch). Every value it needs is written here, not taken from the environment.
#
# On this node it:
#   - starts `nvidia-smi dmon` every 15 s into the log directory, where nvidia-smi exists;
#   - starts torchrun (2 nodes, rendezvous at the address given as the first argument), which starts
#     8 training processes: /project/run_train.py;
#   - passes Slurm's SIGTERM to training, not to torchrun: training saves a checkpoint at its next step and exits,
#     and torchrun waits for it (a preemption's grace time is for saving, not for dying).
#
# Usage (the batch script's): bash node.sh RENDEZVOUS_HOST:PORT
# shellcheck disable=SC2016,SC2089,SC2090  # (values are single-quoted on purpose: a $ or quote is a literal character)
set -uo pipefail

rdzv="$1"
LAUNCHER_PYTHON=/usr/bin/python3
LAUNCHER_TRAIN_SCRIPT=/project/run_train.py
LAUNCHER_CONFIG=/project/logs/configs/golden-every-option/20260101-000000/config.yaml
LAUNCHER_LOG_DIR=/project/logs/slurm_logs/golden-every-option
export LAUNCHER_STOP_FILE=/project/logs/configs/golden-every-option/20260101-000000/stop-requested
export LAUNCHER_OUTCOME_FILE=/project/logs/configs/golden-every-option/20260101-000000/outcome
export LAUNCHER_METRICS_FILE=/project/logs/configs/golden-every-option/20260101-000000/metrics.jsonl
export TMPDIR=/tmp
export CUDA_DEVICE_MAX_CONNECTIONS=1
export PYTHONUNBUFFERED=1
export PYTHONFAULTHANDLER=1
export NCCL_DEBUG="${NCCL_DEBUG:-WARN}"
cpus_per_process=$(( ${SLURM_CPUS_PER_TASK:-1} / 8 ))
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-$(( cpus_per_process > 0 ? cpus_per_process : 1 ))}"
export WANDB_MODE=disabled
export NCCL_DEBUG=INFO
export A='x y'

node="${SLURMD_NODENAME:-$(hostname)}"
status_file="${TMPDIR}/launcher-torchrun-${SLURM_JOB_ID}-${node}.status"
monitor_pid=""
trap '[[ -n "$monitor_pid" ]] && kill "$monitor_pid" 2>/dev/null; rm -f "$status_file"; true' EXIT
# Slurm's SIGTERM is for the training processes (they checkpoint and exit); this script waits for them.
trap 'true' TERM

if [[ "${SLURM_LOCALID:-0}" == 0 ]] && command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi dmon -d 15 -s pumt -o DT -f "${LAUNCHER_LOG_DIR}/gpu-${SLURM_JOB_ID}-${node}.log" &
  monitor_pid=$!
fi

# torchrun starts with SIGTERM blocked (a blocked signal stays blocked through exec and into the processes it
# starts, whatever handler torchrun installs), so that it does not stop the training processes the moment Slurm
# sends its notice; run_train.py unblocks SIGTERM once it can save on it.
{
  trap '' TERM  # this subshell outlives the notice too, to write torchrun's exit status
  "$LAUNCHER_PYTHON" -c 'import os, signal, sys
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
os.execv(sys.executable, [sys.executable, "-m", "torch.distributed.run", *sys.argv[1:]])' \
    --nnodes=2 --nproc_per_node=8 --rdzv_backend=c10d --rdzv_endpoint="$rdzv" \
    --rdzv_id="$SLURM_JOB_ID" --max_restarts=0 "$LAUNCHER_TRAIN_SCRIPT" --config-file "$LAUNCHER_CONFIG"
  echo "$?" > "$status_file"
} &
torchrun_pid=$!
while kill -0 "$torchrun_pid" 2>/dev/null; do
  wait "$torchrun_pid" || true  # returns early when a signal arrives; then wait again
done
exit "$(cat "$status_file" 2>/dev/null || echo 1)"
