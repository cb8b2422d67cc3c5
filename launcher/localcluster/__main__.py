"""`python -m launcher.localcluster {up,down,status,env} [--dir DIR]`: the local Slurm cluster's command line;
`python -m launcher.localcluster s3 {up,down,status,env} [--dir DIR]`: the local S3 server's (docs/s3-server.md)."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from launcher.errors import closed_pipe
from launcher.localcluster import containers, s3, s3_access
from launcher.localcluster.daemons import ClusterError, down, status, up
from launcher.localcluster.s3_conf import S3Spec
from launcher.localcluster.s3_conf import default_dir as s3_default_dir
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
    server = commands.add_parser("s3", help="the local S3 server: a one-node Ceph cluster behind radosgw")
    server_common = argparse.ArgumentParser(add_help=False)
    server_common.add_argument("--dir", type=Path, default=s3_default_dir(), help="server directory (%(default)s)")
    actions = server.add_subparsers(dest="action", required=True)
    s3_up = actions.add_parser("up", parents=[server_common], help="start (make) the server, wait until it answers")
    s3_up.add_argument("--bucket", action="append", default=[], help="a bucket to make (repeatable)")
    actions.add_parser("down", parents=[server_common], help="stop its daemons (what they stored stays)")
    actions.add_parser("status", parents=[server_common], help="daemons' liveness, the endpoint, ceph status")
    actions.add_parser("env", parents=[server_common], help="print the export line for eval (no secret in it)")
    return parser


def _print_s3_env(spec: S3Spec) -> None:
    env = s3_access.stored_env(s3.configured(spec))
    print("export " + " ".join(f"{key}={shlex.quote(value)}" for key, value in env.items()))


def _s3(args: argparse.Namespace) -> None:
    spec = S3Spec(args.dir)
    if args.action == "up":
        spec = s3.up(spec)
        user = s3_access.stored_user(spec)
        s3_access.add_user(spec, user)
        for bucket in args.bucket:
            s3_access.create_bucket(spec, user, bucket)
    {"up": _print_s3_env, "down": s3.down, "status": s3.status, "env": _print_s3_env}[args.action](spec)


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command == "s3":
        try:
            _s3(args)
        except s3.S3Error as e:
            print(f"error: {e}", file=sys.stderr)
            return e.exit_code
        except BrokenPipeError:
            return closed_pipe()
        return 0
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
