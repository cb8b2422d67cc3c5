"""`python -m launcher.localcluster {up,down,status,env} [--dir DIR]`: the local Slurm cluster's command line."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from launcher.errors import closed_pipe
from launcher.localcluster import containers
from launcher.localcluster.daemons import ClusterError, down, status, up
from launcher.localcluster.slurm_conf import ClusterSpec, default_dir


def _print_env(spec: ClusterSpec) -> None:
    print(f"export SLURM_CONF={shlex.quote(str(spec.conf))}")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m launcher.localcluster", description="A real Slurm cluster on this one machine."
    )
    parser.set_defaults(
        nodes=ClusterSpec.nodes, gpus_per_node=ClusterSpec.gpus_per_node, containers=False, accounting=False
    )
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--dir", type=Path, default=default_dir(), help="cluster directory (default: %(default)s)")
    commands = parser.add_subparsers(dest="command", required=True)
    up_parser = commands.add_parser("up", parents=[common], help="start (or restart) the cluster, wait until ready")
    up_parser.add_argument("--nodes", type=int, default=ClusterSpec.nodes)
    up_parser.add_argument("--gpus_per_node", type=int, default=ClusterSpec.gpus_per_node)
    up_parser.add_argument("--containers", action="store_true", help="pyxis + enroot on the nodes, and an image")
    up_parser.add_argument("--accounting", action="store_true",
                           help="slurmdbd on a MariaDB of its own: sacct works (docs/accounting.md)")  # fmt: skip
    commands.add_parser("down", parents=[common], help="stop the daemons this directory started")
    commands.add_parser("status", parents=[common], help="daemons' liveness, sinfo, squeue")
    commands.add_parser("env", parents=[common], help="print the export line for eval")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        spec = ClusterSpec(
            args.dir, args.nodes, args.gpus_per_node, containers=args.containers, accounting=args.accounting
        )
    except ValueError as e:
        parser.error(str(e))
    try:
        {"up": up, "down": down, "status": status, "env": _print_env}[args.command](spec)
        if args.command == "up":
            _print_env(spec)
            if spec.containers:
                print(f"# image: {containers.image()}")
    except ClusterError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    except BrokenPipeError:
        return closed_pipe()
    return 0


if __name__ == "__main__":
    sys.exit(main())
