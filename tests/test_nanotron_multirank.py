"""nanotron's own trainer with several ranks on CPU (gloo), through the job's door (`torchrun run_train.py --engine
nanotron`) on configs the launcher writes, with the test-side CPU patches (tests/cpu_nanotron/): layouts against
the one-process run from the same weights, and each nanotron bug the launcher's configs would meet, each test
failing without its mend (docs/engines.md, "Several ranks on CPU").

The weights: a one-process run saves its step 0 (`save_initial_state`), and every other run starts from it
(`model.init_method.path`): tp and pp shard and initialise differently, so fresh runs would not compare.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml
from cpu_nanotron import ROOT, STEPS, launcher_config, parameters_line, torchrun, train
from launcher_helpers import spec_for

from launcher.nanotron_config import dialect as dialects
from launcher.train.nanotron_engine.compiled import COMPILED_LINE
from launcher.train.nanotron_engine.mends import shape_from_text

if TYPE_CHECKING:
    from conftest import DemoData

TOLERANCE = 1e-3  # bf16; the runs below match within 1e-4 where right, and part by 1e-2 where a bug is left in


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory, demo_data: DemoData) -> Any:
    """Per dialect (made once): the one-process run's step-0 weights and its metrics for STEPS + 3 steps."""
    made: dict[str, tuple[Path, dict[int, dict]]] = {}

    def get(dialect: str) -> tuple[Path, dict[int, dict]]:
        if dialect not in made:
            where = tmp_path_factory.mktemp(f"reference-{dialect}")
            config = launcher_config(where, "one", demo_data, dialect, 1, 1, 1, **{
                "checkpoints.save_initial_state": True, "tokens.train_steps": STEPS + 3})  # fmt: skip
            made[dialect] = (where / "ckpt" / "one" / "0", train(config, 1, dialect))
        return made[dialect]

    return get


def assert_same_run(run: dict[int, dict], ref: dict[int, dict], steps: range, loss: float = TOLERANCE) -> None:
    assert sorted(run) == list(steps), sorted(run)
    for step in steps:
        assert run[step]["loss"] == pytest.approx(ref[step]["loss"], abs=loss), (step, run[step], ref[step])
        assert run[step]["lr"] == pytest.approx(ref[step]["lr"], rel=1e-9), step
        assert run[step]["grad_norm"] == pytest.approx(ref[step]["grad_norm"], rel=1e-2), step  # the gradients


def test_8_ranks_dp2_tp2_pp2_of_main_train_as_one_process(reference: Any, demo_data: DemoData, tmp_path: Path):
    """The launcher's own 8-rank layout in main's dialect: it needs the loss on every pipeline rank (b). (0.4's, which
    needs its sync TP linears (a) and its checkpoint shapes read (d), is held to its one-process run through Slurm,
    across the time-limit notice, in tests/test_nanotron_slurm.py: the same layout, flags and reference.)"""
    init, ref = reference("main")
    init_from = {"model.init_method": {"path": str(init)}}
    config = launcher_config(tmp_path, "eight", demo_data, "main", 2, 2, 2, **init_from)
    assert_same_run(train(config, 8, "main"), ref, range(1, STEPS + 1))
    # the memory model's parameters per rank are what nanotron built on each of the 8
    said = [line for line in config.with_suffix(".log").read_text().splitlines() if line.startswith("parameters per")]
    assert said == [parameters_line(tmp_path, demo_data, "main")], said


def test_04s_async_tp_is_written_sync_and_mended_by_the_job(reference: Any, demo_data: DemoData, tmp_path: Path):
    """Bug a: nanotron 0.4's async row-parallel backward. The launcher writes tp > 1 synchronous, and the job
    mends a config that asks otherwise (here, one changed after the launcher wrote it), saying so."""
    init, ref = reference("0.4")
    config = launcher_config(tmp_path, "tp2", demo_data, "0.4", 1, 2, 1, **{"model.init_method": {"path": str(init)}})
    written = yaml.safe_load(config.read_text())
    assert written["parallelism"]["tp_linear_async_communication"] is False
    written["parallelism"]["tp_linear_async_communication"] = True
    config.write_text(yaml.safe_dump(written, sort_keys=False))
    assert_same_run(train(config, 2, "0.4"), ref, range(1, STEPS + 1))
    assert (
        "asks for asynchronous tensor-parallel communication, but nanotron 0.4's"
        in config.with_suffix(".log").read_text()
    )


def test_mains_zero1_with_fp32_accumulation_trains_with_dp2(reference: Any, demo_data: DemoData, tmp_path: Path):
    """Bug c: main built DDP under ZeRO-1 with fp32 accumulation (`make_ddp`'s precedence) and died in the first
    backward."""
    init, ref = reference("main")
    config = launcher_config(tmp_path, "zero1", demo_data, "main", 2, 1, 1, "--zero_stage", "1",
                             **{"model.init_method": {"path": str(init)}})  # fmt: skip
    assert yaml.safe_load(config.read_text())["optimizer"]["accumulate_grad_in_fp32"] is True
    assert_same_run(train(config, 2, "main"), ref, range(1, STEPS + 1))


def test_04_resumes_a_tp2_pp2_run_on_one_process(reference: Any, demo_data: DemoData, tmp_path: Path):
    """Bug d and the optimizer's shard pattern: a 0.4 run saved with tp 2 x pp 2 resumes on one process (fewer
    nodes after a relaunch), steps 5-8 within bf16's noise of the straight run (nanotron re-shards the optimizer's
    moments; its fp32 master weights it re-makes from the bf16 weights)."""
    init, ref = reference("0.4")
    common = {"model.init_method": {"path": str(init)}, "checkpoints.checkpoints_path": str(tmp_path / "ckpt")}
    first = launcher_config(tmp_path, "first", demo_data, "0.4", 1, 2, 2, **{**common, "tokens.train_steps": 4})
    then = launcher_config(tmp_path, "then", demo_data, "0.4", 1, 1, 1, **{**common, "tokens.train_steps": STEPS + 3})
    metrics = tmp_path / "m.jsonl"
    train(first, 4, "0.4", metrics)
    resumed = train(then, 1, "0.4", metrics)
    assert "resuming from the run's own checkpoints" in then.with_suffix(".log").read_text()
    assert_same_run(resumed, ref, range(1, STEPS + 4))


def test_04_resume_in_bf16_continues_exactly(demo_data: DemoData, tmp_path: Path):
    """nanotron 0.4 trained the first step after every resume at the LR of step 0 (its loader restores the
    schedule, not the optimizer's LR): straight to 8 against 4, then resumed to 8, through nanotron's own
    DistributedTrainer, bf16 with fp32 accumulation: the same loss and LR at every step."""
    straight = launcher_config(tmp_path, "straight", demo_data, "0.4", 1, 1, 1, **{"tokens.train_steps": 8})
    ckpt = {"checkpoints.checkpoints_path": str(tmp_path / "b")}
    first = launcher_config(tmp_path, "first", demo_data, "0.4", 1, 1, 1, **{**ckpt, "tokens.train_steps": 4})
    rest = launcher_config(tmp_path, "rest", demo_data, "0.4", 1, 1, 1, **{**ckpt, "tokens.train_steps": 8})
    a = train(straight, 1, "0.4")
    train(first, 1, "0.4", tmp_path / "b.jsonl")
    b = train(rest, 1, "0.4", tmp_path / "b.jsonl")
    assert [b[s]["loss"] for s in range(1, 9)] == [a[s]["loss"] for s in range(1, 9)]
    assert [b[s]["lr"] for s in range(1, 9)] == [a[s]["lr"] for s in range(1, 9)] and b[5]["lr"] > 0


def test_a_relayout_nanotron_cannot_reshard_is_refused_by_the_job(demo_data: DemoData, tmp_path: Path):
    """main resumes into another dp only: a tp change ends at once with the reason, before the trainer is built
    (the launcher says the same before the queue: tests/test_validate.py)."""
    ckpt = {"checkpoints.checkpoints_path": str(tmp_path / "ckpt")}
    first = launcher_config(tmp_path, "first", demo_data, "main", 1, 2, 1, **{**ckpt, "tokens.train_steps": 2})
    then = launcher_config(tmp_path, "then", demo_data, "main", 1, 1, 1, **ckpt)
    train(first, 2, "main")
    done = torchrun(then, 1, then.with_suffix(".log"), main=True)
    log = then.with_suffix(".log").read_text()
    assert done.returncode != 0 and "error: this run resumes from" in log
    assert "nanotron main resumes into another dp only" in log and "saved with dp 1, tp 2, pp 1" in log


def test_saved_shapes_are_read_in_numpys_spelling_too():
    assert shape_from_text("(np.int64(128), 64)") == (128, 64)
    assert shape_from_text("(128, 64)") == (128, 64) and shape_from_text("(numpy.int32(7),)") == (7,)


def test_the_saved_layout_is_read_from_the_checkpoint(tmp_path: Path):
    (tmp_path / "12").mkdir()
    (tmp_path / "latest.txt").write_text("12")
    config = {"parallelism": {"dp": 2, "tp": 2, "pp": 1}, "optimizer": {"zero_stage": 1}}
    (tmp_path / "12" / "config.yaml").write_text(yaml.safe_dump(config))
    assert dialects.saved_layout(tmp_path) == ({"dp": 2, "tp": 2, "pp": 1, "zero_stage": 1},
                                               str(tmp_path / "12" / "config.yaml"))  # fmt: skip
    shutil.rmtree(tmp_path / "12")
    assert dialects.saved_layout(tmp_path) == (None, "")


@pytest.mark.parametrize(
    ("saved", "flags", "dialect", "refused"),
    [
        ({"dp": 2, "tp": 2, "pp": 1, "zero_stage": 0}, ("--tp", "1", "--pp", "1"), "0.4", None),  # 0.4 re-shards
        ({"dp": 2, "tp": 2, "pp": 1, "zero_stage": 0}, ("--tp", "1", "--pp", "1"), "main", "main resumes into"),
        ({"dp": 4, "tp": 1, "pp": 1, "zero_stage": 0}, ("--tp", "1", "--pp", "1"), "main", None),  # dp only
        (
            {"dp": 4, "tp": 1, "pp": 1, "zero_stage": 1},
            ("--tp", "1", "--pp", "1", "--zero_stage", "1"),
            "0.4",
            "ZeRO-1 optimizer",
        ),  # fmt: skip
    ],
)
def test_a_relayout_is_judged_before_the_queue(saved: dict, flags: tuple, dialect: str, refused: str | None,
                                               tmp_path: Path):  # fmt: skip
    """Relaunched on 2 GPUs (fewer nodes) after a run saved on 4: where nanotron re-shards, the launch goes ahead;
    where it cannot, it is refused with the saved layout as the fix."""
    from launcher.slurm import checks

    root = tmp_path / "ckpt" / "r"
    (root / "7").mkdir(parents=True)
    (root / "latest.txt").write_text("7")
    (root / "nanotron-dialect").write_text(dialect)
    config = {
        "parallelism": {k: saved[k] for k in ("dp", "tp", "pp")},
        "optimizer": {"zero_stage": saved["zero_stage"]},
    }
    (root / "7" / "config.yaml").write_text(yaml.safe_dump(config))
    spec, problems = spec_for("--run_name", "r", "--nodes", "1", "--gpus_per_node", "2", "--model_size", "tiny",
                              "--nanotron_dialect", dialect, "--checkpoints_path", str(tmp_path / "ckpt"),
                              *flags)  # fmt: skip
    assert problems == []
    found = checks.resume_problems(spec)
    if refused is None:
        assert found == []
    else:
        assert len(found) == 1 and refused in found[0].message
        assert f"--dp {saved['dp']} --tp {saved['tp']} --pp {saved['pp']}" in found[0].fix


@pytest.mark.parametrize(("dialect", "tp", "pp"), [("0.4", 2, 2), ("main", 2, 1)])
def test_compiled_decoder_layers_train_as_the_eager_one_process_run(
    dialect: str, tp: int, pp: int, reference: Any, demo_data: DemoData, tmp_path: Path
) -> None:
    """--compile_layers: each rank's decoder layers through torch.compile (inductor's C++ kernels on CPU), with
    the tensor-parallel collectives and the pipeline around them, train as the one-process eager run, with no graph
    break in the launcher's own code (the flash_attn stand-in's RMSNorm and rotary). The test side's CPU patches and
    nanotron's tensor-parallel collectives break graphs here; the job counts them after its first step."""
    init, ref = reference(dialect)
    config = launcher_config(tmp_path, "compiled", demo_data, dialect, 1, tp, pp,
                             **{"model.init_method": {"path": str(init)}})  # fmt: skip
    run = train(config, tp * pp, dialect, args=("--compile_layers",), TORCH_LOGS="graph_breaks")
    log = config.with_suffix(".log").read_text()
    layers = re.search(COMPILED_LINE.replace("{count}", r"(\d+)").replace("(s)", r"\(s\)"), log)
    assert layers and int(layers[1]) >= 1, log[-3000:]  # rank 0, the first pipeline stage, holds one or both
    summary = re.search(r"compile_layers: (\d+) graph\(s\) compiled in the first step, (\d+) graph break", log)
    assert summary and int(summary[1]) >= 1 and int(summary[2]) >= 1, log[-3000:]
    ours = [line for line in log.splitlines() if "Graph break" in line and str(ROOT / "launcher") in line]
    assert ours == [], ours
    assert_same_run(run, ref, range(1, STEPS + 1))
