"""The exported folder, as transformers' `from_pretrained` reads it: config.json, generation_config.json,
model-0000K-of-0000N.safetensors with model.safetensors.index.json, the run's tokenizer, a README (model card).

Written into a temporary folder beside the output and renamed into place once whole: an export that fails or is
killed leaves no folder under the output's name (a leftover `.NAME.tmp-*` says what it is). A shard holds groups of
tensors up to the size of the largest one (at least SHARD_FLOOR), so memory stays within a few times the
largest tensor.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

from launcher import atomic
from launcher.export.checkpoints import Checkpoint, ExportError
from launcher.export.weights import Group

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}
INDEX = "model.safetensors.index.json"
SHARD_FLOOR = 256 * 2**20  # a shard's least budget (bytes): a small model in a few files, not one per tensor


def llama_config(checkpoint: Checkpoint, dtype: str) -> dict:
    """transformers' LlamaConfig of the checkpoint's model, as config.json holds it."""
    from transformers import LlamaConfig

    shape = checkpoint.shape
    config = LlamaConfig(  # type: ignore[call-arg]
        **shape.llama_config_kwargs(),
        attention_bias=False,
        mlp_bias=False,
        dtype=dtype,
    )
    config.architectures = ["LlamaForCausalLM"]
    return config.to_dict()


def planned_shards(groups: list[Group], itemsize: int) -> list[list[Group]]:
    """The groups in files of at most the largest group's size (or SHARD_FLOOR; a group is never split)."""
    budget = max(max((g.numel for g in groups), default=0) * itemsize, SHARD_FLOOR)
    shards: list[list[Group]] = [[]]
    size = 0
    for group in groups:
        if shards[-1] and size + group.numel * itemsize > budget:
            shards.append([])
            size = 0
        shards[-1].append(group)
        size += group.numel * itemsize
    return shards


def write_weights(directory: Path, groups: list[Group], dtype: torch.dtype) -> int:
    """The safetensors shards and their index; returns the bytes of weights written."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    shards = planned_shards(groups, itemsize)
    weight_map, total = {}, 0
    for k, shard in enumerate(shards, 1):
        name = f"model-{k:05d}-of-{len(shards):05d}.safetensors"
        tensors = {}
        for group in shard:
            for tensor_name, tensor in group.load().items():
                if tuple(tensor.shape) != group.shapes[tensor_name]:
                    raise ExportError(f"{tensor_name} has shape {tuple(tensor.shape)}, its checkpoint's metadata "
                                      f"said {group.shapes[tensor_name]}: a damaged checkpoint")  # fmt: skip
                tensors[tensor_name] = tensor.to(dtype).contiguous()
                weight_map[tensor_name] = name
                total += tensors[tensor_name].numel() * itemsize
        save_file(tensors, str(directory / name), metadata={"format": "pt"})
        del tensors
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (directory / INDEX).write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")
    return total


def write_tokenizer(directory: Path, tokenizer: str | None) -> str:
    """The run's tokenizer's files (transformers' own save of it); what was written, in words."""
    if not tokenizer:
        return "no tokenizer: the run's config names none"
    from transformers import AutoTokenizer

    try:
        AutoTokenizer.from_pretrained(tokenizer).save_pretrained(str(directory))
    except (OSError, ValueError) as e:
        raise ExportError(
            f"the run's tokenizer {tokenizer} cannot be read here ({str(e).splitlines()[0]}): give a "
            "node that can read it, or copy it to a local directory the run's config names"
        ) from None
    return f"the run's tokenizer, {tokenizer}"


def model_card(lines: dict[str, str]) -> str:
    """README.md: where the model came from (each line a field)."""
    body = "\n".join(f"- **{key}**: {value}" for key, value in lines.items())
    return ("---\nlibrary_name: transformers\npipeline_tag: text-generation\ntags: [llama, nanotron]\n---\n\n"
            f"# {lines.get('run', 'model')}\n\nA Llama exported by the nanotron Slurm launcher "
            f"(`python -m launcher.jobs export`).\n\n{body}\n")  # fmt: skip


def temporary_beside(output: Path) -> Path:
    return output.parent / f".{output.name}.tmp-{secrets.token_hex(4)}"


def write(output: Path, checkpoint: Checkpoint, groups: list[Group], dtype: str, card: dict[str, str]) -> int:
    """The whole folder at `output` (which must not exist), or nothing there. Returns the weights' bytes."""
    if output.exists():
        raise ExportError(f"{output} exists; the export never overwrites: give another --output, or move it away")
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_beside(output)
    tmp.mkdir()
    try:
        (tmp / "config.json").write_text(json.dumps(llama_config(checkpoint, dtype), indent=2) + "\n")
        generation = {"bos_token_id": checkpoint.shape.bos_token_id, "eos_token_id": checkpoint.shape.eos_token_id}
        (tmp / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
        card["tokenizer"] = write_tokenizer(tmp, checkpoint.tokenizer)
        total = write_weights(tmp, groups, DTYPES[dtype])
        (tmp / "README.md").write_text(model_card(card), encoding="utf-8")
        for f in tmp.iterdir():
            _fsync(f)
        os.rename(tmp, output)  # refuses a folder made meanwhile at `output` (not empty): nothing is replaced
        atomic.fsync_dir(output.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return total


def _fsync(path: Path) -> None:
    if path.is_file():
        with open(path, "rb") as f:
            os.fsync(f.fileno())
