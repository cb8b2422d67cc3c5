"""`python -m launcher.jobs export`: a run's checkpoint as a transformers Llama, proven by its logits.

Each run is a launcher bundle (a dry run of the launcher's own flags on a tiny Llama and the demo data, from a
--config that asks for float32 weights, a padded vocabulary and, in main's dialect, tied embeddings and interleaved
RoPE), trained for real: the torch engine in one process, nanotron's trainer (0.4's and main's) with 8 ranks,
dp 2 x tp 2 x pp 2, on CPU (tests/cpu_nanotron.py). The export's folder is loaded by transformers'
`AutoModelForCausalLM.from_pretrained`, and its logits on held-out tokens compared with the engine's own forward on
the same checkpoint: the torch engine's Llama (launcher/train/torch_engine/llama.py) loaded from its state.pt, and
nanotron's model in one process with nanotron's own `load_weights` merging the 8 ranks' shards
(tests/nanotron_forward.py), over the tokenizer's 77 tokens (the rows past them, the launcher's rounding to 128 and
the engines' padding to 192, are no token's: the export drops them). float32 on CPU: within 1e-4; greedy
generation of a few tokens identical. The exported files all take the user's umask's mode.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import torch
import yaml
from cpu_nanotron import ROOT, environment, launcher_config, train

from launcher import jobs
from launcher.bundle import manifest
from launcher.export import checkpoints, folder, weights
from launcher.export.exporter import export
from launcher.runs import launch

if TYPE_CHECKING:
    from conftest import DemoData

TOLERANCE = 1e-4
VOCAB = 77  # the demo tokenizer's (demo_data.vocab), written by the launcher as 128 and padded to 192 (EXTRAS)
NEW_TOKENS = 5  # tests/nanotron_forward.py's
# float32 weights (nanotron's fp32 gradient accumulation asks for bf16 ones), a vocabulary padded from 128 to 192
EXTRAS: dict[str, Any] = {"model.dtype": "float32", "optimizer.accumulate_grad_in_fp32": False,
                          "model.make_vocab_size_divisible_by": 96}  # fmt: skip
MAIN_EXTRAS = {"model.model_config.tie_word_embeddings": True, "model.model_config.rope_interleaved": True}


def bundle(where: Path, demo: DemoData, dialect: str, dp: int, tp: int, pp: int, engine: str) -> manifest.Manifest:
    """A launcher bundle (dry run) for the tiny Llama on dp x tp x pp, from a --config with EXTRAS."""
    extras = {**EXTRAS, **(MAIN_EXTRAS if dialect == "main" else {})}
    given = launcher_config(where, "given", demo, dialect, dp, tp, pp, **extras)
    cwd = os.getcwd()
    os.chdir(where)
    try:
        argv = ["--run_name", f"export-{engine}-{dialect}", "--nodes", "1", "--gpus_per_node", str(dp * tp * pp),
                "--tp", str(tp), "--pp", str(pp), "--config", str(given), "--nanotron_dialect", dialect,
                "--engine", engine, "--dataset", str(demo.dataset), "--tokenizer", str(demo.tokenizer),
                "--micro_batch_size", "2", "--grad_accum_steps", str(8 // (2 * dp)), "--train_steps", "5",
                "--dry_run"]  # fmt: skip
        run = manifest.load(launch.prepare(argv).paths.bundle_dir)
    finally:
        os.chdir(cwd)
    written = yaml.safe_load(config_of(run).read_text())["model"]["model_config"]["vocab_size"]
    assert (demo.vocab, written) == (VOCAB, 128)  # the launcher's rounding, which the export drops with the padding
    return run


def config_of(run: manifest.Manifest) -> Path:
    return Path(run.data["files"]["config"]["path"])


def held_out(vocab: int) -> torch.Tensor:
    return torch.randint(4, vocab, (2, 12), generator=torch.Generator().manual_seed(11))


def hf_model(directory: Path) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(directory), dtype=torch.float32).eval()


def hf_greedy(model: Any, ids: torch.Tensor) -> list[list[int]]:
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS, do_sample=False,
                             min_new_tokens=NEW_TOKENS, eos_token_id=None, pad_token_id=0)  # fmt: skip
    return out.tolist()


def written_names(out: Path) -> set[str]:
    """The tensors the export's safetensors files hold, each file read (the index, where there is one, agrees)."""
    from safetensors import safe_open

    names: dict[str, str] = {}
    for path in sorted(out.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as f:
            names.update((name, path.name) for name in f.keys())
    if (out / folder.INDEX).exists():
        assert json.loads((out / folder.INDEX).read_text())["weight_map"] == names
    return set(names)


def exported(run: manifest.Manifest, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    """`python -m launcher.jobs export BUNDLE --dtype float32 --output DIR` in this process: DIR."""
    out = tmp_path / "hf"
    assert jobs.main(["export", str(run.bundle_dir), "--dtype", "float32", "--output", str(out)]) == 0
    said = capsys.readouterr().out
    assert f"Exported step 5 of {run.bundle_dir.resolve()}" in said and str(out) in said, said
    return out


# --- pure parts: the shard plan, the vocabulary, the files' mode --------------------------------------------------


def _groups(*sizes: tuple[tuple[int, ...], ...]) -> list[weights.Group]:
    """Groups of the given tensors' shapes, never loaded (a plan reads shapes only)."""
    return [weights.Group({f"g{n}.t{i}": shape for i, shape in enumerate(shapes)}, dict) for n, shapes in
            enumerate(sizes)]  # fmt: skip


def test_the_shard_plan_is_huggingface_hubs_over_whole_groups():
    small = _groups(((128, 64),), ((64, 64), (16, 64), (16, 64)))
    assert folder.planned_shards(small, 2) == {"model.safetensors": small}  # one file: no index
    embedding, qkv = ((150_000_000, 1),), ((30_000_000, 1), (5_000_000, 1), (5_000_000, 1))  # 300 MB, 80 MB in bf16
    big = _groups(embedding, qkv, qkv, qkv, qkv, ((1,),))
    plan = folder.planned_shards(big, 2)
    assert list(plan) == [f"model-0000{k}-of-00003.safetensors" for k in (1, 2, 3)]
    assert list(plan.values()) == [big[:1], big[1:4], big[4:]]  # at most the largest group's bytes a file
    assert [n for shard in plan.values() for g in shard for n in g.shapes] == [n for g in big for n in g.shapes]


def test_the_vocabulary_is_the_tokenizers_and_never_more_than_the_models_rows(demo_data: DemoData, tmp_path: Path):
    assert folder.vocabulary(str(demo_data.tokenizer)) == demo_data.vocab == VOCAB
    shape = checkpoints.ModelShape(hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4, num_kv_heads=2,
                                   vocab_size=128, max_seq_len=64)  # fmt: skip
    found = checkpoints.Checkpoint(tmp_path, 5, "torch", "0.4", {}, shape, False)
    assert found.with_vocabulary(VOCAB).shape.vocab_size == VOCAB and found.shape.vocab_size == 128
    with pytest.raises(checkpoints.ExportError, match="has 129 tokens, more than the model's 128 rows"):
        found.with_vocabulary(129)
    with pytest.raises(checkpoints.ExportError, match="cannot be read here"):
        folder.vocabulary(str(tmp_path / "no-tokenizer"))


def test_a_new_file_takes_the_umasks_mode(tmp_path: Path):
    umask = os.umask(0o027)
    try:
        (tmp_path / "f").write_text("")
        assert folder.new_file_mode() == 0o640 == (tmp_path / "f").stat().st_mode & 0o777
    finally:
        os.umask(umask)
    assert folder.new_file_mode() == 0o666 & ~umask


# --- the torch engine ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def torch_run(tmp_path_factory: pytest.TempPathFactory, demo_data: DemoData) -> Any:
    """Per dialect (made once): a torch engine run of 5 steps in one process, through run_train.py."""
    made: dict[str, manifest.Manifest] = {}

    def get(dialect: str) -> manifest.Manifest:
        if dialect not in made:
            run = bundle(tmp_path_factory.mktemp(f"torch-{dialect}"), demo_data, dialect, 1, 1, 1, "torch")
            env = {**os.environ, "PYTHONPATH": str(ROOT), "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1"}
            command = [sys.executable, str(ROOT / "run_train.py"), "--config-file", str(config_of(run)), "--engine",
                       "torch"]  # fmt: skip
            done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
            assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
            made[dialect] = run
        return made[dialect]

    return get


def torch_engine_model(run: manifest.Manifest) -> Any:
    """The torch engine's own Llama as the job builds it from the run's config (its vocabulary padded), its
    checkpoint at step 5 loaded."""
    from launcher.train.settings import load_train_config
    from launcher.train.torch_engine.llama import LlamaForCausalLM

    model = LlamaForCausalLM(load_train_config(str(config_of(run))).model)
    state = torch.load(run.checkpoints / "5" / "state.pt", weights_only=True)
    model.load_state_dict(state["model"])
    return model.eval()


@pytest.mark.parametrize("dialect", ["0.4", "main"])
def test_the_torch_engines_checkpoint_exports_to_its_logits(
    dialect: str, torch_run: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """0.4: rotate-half RoPE, untied; main: interleaved RoPE (the torch engine rotates pairs: rows reordered), tied."""
    run = torch_run(dialect)
    umask = os.umask(0o007)  # a group that shares the folder: every file rw for it, the weights too
    try:
        out = exported(run, tmp_path, capsys)
    finally:
        os.umask(umask)
    modes = {f.name: oct(f.stat().st_mode & 0o777) for f in out.iterdir()}
    assert set(modes.values()) == {"0o660"} and "model.safetensors" in modes, modes
    engine, hf = torch_engine_model(run), hf_model(out)
    assert hf.config.vocab_size == VOCAB and engine.lm_head.weight.shape[0] == 192
    assert json.loads((out / "config.json").read_text())["vocab_size"] == VOCAB
    ids = held_out(VOCAB)
    with torch.no_grad():
        ours, theirs = engine(ids)[..., :VOCAB], hf(ids).logits
    print(f"torch engine, {dialect}: logits' max abs difference {(ours - theirs).abs().max().item():.3g}")
    assert (ours - theirs).abs().max().item() <= TOLERANCE
    assert ours.abs().max().item() > 0.1  # a model that says something
    greedy = ids
    with torch.no_grad():
        for _ in range(NEW_TOKENS):
            greedy = torch.cat([greedy, engine(greedy)[:, -1, :VOCAB].argmax(-1, keepdim=True)], dim=1)
    assert hf_greedy(hf, ids) == greedy.tolist()
    tied = dialect == "main"
    assert ("lm_head.weight" in written_names(out)) is not tied and hf.config.tie_word_embeddings is tied
    assert hf.lm_head.weight.data_ptr() == hf.model.embed_tokens.weight.data_ptr() or not tied
    card = (out / "README.md").read_text()
    assert str(run.bundle_dir.resolve()) in card and "**step**: 5" in card and run.data["command"] in card
    assert card.startswith("---\nlibrary_name: transformers\n") and f"vocabulary {VOCAB}," in card
    generation = json.loads((out / "generation_config.json").read_text())
    assert (out / "tokenizer.json").is_file() and (generation["bos_token_id"], generation["eos_token_id"]) == (1, 2)


# --- nanotron, 8 ranks ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def nanotron_run(tmp_path_factory: pytest.TempPathFactory, demo_data: DemoData) -> Any:
    """Per dialect (made once): nanotron's trainer with 8 ranks (dp 2 x tp 2 x pp 2) on CPU for 5 steps."""
    made: dict[str, manifest.Manifest] = {}

    def get(dialect: str) -> manifest.Manifest:
        if dialect not in made:
            where = tmp_path_factory.mktemp(f"nanotron-{dialect}")
            run = bundle(where, demo_data, dialect, 2, 2, 2, "nanotron")
            train(config_of(run), 8, dialect, metrics=where / "metrics.jsonl")
            made[dialect] = run
        return made[dialect]

    return get


def nanotron_forward(step: Path, ids: torch.Tensor, dialect: str, where: Path) -> dict:
    """nanotron's own logits and greedy tokens for `ids`, from the checkpoint at `step` loaded into one process."""
    config = yaml.safe_load((step / "config.yaml").read_text())
    config["parallelism"].update(dp=1, tp=1, pp=1)
    config["model"]["init_method"] = {"path": str(step)}
    config["checkpoints"].update(checkpoints_path=str(where / "ckpt"), resume_checkpoint_path=None)
    (where / "one.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    (where / "tokens.json").write_text(json.dumps(ids.tolist()))
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "1",
               str(ROOT / "tests" / "nanotron_forward.py"), str(where / "one.yaml"), str(where / "tokens.json"),
               str(VOCAB), str(where / "out.json")]  # fmt: skip
    env = {**os.environ, **environment(dialect == "main")}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads((where / "out.json").read_text())


@pytest.mark.parametrize("dialect", ["0.4", "main"])
def test_nanotrons_8_rank_checkpoint_exports_to_its_logits(
    dialect: str, nanotron_run: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """tp and pp shards merged, fused qkv (GQA: 4 heads, 2 kv heads) and gate_up split, the rows past the
    tokenizer's 77 (of 192) removed, interleaved RoPE (0.4's always; main's asked) reordered; main's tied
    embeddings kept tied."""
    run = nanotron_run(dialect)
    step = run.checkpoints / "5"
    assert len(list((step / "model").rglob("*tp-rank-1-of-2.safetensors"))) > 0  # sharded as the issue says
    out = exported(run, tmp_path, capsys)
    hf = hf_model(out)
    assert hf.config.vocab_size == VOCAB and hf.config.tie_word_embeddings is (dialect == "main")
    ids = held_out(VOCAB)
    reference = nanotron_forward(step, ids, dialect, tmp_path)
    theirs = torch.tensor(reference["logits"])
    assert theirs.shape == (2, 12, 192)  # nanotron's padded vocabulary
    with torch.no_grad():
        ours = hf(ids).logits
    difference = (ours - theirs[..., :VOCAB]).abs().max().item()
    print(f"nanotron {dialect}, 8 ranks: logits' max abs difference {difference:.3g}")
    assert difference <= TOLERANCE and ours.abs().max().item() > 0.1
    assert hf_greedy(hf, ids) == reference["greedy"]


# --- refusals: nothing written ----------------------------------------------------------------------------------


def _copy(run: manifest.Manifest, where: Path) -> manifest.Manifest:
    """The run's bundle with its checkpoints copied to `where` (its manifest pointing there), to damage."""
    copied = where / "bundle"
    shutil.copytree(run.bundle_dir, copied)
    shutil.copytree(run.checkpoints, where / "ckpt")
    data = {**run.data, "outputs": {**run.data["outputs"], "checkpoints": str(where / "ckpt")}}
    (copied / "manifest.json").write_text(json.dumps(data))
    return manifest.load(copied)


def _refused(run: manifest.Manifest, error: type, *more: str, step: int | None = None) -> str:
    out = run.bundle_dir.parent / "out"
    with pytest.raises(error) as e:
        export(run, step, out, "float32", [])
    assert not out.exists() and not list(out.parent.glob(".out.tmp-*"))
    return str(e.value)


def test_refusals_name_what_is_wrong_and_write_nothing(
    nanotron_run: Any, torch_run: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _copy(nanotron_run("0.4"), tmp_path / "n")
    said = _refused(run, checkpoints.StepNotFound, step=7)
    assert "no checkpoint at step 7" in said and "complete checkpoints: 5" in said

    shard = next((run.checkpoints / "5" / "model").rglob("*qkv_proj/*tp-rank-1-of-2.safetensors"))
    moved = shard.read_bytes()
    shard.unlink()
    assert "not one whole tp set" in _refused(run, checkpoints.ShardsMissing)
    shard.write_bytes(moved[: len(moved) // 2])  # cut short, as a kill mid-write leaves it
    assert "cut short or damaged" in _refused(run, checkpoints.CheckpointIncomplete)
    shard.write_bytes(moved)

    (run.checkpoints / "5" / "checkpoint_metadata.json").rename(run.checkpoints / "5" / "meta.moved")
    assert "nanotron writes last" in _refused(run, checkpoints.CheckpointIncomplete, step=5)
    assert "holds no complete checkpoint" in _refused(run, checkpoints.StepNotFound)
    (run.checkpoints / "5" / "meta.moved").rename(run.checkpoints / "5" / "checkpoint_metadata.json")

    config = yaml.safe_load((run.checkpoints / "5" / "config.yaml").read_text())
    config["model"]["model_config"]["moe_config"] = {"num_experts": 8, "top_k": 2}
    (run.checkpoints / "5" / "config.yaml").write_text(yaml.safe_dump(config))
    assert "mixture-of-experts" in _refused(run, checkpoints.UnknownModel)

    # the command line: one line naming the refusal, no traceback, nothing written
    torch_copy = _copy(torch_run("0.4"), tmp_path / "t")
    assert jobs.main(["export", str(torch_copy.bundle_dir), "--step", "3"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: --step 3: the run has no checkpoint at step 3") and "Traceback" not in err
    (torch_copy.checkpoints / ".tmp-9-abcd").mkdir()
    assert "save of step 9 is in progress" in _refused(torch_copy, checkpoints.CheckpointIncomplete, step=9)


def test_an_interrupted_export_leaves_nothing_that_looks_finished(
    torch_run: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run = torch_run("0.4")
    out = tmp_path / "hf"
    real = folder.write_weights

    def killed(directory: Path, groups: list[weights.Group], dtype: torch.dtype) -> int:
        real(directory, groups[:2], dtype)  # a shard written, then the end
        raise KeyboardInterrupt

    monkeypatch.setattr(folder, "write_weights", killed)
    assert jobs.main(["export", str(run.bundle_dir), "--output", str(out)]) == 130
    assert not out.exists() and list(tmp_path.iterdir()) == []
    monkeypatch.setattr(folder, "write_weights", real)
    out.mkdir()
    assert jobs.main(["export", str(run.bundle_dir), "--output", str(out)]) == 1
    assert "exists; the export never overwrites" in capsys.readouterr().err and list(out.iterdir()) == []


def test_an_export_holds_its_step_against_the_runs_retention(
    torch_run: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run keeps only its newest step (--keep_last 1) and its supervisor purges while `jobs export --step 5`
    reads step 5: the export's lease keeps it; once the export has ended, the next purge removes it."""
    from launcher import checkpoint_layout as ckpt
    from launcher.retention import purge
    from launcher.retention.rules import Rules

    run = _copy(torch_run("0.4"), tmp_path / "t")
    shutil.copytree(run.checkpoints / "5", run.checkpoints / "10")
    for step in (5, 10):
        ckpt.note_save(run.checkpoints, step)
    (run.checkpoints / "latest").write_text("10\n")
    real, purged = folder.write_weights, []

    def while_reading(directory: Path, groups: list[weights.Group], dtype: torch.dtype) -> int:
        purged.append(purge.purge(run.checkpoints, Rules(keep_last=1), ""))
        return real(directory, groups, dtype)

    monkeypatch.setattr(folder, "write_weights", while_reading)
    assert jobs.main(["export", str(run.bundle_dir), "--step", "5", "--output", str(tmp_path / "hf")]) == 0
    assert purged[0].removed == [] and 5 in purged[0].kept  # read by the export
    assert ckpt.leases(run.checkpoints) == []  # dropped as the export ended
    assert [r["step"] for r in purge.purge(run.checkpoints, Rules(keep_last=1), "").removed] == [5]
