"""A checkpoint's tensors under transformers' Llama names, planned from shapes alone and loaded one group at a
time (memory: the largest tensor and its shards, never the model).

nanotron (either dialect): each parameter is a folder path with one safetensors file (key `data`) per tp/pp shard;
a sharded file's metadata says which slices of the whole it holds (`local_global_slices_pairs`) and the whole's
shape (`unsharded_shape`), so the shards are merged by nanotron's own record of how it cut them: the fused
`qkv_proj` ([q | k | v] rows, each cut per tp rank) and `gate_up_proj` ([gate | up]) come out whole, then split.
The embedding's and lm_head's rows past the checkpoint's vocabulary (`Checkpoint.shape`: the tokenizer's, where the
export read it) are dropped, the launcher's rounding and the engine's padding; where the engine rotated q and k
by interleaved pairs (0.4; main with rope_interleaved), each head's rows are reordered into transformers'
rotate-half order (the same rotation of the same pairs: q.k is unchanged). Tied embeddings are saved once by
nanotron (under the embedding's name) and written once here (transformers ties lm_head to it).

The torch engine: `state.pt`'s model, already under transformers' names, read memory-mapped; its vocabulary padded
and its RoPE rotated as nanotron's would be, so the same padding is dropped and the same rows reordered.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from launcher.checkpoint_layout import TORCH_STATE
from launcher.export.checkpoints import Checkpoint, CheckpointIncomplete, ShardsMissing, UnknownModel
from launcher.nanotron_config.shape import ModelShape

SHARD = re.compile(r"^(?P<leaf>.+?)_pp-rank-(?P<pp>\d+)-of-(?P<pp_size>\d+)_tp-rank-(?P<tp>\d+)-of-(?P<tp_size>\d+)$")
VOCABULARY_ROWS = ("model.embed_tokens.weight", "lm_head.weight")
LAYER = re.compile(r"^model\.decoder\.(?P<i>\d+)\.(?P<leaf>.+)$")


@dataclass(frozen=True)
class Group:
    """Tensors that come from one stored parameter: their names and shapes (known before any is read) and how to
    read them."""

    shapes: dict[str, tuple[int, ...]]
    load: Callable[[], dict[str, torch.Tensor]]

    @property
    def numel(self) -> int:
        return sum(_numel(s) for s in self.shapes.values())


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def expected_names(shape: ModelShape) -> set[str]:
    """Every tensor of a transformers Llama of this shape (lm_head only where it is not tied)."""
    names = {"model.embed_tokens.weight", "model.norm.weight"} | ({"lm_head.weight"} - _tied(shape))
    for i in range(shape.num_layers):
        names |= {f"model.layers.{i}.{leaf}.weight" for leaf in (
            "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
            "mlp.up_proj", "mlp.down_proj", "input_layernorm", "post_attention_layernorm")}  # fmt: skip
    return names


def _tied(shape: ModelShape) -> set[str]:
    return {"lm_head.weight"} if shape.tie_word_embeddings else set()


def interleaved_to_halves(rows: torch.Tensor, heads: int) -> torch.Tensor:
    """q's or k's rows, each head's (x0, x1, x2, x3, ...) pairs (GPT-J) put in rotate-half order (x0, x2, ...,
    x1, x3, ...): the pair (2i, 2i+1) becomes (i, i + head_dim/2), rotated by the same angle."""
    out, inp = rows.shape
    return rows.view(heads, out // heads // 2, 2, inp).transpose(1, 2).reshape(out, inp)


def groups(checkpoint: Checkpoint) -> list[Group]:
    """The checkpoint's tensors as transformers names them, in groups; every tensor of the model accounted for."""
    found = _torch_groups(checkpoint) if checkpoint.engine == "torch" else _nanotron_groups(checkpoint)
    names = [n for g in found for n in g.shapes]
    expected = expected_names(checkpoint.shape)
    missing, extra = expected - set(names), set(names) - expected
    if extra:
        raise UnknownModel(f"{checkpoint.directory} holds tensors a Llama of its config does not have: "
                           f"{', '.join(sorted(extra)[:6])}: not a model the export knows")  # fmt: skip
    if missing:
        raise ShardsMissing(f"{checkpoint.directory} lacks {len(missing)} of the model's tensors "
                            f"({', '.join(sorted(missing)[:6])}): a damaged or partly copied checkpoint; export "
                            "another step, or copy the checkpoint again")  # fmt: skip
    return found


# --- the torch engine ---------------------------------------------------------------------------------------------


def _torch_groups(checkpoint: Checkpoint) -> list[Group]:
    path = checkpoint.directory / TORCH_STATE
    try:  # memory-mapped: a tensor is read when it is copied out, not before
        model = torch.load(path, map_location="cpu", weights_only=True, mmap=True)["model"]
    except (OSError, RuntimeError, KeyError, EOFError) as e:
        raise CheckpointIncomplete(f"{path} cannot be read ({str(e).splitlines()[0]}): a damaged checkpoint; "
                                   "export another step") from None  # fmt: skip
    vocab, out = checkpoint.shape.vocab_size, []
    for name, t in model.items():
        if name in _tied(checkpoint.shape):
            continue
        if name in VOCABULARY_ROWS:  # the engine pads the vocabulary as nanotron does
            out.append(Group({name: (vocab, *t.shape[1:])}, functools.partial(_unpadded, name, vocab, t)))
        elif checkpoint.rope_interleaved and name.endswith(("q_proj.weight", "k_proj.weight")):
            heads = checkpoint.shape.num_heads if name.endswith("q_proj.weight") else checkpoint.shape.num_kv_heads
            out.append(Group({name: tuple(t.shape)}, functools.partial(_halves_of_pairs, name, heads, t)))
        else:
            out.append(Group({name: tuple(t.shape)}, functools.partial(_as, name, t)))
    return out


# --- nanotron -------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Stored:
    """One nanotron parameter: its name (`.pp_block` dropped), its files, its whole shape."""

    name: str
    files: list[Path]
    shape: tuple[int, ...]


def stored_parameters(model_dir: Path) -> list[Stored]:
    """Every parameter under a nanotron checkpoint's `model/` folder, its shard set checked complete."""
    by_name: dict[str, list[tuple[Path, re.Match | None]]] = {}
    for path in sorted(model_dir.rglob("*.safetensors")):
        stem = path.name.removesuffix(".safetensors")
        if "_exp-rank-" in stem:
            raise UnknownModel(f"{path}: expert-parallel shards (a mixture-of-experts model), which the export "
                               "does not know")  # fmt: skip
        match = SHARD.match(stem)
        leaf = (match["leaf"] if match else stem).removeprefix("model_")
        parts = [p for p in path.relative_to(model_dir).parent.parts if p != "pp_block"]
        by_name.setdefault(".".join([*parts, leaf]), []).append((path, match))
    return [_stored(name, files) for name, files in sorted(by_name.items())]


def _stored(name: str, files: list[tuple[Path, re.Match | None]]) -> Stored:
    paths = [p for p, _ in files]
    if all(m is None for _, m in files):
        return Stored(name, paths[:1], _read_shape(paths[0]))
    sizes = {int(m["tp_size"]) for _, m in files if m is not None}
    ranks = sorted(int(m["tp"]) for _, m in files if m is not None)
    if len(sizes) != 1 or ranks != list(range(sizes.pop())) or any(m is None for _, m in files):
        raise ShardsMissing(f"{paths[0].parent}: the shards of {name} are not one whole tp set (tp ranks found: "
                            f"{ranks}): a damaged or partly copied checkpoint; export another step")  # fmt: skip
    metadata = _metadata(paths[0])
    shape = whole_shape(metadata.get("unsharded_shape", ""))
    if not shape:
        raise CheckpointIncomplete(f"{paths[0]} has no unsharded_shape in its metadata: not nanotron's format")
    return Stored(name, paths, shape)


def whole_shape(text: str) -> tuple[int, ...]:
    """'(128, 64)' as a shape; numpy 2's '(np.int64(128), 64)' too (0.4 wrote it so, unmended)."""
    pieces = [p for p in text.strip().removeprefix("(").removesuffix(")").split(",") if p.strip()]
    return tuple(int(re.findall(r"\d+", p)[-1]) for p in pieces if re.search(r"\d", p))


def _metadata(path: Path) -> dict[str, str]:
    try:
        with safe_open(str(path), framework="pt") as f:
            return f.metadata() or {}
    except (SafetensorError, OSError) as e:
        raise CheckpointIncomplete(f"{path} cannot be read ({e}): cut short or damaged; export another step") from None


def _read_shape(path: Path) -> tuple[int, ...]:
    try:
        with safe_open(str(path), framework="pt") as f:
            return tuple(f.get_slice("data").get_shape())
    except (SafetensorError, OSError) as e:
        raise CheckpointIncomplete(f"{path} cannot be read ({e}): cut short or damaged; export another step") from None


def _slices(text: str) -> tuple[slice, ...]:
    return tuple(slice(*(None if x == "None" else int(x) for x in part.split(","))) for part in text.split("|"))


def merged(stored: Stored) -> torch.Tensor:
    """The whole parameter, its shards put where their metadata says."""
    if len(stored.files) == 1 and not SHARD.match(stored.files[0].name.removesuffix(".safetensors")):
        return _read(stored.files[0])
    whole: torch.Tensor | None = None
    covered = 0
    for path in stored.files:
        shard = _read(path)
        if whole is None:
            whole = torch.empty(stored.shape, dtype=shard.dtype)
        for pair in _metadata(path)["local_global_slices_pairs"].split(";"):
            local, global_ = pair.split("#")
            part = shard[_slices(local)]
            whole[_slices(global_)] = part
            covered += part.numel()
        del shard
    if whole is None or covered != whole.numel():
        raise ShardsMissing(f"the shards of {stored.name} cover {covered} of its {_numel(stored.shape)} values: "
                            "a damaged checkpoint; export another step")  # fmt: skip
    return whole


def _read(path: Path) -> torch.Tensor:
    try:
        with safe_open(str(path), framework="pt") as f:
            return f.get_tensor("data")
    except (SafetensorError, OSError) as e:
        raise CheckpointIncomplete(f"{path} cannot be read ({e}): cut short or damaged; export another step") from None


def _nanotron_groups(checkpoint: Checkpoint) -> list[Group]:
    shape = checkpoint.shape
    d, heads, kv, inter = shape.head_dim, shape.num_heads, shape.num_kv_heads, shape.intermediate_size
    out, taken = [], set()
    for stored in stored_parameters(checkpoint.directory / "model"):
        name, whole = stored.name, stored.shape
        layer = LAYER.match(name)
        split: Callable[[torch.Tensor], dict[str, torch.Tensor]]
        if name in ("model.token_position_embeddings.token_embedding.weight", "model.lm_head.weight"):
            tied = shape.tie_word_embeddings
            target = "model.embed_tokens.weight" if "token_embedding" in name or tied else "lm_head.weight"
            if target in taken:  # tied: nanotron saves one of the two (under the first name it tied)
                continue
            taken.add(target)
            shapes = {target: (shape.vocab_size, *whole[1:])}
            split = functools.partial(_unpadded, target, shape.vocab_size)
        elif name == "model.final_layer_norm.weight":
            shapes = {"model.norm.weight": whole}
            split = functools.partial(_as, "model.norm.weight")
        elif layer and layer["leaf"] == "attn.qkv_proj.weight":
            p = f"model.layers.{layer['i']}.self_attn."
            rows = {p + "q_proj.weight": heads * d, p + "k_proj.weight": kv * d, p + "v_proj.weight": kv * d}
            shapes = {n: (r, whole[1]) for n, r in rows.items()}
            split = functools.partial(_qkv, p, heads, kv, d, checkpoint.rope_interleaved)
        elif layer and layer["leaf"] == "mlp.gate_up_proj.weight":
            p = f"model.layers.{layer['i']}.mlp."
            shapes = {p + "gate_proj.weight": (inter, whole[1]), p + "up_proj.weight": (inter, whole[1])}
            split = functools.partial(_halves, p + "gate_proj.weight", p + "up_proj.weight", inter)
        elif layer and layer["leaf"] in LAYER_LEAVES:
            target = f"model.layers.{layer['i']}.{LAYER_LEAVES[layer['leaf']]}"
            shapes, split = {target: whole}, functools.partial(_as, target)
        else:
            raise UnknownModel(f"{stored.files[0]}: nanotron parameter {name} is not one of a Llama's: not a "
                               "model the export knows")  # fmt: skip
        out.append(Group(shapes, functools.partial(_split_merged, stored, split)))
    return out


def _split_merged(stored: Stored, split: Callable[[torch.Tensor], dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    return split(merged(stored))


def _as(name: str, whole: torch.Tensor) -> dict[str, torch.Tensor]:
    return {name: whole}


def _halves_of_pairs(name: str, heads: int, rows: torch.Tensor) -> dict[str, torch.Tensor]:
    return {name: interleaved_to_halves(rows, heads)}


def _unpadded(name: str, vocab: int, whole: torch.Tensor) -> dict[str, torch.Tensor]:
    return {name: whole[:vocab]}


def _halves(first: str, second: str, rows: int, whole: torch.Tensor) -> dict[str, torch.Tensor]:
    a, b = whole.split([rows, rows])
    return {first: a, second: b}


LAYER_LEAVES = {
    "attn.o_proj.weight": "self_attn.o_proj.weight",
    "mlp.down_proj.weight": "mlp.down_proj.weight",
    "input_layernorm.weight": "input_layernorm.weight",
    "post_attention_layernorm.weight": "post_attention_layernorm.weight",
}


def _qkv(prefix: str, heads: int, kv: int, d: int, interleaved: bool, whole: torch.Tensor) -> dict[str, torch.Tensor]:
    if whole.shape[0] != (heads + 2 * kv) * d:
        raise UnknownModel(f"{prefix}qkv_proj has {whole.shape[0]} rows where the config's heads make "
                           f"{(heads + 2 * kv) * d}: the config does not describe this checkpoint")  # fmt: skip
    q, k, v = whole.split([heads * d, kv * d, kv * d])
    if interleaved:
        q, k = interleaved_to_halves(q, heads), interleaved_to_halves(k, kv)
    return {prefix + "q_proj.weight": q, prefix + "k_proj.weight": k, prefix + "v_proj.weight": v}
