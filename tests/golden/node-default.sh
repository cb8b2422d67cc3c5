#!/bin/bash
# Run golden-default, node side: what every node of the job runs, one task per node, started by srun from the batch
# script (/project/logs/slurm_scripts/golden-default/20260101-000000.sbatch). Every value it needs is written here, not taken from the environment.
#
# On this node it:
#   - checks the node before training: its GPUs, the paths the run writes and reads, the Python modules the engine
#     needs; the nodes then meet at the rendezvous port, and the first one says which node failed what;
#   - starts `nvidia-smi dmon` every 15 s into the log directory, where nvidia-smi exists (a new file each attempt);
#   - starts torchrun (2 nodes, rendezvous at the address given), which starts 8 training
#     processes: /project/run_train.py;
#   - passes Slurm's SIGTERM to training, not to torchrun: training saves a checkpoint at its next step and exits,
#     and torchrun waits for it (a preemption's grace time is for saving, not for dying).
# The batch script also runs it to dump the training processes' stacks (a hang) and to stop them.
#
# Usage (the batch script's): bash node.sh run HOST:PORT NODE1,NODE2,...  |  bash node.sh dump DIR  |  bash node.sh stop
# shellcheck disable=SC2016,SC2089,SC2090  # (values are single-quoted on purpose: a $ or quote is a literal character)
set -uo pipefail
# Slurm passes the submitting shell's soft open-file limit (often 1024); torchrun's store on the first node holds
# about (GPUs + 1) x nodes connections: the soft limit goes up to the hard one (the node check says if that is short).
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

LAUNCHER_PYTHON=/usr/bin/python3
LAUNCHER_TRAIN_SCRIPT=/project/run_train.py
LAUNCHER_CONFIG=/project/logs/configs/golden-default/20260101-000000/config.yaml
LAUNCHER_LOG_DIR=/project/logs/slurm_logs/golden-default
LAUNCHER_PROJECT=/checkout  # on PYTHONPATH for the node check (python -m launcher.node.nodecheck)
LAUNCHER_NODECHECK=launcher.node.nodecheck
LAUNCHER_PREFLIGHT_REPORT=/project/logs/configs/golden-default/20260101-000000/preflight
LAUNCHER_PORT_TAKEN=/project/logs/configs/golden-default/20260101-000000/port-taken
export LAUNCHER_STOP_FILE=/project/logs/configs/golden-default/20260101-000000/stop-requested
export LAUNCHER_OUTCOME_FILE=/project/logs/configs/golden-default/20260101-000000/outcome
export LAUNCHER_METRICS_FILE=/project/logs/configs/golden-default/20260101-000000/metrics.jsonl
export LAUNCHER_RUNTIME_FILE=/project/logs/configs/golden-default/20260101-000000/runtime.jsonl
export LAUNCHER_PROGRESS_FILE=/project/logs/configs/golden-default/20260101-000000/progress
export LAUNCHER_SIGNAL_GRACE=120  # seconds a time-limit save has (training warns if saves take longer)
export TMPDIR=/tmp
export CUDA_DEVICE_MAX_CONNECTIONS=1
export PYTHONUNBUFFERED=1
export PYTHONFAULTHANDLER=1
export NCCL_DEBUG="${NCCL_DEBUG:-WARN}"
cpus_per_process=$(( ${SLURM_CPUS_PER_TASK:-1} / 8 ))
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-$(( cpus_per_process > 0 ? cpus_per_process : 1 ))}"
export WANDB_MODE=disabled

node="${SLURMD_NODENAME:-$(hostname)}"
export LAUNCHER_NODE_TAG="${SLURM_JOB_ID}:${node}"  # marks this node's training processes, for dump and stop

# This node's training processes: they carry the tag, and LOCAL_RANK from torchrun.
training_pids() {
  local entry pid environ
  for entry in /proc/[0-9]*; do
    pid=${entry#/proc/}
    environ=$(tr '\0' '\n' < "$entry/environ" 2>/dev/null) || continue
    grep -qxF LAUNCHER_NODE_TAG"=${SLURM_JOB_ID}:${node}" <<< "$environ" && grep -q '^LOCAL_RANK=' <<< "$environ" \
      && echo "$pid"
  done
}

mode="${1:-run}"
case "$mode" in
  dump)  # every training process's Python stacks: py-spy where the job's environment has it, else faulthandler
    # All processes at once, each dump at most 30 s, without pausing the process (--nonblocking): a process stuck
    # in the kernel (D state) cannot hold up the others, nor this node the job.
    pyspy="$(dirname "$LAUNCHER_PYTHON")/py-spy"
    [[ -x "$pyspy" ]] || pyspy=$(command -v py-spy || true)
    for pid in $(training_pids); do
      if [[ -n "$pyspy" ]]; then
        { timeout -k 5 30 "$pyspy" dump --nonblocking --pid "$pid" > "$2/${node}-${pid}.txt" 2>&1 \
            || kill -USR2 "$pid" 2>/dev/null; } &
      else
        kill -USR2 "$pid" 2>/dev/null  # faulthandler writes every thread's stack to the job's log
        echo "py-spy not found: the stacks of process ${pid} are in the job's log (faulthandler)" > "$2/${node}-${pid}.txt"
      fi
    done
    wait
    exit 0 ;;
  stop)
    pids=$(training_pids)
    # shellcheck disable=SC2086  # one pid a word
    [[ -n "$pids" ]] && kill -KILL $pids 2>/dev/null
    exit 0 ;;
esac
rdzv="$2"
job_nodes="$3"

status_file="${TMPDIR}/launcher-torchrun-${SLURM_JOB_ID}-${node}.status"
monitor_pid=""
trap '[[ -n "$monitor_pid" ]] && kill "$monitor_pid" 2>/dev/null; rm -f "$status_file"; true' EXIT
# Slurm's SIGTERM is for the training processes (they checkpoint and exit); this script waits for them.
trap 'true' TERM

PYTHONPATH="$LAUNCHER_PROJECT" "$LAUNCHER_PYTHON" -m "$LAUNCHER_NODECHECK" --head "${rdzv%:*}" --port "${rdzv##*:}" --nodes "$job_nodes" \
  --node "$node" --gpus 8 --report "$LAUNCHER_PREFLIGHT_REPORT" --modules torch,numpy,yaml,transformers \
  --writable /project/checkpoints/golden-default \
  --writable /project/logs/slurm_logs/golden-default \
  --writable /project/logs/configs/golden-default/20260101-000000 \
  --readable /project/logs/configs/golden-default/20260101-000000/config.yaml \
  --readable /project/run_train.py \
  --timeout 60
case $? in
  0) ;;
  6) touch "$LAUNCHER_PORT_TAKEN"; exit 6 ;;  # the batch script tries another port
  *) exit 5 ;;
esac

if [[ "${SLURM_LOCALID:-0}" == 0 ]] && command -v nvidia-smi >/dev/null 2>&1; then
  # one file per attempt on this node (a requeue, another rendezvous port): gpu-JOB-NODE.log, then .log.2, .log.3,
  # ..., so that no attempt's samples are lost, whether dmon -f would start an existing file afresh or not
  monitor_log="${LAUNCHER_LOG_DIR}/gpu-${SLURM_JOB_ID}-${node}.log"
  n=1
  while [[ -e "$monitor_log" ]]; do
    n=$(( n + 1 ))
    monitor_log="${LAUNCHER_LOG_DIR}/gpu-${SLURM_JOB_ID}-${node}.log.${n}"
  done
  nvidia-smi dmon -d 15 -s pumt -o DT -f "$monitor_log" &
  monitor_pid=$!
fi

# torchrun's c10d rendezvous (--rdzv_backend; docs/running.md): the agent on the first node hosts its store at the
# job's port, the others join it there; the node ranks are the order they joined in.

# torchrun starts with SIGTERM blocked (a blocked signal stays blocked through exec and into the processes it
# starts, whatever handler torchrun installs), so that it does not stop the training processes the moment Slurm
# sends its notice; training unblocks SIGTERM once it can save on it (launcher/train/stop.py, StopRequest).
{
  trap '' TERM  # this subshell outlives the notice too, to write torchrun's exit status
  "$LAUNCHER_PYTHON" -c 'import os, signal, sys
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
os.execv(sys.executable, [sys.executable, "-m", "torch.distributed.run", *sys.argv[1:]])' \
    --nnodes=2 --nproc_per_node=8 --rdzv_backend=c10d --rdzv_endpoint="$rdzv" \
    --rdzv_id="$SLURM_JOB_ID" \
    --max_restarts=0 "$LAUNCHER_TRAIN_SCRIPT" --config-file "$LAUNCHER_CONFIG" --engine auto
  echo "$?" > "$status_file"
} &
torchrun_pid=$!
while kill -0 "$torchrun_pid" 2>/dev/null; do
  wait "$torchrun_pid" || true  # returns early when a signal arrives; then wait again
done
exit "$(cat "$status_file" 2>/dev/null || echo 1)"
