"""A run's evaluations read back (launcher/evals/report.py, launcher/evals/record.py): `jobs evals`' table and
picture, a sweep's points ranked by an eval score (best first, the direction of the metric), `jobs diff`'s evals,
the ledger's eval GPU-hours apart, a second launch's steps found through the checkpoints' submissions. The results
are the eval job's (tests/test_evals_job.py makes real ones); here they are written as it writes them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from launcher import jobs
from launcher.bundle import manifest
from launcher.evals import record as eval_record
from launcher.evals import report
from launcher.node import job as job_file
from launcher.report import compare
from launcher.runs import launch, sweep


def tasks_folder(where: Path) -> Path:
    folder = where / "tasks"
    folder.mkdir(exist_ok=True)
    (where / "mc.jsonl").write_text('{"q": "a", "choices": ["x", "y"], "label": 0}\n')
    (folder / "mc.yaml").write_text(json.dumps({
        "task": "rep_mc", "dataset_path": "json", "dataset_kwargs": {"data_files": {"test": str(where / "mc.jsonl")}},
        "test_split": "test", "output_type": "multiple_choice", "doc_to_text": "{{q}}", "doc_to_choice": "{{choices}}",
        "doc_to_target": "{{label}}"}))  # fmt: skip
    (folder / "ppl.yaml").write_text(json.dumps({
        "task": "rep_ppl", "dataset_path": "json", "dataset_kwargs": {"data_files": {"test": str(where / "mc.jsonl")}},
        "test_split": "test", "output_type": "loglikelihood_rolling", "doc_to_text": "",
        "doc_to_target": "{{q}}"}))  # fmt: skip
    return folder


def argv(where: Path, demo, name: str, *more: str) -> list[str]:
    return ["--run_name", name, "--nodes", "1", "--gpus_per_node", "2", "--dataset", str(demo.dataset), "--tokenizer",
            str(demo.tokenizer), "--train_steps", "30", "--save_interval", "10", "--eval_tasks", "rep_mc,rep_ppl",
            "--eval_include", str(tasks_folder(where)), "--eval_every", "10", "--dry_run", *more]  # fmt: skip


def key(bundle: Path) -> str:
    return job_file.load(bundle).evals.key  # type: ignore[union-attr]


def put(bundle: Path, row: dict) -> None:
    """A result, as the eval job writes it, of the run's own --eval_tasks."""
    eval_record.write_result(bundle, row["step"], key(bundle), row)


def row(step: int, acc: float, bpb: float, **more: object) -> dict:
    tasks = {"rep_mc": {"acc": acc, "acc_norm": acc + 0.1}, "rep_ppl": {"bits_per_byte": bpb, "word_perplexity": 9.0}}
    return {"step": step, "tokens": step * 4096, "state": "done", "tasks": tasks, "gpus": 1, "seconds": 360.0,
            "gpu_hours": 0.1, **more}  # fmt: skip


@pytest.fixture
def bundle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, demo_data) -> manifest.Manifest:
    monkeypatch.chdir(tmp_path)
    return manifest.load(launch.prepare(argv(tmp_path, demo_data, "rep")).paths.bundle_dir)


def test_the_table_says_every_step_the_failures_and_what_is_still_to_end(bundle: manifest.Manifest):
    assert report.asked(bundle) and report.settings(bundle).tasks == ("rep_mc", "rep_ppl")  # type: ignore[union-attr]
    assert report.run_lines(bundle, ask_slurm=False)[1:] == ["  no step evaluated yet"]
    put(bundle.bundle_dir, row(10, 0.25, 1.5))
    put(bundle.bundle_dir, {"step": 20, "state": "failed", "cause": "ExportError: gone", "job": "7", "gpus": 1,
                            "seconds": 36.0, "gpu_hours": 0.01})  # fmt: skip
    eval_record.result_path(bundle.bundle_dir, 40, key(bundle.bundle_dir)).write_text('{"step": 40, "sta')  # cut
    eval_record.note_submission(bundle.checkpoints, 30, key(bundle.bundle_dir), state="submitted", job="99",
                                bundle=str(bundle.bundle_dir))  # fmt: skip
    lines = report.run_lines(bundle, ask_slurm=False)
    assert lines[0].startswith("Evals of rep (lm-eval: rep_mc, rep_ppl")
    assert lines[1].split() == ["step", "tokens", "rep_mc", "acc_norm", "rep_ppl", "bits_per_byte"]
    assert lines[2].split() == ["10", "40,960", "0.3500", "1.5000"]
    assert lines[3] == "  step 20: failed (job 7): ExportError: gone"
    assert lines[4] == "  still to end: step 30 (job 99, submitted)"
    put(bundle.bundle_dir, {"step": 30, "state": "interrupted", "cause": "signal SIGTERM (preempted, ...)"})
    assert report.table(report.of(bundle), {"99": "TIMEOUT"})[-1] == (
        "  step 30: eval job 99 ended TIMEOUT without a result"
    )
    assert report.table(report.of(bundle), {"99": "PENDING"})[-1] == "  still to end: step 30 (job 99, PENDING)"
    assert report.table(report.of(bundle))[-1] == "  still to end: step 30 (job 99, interrupted)"
    assert report.ledger_line(bundle) == "0.110 GPU-hours in 2 eval job(s) on CPUs (0.110 hours, 1 still to end), apart"


def test_jobs_evals_draws_the_picture(bundle: manifest.Manifest, capsys: pytest.CaptureFixture[str]):
    for step, acc in ((10, 0.2), (20, 0.3), (30, 0.4)):
        put(bundle.bundle_dir, row(step, acc, 2.0 - acc))
    assert jobs.main(["evals", str(bundle.bundle_dir)]) == 0
    out = capsys.readouterr().out
    assert (
        any(line.split()[:2] == ["30", "122,880"] for line in out.splitlines())
        and f"picture      {bundle.bundle_dir / 'evals.png'}" in out
    )
    assert (bundle.bundle_dir / "evals.png").read_bytes()[:4] == b"\x89PNG"
    assert jobs.main(["evals", str(bundle.bundle_dir), "--rank_by", "rep_mc"]) == 2  # one run: nothing to rank
    assert "--rank_by: it ranks a sweep's points; give the sweep's directory" in capsys.readouterr().err


def test_a_second_launchs_steps_are_found_through_the_checkpoints(bundle: manifest.Manifest, tmp_path: Path):
    first = tmp_path / "first-bundle"
    first.mkdir()
    k = key(bundle.bundle_dir)
    eval_record.write_result(first, 10, k, row(10, 0.2, 1.8))
    eval_record.note_submission(bundle.checkpoints, 10, k, state="submitted", job="5", bundle=str(first))
    put(bundle.bundle_dir, row(20, 0.3, 1.7))
    found = report.of(bundle)
    assert sorted(found.done) == [10, 20] and found.open == {}
    assert found.series("rep_ppl") == ("bits_per_byte", [(10, 40960, 1.8), (20, 81920, 1.7)])


def test_a_sweep_is_ranked_by_an_eval_score_best_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, demo_data,
                                                      capsys: pytest.CaptureFixture[str]):  # fmt: skip
    monkeypatch.chdir(tmp_path)
    assert launch.main(argv(tmp_path, demo_data, "sw", "--sweep", "seed=1,2,3", "--rank_by", "rep_mc")) == 0
    (record_dir,) = [p.parent for p in tmp_path.glob("logs/configs/sw/*/sweep.json")]
    bundles = {p.parts[-3]: p.parent for p in tmp_path.glob("logs/configs/sw-*/*/manifest.json")}
    put(bundles["sw-1"], row(30, 0.30, 1.2))
    put(bundles["sw-2"], row(20, 0.90, 1.0))  # the best score, though of an earlier step
    put(bundles["sw-2"], row(30, 0.50, 1.6))  # its last step's counts
    capsys.readouterr()
    text = sweep.results(record_dir, {}, plot=False)  # --rank_by read from the points' flags
    ranking = text[text.index("Ranked by") :].splitlines()
    assert ranking[0] == "Ranked by rep_mc acc_norm, highest first (each point's last evaluated step)"
    assert ranking[1:] == ["  1. sw-2             0.6000 at step 30", "  2. sw-1             0.4000 at step 30",
                           "  3. sw-3             no score yet"]  # fmt: skip
    lowest = report.ranking_lines([("sw-1", bundles["sw-1"]), ("sw-2", bundles["sw-2"])], "rep_ppl")
    assert lowest[0].startswith("Ranked by rep_ppl bits_per_byte, lowest first") and "sw-1" in lowest[1]
    assert jobs.main(["evals", str(record_dir), "--rank_by", "rep_mc:acc"]) == 0
    out = capsys.readouterr().out
    assert "Ranked by rep_mc acc, highest first" in out and out.count("Evals of sw-") == 3
    assert (record_dir / "evals.png").is_file()
    for by, said in (("rep_mc:bogus", "the records hold no 'bogus' of rep_mc (they hold acc, acc_norm)"),
                     ("rep_mc:", "'rep_mc:' names no metric after the colon"),
                     ("acc:extra", "'acc' is not a task the records hold (rep_mc, rep_ppl)")):  # fmt: skip
        assert jobs.main(["evals", str(record_dir), "--rank_by", by]) == 2
        err = capsys.readouterr().err
        assert f"error: --rank_by: {said}" in err and "Traceback" not in err, err


def test_jobs_diff_compares_the_evals(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, demo_data):
    monkeypatch.chdir(tmp_path)
    a = manifest.load(launch.prepare(argv(tmp_path, demo_data, "da")).paths.bundle_dir)
    b = manifest.load(launch.prepare(argv(tmp_path, demo_data, "db", "--seed", "7")).paths.bundle_dir)
    for step in (10, 20):
        put(a.bundle_dir, row(step, 0.2 + step / 100, 1.5))
    put(b.bundle_dir, row(20, 0.45, 1.4))
    found = compare.diff(a, b, ("A", "B"))
    assert found.evals["rep_mc"] == {"metric": "acc_norm", "rows": [(20, 0.5, pytest.approx(0.55))]}
    text = compare.render(found)
    assert "evals: the scores at the steps both runs were evaluated at" in text
    assert "rep_ppl bits_per_byte:" in text and "1.5000      1.4000    -0.1000" in text
    plain = compare.diff(manifest.load(a.bundle_dir), manifest.load(a.bundle_dir), ("A", "A"))
    assert compare.render(plain).count("evals:") == 1


def test_jobs_checkpoints_says_which_steps_are_owed_an_eval(bundle: manifest.Manifest,
                                                             capsys: pytest.CaptureFixture[str]):  # fmt: skip
    """A step --eval_every names stays until its eval has ended, and `jobs checkpoints` says why; once the result is
    done, only the rules speak for it."""
    from test_retention import saved, torch_step

    for step in (5, 10, 15):
        torch_step(bundle.checkpoints, step)
    saved(bundle.checkpoints, 5, 10, 15)
    assert jobs.main(["checkpoints", str(bundle.bundle_dir)]) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[1:4]}
    assert "owed an eval (--eval_every names it; not submitted yet)" in lines["10"], lines
    assert "owed an eval" not in lines["5"] and "owed an eval" not in lines["15"]
    k = key(bundle.bundle_dir)
    eval_record.note_submission(bundle.checkpoints, 10, k, state="submitted", job="77", bundle=str(bundle.bundle_dir))
    assert jobs.main(["checkpoints", str(bundle.bundle_dir)]) == 0
    assert "owed an eval (eval job 77 submitted)" in capsys.readouterr().out
    put(bundle.bundle_dir, row(10, 0.5, 1.0))
    assert jobs.main(["checkpoints", str(bundle.bundle_dir)]) == 0
    assert "owed an eval" not in capsys.readouterr().out


def test_waiting_for_the_eval_jobs_asks_slurm_as_often_as_the_follower_does(bundle: manifest.Manifest,
                                                                          monkeypatch: pytest.MonkeyPatch):  # fmt: skip
    """--rank_by's wait for the points' eval jobs: one query a look, a look every LAUNCHER_POLL_SECONDS (a site's
    rule for --show_logs holds here too), until Slurm says every one ended."""
    import time

    from launcher.slurm import client
    from launcher.slurm.parse import JobState

    eval_record.note_submission(bundle.checkpoints, 10, key(bundle.bundle_dir), state="submitted", job="99",
                                bundle=str(bundle.bundle_dir))  # fmt: skip
    answers = iter(["RUNNING", "RUNNING", "COMPLETED"])
    monkeypatch.setattr(client, "job_states_many", lambda jobs: {j: JobState(j, next(answers), "None", None, None, 0,
                                                                              "") for j in jobs})  # fmt: skip
    slept: list[float] = []
    monkeypatch.setattr(time, "sleep", slept.append)
    monkeypatch.setenv("LAUNCHER_POLL_SECONDS", "7")
    report.wait([bundle.bundle_dir])
    assert slept == [7.0, 7.0]
