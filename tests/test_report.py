"""The run's pictures: the dmon log parser (pure), training.png from a real CPU run's metrics, gpus.png from the
dmon fixtures, and `python -m launcher.report` on a bundle, a run's directory and a sweep's."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from launcher.bundle import sweep_record
from launcher.bundle.manifest import load as load_manifest
from launcher.bundle.sweep_record import SweepPoint
from launcher.report import __main__ as report_cli
from launcher.report import dmon, pictures
from launcher.runs import sweep

FIXTURES = Path(__file__).parent / "fixtures"
DMON = FIXTURES / "dmon"
METRICS = FIXTURES / "metrics" / "cpu-run-resumed.jsonl"
ROOT = Path(__file__).resolve().parent.parent


def test_dmon_log_parsed_by_its_header():
    log = dmon.parse((DMON / "gpu-4242-gpu-a01.log").read_text(), "gpu-a01")
    assert log.columns[:6] == ["date", "time", "gpu", "pwr", "gtemp", "mtemp"] and log.gpus == [0, 1]
    assert log.units["pwr"] == "W" and log.units["fb"] == "MB" and log.units["rxpci"] == "MB/s"
    assert len(log.samples) == 2 * 26  # 26 samples of 2 GPUs, 15 s apart
    first, last = log.samples[0], log.samples[-1]
    assert str(first.time) == "2026-11-23 14:41:47" and (last.time - first.time).total_seconds() == 25 * 15
    assert first.values["pwr"] == 69 and first.values["sm"] == 0 and max(log.series(0, "fb")[1]) == 62010


def test_dmon_dash_and_a_line_cut_short():
    log = dmon.parse((DMON / "gpu-4242-gpu-a02.log").read_text(), "gpu-a02")
    assert len(log.samples) == 52  # the last line, cut mid-write, is left out
    (missing,) = [s for s in log.samples if s.values["pwr"] is None]  # dmon's '-'
    assert (missing.gpu, str(missing.time)) == (1, "2026-11-23 14:43:32")
    times, values = log.series(1, "pwr")
    assert missing.time not in times and len(values) == 25


def test_dmon_header_repeated_other_columns_or_no_samples():
    header = "# gpu   pwr gtemp mtemp    sm   mem\n# Idx     W     C     C     %     %\n"
    text = header + "    0    25    29     -     1     1\n" + header + "    0    26    30     -     2     1\n"
    log = dmon.parse(text)
    assert [s.values["pwr"] for s in log.samples] == [25, 26] and log.samples[0].values["mtemp"] is None
    assert dmon.parse("# gpu sample\n# gpu sample\n").samples == []  # the end-to-end tests' stand-in nvidia-smi
    assert dmon.parse("").samples == [] and dmon.parse("0 1 2\n").samples == []  # no header: nothing to read


def test_host_from_the_log_name():
    assert dmon.host_of(Path("logs/gpu-4242-gpu-a01.log"), "4242") == "gpu-a01"
    assert dmon.host_of(Path("gpu-7-node-7.log"), "7") == "node-7"
    assert dmon.host_of(Path("gpu-7-node-7.log.2"), "7") == "node-7"  # a later attempt on the node
    names = ["gpu-7-node-7.log", "gpu-7-node-7.log.12", "gpu-7-node-7.log.bak", "gpu-70-node-7.log", "gpu-7-.log"]
    assert [dmon.is_log_of(Path(n), "7") for n in names] == [True, True, False, False, False]


def shifted(text: str, by: timedelta) -> str:
    """A dmon log's text with every sample's time moved on (a later attempt's log)."""
    lines = []
    for line in text.splitlines():
        words = line.split()
        if words and not line.startswith("#") and len(words) > 2:
            when = datetime.strptime(f"{words[0]} {words[1]}", "%Y%m%d %H:%M:%S") + by
            line = line.replace(f"{words[0]}   {words[1]}", f"{when:%Y%m%d}   {when:%H:%M:%S}", 1)
        lines.append(line)
    return "\n".join(lines) + "\n"


def test_a_nodes_attempts_are_joined_and_the_time_between_left_blank(tmp_path: Path):
    first = (DMON / "gpu-4242-gpu-a01.log").read_text()
    (tmp_path / "gpu-4242-gpu-a01.log").write_text(first)
    (tmp_path / "gpu-4242-gpu-a01.log.2").write_text(shifted(first, timedelta(hours=1)))  # the requeued attempt
    shutil.copy(DMON / "gpu-4242-gpu-a02.log", tmp_path)
    logs = pictures.dmon_logs(tmp_path, "4242")
    assert [log.host for log in logs] == ["gpu-a01", "gpu-a02"]
    a01 = logs[0]
    assert len(a01.samples) == 2 * 52 and a01.samples == sorted(a01.samples, key=lambda s: (s.time, s.gpu))
    assert (a01.samples[-1].time - a01.samples[0].time) == timedelta(hours=1, seconds=25 * 15)
    times, stats = pictures.node_series(a01, "pwr")
    blanks = [i for i, (mean, _, _) in enumerate(stats) if math.isnan(mean)]
    assert len(times) == 2 * 26 + 1 and blanks == [26]  # one break, between the attempts, not a line across it
    assert times[25] < times[26] < times[27]
    assert pictures.gpus_png(logs, tmp_path / "gpus.png", "joined").stat().st_size > 30_000


def test_requeued_steps_keep_their_last_line_and_mark_the_resume():
    rows = [json.loads(line) for line in METRICS.read_text().splitlines()]
    by_step, resumes = pictures.steps_and_resumes(rows)
    assert len(rows) == 127 and sorted(by_step) == list(range(1, 121)) and resumes == [41]
    second_41 = [r for r in rows if r["step"] == 41][-1]
    assert by_step[41] == second_41


def bundle(tmp_path: Path, job_id: str = "4242", name: str = "20261123-144147") -> Path:
    """A bundle as the launcher writes it (the manifest's fields the pictures read), with the recorded metrics and
    the dmon fixtures beside its log."""
    bundle_dir, logs = tmp_path / "logs/configs/demo" / name, tmp_path / "logs/slurm_logs/demo"
    bundle_dir.mkdir(parents=True)
    logs.mkdir(parents=True, exist_ok=True)
    shutil.copy(METRICS, bundle_dir / "metrics.jsonl")
    for log in DMON.glob("*.log"):
        shutil.copy(log, logs / log.name.replace("4242", job_id))
    manifest = {
        "run_name": "demo",
        "outputs": {"log": str(logs / f"{name}.out"), "metrics": str(bundle_dir / "metrics.jsonl")},
        "slurm": {"submitted": True, "job_id": job_id},
    }
    (bundle_dir / "manifest.json").write_text(json.dumps(manifest))
    return bundle_dir


def test_render_draws_both_pictures(tmp_path: Path):
    bundle_dir = bundle(tmp_path)
    drawn = pictures.render(load_manifest(bundle_dir))
    assert drawn == {"training": bundle_dir / "training.png", "gpus": bundle_dir / "gpus.png"}
    for png in drawn.values():
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 30_000


def test_render_draws_nothing_it_has_no_data_for(tmp_path: Path):
    bundle_dir = bundle(tmp_path, job_id="77")
    (bundle_dir / "metrics.jsonl").write_text('{"step": 1, "loss": 3.0')  # cut mid-write
    for log in (tmp_path / "logs/slurm_logs/demo").glob("gpu-77-*.log"):
        log.write_text("# gpu sample\n")  # the stand-in nvidia-smi of the end-to-end tests
    assert pictures.render(load_manifest(bundle_dir)) == {}


def test_matplotlib_is_imported_only_to_draw():
    code = "import sys, launcher.report.pictures, launcher.runs.submission; print('matplotlib' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_report_command_on_a_bundle_a_run_and_a_sweep(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    older = bundle(tmp_path, job_id="4241", name="20261123-144147")
    newer = bundle(tmp_path, job_id="4242", name="20261123-144147-2")
    assert report_cli.main([str(older)]) == 0
    assert f"training  {older / 'training.png'}" in capsys.readouterr().out
    assert report_cli.main([str(older.parent)]) == 0  # a run's directory: its newest bundle
    out = capsys.readouterr().out
    assert str(newer / "gpus.png") in out and f"{older}/" not in out
    record = tmp_path / "sweep"
    record.mkdir()
    points = [
        SweepPoint(f"sw-{i}", {"seed": str(i)}, b, job) for i, (b, job) in enumerate([(older, "4241"), (newer, None)])
    ]
    sweep_record.write(record, "seed=0,1", points)
    assert report_cli.main([str(record)]) == 0
    out = capsys.readouterr().out
    assert f"{older}:" in out and f"{newer}:" in out
    assert report_cli.main([str(tmp_path / "nothing")]) == 1
    assert "neither a bundle" in capsys.readouterr().err


def test_the_sweep_record_name_is_the_sweeps():
    assert report_cli.SWEEP_RECORD == sweep.RECORD


def test_many_nodes_are_drawn_as_their_distribution_in_bounded_bins(tmp_path: Path):
    from synthetic_dmon import write_logs

    write_logs(tmp_path, "99", nodes=40, gpus=4, samples=800, slow={7})  # 40 nodes, 3 h 20 min each
    nodes = pictures.binned_logs(tmp_path, "99")
    assert len(nodes) == 40 and all(len(n.sums["sm"]) <= pictures.MAX_BINS for n in nodes)
    slow = next(n for n in nodes if n.host == "node0007")
    assert {round(m) for m in slow.means("sm")} == {10} and slow.gpus == {0, 1, 2, 3}
    assert sum(sum(n.counts["sm"]) for n in nodes) == 40 * 4 * 800  # every sample counted once
    png = pictures.gpus_picture(tmp_path, "99", tmp_path / "gpus.png", "many")
    assert png is not None and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 30_000
