"""Shared helpers for the launcher's tests (not fixtures: plain functions)."""

from __future__ import annotations

import errno
import fcntl
import os
import random
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import IO

from launcher import protocol as P
from launcher.bundle.files import BundlePaths, paths_for
from launcher.config.cli import parse
from launcher.config.resolve import resolve
from launcher.config.spec import RunSpec
from launcher.config.validate import validate
from launcher.nanotron_config.schema import written
from launcher.perf import fit
from launcher.problems import Problem
from launcher.slurm import checks

ROOT = Path(__file__).resolve().parent.parent
LAUNCHER = ROOT / "slurm_launcher.py"
# Ports the tests' own listeners take: below the kernel's ephemeral range (32768- by default), above the jobs'
# rendezvous window (20000-31999) and the local clusters' daemons (10000-19999): docs/architecture.md#ports.
TEST_PORTS = range(P.RDZV_PORT_LOW + P.RDZV_PORT_SPAN, 32768)
# A port drawn is claimed for the life of the process that drew it: a lock file here, held, that every other process
# drawing (another pytest-xdist worker, another checkout's suite) passes over.
PORT_CLAIMS = Path(tempfile.gettempdir()) / "nanotron-launcher-test-ports"
_CLAIMED: dict[int, IO[str]] = {}


def worker_ports() -> range:
    """This pytest-xdist worker's share of TEST_PORTS: the N-th of PYTEST_XDIST_WORKER_COUNT equal shares for worker
    gwN (all of it without xdist), so that no two workers of a session ever draw the same port."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER"), int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if worker is None or count <= 1:
        return TEST_PORTS
    size = len(TEST_PORTS) // count
    n = int(worker.removeprefix("gw")) % count
    return TEST_PORTS[n * size : (n + 1) * size]


def _claim(port: int) -> bool:
    """Whether this process holds `port`'s claim now (taken here if no other process holds it)."""
    if port in _CLAIMED:
        return True
    PORT_CLAIMS.mkdir(exist_ok=True)
    claim = open(PORT_CLAIMS / str(port), "a", encoding="ascii")  # held open: the claim
    try:
        fcntl.flock(claim, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        claim.close()
        return False
    _CLAIMED[port] = claim
    return True


def _listenable(port: int) -> bool:
    """Whether `port` can be listened on now on every address, IPv4 and IPv6 (torch's store listens on both)."""
    for family, address in ((socket.AF_INET, ""), (socket.AF_INET6, "::")):
        with socket.socket(family) as sock:
            try:
                if family == socket.AF_INET6:
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                sock.bind((address, port))
            except OSError as e:
                if family == socket.AF_INET6 and e.errno == errno.EAFNOSUPPORT:
                    continue  # no IPv6 here
                return False
    return True


def free_port() -> int:
    """A port of this worker's share of TEST_PORTS that this process has claimed and no one holds now: handed to
    a listener of the test's (torchrun's store, a node check) that no other process drawing from here can take
    meanwhile. (A port bound to 0 and let go is the ephemeral range's, which the kernel may hand to any outgoing
    connection before the test listens on it; a port merely found free was once drawn by two workers at once, and
    torchrun, finding it held, waited on the other as a client.)"""
    ports = worker_ports()
    start = random.randrange(len(ports))
    rotated = [ports[(start + k) % len(ports)] for k in range(len(ports))]
    # a port this process has not drawn before first: two draws before either is listened on get two ports
    for port in sorted(rotated, key=lambda port: port in _CLAIMED):
        if _claim(port) and _listenable(port):
            return port
    raise RuntimeError(f"no free port in {ports.start}-{ports.stop - 1}")


def spec_for(*flags: str, cwd: Path | None = None) -> tuple[RunSpec, list]:
    """Resolve flags as the launcher would (run name defaults to "t")."""
    argv = list(flags) if "--run_name" in flags else ["--run_name", "t", *flags]
    args, explicit = parse(argv)
    return resolve(args, explicit, cwd=cwd)


def all_problems(spec: RunSpec, problems: list[Problem]) -> list[Problem]:
    """`problems` (resolution's) and every problem both validation phases find, as a dry run checks them."""
    problems = problems + validate(spec)
    problems += fit.problems(spec, problems)
    return problems + checks.problems(spec, problems, ask_slurm=False)


def config_of(spec: RunSpec, checkpoints: str) -> dict:
    """The nanotron config the launcher writes for `spec`, its checkpoints in `checkpoints`."""
    return written(spec.config, spec.dialect.dialect, checkpoints)


def fixed_paths(run_name: str, root: Path = Path("/project")) -> BundlePaths:
    """Bundle paths as a launch from `root` at a fixed time would get them."""
    return paths_for(
        run_name,
        "20260101-000000",
        root / "logs/configs",
        root / "logs/slurm_scripts",
        root / "logs/slurm_logs",
        root / "checkpoints" / run_name,
    )


def run_launcher(
    *flags: str, cwd: Path, env: dict | None = None, block: tuple[str, ...] = ()
) -> subprocess.CompletedProcess:
    """Run slurm_launcher.py in a subprocess; `block` names modules whose import must fail."""
    code = (
        "import sys, runpy\n"
        f"for name in {list(block)!r}: sys.modules[name] = None\n"
        f"sys.argv = [{str(LAUNCHER)!r}, *{list(flags)!r}]\n"
        f"runpy.run_path({str(LAUNCHER)!r}, run_name='__main__')\n"
    )
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=cwd,
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=120,
    )


TRIAGE_FIXTURES = ROOT / "tests" / "fixtures" / "triage"  # real torchrun logs (see its README)
START = (
    P.line("attempt_started", "14:41:47.512", job=48, attempt=1, when="2026-11-23T14:41:47+00:00", nodes="node[1-2]")
    + "\n"
)
SRUN_KILL = (  # srun --kill-on-bad-exit=1 after one node's torchrun exits 1: it stops the other task
    "srun: error: node2: task 1: Exited with exit code 1\n"
    "srun: Job step aborted: Waiting up to 32 seconds for job step to finish.\n"
    "slurmstepd: error: *** STEP 48.0 ON node1 CANCELLED AT 2026-11-23T14:43:02 ***\n"
    "srun: error: node1: task 0: Exited with exit code 143\n"
)
END = P.line("attempt_ended", "14:43:03.101", job=48, attempt=1, when="2026-11-23T14:43:03+00:00", code=143) + "\n"


def job_log(fixture: str, slurm: str = SRUN_KILL) -> str:
    """A job's log around a recorded torchrun log: the batch script's first line, torchrun, srun, the last line."""
    return START + (TRIAGE_FIXTURES / fixture).read_text() + slurm + END


# run_train.py itself, with what a test asks of it through the job's environment (--extra_env), test-side only:
# SLOW_RANK/SLOW_S: that rank sleeps SLOW_S before each step (a straggler); STEP_S: every rank sleeps STEP_S before
# each step (a run slow enough to outlast Slurm's notice of a dead node), until the file STEP_S_UNTIL is made where it
# is given (the test makes it once the restart is under way: the steps after it go at full speed); CRASH_AT/RAISE_AT:
# rank 1 dies of SIGKILL, or raises, at that step, in every node step (a run that cannot progress); HANG_AT: rank 1
# stops answering at that step, once (the file HANG_ONCE marks it done).
WRAPPED = """
import os, runpy, signal, sys, time
sys.path.insert(0, {root!r})
from launcher.train.torch_engine import engine as torch_engine

step = torch_engine.TorchTrainer.train_step

def wrapped(self, ddp):
    env = os.environ
    if str(self.where.rank) == env.get("SLOW_RANK"):
        time.sleep(float(env["SLOW_S"]))
    if not (env.get("STEP_S_UNTIL") and os.path.exists(env["STEP_S_UNTIL"])):
        time.sleep(float(env.get("STEP_S", "0")))
    if self.where.rank == 1 and str(self.step) == env.get("CRASH_AT"):
        os.kill(os.getpid(), signal.SIGKILL)
    if self.where.rank == 1 and str(self.step) == env.get("RAISE_AT"):
        raise ValueError("bad shard 7 in the data")
    if self.where.rank == 1 and str(self.step) == env.get("HANG_AT") and not os.path.exists(env["HANG_ONCE"]):
        open(env["HANG_ONCE"], "w").close()
        while True:
            time.sleep(1)  # what a hung rank looks like from the outside
    return step(self, ddp)

torch_engine.TorchTrainer.train_step = wrapped
sys.argv[0] = {script!r}
runpy.run_path({script!r}, run_name="__main__")
"""


def wrapped_script(where: Path) -> str:
    """run_train.py wrapped as WRAPPED says, written into `where`: its path."""
    script = where / "wrapped.py"
    script.write_text(WRAPPED.format(root=str(ROOT), script=str(ROOT / "run_train.py")))
    return str(script)
