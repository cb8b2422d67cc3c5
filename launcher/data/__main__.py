"""Data ahead of training (docs/data.md).

python -m launcher.data tokenize --dataset D --tokenizer T --output DIR [--text_column text] [--tasks N] [--workers N]
    [--slurm --partition P [--qos Q] [--account A] [--time_limit 4:00:00] [--show_logs]]
python -m launcher.data inspect DIR [--vocab_size N]
"""

from __future__ import annotations

import argparse
import sys

from launcher.data import on_slurm
from launcher.data.on_slurm import SlurmArgs
from launcher.data.tokenize import TokenizeArgs, check, run_local
from launcher.errors import ConfigError, as_command
from launcher.nanotron_config import nanoset
from launcher.problems import report


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m launcher.data", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    t = commands.add_parser("tokenize", help="tokenize a dataset into nanotron's Nanoset files, with datatrove")
    t.add_argument("--dataset", required=True, help="a save_to_disk directory, a data file, a folder of "
                   ".jsonl/.parquet files, or a hub name in this machine's datasets cache (read offline)")  # fmt: skip
    t.add_argument("--tokenizer", required=True, help="a tokenizer directory (with tokenizer.json) or a hub name")
    t.add_argument("--output", required=True, help="the folder for the token files (new, or this command's own)")
    t.add_argument("--text_column", default="text", help="the column holding the text")
    t.add_argument("--split", default="train", help="the split of a saved DatasetDict or a hub dataset")
    t.add_argument("--eos_token", default="auto", help="appended to every document: auto (the tokenizer's "
                   "eos_token), none, or a token")  # fmt: skip
    t.add_argument("--tasks", type=int, default=1, help="datatrove tasks: one token file each")
    t.add_argument("--workers", type=int, default=None, help="tasks run at once (default: 1 here, all on Slurm)")
    t.add_argument("--no_shuffle", action="store_true", help="keep each file's documents in reading order")
    t.add_argument("--seed", type=int, default=0, help="the shuffle's seed")
    s = t.add_argument_group("on Slurm (datatrove's SlurmPipelineExecutor: an array job, one task per --tasks)")
    s.add_argument("--slurm", action="store_true", help="tokenize as a Slurm array job instead of on this machine")
    s.add_argument("--partition", default=None)
    s.add_argument("--qos", default=None, help="default: none (the partition's)")
    s.add_argument("--account", default=None)
    s.add_argument("--time_limit", default="4:00:00", help="of each array task")
    s.add_argument("--cpus_per_task", type=int, default=1)
    s.add_argument("--mem_per_cpu_gb", type=int, default=2)
    s.add_argument("--job_name", default="tokenize")
    s.add_argument("--show_logs", action="store_true", help="follow the job to its end, then check the folder")
    i = commands.add_parser("inspect", help="what a tokenized folder holds, and whether it is whole")
    i.add_argument("folder")
    i.add_argument("--vocab_size", type=int, default=None, help="check that the token size holds this vocabulary")
    return parser


def _tokenize(ns: argparse.Namespace, argv: list[str]) -> int:
    args = TokenizeArgs(
        ns.dataset, ns.tokenizer, ns.output, ns.text_column, ns.split, ns.eos_token, ns.tasks, ns.workers,
        not ns.no_shuffle, ns.seed,
    )  # fmt: skip
    slurm = SlurmArgs(ns.partition, ns.qos, ns.account, ns.time_limit, ns.cpus_per_task, ns.mem_per_cpu_gb,
                      ns.job_name)  # fmt: skip
    plan, problems = check(args)
    problems += on_slurm.problems(slurm, ns.output) if ns.slurm else []
    problems += on_slurm.live_job_problems(plan, ns.slurm) if plan is not None else []
    if plan is None or problems:
        raise ConfigError(report(problems))
    if plan.resume:
        print(f"[data] {plan.output} holds this tokenization: continuing (finished tasks are skipped)")
    if ns.slurm:
        print(f"[data] {on_slurm.run_slurm(plan, slurm, argv, ns.show_logs)}")
        return 0
    folder = run_local(plan, argv)
    print(
        f"[data] {folder.path}: {folder.tokens} tokens in {folder.documents} documents, {len(folder.files)} files, "
        f"{folder.token_size}-byte tokens of {folder.tokenizer}"
    )
    return 0


def _inspect(ns: argparse.Namespace) -> int:
    folder, problems = nanoset.inspect(ns.folder, "folder", ns.vocab_size)
    if folder is None:
        print(report(problems).replace("nothing was written or submitted", "the folder is not whole"), file=sys.stderr)
        return 2
    print(
        f"{folder.path}: {folder.tokens} tokens, {folder.documents} documents, {len(folder.files)} files, "
        f"{folder.token_size}-byte tokens, tokenizer {folder.tokenizer}"
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ns = _parser().parse_args(argv)
    return as_command(lambda: _tokenize(ns, argv) if ns.command == "tokenize" else _inspect(ns))


if __name__ == "__main__":
    sys.exit(main())
