"""Where a run writes: output directories that cannot be written, and no room for a checkpoint, are problems."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from launcher_helpers import all_problems, run_launcher, spec_for

from launcher.bundle import storage
from launcher.perf import sizes


def flags_of(*flags: str) -> list[str]:
    spec, problems = spec_for(*flags, "--dataset", "none")
    return [p.flag for p in all_problems(spec, problems)]


def test_a_directory_under_a_file_cannot_be_created(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    for flag in ("configs_path", "slurm_scripts_dir", "slurm_logs_path", "checkpoints_path", "profiler_export_path"):
        (problem,) = storage.writable_problems(flag, str(tmp_path / "f" / "sub" / "dir"))
        assert problem.flag == flag and f"{tmp_path / 'f'} is not a directory" in problem.message
    assert storage.writable_problems("configs_path", str(tmp_path / "new" / "deeper")) == []  # mkdir -p works


def test_unwritable_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # root passes every permission check; ask os.access as a user who may not write tmp_path would
    real = storage.os.access
    monkeypatch.setattr(storage.os, "access", lambda p, mode: Path(p) != tmp_path and real(p, mode))
    (problem,) = storage.writable_problems("checkpoints_path", str(tmp_path / "ck"))
    assert f"{tmp_path / 'ck'} cannot be created: {tmp_path} is not writable by you" in problem.message


def test_checkpoint_count_over_a_run() -> None:
    assert sizes.checkpoint_count(1000, 300, save_initial_state=True) == 3 + 1 + 1  # 300, 600, 900; last; initial
    assert sizes.checkpoint_count(900, 300, False) == 3
    spec, _ = spec_for("--dataset", "none", "--train_steps", "1000", "--save_interval", "300")
    assert sizes.derived(spec)["checkpoint_bytes"] == sizes.parameters(spec) * sizes.BYTES_PER_PARAMETER
    free = storage.free_bytes("/")
    assert free is not None and 0 < free <= shutil.disk_usage("/").total


def test_no_room_for_one_checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec, _ = spec_for("--model_size", "8b", "--nodes", "1", "--dataset", "none", cwd=tmp_path)
    least = sizes.parameters(spec) * sizes.MIN_BYTES_PER_PARAMETER
    for free, refused in ((least - 1, True), (least, False)):
        monkeypatch.setattr(storage.shutil, "disk_usage", lambda path, free=free: shutil._ntuple_diskusage(0, 0, free))
        problems = [p for p in all_problems(spec, []) if p.flag == "checkpoints_path"]
        assert bool(problems) == refused
    monkeypatch.setattr(storage.shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(0, 0, least - 1))
    (problem,) = storage.space_problems(sizes.parameters(spec), "/ck")
    assert "less than one checkpoint of this model (at least 96.4 GB)" in problem.message


def test_summary_plans_the_checkpoints_on_this_machines_disk(tmp_path: Path) -> None:
    out = run_launcher("--run_name", "s", "--dataset", "none", "--train_steps", "100", "--save_interval", "30",
                       "--warmup_steps", "10", "--dry_run", cwd=tmp_path)  # fmt: skip
    assert out.returncode == 0, out.stderr
    line = next(x for x in out.stdout.splitlines() if x.strip().startswith("checkpoints"))
    # tiny: 4.22M parameters x 14 bytes, all 4 kept; then the free space read now (it changes from read to read)
    assert re.search(r"\(~59\.1 MB each, 4 over the run, all kept: 236 MB at the end; [\d.]+ [KMGT]?B free\)$", line), (
        line
    )


def test_output_directories_are_checked_by_the_launcher(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    out = run_launcher("--run_name", "w", "--dataset", "none", "--configs_path", str(tmp_path / "f" / "c"),
                       "--checkpoints_path", str(tmp_path / "f" / "k"), "--dry_run", cwd=tmp_path)  # fmt: skip
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "--configs_path:" in out.stderr and "--checkpoints_path:" in out.stderr
    assert flags_of("--slurm_logs_path", str(tmp_path / "f" / "l")) == ["slurm_logs_path"]


def test_a_directory_the_bundle_cannot_be_made_in_is_an_error_not_a_traceback(tmp_path: Path) -> None:
    # /proc refuses mkdir even to root, whom os.access lets through: the launcher's last line of defence
    out = run_launcher("--run_name", "p", "--dataset", "none", "--slurm_logs_path", "/proc/launcher-logs",
                       "--dry_run", cwd=tmp_path)  # fmt: skip
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert "--slurm_logs_path" in out.stderr and "/proc/launcher-logs" in out.stderr
