"""The exported folder, as transformers' `from_pretrained` reads it: config.json, generation_config.json, the weights
(model.safetensors, or model-0000K-of-0000N.safetensors with model.safetensors.index.json), the run's tokenizer, a
README (model card).

Written by the libraries where they fit an export that never holds the model: config.json by transformers'
`LlamaConfig`, generation_config.json by its `GenerationConfig`, the tokenizer by its own `save_pretrained`, the
README by huggingface_hub's `ModelCard`; the shards planned by huggingface_hub's splitter
(`split_state_dict_into_shards_factory`, which `split_torch_state_dict_into_shards` calls with a tensor's bytes),
here over the groups' bytes, known from their shapes before any tensor is read; each shard written by safetensors'
`save_file`, its tensors loaded one group at a time. Not huggingface_hub's `save_torch_state_dict` nor
transformers' `save_pretrained` of a model: both take every tensor in memory at once. A group (q, k and v of one
fused parameter) is one entry of the plan, so it is read once and never split over two files. A shard holds
groups up to the size of the largest one (at least SHARD_FLOOR), so memory stays within a few times the largest
tensor.

Written into a temporary folder beside the output and renamed into place once whole: an export that fails or is
killed leaves no folder under the output's name (a leftover `.NAME.tmp-*` says what it is). Every file takes the
mode the user's umask gives a new file (safetensors writes its own 0600: set again here), so a group that shares
the folder reads the weights as it reads the rest.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
from pathlib import Path
from typing import Any

import torch
from huggingface_hub import ModelCard, ModelCardData
from huggingface_hub.serialization import split_state_dict_into_shards_factory
from safetensors.torch import save_file

from launcher import atomic
from launcher.export.checkpoints import Checkpoint, ExportError
from launcher.export.weights import Group

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}
WEIGHTS = "model{suffix}.safetensors"  # transformers' names: model.safetensors, model-00001-of-00002.safetensors
INDEX = "model.safetensors.index.json"  # where the weights take more than one file
SHARD_FLOOR = 256 * 2**20  # a shard's least budget (bytes): a small model in a few files, not one per tensor


def write_config(directory: Path, checkpoint: Checkpoint, dtype: str) -> None:
    """config.json: transformers' LlamaConfig of the checkpoint's model; generation_config.json: its bos and eos."""
    from transformers import GenerationConfig, LlamaConfig

    shape = checkpoint.shape
    config = LlamaConfig(  # type: ignore[call-arg]
        **shape.llama_config_kwargs(),
        attention_bias=False,
        mlp_bias=False,
        dtype=dtype,
    )
    config.architectures = ["LlamaForCausalLM"]
    config.save_pretrained(str(directory))
    GenerationConfig(bos_token_id=shape.bos_token_id, eos_token_id=shape.eos_token_id).save_pretrained(str(directory))


def planned_shards(groups: list[Group], itemsize: int) -> dict[str, list[Group]]:
    """File name -> its groups, in order: huggingface_hub's plan over the groups' bytes, in files of at most the
    largest group's size (or SHARD_FLOOR; a group is never split)."""
    budget = max(max((g.numel for g in groups), default=0) * itemsize, SHARD_FLOOR)
    by_key = {next(iter(g.shapes)): g for g in groups}  # a group by its first tensor's name
    split = split_state_dict_into_shards_factory(
        by_key, get_storage_size=lambda g: g.numel * itemsize, filename_pattern=WEIGHTS, max_shard_size=budget
    )
    return {name: [by_key[key] for key in keys] for name, keys in split.filename_to_tensors.items()}


def new_file_mode() -> int:
    """The mode `open` gives a new file here: 0666 less the umask (read without changing it, where Linux says it)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            mask = next(int(line.split()[1], 8) for line in status if line.startswith("Umask:"))
    except (OSError, StopIteration, ValueError):
        mask = os.umask(0o022)
        os.umask(mask)
    return 0o666 & ~mask


def write_weights(directory: Path, groups: list[Group], dtype: torch.dtype) -> int:
    """The safetensors files (and their index, where there are several); returns the bytes of weights written."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    shards = planned_shards(groups, itemsize)
    mode = new_file_mode()
    weight_map, total = {}, 0
    for name, shard in shards.items():
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
        os.chmod(directory / name, mode)
        del tensors
    if len(shards) > 1:
        index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
        (directory / INDEX).write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")
    return total


def read_tokenizer(name: str) -> Any:
    """The run's tokenizer (transformers' AutoTokenizer)."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(name)
    except (OSError, ValueError) as e:
        raise ExportError(
            f"the run's tokenizer {name} cannot be read here ({str(e).splitlines()[0]}): give a "
            "node that can read it, or copy it to a local directory the run's config names"
        ) from None


def vocabulary(tokenizer: str) -> int:
    """The rows a model needs for every id the tokenizer gives (its added tokens too): its largest id, plus one. The
    tokenizer is let go on return (and read again to be saved): a large one's memory is never held beside the
    weights' (a tokenizer of 128256 added tokens takes 0.3 GiB)."""
    return max(read_tokenizer(tokenizer).get_vocab().values()) + 1


def write_tokenizer(directory: Path, tokenizer: str | None) -> str:
    """The run's tokenizer's files (transformers' own save of it); what was written, in words."""
    if not tokenizer:
        return "no tokenizer: the run's config names none"
    read_tokenizer(tokenizer).save_pretrained(str(directory))
    return f"the run's tokenizer, {tokenizer}"


def model_card(lines: dict[str, str]) -> ModelCard:
    """README.md: where the model came from (each line a field), under huggingface_hub's metadata block."""
    data = ModelCardData(library_name="transformers", pipeline_tag="text-generation", tags=["llama", "nanotron"])
    body = "\n".join(f"- **{key}**: {value}" for key, value in lines.items())
    return ModelCard(f"---\n{data.to_yaml()}\n---\n\n# {lines.get('run', 'model')}\n\nA Llama exported by the "
                     f"nanotron Slurm launcher (`python -m launcher.jobs export`).\n\n{body}\n")  # fmt: skip


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
        write_config(tmp, checkpoint, dtype)
        card["tokenizer"] = write_tokenizer(tmp, checkpoint.tokenizer)
        total = write_weights(tmp, groups, DTYPES[dtype])
        model_card(card).save(tmp / "README.md")
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
