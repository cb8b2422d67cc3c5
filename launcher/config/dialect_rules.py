"""The launcher's rules where the two nanotron dialects differ: which model a --config may hold, the RoPE theta
0.4 can write, and what a run written in 0.4's dialect cannot carry (pure; `launcher.nanotron_config.dialect` has the
dialects themselves)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from launcher.config.flags import ModelArgs
from launcher.config.spec import RunSpec
from launcher.nanotron_config import dialect, schema, stages
from launcher.problems import Problem

OTHER_MODELS = {"is_qwen2_config": "Qwen2", "is_starcoder2_config": "Starcoder2"}


def model_problems(config: dict, target: Path) -> list[Problem]:
    """A --config model the launcher cannot write as it is: the launcher trains nanotron's Llama, and laying
    another model's keys onto its Llama config would make a hybrid neither nanotron loads as meant."""
    mc = schema.get_path(config, ("model", "model_config"))
    if not isinstance(mc, dict):
        return []
    kinds = [name for key, name in OTHER_MODELS.items() if mc.get(key)]
    moe = sorted(k for k in mc if (k.startswith("moe_") or "experts" in k) and mc[k] is not None)
    ep = schema.get_path(config, ("parallelism", "expert_parallel_size"))
    out = []
    if kinds or moe:
        what = f"a {kinds[0]} model" if kinds else "a mixture-of-experts Llama"
        keys = ", ".join(moe or [next(k for k in OTHER_MODELS if mc.get(k))])
        out.append(
            Problem(
                "config",
                f"{target}'s model_config is {what} ({keys}); the launcher writes and trains nanotron's dense Llama "
                "only, and will not merge these keys into one",
                "train it with nanotron's own run_train.py, or remove them for a dense Llama (is_llama_config: true)",
            )
        )
    if isinstance(ep, int) and ep > 1:
        out.append(
            Problem(
                "config",
                f"parallelism.expert_parallel_size is {ep}: a dense Llama has no experts, and nanotron's launcher "
                "counts ep in the node count while its parallel context does not (it cannot start)",
                f"set expert_parallel_size: 1 in {target}",
            )
        )
    return out


def rope_theta(model: ModelArgs, written: str, size: str, chosen: set[str]) -> tuple[ModelArgs, dict[str, str]]:
    """nanotron 0.4's Llama has no rope_theta (it uses 10000): a preset's other theta cannot be written there, and
    the summary says so; one you chose stays, and validation says it needs nanotron main."""
    theta = model.rope_theta if model.rope_theta is not None else dialect.ROPE_THETA_04
    if written == "0.4" and "rope_theta" not in chosen and theta != dialect.ROPE_THETA_04:
        note = f"nanotron 0.4 has no rope_theta: its Llama uses 10000, not the {size} preset's {theta:g}"
        return dataclasses.replace(model, rope_theta=dialect.ROPE_THETA_04), {"rope_theta": note}
    return dataclasses.replace(model, rope_theta=theta), {}


CP_UNSOUND = (
    "nanotron main splits each sequence over the cp ranks, but only its Qwen2 model attends across them (ring "
    "attention): its Llama would attend within each piece, and its trainer refuses a fresh start with cp > 1 "
    "('Init with Context parallel size > 1 not supported yet')"
)


def written_problems(spec: RunSpec) -> list[Problem]:
    """What the run's config (`spec.config`, canonical) cannot say in the dialect it is written in."""
    out = []
    values, config = spec.flag_values(), spec.config
    written = values["nanotron_dialect"]
    if values["cp"] > 1:
        fix = "use --cp 1 (more GPUs: a larger dp, tp or pp)"
        out.append(Problem("cp", f"--cp {values['cp']}: {CP_UNSOUND}", fix))
    if values["cp"] < 1:
        out.append(Problem("cp", f"must be a positive integer, got {values['cp']}", "give --cp 1"))
    if written != "0.4":
        return out + stages.seq_len_problems(config, values["max_seq_len"])
    why = "the job's nanotron is 0.4 (the PyPI release)"
    if values["rope_theta"] != dialect.ROPE_THETA_04:
        fix = "install nanotron from git on the nodes (--nanotron_dialect main), or leave --rope_theta out"
        out.append(
            Problem("rope_theta", f"--rope_theta {values['rope_theta']:g}: {why}, whose Llama has only 10000", fix)
        )
    benchmark = schema.get_path(config, ("general", "benchmark_csv_path"))
    if benchmark and spec.extra_env.get("NANOTRON_BENCHMARK") != "1":  # what nanotron 0.4 asserts, as the job sees it
        out.append(Problem("config", f"general.benchmark_csv_path is {benchmark!r}: nanotron 0.4 then asserts "
                           "NANOTRON_BENCHMARK=1 at start-up", "give --extra_env NANOTRON_BENCHMARK=1, or set "
                           "benchmark_csv_path: null"))  # fmt: skip
    if spec.stages:
        fix = "install nanotron from git on the nodes (--nanotron_dialect main), or leave --data_stages out"
        out.append(Problem("data_stages", f"{why}, which has no data stages: one dataset (or mixture) all run", fix))
    for path, value in dialect.to_04(config)[1]:
        if path in (schema.FLAG_PATHS["rope_theta"], schema.FLAG_PATHS["cp"]):
            continue  # a flag's value: said above
        if path[0] == "data_stages" and spec.stages:
            continue  # the flag's: said above
        where = ".".join(path)
        fix = "remove it from --config, or run nanotron main (--nanotron_dialect main)"
        out.append(Problem("config", f"{where}: {value!r} is nanotron main's and {why}, which cannot hold it", fix))
    return out
