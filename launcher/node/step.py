"""The node step: what srun runs on every node of the job, one task a node, with the job's Python (in the image where
the run has one), and what the supervisor runs beside it on the same nodes (`srun --overlap`).

    python -m launcher.node.step JOB run HOST:PORT NODE1,NODE2,...
    python -m launcher.node.step JOB dump DIR
    python -m launcher.node.step JOB stop

JOB is the bundle's job.json (launcher/node/job.py). `run`, on this node:

- checks the node before training (`nodecheck`, in this process: its GPUs, the paths the run writes and reads, the
  modules the engine imports; the nodes meet at the rendezvous port and the first says which node failed what):
  exit 5, or 6 where the first node found the port taken (it leaves the port-taken file: the supervisor tries
  another port);
- starts `nvidia-smi dmon` every 15 s into the log directory, where nvidia-smi exists (a new file each attempt);
- starts torchrun with SIGTERM blocked (a blocked signal stays blocked through exec, into the training processes):
  Slurm's SIGTERM is for training, which unblocks it once it can save on it (launcher/train/stop.py), and torchrun
  waits for it. This process keeps it blocked too and waits for torchrun: a preemption's grace time is for saving;
- keeps a handle to torchrun (its pid, in a file under TMPDIR named by job and node) for `dump` and `stop`, which
  find the training processes as torchrun's children.

`dump DIR` writes every training process's Python stacks to DIR/NODE-PID.txt: py-spy's (all at once, each at most
30 s, without pausing the process), or faulthandler's in the job's log (SIGUSR2) where there is no py-spy. `stop`
ends the training processes (SIGKILL); torchrun and the step then end by themselves.

Standard library and the node helpers only: it runs in whatever Python the job has, before anything heavy.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from launcher import protocol as P
from launcher.node import job as jobs
from launcher.node import nodecheck
from launcher.node.job import Job

DUMP_S, DUMP_KILL_S = 30, 5  # a stack dump's time, then its SIGTERM; SIGKILL this long after
MONITOR_EVERY_S = 15  # nvidia-smi dmon's sampling period
USAGE = "usage: python -m launcher.node.step JOB run HOST:PORT NODES | JOB dump DIR | JOB stop"


def environment(job: Job, env: Mapping[str, str], job_id: str, node: str) -> dict[str, str]:
    """Training's environment: the step's own (srun's), the run's bundle (whose files training reads and writes by
    their protocol names), the settings training and its libraries read, --extra_env over them, and --debug's over
    all."""
    out = dict(env)
    out[P.ENV_BUNDLE] = str(job.bundle)
    out[P.ENV_NODE_TAG] = f"{job_id}:{node}"  # training's node, as Slurm names it
    if job.signal_grace:  # seconds a time-limit save has (training warns where its saves take longer)
        out[P.ENV_SIGNAL_GRACE] = str(job.signal_grace)
    out.update(TMPDIR=str(job.tmp_dir), CUDA_DEVICE_MAX_CONNECTIONS="1", PYTHONUNBUFFERED="1", PYTHONFAULTHANDLER="1")
    out.setdefault("NCCL_DEBUG", "WARN")
    if "OMP_NUM_THREADS" not in out:  # the node's CPUs shared by its training processes
        cpus = int(env.get("SLURM_CPUS_PER_TASK") or 1)
        out["OMP_NUM_THREADS"] = str(max(cpus // max(job.gpus_per_node, 1), 1))
    if job.wandb_disabled:
        out["WANDB_MODE"] = "disabled"
    out.update(job.extra_env)
    if job.debug:  # what NCCL, torch.distributed and CUDA say about themselves
        out.update(NCCL_DEBUG="INFO", NCCL_DEBUG_SUBSYS="INIT,NET", CUDA_LAUNCH_BLOCKING="1",
                   TORCH_SHOW_CPP_STACKTRACES="1", TORCH_DISTRIBUTED_DEBUG="INFO")  # fmt: skip
        if shutil.which("addr2line", path=out.get("PATH")) is None:  # torch's C++ stacks stall minutes without it
            out["TORCH_DISABLE_ADDR2LINE"] = "1"
        if shutil.which("nvidia-smi", path=out.get("PATH")) is not None:  # (DETAIL crashes DDP on CPU with gloo)
            out["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL"
    return out


def torchrun_argv(job: Job, job_id: str, rdzv: str, node_rank: int | None) -> list[str]:
    """torchrun's command: the layout's nodes and processes, the rendezvous, the training script and its config.

    c10d (`--rdzv_backend`; docs/running.md): the agent on the first node hosts its store at the job's port, the
    others join it there, the node ranks are the order they joined in. static (auto beyond the nodes c10d's
    keep-alive serves): this node's rank is its place in the job's node list, and each agent joins the store once,
    where c10d would have every agent re-read and compare-and-set one state of ~125 bytes a node every second."""
    argv = [str(job.python), "-m", "torch.distributed.run", f"--nnodes={job.nodes}",
            f"--nproc_per_node={job.gpus_per_node}"]  # fmt: skip
    if node_rank is None:
        argv += ["--rdzv_backend=c10d", f"--rdzv_endpoint={rdzv}", f"--rdzv_id={job_id}"]
    else:
        head, port = rdzv.rsplit(":", 1)
        argv += [f"--node_rank={node_rank}", f"--master_addr={head}", f"--master_port={port}"]
    argv += ["--max_restarts=0", str(job.train_script), "--config-file", str(job.config), "--engine", job.engine]
    return argv + ["--compile_layers"] * job.compile_layers


def node_check_argv(job: Job, rdzv: str, nodes: Sequence[str], node: str) -> list[str]:
    """The node check's arguments (`python -m launcher.node.nodecheck`'s): what the run writes and reads."""
    head, port = rdzv.rsplit(":", 1)
    argv = ["--head", head, "--port", port, "--nodes", ",".join(nodes), "--node", node, "--gpus",
            str(job.gpus_per_node), "--report", str(job.file(P.NODE_CHECK_REPORT)), "--modules", ",".join(job.modules),
            "--timeout", f"{job.node_check_timeout:g}"]  # fmt: skip
    argv += ["--container", job.image] if job.image else []
    for path in (job.checkpoints, job.log_dir, job.bundle):
        argv += ["--writable", str(path)]
    for read in (str(job.config), str(job.train_script), *job.inputs):
        argv += ["--readable", read]
    return argv


def handle(job: Job, job_id: str, node: str) -> Path:
    """Where this node's step keeps its handle to torchrun, for `dump` and `stop` on the same node."""
    return job.tmp_dir / f"launcher-step-{job_id}-{node}.json"


def trace(job: Job, argv: Sequence[str]) -> None:
    """--debug: each command the step runs, before it runs (as `set -x` prints it)."""
    if job.debug:
        print("+ " + shlex.join(argv), file=sys.stderr, flush=True)


def start_monitor(job: Job, job_id: str, node: str) -> subprocess.Popen[bytes] | None:
    """`nvidia-smi dmon` on the node's first task where nvidia-smi exists: one file per attempt on this node
    (gpu-JOB-NODE.log, then .log.2, .log.3, ...), so that no attempt's samples are lost."""
    smi = shutil.which("nvidia-smi")
    if smi is None or os.environ.get("SLURM_LOCALID", "0") != "0":
        return None
    log, n = job.log_dir / f"gpu-{job_id}-{node}.log", 1
    while log.exists():
        n += 1
        log = job.log_dir / f"gpu-{job_id}-{node}.log.{n}"
    argv = [smi, "dmon", "-d", str(MONITOR_EVERY_S), "-s", "pumt", "-o", "DT", "-f", str(log)]
    trace(job, argv)
    return subprocess.Popen(argv, stdin=subprocess.DEVNULL)


def end(proc: subprocess.Popen[bytes] | None, wait_s: float = 5) -> None:
    """A process this one started, ended: SIGTERM, then SIGKILL after `wait_s` s (nothing where it has ended)."""
    if proc is not None and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def raise_open_files() -> None:
    """Slurm passes the submitting shell's soft open-file limit (often 1024); torchrun's store on the first node holds
    about (GPUs + 1) x nodes connections: the soft limit goes up to the hard one (the node check says if that is
    short)."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ImportError, ValueError, OSError):
        pass


def run(job: Job, job_id: str, node: str, rdzv: str, nodes: list[str]) -> int:
    """The node check, the GPU monitor, torchrun to its end: the step's exit status."""
    raise_open_files()
    if job.node_check:
        argv = node_check_argv(job, rdzv, nodes, node)
        trace(job, [str(job.python), "-m", nodecheck.__name__, *argv])
        code = nodecheck.main(argv)
        if code == nodecheck.PORT_TAKEN:
            job.file(P.PORT_TAKEN_FILE).touch()  # the supervisor tries another port
            return code
        if code != 0:
            return nodecheck.FAILED
    node_rank = None
    if job.rdzv_backend == "static":
        if node not in nodes:
            print(P.line("no_rank", node=node, nodes=",".join(nodes)[:200]), file=sys.stderr, flush=True)
            return 1
        node_rank = nodes.index(node)  # the first node, where the store listens, is 0
    monitor = start_monitor(job, job_id, node)
    argv = torchrun_argv(job, job_id, rdzv, node_rank)
    trace(job, argv)
    kept = handle(job, job_id, node)
    # From here SIGTERM is blocked in this process and, through fork and exec, in torchrun and training: training
    # unblocks it once it can save (StopRequest); torchrun and this process wait for training to end.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    try:
        torchrun = subprocess.Popen(argv, env=environment(job, os.environ, job_id, node))
        write_handle(kept, torchrun.pid)
        code = torchrun.wait()
    finally:
        kept.unlink(missing_ok=True)
        end(monitor)
    return 128 - code if code < 0 else code


def write_handle(path: Path, torchrun: int) -> None:
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"torchrun": torchrun, "step": os.getpid()}) + "\n", encoding="utf-8")
    tmp.replace(path)


def children(pid: int) -> list[int]:
    """The processes `pid` started, by the kernel's list of each of its threads' children."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found += [int(c) for c in (task / "children").read_text().split()]
        except (OSError, ValueError):
            continue
    return sorted(set(found))


def training_pids(job: Job, job_id: str, node: str) -> list[int]:
    """This node's training processes: the children of the torchrun its step started (none where no torchrun runs:
    before it starts, or after it ended)."""
    try:
        torchrun = int(json.loads(handle(job, job_id, node).read_text(encoding="utf-8"))["torchrun"])
        cmdline = Path(f"/proc/{torchrun}/cmdline").read_bytes().split(b"\0")
    except (OSError, ValueError, KeyError, TypeError):
        return []
    if b"torch.distributed.run" not in cmdline:  # the handle outlived its torchrun, and the pid is another's now
        return []
    return children(torchrun)


def py_spy(job: Job) -> str | None:
    """py-spy where the job's environment has it (beside the job's Python), else on PATH."""
    beside = job.python.parent / "py-spy"
    return str(beside) if os.access(beside, os.X_OK) else shutil.which("py-spy")


def dump(job: Job, job_id: str, node: str, folder: Path) -> int:
    """Every training process's stacks, all at once, each dump at most DUMP_S s and without pausing the process
    (--nonblocking): a process stuck in the kernel (D state) holds up neither the others nor the job."""
    spy = py_spy(job)
    dumps: list[tuple[int, subprocess.Popen[bytes]]] = []
    for pid in training_pids(job, job_id, node):
        out = folder / f"{node}-{pid}.txt"
        if spy is None:
            _usr2(pid)  # faulthandler writes every thread's stack to the job's log
            out.write_text(f"py-spy not found: the stacks of process {pid} are in the job's log (faulthandler)\n")
            continue
        with open(out, "wb") as f:
            argv = [spy, "dump", "--nonblocking", "--pid", str(pid)]
            trace(job, argv)
            dumps.append((pid, subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT)))
    deadline = time.monotonic() + DUMP_S
    for pid, proc in dumps:
        try:
            code = proc.wait(timeout=max(deadline - time.monotonic(), 0))
        except subprocess.TimeoutExpired:
            end(proc, DUMP_KILL_S)
            code = 1
        if code != 0:
            _usr2(pid)
    return 0


def _usr2(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGUSR2)
    except OSError:
        pass


def stop(job: Job, job_id: str, node: str) -> int:
    """The training processes ended at once (a hang's end, once their stacks are dumped)."""
    for pid in training_pids(job, job_id, node):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) < 2 or (args[1], len(args)) not in (("run", 4), ("dump", 3), ("stop", 2)):
        print(USAGE, file=sys.stderr)
        return 1
    try:
        job = jobs.load(args[0])
    except jobs.JobFileError as e:  # the bundle's file, damaged or of another release: said, not a traceback
        print(f"the node step cannot read the job's settings: {e}", file=sys.stderr)
        return 1
    job_id, node = os.environ.get("SLURM_JOB_ID", ""), os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    if args[1] == "run":
        return run(job, job_id, node, args[2], [n for n in args[3].split(",") if n])
    if args[1] == "dump":
        return dump(job, job_id, node, Path(args[2]))
    return stop(job, job_id, node)


if __name__ == "__main__":
    sys.exit(main())
