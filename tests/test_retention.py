"""Checkpoint retention as pure logic and as the purge on a real folder (launcher/node/retention.py, purge.py;
docs/checkpoints.md): what stays and why, what goes, what is never removed, the forecast's count, the records. The
real job on the local cluster: tests/test_retention_slurm.py."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from launcher import atomic, jsonl
from launcher import checkpoint_layout as ckpt
from launcher import protocol as P
from launcher.node.job import Job, from_json
from launcher.node.supervisor.attempt import Attempt
from launcher.node.supervisor.effects import Node
from launcher.node.supervisor.followers import LOOK_EVERY_S, AfterCheckpoints
from launcher.node.supervisor.records import take_lock
from launcher.node.supervisor.state import Allocation
from launcher.retention import purge as purging
from launcher.retention.rules import Rules, judge, most_kept

ROOT = Path(__file__).resolve().parent.parent

DONE_WHEN = Rules(keep_last=2, keep_every=50)


class Judged(purging.Unasked):
    """Retention's effects in a test: Slurm's word on each job from `alive` (False where it names none), the lines
    kept in `said`."""

    def __init__(self, alive: dict[str, bool], said: list | None = None) -> None:
        self.alive, self.said = alive, said if said is not None else []

    def say(self, name: str, **fields: object) -> None:
        self.said.append((name, fields))

    def jobs_alive(self, jobs):
        return {j: self.alive.get(j, False) for j in jobs}


def torch_step(root: Path, step: int, size: int = 10) -> Path:
    folder = root / str(step)
    folder.mkdir(parents=True)
    (folder / ckpt.TORCH_STATE).write_bytes(b"x" * size)
    (folder / ckpt.TORCH_META).write_text("{}")
    return folder


def nanotron_step(root: Path, step: int, complete: bool = True) -> Path:
    folder = root / str(step)
    (folder / "model" / "layer").mkdir(parents=True)
    (folder / "model" / "layer" / "weight.safetensors").write_bytes(b"w" * 100)
    if complete:
        (folder / P.NANOTRON_METADATA).write_text('{"version": "1.5"}')
    return folder


def saved(root: Path, *steps: int, pointer: str = P.TORCH_POINTER) -> None:
    """The launcher's saves record for `steps`, and the pointer at the last."""
    for step in steps:
        ckpt.note_save(root, step)
    (root / pointer).write_text(f"{steps[-1]}\n")


def run_of(root: Path, steps: range, rules: Rules) -> set[int]:
    """What stays after saving `steps` one by one, a purge after each (the supervisor's order)."""
    for step in steps:
        ckpt.note_save(root, step)
        torch_step(root, step)
        (root / P.TORCH_POINTER).write_text(f"{step}\n")
        purging.purge(root, rules, "")
    return set(ckpt.complete_steps(root))


def on_disk(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir())


def test_the_issues_run_keeps_50_100_150_190_and_200(tmp_path: Path):
    assert run_of(tmp_path, range(10, 201, 10), DONE_WHEN) == {50, 100, 150, 190, 200}


def test_the_plan_says_why_each_step_stays_and_why_the_others_go(tmp_path: Path):
    for step in range(10, 201, 10):
        torch_step(tmp_path, step)
    saved(tmp_path, *range(10, 201, 10))
    plan = judge(ckpt.look(tmp_path), DONE_WHEN, {})
    by_step = {j.step: j for j in plan.steps}
    assert [j.step for j in plan.removed] == [s for s in range(10, 201, 10) if s not in (50, 100, 150, 190, 200)]
    assert by_step[40].remove == "not among the last 2, not a multiple of 50"
    assert by_step[200].kept == ("latest (the pointer names it)", "among the last 2", "a multiple of 50 (--keep_every)")
    assert by_step[190].kept == ("among the last 2",) and by_step[190].later == "removed after 1 more checkpoint"
    assert by_step[150].later == ""  # kept for good


def test_the_pointers_step_and_the_newest_complete_one_are_never_removed(tmp_path: Path):
    """A save between its last file and the pointer's move: the newest complete step is not the pointer's."""
    for step in (10, 20, 30):
        torch_step(tmp_path, step)
    saved(tmp_path, 10, 20, 30)
    (tmp_path / P.TORCH_POINTER).write_text("10\n")  # the pointer lags: 20 and 30 completed after it
    plan = judge(ckpt.look(tmp_path), Rules(keep_last=1), {})
    assert [j.step for j in plan.removed] == [20]
    kept = {j.step: j.kept for j in plan.steps if j.kept}
    assert kept == {10: ("latest (the pointer names it)",), 30: ("the newest complete step", "among the last 1")}


def test_a_save_in_progress_stays_and_one_cut_short_goes_once_a_newer_step_is_complete(tmp_path: Path):
    for step in (10, 20):
        torch_step(tmp_path, step)
    saved(tmp_path, 10, 20, 30)
    (tmp_path / ".tmp-30-abcd").mkdir()  # the torch engine's save of 30, in progress
    nanotron_step(tmp_path, 15, complete=False)  # cut short before 20 was saved
    (tmp_path / P.TORCH_POINTER).write_text("20\n")
    ckpt.note_save(tmp_path, 15)
    plan = judge(ckpt.look(tmp_path), Rules(keep_last=5), {})
    assert [(j.step, j.complete) for j in plan.removed] == [(15, False)]
    writing = next(j for j in plan.steps if j.step == 30)
    assert not writing.remove and writing.kept[0].startswith("being written")
    purging.purge(tmp_path, Rules(keep_last=5), "")
    assert ".tmp-30-abcd" in on_disk(tmp_path) and "15" not in on_disk(tmp_path)


def test_a_partial_step_newer_than_the_pointer_stays(tmp_path: Path):
    """nanotron's <step>/ without its metadata, past the pointer: a save in progress, whatever else is complete."""
    for step in (10, 30):
        nanotron_step(tmp_path, step)
    nanotron_step(tmp_path, 20, complete=False)
    saved(tmp_path, 10, 20, 30, pointer=P.NANOTRON_POINTER)
    (tmp_path / P.NANOTRON_POINTER).write_text("10")
    assert judge(ckpt.look(tmp_path), Rules(keep_last=1), {}).removed == []


def test_steps_the_launcher_did_not_save_are_left_alone(tmp_path: Path):
    for step in (100, 200, 300):
        nanotron_step(tmp_path, step)  # from a run elsewhere: no saves record
    for step in (310, 320, 330):
        nanotron_step(tmp_path, step)
    saved(tmp_path, 310, 320, 330, pointer=P.NANOTRON_POINTER)
    assert [j.step for j in judge(ckpt.look(tmp_path), Rules(keep_last=1), {}).removed] == [310, 320]
    folder = judge(ckpt.look(tmp_path), Rules(keep_last=1), {})
    assert "left alone" in next(j for j in folder.steps if j.step == 100).kept[0]


def test_without_rules_nothing_is_removed(tmp_path: Path):
    for step in (10, 20, 30):
        torch_step(tmp_path, step)
    saved(tmp_path, 10, 20, 30)
    (tmp_path / ".tmp-5-dead").mkdir()
    assert not Rules().active and judge(ckpt.look(tmp_path), Rules(), {}).removed == []
    assert run_of(tmp_path / "again", range(10, 60, 10), Rules()) == {10, 20, 30, 40, 50}


def test_a_read_step_stays_while_its_reader_lives_and_goes_once_it_is_gone(tmp_path: Path):
    for step in (10, 20, 30):
        torch_step(tmp_path, step)
    saved(tmp_path, 10, 20, 30)
    alive = {"77": True}
    job_lease = ckpt.take_lease(tmp_path, 10, "export", env={"SLURM_JOB_ID": "77"})
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        pid_lease = json.loads(ckpt.take_lease(tmp_path, 20, "eval", env={}).path.read_text())
        pid_lease.update(pid=proc.pid, started=ckpt._process_start(proc.pid))
        next(p for p in ckpt.leases(tmp_path) if p.step == 20).path.write_text(json.dumps(pid_lease))
        done = purging.purge(tmp_path, Rules(keep_last=1), "", Judged(alive))
        assert done.removed == [] and sorted(done.kept) == [10, 20, 30]
        plan = judge(ckpt.look(tmp_path), Rules(keep_last=1), {10: "export (job 77)"})
        assert next(j for j in plan.steps if j.step == 10).kept == ("read by export (job 77)",)
    finally:
        proc.kill()
        proc.wait()
    alive["77"] = False
    done = purging.purge(tmp_path, Rules(keep_last=1), "", Judged(alive))
    assert [r["step"] for r in done.removed] == [10, 20]
    assert ckpt.leases(tmp_path) == [] and not job_lease.path.exists()  # the stale leases dropped


def test_a_lease_whose_job_slurm_cannot_judge_holds(tmp_path: Path):
    lease = ckpt.take_lease(tmp_path, 10, "export", env={"SLURM_JOB_ID": "5"})
    assert ckpt.lease_holds(lease, lambda job: None)
    assert not ckpt.lease_holds(lease, lambda job: False)
    elsewhere = ckpt.Lease(10, "export", "", "another-host", 1, "", 0.0, lease.path)
    assert not ckpt.lease_holds(elsewhere, lambda job: None, now=ckpt.LEASE_MAX_AGE_S + 1)
    assert ckpt.lease_holds(elsewhere, lambda job: None, now=ckpt.LEASE_MAX_AGE_S - 1)


def test_a_reader_that_comes_as_the_step_is_renamed_out_gets_it_back(tmp_path: Path, monkeypatch):
    for step in (10, 20):
        torch_step(tmp_path, step)
    saved(tmp_path, 10, 20)
    real, taken = atomic.fsync_dir, []

    def lease_comes(directory: Path) -> None:  # the purge's first fsync, after its plan: an eval job takes step 10
        real(directory)
        if not taken:
            taken.append(10)  # once: taking the lease fsyncs a folder too
            ckpt.take_lease(tmp_path, 10, "eval", env={})

    monkeypatch.setattr(atomic, "fsync_dir", lease_comes)
    done = purging.purge(tmp_path, Rules(keep_last=1), "")
    assert taken and done.restored == [10] and done.removed == [] and 10 in ckpt.complete_steps(tmp_path)


def test_a_purge_killed_mid_delete_leaves_no_step_that_looks_complete_and_the_next_purge_ends_it(tmp_path: Path):
    """The kill is real: a child process purges, and SIGKILLs itself once half of step 10's files are gone."""
    step = torch_step(tmp_path, 10)
    for n in range(6):
        (step / f"shard-{n}").write_bytes(b"s" * 1000)
    torch_step(tmp_path, 20)
    saved(tmp_path, 10, 20)
    child = f"""
import os, signal, sys
from pathlib import Path
from launcher.retention import purge
from launcher.retention.rules import Rules

def killed_midway(path):
    for n, f in enumerate(sorted(path.iterdir())):
        if n == 3:
            os.kill(os.getpid(), signal.SIGKILL)
        f.unlink()

purge.remove_tree = killed_midway
purge.purge(Path({str(tmp_path)!r}), Rules(keep_last=1), "")
"""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    assert subprocess.run([sys.executable, "-c", child], env=env).returncode == -9
    left = [p for p in tmp_path.iterdir() if p.name.startswith(P.PURGING)]
    assert len(left) == 1 and len(list(left[0].iterdir())) == 5  # half deleted, out of the steps' names
    assert ckpt.complete_steps(tmp_path) == {20: "torch"} and ckpt.partial_steps(tmp_path) == []
    done = purging.purge(tmp_path, Rules(keep_last=1), "")
    assert [r["path"] for r in done.leftovers] == [left[0].name] and not left[0].exists()


def test_only_the_holder_of_the_runs_lock_purges(tmp_path: Path):
    for step in (10, 20):
        torch_step(tmp_path, step)
    saved(tmp_path, 10, 20)
    (tmp_path / P.LOCK).mkdir()
    (tmp_path / P.LOCK / P.LOCK_HOLDER).write_text("41\n")
    refused = purging.purge(tmp_path, Rules(keep_last=1), "42")
    assert "names job 41, not this job (42)" in refused.refused and set(ckpt.complete_steps(tmp_path)) == {10, 20}
    assert [r["step"] for r in purging.purge(tmp_path, Rules(keep_last=1), "41").removed] == [10]


def simulated_peak(rules: Rules, train_steps: int, interval: int, initial: bool) -> int:
    """The most steps on disk at once in a simulated run (the save being written counted), by `judge` itself."""
    complete: set[int] = set()
    steps = ([0] if initial else []) + list(range(interval, train_steps + 1, interval))
    if train_steps % interval:
        steps.append(train_steps)
    peak = 0
    for step in steps:
        peak = max(peak, len(complete) + 1)  # the new one being written beside those kept
        complete.add(step)
        folder = ckpt.Folder(Path("/x"), dict.fromkeys(complete, "torch"), (), step, frozenset(complete), (), ())
        complete -= {j.step for j in judge(folder, rules, {}).removed}
    return peak


@pytest.mark.parametrize("keep_last", [None, 1, 2, 5, 100])
@pytest.mark.parametrize("keep_every", [None, 10, 30, 50])
@pytest.mark.parametrize(("steps", "interval", "initial"), [(200, 10, False), (205, 10, True), (7, 10, False)])
def test_the_forecasts_count_is_the_most_a_run_keeps_at_once(keep_last, keep_every, steps, interval, initial):
    rules = Rules(keep_last, keep_every)
    if not rules.active:
        assert most_kept(rules, steps, interval, initial) is None
        return
    assert most_kept(rules, steps, interval, initial) == simulated_peak(rules, steps, interval, initial)


def test_the_forecast_counts_a_long_run_at_once():
    # the last 3 saves, the multiples of 1000 among the 2**40 - 4 older ones, one being written: no loop over saves
    assert most_kept(Rules(3, 1000), 1 << 40, 1) == 3 + (2**40 - 4) // 1000 + 1


def test_the_rules_travel_as_json():
    rules = Rules(2, 50)
    assert Rules.from_json(rules.to_json()) == rules and Rules.from_dict(rules.to_dict()) == rules
    assert Rules.from_json("") == Rules() and not Rules.from_json("").active
    assert rules.describe() == "the last 2 and every step that is a multiple of 50"


def test_the_supervisors_polls_record_each_checkpoint_and_each_purge(tmp_path: Path, monkeypatch):
    root, record = tmp_path / "ckpt", tmp_path / P.CHECKPOINTS_RECORD
    torch_step(root, 5)  # there before the run: found, not its bytes
    said: list[tuple[str, dict]] = []
    now = [0.0]
    looks: list[int] = []
    real_look = ckpt.look
    monkeypatch.setattr(ckpt, "look", lambda r: (looks.append(1), real_look(r))[1])
    keeper = purging.Retention(Rules(1, None), root, "", record, Judged({}, said))
    follower = AfterCheckpoints(root, [keeper.on_checkpoint], clock=lambda: now[0])
    follower.poll()  # the attempt's first look, before training saves
    follower.thread.join()  # type: ignore[union-attr]
    for step in (10, 20, 30):
        ckpt.note_save(root, step)
        torch_step(root, step, size=1000)
        (root / P.TORCH_POINTER).write_text(f"{step}\n")
        now[0] += LOOK_EVERY_S
        follower.poll(wait=True)
        follower.poll(wait=True)  # nothing changed: no look
    assert len(looks) == 4
    rows = jsonl.read(record)
    assert [r["event"] for r in rows] == ["found", "saved", "saved", "purge", "saved", "purge"], rows
    assert rows[0]["steps"] == [5] and [r["step"] for r in rows if r["event"] == "saved"] == [10, 20, 30]
    assert rows[1]["bytes"] == 1002 and [r["removed"][0]["step"] for r in rows if r["event"] == "purge"] == [10, 20]
    assert said[-1][0] == "purged" and said[-1][1]["steps"] == "20" and said[-1][1]["kept"] == "5, 30"
    assert set(ckpt.complete_steps(root)) == {5, 30}


def test_the_supervisor_purges_by_its_jobs_rules_between_its_polls_and_by_none_without_them(tmp_path: Path):
    torch_step(tmp_path, 10)
    torch_step(tmp_path, 20)
    saved(tmp_path, 10, 20)

    def attempt(rules: Rules) -> Attempt:
        job = Job("t", tmp_path, tmp_path / "t.out", tmp_path, Path(sys.executable), ROOT, tmp_path / "train.py",
                  tmp_path / "config.yaml", "auto", 1, 1, tmp_path, retention=rules)  # fmt: skip
        return Attempt(from_json(job.to_json()), Allocation("48", 1, "node1", "node1"), Node(out=io.StringIO()))

    assert take_lock(tmp_path, "48", lambda job: "") is None  # the attempt's, as it starts
    attempt(Rules()).handle_pending()  # (starting: no step runs, a purge is done at once)
    assert set(ckpt.complete_steps(tmp_path)) == {10, 20}
    attempt(Rules(keep_last=1)).handle_pending()
    assert set(ckpt.complete_steps(tmp_path)) == {20}


def test_the_resume_points_are_on_disk_before_anything_older_goes(tmp_path: Path, monkeypatch):
    for step in (10, 20, 30):
        nanotron_step(tmp_path, step)  # nanotron fsyncs none of its files
    saved(tmp_path, 10, 20, 30, pointer=P.NANOTRON_POINTER)
    (tmp_path / P.NANOTRON_POINTER).write_text("20")  # 30 complete, the pointer not moved yet
    order: list[str] = []
    real_durable, real_remove = purging.make_durable, purging.remove_tree
    monkeypatch.setattr(purging, "make_durable", lambda p: (order.append(f"sync {p.name}"), real_durable(p)))
    monkeypatch.setattr(purging, "remove_tree", lambda p: (order.append("remove"), real_remove(p)))
    purging.purge(tmp_path, Rules(keep_last=1), "")
    assert sorted(order[:2]) == ["sync 20", "sync 30"] and order[2:] == ["remove"]
    assert set(ckpt.complete_steps(tmp_path)) == {20, 30}
