"""The hang watchdog (launcher/node/watchdog.py): its limits (a start-up grace before an attempt's first step,
apart from the limit between steps), a hang caught and named, and the verdict (--suspects) on thousands of
synthetic py-spy dumps: the node whose processes differ from the great majority, not every node whose stacks lack
a collective's name."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from synthetic_stacks import IN_COLLECTIVE, IN_DDP_BACKWARD, node_name, write_dumps

from launcher.node import watchdog


def test_the_odd_node_out_of_2000_processes_waiting_host_side(tmp_path: Path):
    # 250 nodes x 8: every rank waits on the host side of an async collective (no collective's name in its stack),
    # node 17 reads data. The rule "no collective keyword" made all 250 nodes suspects.
    write_dumps(tmp_path, nodes=250, per_node=8, stuck={17})
    assert watchdog.suspects(tmp_path, max_suspects=5) == ([node_name(17)], "")


def test_pipeline_stages_are_not_suspects(tmp_path: Path):
    write_dumps(tmp_path, nodes=120, per_node=4, stuck={3}, stages=4)  # four groups of ~30 nodes, all normal
    assert watchdog.suspects(tmp_path, max_suspects=5)[0] == [node_name(3)]


def test_too_many_differing_nodes_point_at_no_one(tmp_path: Path):
    write_dumps(tmp_path, nodes=200, per_node=2, stuck={1, 2, 3, 4, 5, 6, 7})
    assert watchdog.suspects(tmp_path, max_suspects=0)[0] == [node_name(i) for i in range(1, 8)]
    found, why = watchdog.suspects(tmp_path, max_suspects=4)
    assert found == [] and why == "7 nodes' stacks differ from the others': more than 4, so no one node"


def test_a_few_processes_the_one_outside_a_collective(tmp_path: Path):
    # one node, two ranks (the end-to-end test's hang): no group is a minority of ten; the rank outside any
    # collective, while the other waits in one, is the one
    write_dumps(tmp_path, nodes=2, per_node=1, stuck={1}, majority=IN_COLLECTIVE)
    assert watchdog.suspects(tmp_path, max_suspects=1) == ([node_name(1)], "")
    (tmp_path / "ddp").mkdir()  # the other waits for DDP's gradient all-reduce, inside autograd's backward
    write_dumps(tmp_path / "ddp", nodes=2, per_node=1, stuck={0}, majority=IN_DDP_BACKWARD)
    assert watchdog.suspects(tmp_path / "ddp", max_suspects=1) == ([node_name(0)], "")
    (tmp_path / "all").mkdir()
    write_dumps(tmp_path / "all", nodes=3, per_node=2, stuck=set())
    assert watchdog.suspects(tmp_path / "all") == ([], "no node's processes stand out (1 kinds of stacks, none rare)")


def test_the_script_prints_suspects_and_says_why_there_are_none(tmp_path: Path):
    write_dumps(tmp_path, nodes=40, per_node=2, stuck=set(range(20)), majority=IN_COLLECTIVE)
    out = subprocess.run([sys.executable, "-m", watchdog.__name__, "--suspects", str(tmp_path), "--max-suspects", "1"],
                         capture_output=True, text=True, timeout=60, env=HELPER_ENV)  # fmt: skip
    assert out.returncode == 0 and out.stdout.strip() == ""
    assert "no suspected node: 20 nodes' stacks differ from the others': more than 1" in out.stderr


HELPER_ENV = {**os.environ, "PYTHONPATH": str(Path(watchdog.__file__).parents[2])}  # as the supervisor runs it


def test_the_limits_a_start_up_grace_apart_from_the_one_between_steps():
    assert watchdog.limit([], "starting", factor=10, floor=20, startup=300) == 300  # start-up, data, compiling
    assert watchdog.limit([], "starting", factor=10, floor=20) == 20  # no grace given: the floor, as before
    assert watchdog.limit([0.5], "saving", factor=10, floor=20, startup=300) == 20
    assert watchdog.limit([], "step", factor=10, floor=20, startup=300) == 20  # after the first step, before a second
    assert watchdog.limit([0.5, 0.7, 0.6], "step", factor=10, floor=20, startup=300) == 20  # max(6 s, min(60, 20))
    assert watchdog.limit([9.0], "step", factor=10, floor=1800, startup=300) == 90


def watched(tmp_path: Path, startup: str, steps: list[int], first: float) -> tuple[str, float, int]:
    """The watchdog as the supervisor runs it, on a progress file written `steps` (the first after `first`
    seconds, the others 0.1 s apart) then silent: what it wrote to the hung file, when (seconds after the last
    step), and how the process it notified ended."""
    progress, hung = tmp_path / "progress", tmp_path / "hung"
    notified = subprocess.Popen(["sleep", "60"])
    argv = [
        sys.executable,
        "-m",
        watchdog.__name__,
        "--progress",
        str(progress),
        "--hung-file",
        str(hung),
        "--notify",
        str(notified.pid),
        "--factor",
        "10",
        "--floor",
        "2",
        "--startup",
        startup,
        "--poll",
        "0.1",
    ]
    dog = subprocess.Popen(argv, env=HELPER_ENV)  # fmt: skip
    try:
        for step in steps:
            time.sleep(first if step == steps[0] else 0.1)
            progress.write_text(f"{step} {time.time():.3f} step\n")
        silent = time.monotonic()
        assert dog.wait(timeout=60) == 0
        return hung.read_text(), time.monotonic() - silent, notified.wait(timeout=10)
    finally:
        for process in (dog, notified):
            process.kill()


def test_a_slow_start_is_no_hang_and_a_hang_between_steps_is_caught_at_its_limit(tmp_path: Path):
    # 3 s to the first step (a loaded machine's start-up) would be a hang under the 2 s floor; under a 6 s grace it is
    # none, and once steps have come, 2 s without one are one
    text, after, ended = watched(tmp_path, startup="6", steps=[1, 2, 3], first=3.0)
    step, idle, allowed = text.split()
    assert (step, allowed) == ("3", "2") and 2 <= float(idle) < 4 and after < 4
    assert ended == -signal.SIGUSR2  # the supervisor's cue
    (tmp_path / "progress").unlink()
    text, after, _ = watched(tmp_path, startup="3", steps=[], first=0)  # no first step at all: the grace, then
    assert text.split()[::2] == ["0", "3"] and 3 <= after < 6


def test_a_watchdog_whose_supervisor_is_gone_ends(tmp_path: Path):
    """A supervisor killed with SIGKILL (its node's memory, a fault) leaves no watchdog behind, polling a dead job."""
    supervisor = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    argv = [sys.executable, "-m", "launcher.node.watchdog", "--progress", str(tmp_path / "progress"), "--hung-file",
            str(tmp_path / "hung"), "--notify", str(supervisor.pid), "--floor", "600", "--poll", "0.2"]  # fmt: skip
    dog = subprocess.Popen(argv, env=HELPER_ENV)
    try:
        time.sleep(1)
        assert dog.poll() is None  # its supervisor lives: it watches
        supervisor.kill()
        supervisor.wait()
        assert dog.wait(timeout=10) == 1 and not (tmp_path / "hung").exists()
    finally:
        dog.kill()
        supervisor.kill()
