"""The cluster's checks before the queue: the world as it is now, asked just before anything is written.

- where the run writes: every output directory can be created and written, and the checkpoints' filesystem has
  room for one checkpoint (`launcher.bundle.storage`);
- the jobs a `--dependency` names, as Slurm knows them now (`launcher.slurm.awaited_jobs`);
- a live job of the same run, which would write the same checkpoints (`launcher.slurm.one_writer`);
- the follower's rate (LAUNCHER_POLL_SECONDS, `launcher.slurm.follow`), where set;
- a `gpu` GRES in sbatch's environment (SBATCH_GRES) beside the script's --gpus-per-node (`launcher.slurm.releases`);
- `--account`, against the user's associations where the cluster keeps them (accounting: `sacctmgr`);
- a resume into another nanotron dialect, or into a layout nanotron cannot re-shard its checkpoint into;
- Slurm's verdict on the rendered script (`judge`: `sbatch --test-only`), once the script exists; a job that only
  nodes out of service now keep from being placed is held in the queue, not refused (`holds_until_nodes_return`).

A dry run asks Slurm nothing. `launcher.runs.launch.check` runs `problems` after the flags' own checks
(`launcher.config.validate`) and the memory fit (`launcher.perf.fit`), and reports every problem at once.
"""

from __future__ import annotations

import os
from pathlib import Path

from launcher.bundle import storage
from launcher.config import hostlist, ranges
from launcher.config.spec import RunSpec
from launcher.errors import QueueFull, SlurmUnavailable, SubmissionError
from launcher.nanotron_config import dialect
from launcher.nanotron_config.parallel import resume_relayout
from launcher.perf import sizes
from launcher.problems import Problem
from launcher.slurm import awaited_jobs, client, follow, one_writer, releases

OUTPUT_FLAGS = ("configs_path", "slurm_scripts_dir", "slurm_logs_path", "checkpoints_path")


def storage_problems(spec: RunSpec, earlier: list[Problem]) -> list[Problem]:
    """Output directories that cannot be written, and a checkpoints filesystem without room for one checkpoint."""
    a, out = spec.args, []
    for flag in OUTPUT_FLAGS:
        out += storage.writable_problems(flag, getattr(a.paths, flag))
    if a.logging.profiler_export_path:
        out += storage.writable_problems("profiler_export_path", a.logging.profiler_export_path)
    said = {p.flag for p in earlier + out}
    if spec.shape.resolved and not said & {"checkpoints_path", "save_interval"} and not ranges.problems(a):
        one = storage.space_problems(sizes.parameters(spec), a.paths.checkpoints_path)
        out += one
        if not one and not said & {"keep_last", "keep_every"}:  # the forecast: the most the run keeps at once
            out += storage.peak_problems(sizes.disk(spec), a.paths.checkpoints_path)
    return out


def dependency_problems(spec: RunSpec, earlier: list[Problem]) -> list[Problem]:
    """The jobs --dependency names, judged by their states now. Asked whatever else is wrong, so that every mistake
    is reported at once; only a dependency that does not parse (already a problem) is not looked up."""
    if spec.dependency is None:  # none, or one that does not parse (resolution said so)
        return []
    try:
        return awaited_jobs.state_problems(spec.dependency, client.job_states)
    except SlurmUnavailable as e:
        if not earlier:
            raise
        # Slurm being down is not a mistake in the flags: say so beside the mistakes, not instead of them
        return [
            Problem(
                "dependency", f"Slurm could not be asked about its jobs: {e}", "they are checked once Slurm answers"
            )
        ]


def account_problems(spec: RunSpec) -> list[Problem]:
    """--account against the user's associations, where the cluster keeps them (accounting); nothing otherwise."""
    account = spec.args.slurm.account
    accounts = client.user_accounts() if account else None
    if not account or accounts is None or account in accounts:
        return []
    yours = ", ".join(accounts) if accounts else "none: ask the cluster's admins for an association"
    return [Problem("account", f"{account!r} is not an account you may submit to here",
                    f"use one of yours ({yours}), or leave --account out for your default account")]  # fmt: skip


def resume_problems(spec: RunSpec) -> list[Problem]:
    """A run resumed in another nanotron dialect than its checkpoints were written in: nanotron main's checkpoints
    (format 1.5, with data-stage metadata) are not 0.4's (1.2), and the model's RoPE (theta, layout) may differ."""
    a = spec.args
    if not a.paths.resume:
        return []
    root = spec.checkpoints_dir
    saved, how = dialect.of_checkpoints(root)
    if saved is None or saved == spec.dialect.dialect:
        return relayout_problems(spec, root)
    return [
        Problem(
            "nanotron_dialect",
            f"run {a.run_name}'s checkpoints were written from a nanotron {saved} config ({how}), but this launch "
            f"writes {spec.dialect.dialect}'s ({spec.dialect.why}); a checkpoint does not cross dialects",
            f"resume where the job's nanotron is {saved} (--nanotron_dialect {saved}), or start afresh: "
            "--resume false or a new --run_name",
        )
    ]


def relayout_problems(spec: RunSpec, root: Path) -> list[Problem]:
    """A run resumed into a layout nanotron cannot re-shard its checkpoint into (launcher.nanotron_config.parallel)."""
    saved, where = dialect.saved_layout(root)
    p = spec.args.parallelism
    new = {"dp": p.dp or 1, "tp": p.tp or 1, "pp": p.pp or 1, "zero_stage": p.zero_stage}
    why = None if saved is None else resume_relayout(saved, new, spec.dialect.dialect)
    if why is None or saved is None:
        return []
    flags = f"--dp {saved['dp']} --tp {saved['tp']} --pp {saved['pp']} --zero_stage {saved['zero_stage']}"
    return [
        Problem(
            "tp" if saved["tp"] != new["tp"] else "pp" if saved["pp"] != new["pp"] else "dp",
            f"run {spec.args.run_name} resumes from {where}, but {why}",
            f"resume in the saved layout ({flags}, on {saved['dp'] * saved['tp'] * saved['pp']} GPUs), or start "
            "afresh: --resume false or a new --run_name",
        )
    ]


def container_problems(spec: RunSpec) -> list[Problem]:
    """With --container_image: srun here must have pyxis (its --container-image), as the nodes' srun then has."""
    if not spec.args.container.container_image or client.srun_lists("--container-image"):
        return []
    return [
        Problem(
            "container_image",
            "this cluster's srun has no --container-image (`srun --help` does not list it: pyxis is not loaded)",
            "ask the cluster's admins for pyxis + enroot, or launch without --container_image",
        )
    ]


def problems(spec: RunSpec, earlier: list[Problem], ask_slurm: bool) -> list[Problem]:
    """Every problem the cluster's checks find; `earlier`: the flags' own and the memory fit's, which some of these
    defer to."""
    found = storage_problems(spec, earlier) + resume_problems(spec)
    if ask_slurm:
        found += follow.env_problems()  # the follower's rate, before the job is submitted to be followed
        found += releases.gres_problems(os.environ)  # a GPU request of sbatch's environment beside the script's
        try:
            found += container_problems(spec)
        except SlurmUnavailable:
            pass  # said by the look-ups below or by Slurm's verdict on the script
        found += dependency_problems(spec, earlier + found)
        found += account_problems(spec)
        if not any(p.flag == "run_name" for p in earlier):
            try:
                found += one_writer.problems(spec)
            except SlurmUnavailable:
                pass  # said by the dependency look-up or by Slurm's verdict on the script, whichever asks next
    return found


def judge(spec: RunSpec, script_text: str) -> str:
    """Slurm's verdict on the rendered script, as the summary says it: its forecast (`sbatch --test-only`), or
    that it will hold the job until nodes out of service now return (`holds_until_nodes_return`). Raises
    SubmissionError with Slurm's refusal."""
    try:
        return "accepts it (sbatch --test-only): " + client.check_submission(script_text)
    except QueueFull as full:  # the cluster's state now, not the job's: sbatch's own retries may see it through
        return (f"cannot judge it now: its queue is full (sbatch --test-only: {str(full)!r}); sbatch retries for up "
                f"to {client.SBATCH_RETRIES_S // 60} minutes as it submits")  # fmt: skip
    except SubmissionError as refusal:
        held = holds_until_nodes_return(spec) if "node configuration is not available" in str(refusal) else None
        if held is None:
            raise
        return held


def holds_until_nodes_return(spec: RunSpec) -> str | None:
    """`sbatch --test-only` places a job on the nodes in service now: it refuses one that needs a drained or down
    node, which sbatch itself takes and holds in the queue until the node returns. Where the partition's nodes
    out of service would complete the job's set (by their count and GPUs, --exclude's left out: an upper bound),
    the job is not refused: say that it will wait, and for which nodes. None where not even every node of the
    partition could hold it, or none is out of service: Slurm's refusal stands."""
    s = spec.args.slurm
    try:
        nodes = client.node_states(s.partition)
    except SlurmUnavailable:
        return None
    excluded = set(hostlist.expand(s.exclude) or []) if s.exclude else set()
    fitting = [n for n in nodes if n.gpus >= s.gpus_per_node and n.name not in excluded]
    away = [n for n in fitting if not n.in_service]
    if not away or len(fitting) < s.nodes + s.spare_nodes:
        return None
    named = ", ".join(f"{n.name} {n.state} ({n.reason})" for n in away[:4]) + (", ..." if len(away) > 4 else "")
    return (
        f"holds it in the queue until nodes return: no set of the nodes in service now fits it (sbatch --test-only), "
        f"{len(away)} out of service would: {named}; `squeue --me` shows the reason while it waits"
    )
