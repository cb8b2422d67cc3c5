"""Retention on the launcher's side (docs/checkpoints.md): --keep_last and --keep_every checked with every other
problem, the forecast of the run's peak on disk against the free space (named with its figures and the rules that
would fit), the summary's line, and the rules as the job's settings (job.json) hand them to its supervisor."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from launcher_helpers import all_problems, fixed_paths, run_launcher, spec_for

from launcher import checkpoint_layout as ckpt
from launcher import protocol as P
from launcher.bundle import render, storage
from launcher.bundle.records import checkpoint_totals
from launcher.ledger import breakdown
from launcher.node import job
from launcher.perf import sizes
from launcher.report import summary
from launcher.retention.rules import Rules, most_kept

TINY = ("--dataset", "none", "--warmup_steps", "10", "--train_steps", "200", "--save_interval", "10")


def problems_of(*flags: str) -> list:
    spec, problems = spec_for(*TINY, *flags)
    return [p for p in all_problems(spec, problems) if p.flag in ("keep_last", "keep_every", "checkpoints_path")]


def test_bad_rules_are_named_all_at_once_with_their_fixes():
    keep_last, keep_every = problems_of("--keep_last", "0", "--keep_every", "55")
    assert keep_last.flag == "keep_last" and "would keep no checkpoint to resume from" in keep_last.message
    assert "--keep_last 1 or more" in keep_last.fix
    assert keep_every.message == "--keep_every 55 is not a multiple of --save_interval 10: the steps it would keep " \
                                 "are not all saved"  # fmt: skip
    assert keep_every.fix == "use --keep_every 50 or 60 (multiples of --save_interval)"
    (negative,) = problems_of("--keep_every", "-5")
    assert negative.message == "must be positive, got -5" and "--keep_every 100" in negative.fix
    assert problems_of("--keep_last", "1", "--keep_every", "50") == []
    assert problems_of("--keep_every", "5")[0].fix == "use --keep_every 10 (multiples of --save_interval)"


def free_space(monkeypatch: pytest.MonkeyPatch, free: int) -> None:
    monkeypatch.setattr(storage.shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(0, 0, free))


def test_the_forecast_refuses_a_peak_the_disk_cannot_hold_and_names_rules_that_fit(monkeypatch, tmp_path: Path):
    spec, _ = spec_for(*TINY, "--keep_last", "2", "--keep_every", "50", cwd=tmp_path)
    disk = sizes.disk(spec)
    assert (disk.most, disk.saves, disk.each) == (6, 20, sizes.parameters(spec) * 14)
    free_space(monkeypatch, disk.each * 4 + 1)  # room for 4 at once, not 6
    (problem,) = problems_of_spec(spec)
    assert problem.flag == "keep_last"
    assert problem.message == (
        "the run keeps up to 6 checkpoints at once (the last 2 and every step that is a multiple of 50, one being "
        f"written) of ~59.1 MB each: 354 MB at its peak, more than the 236 MB free where {tmp_path}/checkpoints lies"
    )
    assert (
        problem.fix == "keep fewer (--keep_every 90 fits), or give a --checkpoints_path with 354 MB free, or make room"
    )
    assert most_kept(Rules(2, 90), 200, 10) == 4 < most_kept(Rules(2, 80), 200, 10)  # type: ignore[operator]  # the least that fits
    free_space(monkeypatch, disk.peak)
    assert problems_of_spec(spec) == []


def test_a_run_that_removes_nothing_is_told_in_the_summary_not_refused(monkeypatch, tmp_path: Path):
    """Every save kept (no rule) and more than the disk holds: as before retention, a note with a rule that fits."""
    spec, _ = spec_for(*TINY, cwd=tmp_path)
    found = sizes.disk(spec)
    assert (found.most, found.saves) == (20, 20)
    free_space(monkeypatch, found.each * 7)
    assert problems_of_spec(spec) == []
    note = summary._checkpoint_note(spec, sizes.derived(spec))
    assert note == ("~59.1 MB each, 20 over the run, all kept: 1.18 GB at the end; 413 MB free: not enough for all "
                    "20: --keep_last 6 fits (older ones are then removed), or make room")  # fmt: skip
    assert most_kept(Rules(6, None), 200, 10) == 7


def problems_of_spec(spec) -> list:  # type: ignore[no-untyped-def]
    return [p for p in all_problems(spec, []) if p.flag in ("keep_last", "keep_every", "checkpoints_path")]


def test_the_forecast_on_this_machines_disk_refuses_with_its_figures(tmp_path: Path):
    """The 1b preset (~17.3 GB a checkpoint) kept every 10 steps, for more steps than the disk here holds."""
    free = shutil.disk_usage(tmp_path).free
    each = 1_235_814_400 * 14  # the 1b preset's parameters x nanotron's bytes a parameter
    steps = 10 * (free // each + 3)
    out = run_launcher("--run_name", "big", "--model_size", "1b", "--nodes", "1", "--dataset", "none",
                       "--train_steps", str(steps), "--save_interval", "10", "--keep_last", "1", "--keep_every", "10",
                       "--warmup_steps", "1", "--dry_run", cwd=tmp_path)  # fmt: skip
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    said = next(line for line in out.stderr.splitlines() if "--keep_last:" in line)
    assert re.search(r"keeps up to \d+ checkpoints at once .* of ~17\.3 GB each: [\d.]+ [GT]B at its peak, more than "
                     r"the [\d.]+ [GT]B free where", said), said  # fmt: skip
    assert not (tmp_path / "logs").exists()  # nothing written


def test_the_summary_says_the_peak_and_the_script_hands_the_rules_to_the_supervisor(tmp_path: Path):
    out = run_launcher("--run_name", "r", *TINY, "--keep_last", "2", "--keep_every", "50", "--dry_run", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    line = next(x for x in out.stdout.splitlines() if x.strip().startswith("checkpoints"))
    assert "20 over the run, at most 6 at once (the last 2 and every step that is a multiple of 50, one being " \
           "written): 354 MB at the peak;" in line  # fmt: skip
    (bundle,) = (tmp_path / "logs/configs/r").iterdir()
    settings = job.load(bundle)
    assert settings.retention == Rules(2, 50) and settings.train_steps == 200
    assert settings.file(P.CHECKPOINTS_RECORD) == bundle / P.CHECKPOINTS_RECORD
    assert settings.checkpoints == tmp_path / "checkpoints" / "r"


def test_without_rules_the_job_keeps_every_checkpoint(tmp_path: Path):
    spec, _ = spec_for(*TINY)
    assert not render.job_settings(spec, fixed_paths("t")).retention.active
    spec, _ = spec_for(*TINY, "--keep_last", "3")
    assert render.job_settings(spec, fixed_paths("t")).retention.keep_last == 3


def test_a_weird_bundle_path_reaches_the_supervisor_as_it_is(tmp_path: Path):
    weird = tmp_path / "a'; echo $HOME `x` b"
    spec, _ = spec_for(*TINY, "--keep_last", "3")
    settings = job.from_json(render.job_settings(spec, fixed_paths("t", weird)).to_json())
    assert settings.file(P.CHECKPOINTS_RECORD) == weird / "logs/configs/t/20260101-000000" / P.CHECKPOINTS_RECORD


def test_the_summary_names_steps_this_launcher_did_not_save(tmp_path: Path):
    root = tmp_path / "checkpoints" / "r"
    for step in (100, 200):
        (root / str(step)).mkdir(parents=True)
        (root / str(step) / ckpt.TORCH_STATE).write_text("x")
        (root / str(step) / ckpt.TORCH_META).write_text("{}")
    out = run_launcher("--run_name", "r", *TINY, "--keep_last", "2", "--dry_run", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "leaves alone 2 steps this launcher did not save (100, 200)" in out.stdout


def test_the_ledger_counts_the_bytes_the_record_says_written_and_freed(tmp_path: Path):
    record = tmp_path / P.CHECKPOINTS_RECORD
    assert checkpoint_totals(record) is None  # no rules, no record: nothing said
    rows = [
        {"event": "found", "steps": [5]},
        {"event": "saved", "step": 10, "bytes": 2_000_000},
        {"event": "saved", "step": 20, "bytes": 3_000_000},
        {"event": "purge", "removed": [{"step": 10, "bytes": 2_000_000}], "leftovers": [], "freed": 2_500_000},
    ]
    record.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"event": "sav')  # a line cut by a kill
    totals = checkpoint_totals(record)
    assert totals == {"saved": 2, "written_bytes": 5_000_000, "removed": 1, "freed_bytes": 2_500_000, "purges": 1}
    ledger = breakdown.Ledger("job records", [], checkpoints=totals)
    assert ledger.record()["checkpoints"] == totals
    assert breakdown.summary(ledger).endswith("; checkpoints: 2 saved (5.0 MB), 1 removed (2.5 MB freed)")
    assert "checkpoints" not in breakdown.Ledger("job records", []).record()


def test_the_checkpoints_command_says_why_each_step_stays_and_what_was_removed(tmp_path: Path):
    out = run_launcher("--run_name", "r", *TINY, "--keep_last", "2", "--keep_every", "50", "--dry_run", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    (bundle,) = (tmp_path / "logs/configs/r").iterdir()
    root = tmp_path / "checkpoints/r"
    for step in (50, 100, 110, 120, 130):
        (root / str(step)).mkdir(parents=True)
        (root / str(step) / ckpt.TORCH_STATE).write_bytes(b"x" * 1000)
        (root / str(step) / ckpt.TORCH_META).write_text("{}")
        ckpt.note_save(root, step)
    (root / P.TORCH_POINTER).write_text("130\n")
    (root / ".tmp-140-abcd").mkdir()
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    lease = ckpt.take_lease(root, 110, "export", env={})
    lease.path.write_text(lease.path.read_text().replace(f'"pid": {lease.pid}', f'"pid": {gone.stdout.strip()}'))
    row = {"event": "purge", "removed": [{"step": 40, "bytes": 1000, "why": "not among the last 2, not a multiple "
           "of 50"}], "leftovers": [], "freed": 1000, "time": 0, "job": "7"}  # fmt: skip
    (bundle / P.CHECKPOINTS_RECORD).write_text(json.dumps(row) + "\n")
    shown = subprocess.run([sys.executable, "-m", "launcher.jobs", "checkpoints", str(bundle)], cwd=tmp_path,
                           capture_output=True, text=True, env=environment_here())  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0] == f"Checkpoints of run r in {root}: it keeps the last 2 and every step that is a multiple of 50"
    assert re.match(r"\s+50\s+1\.\d+ KB\s+complete\s+a multiple of 50 \(--keep_every\)$", lines[1]), lines[1]
    assert lines[3].split()[:3] == ["110", "1.00", "KB"]  # its reader is gone: its lease holds it no more
    assert "removed at the next purge: not among the last 2" in lines[3]
    assert "among the last 2; removed after 1 more checkpoint" in lines[4]
    assert "latest (the pointer names it); among the last 2" in lines[5]
    assert "partial (.tmp-140-abcd)" in lines[6] and "being written" in lines[6]
    assert "job 7 removed 40 (1.00 KB): not among the last 2, not a multiple of 50" in shown.stdout
    assert ckpt.leases(root) != []  # it judges, and removes nothing: not even a gone reader's lease
    assert set(ckpt.complete_steps(root)) == {50, 100, 110, 120, 130}


def environment_here() -> dict[str, str]:
    import os

    return {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
