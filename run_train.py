"""The training job: `torchrun ... run_train.py --config-file CONFIG.yaml` on every node.

Reads a nanotron 0.4 config and trains it with nanotron's trainer (GPU nodes; flash_attn or torch SDPA) or the
portable torch engine (data parallel, CPU or GPU). A user error prints one `error: ...` line and exits 2.
"""

from __future__ import annotations

import argparse
import atexit
import faulthandler
import os
import signal
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config-file", required=True, help="nanotron 0.4 config YAML written by the launcher")
    parser.add_argument(
        "--engine",
        choices=("auto", "torch", "nanotron"),
        default="auto",
        help="auto: nanotron where CUDA, NCCL and nanotron are present (flash_attn optional), else torch",
    )
    parser.add_argument(
        "--compile_layers",
        action="store_true",
        help="the nanotron engine compiles each decoder layer with torch.compile (the torch engine: on GPUs anyway)",
    )
    args = parser.parse_args(argv)

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the launcher package sits next to this file
    from launcher.errors import LauncherError
    from launcher.train.main import run

    try:
        run(args.config_file, args.engine, args.compile_layers)
    except LauncherError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 2
    return 0


if __name__ == "__main__":
    # Every thread's Python stack to stderr (the job's log) on SIGUSR2: what the hang watchdog asks for where py-spy
    # is not installed.
    faulthandler.register(signal.SIGUSR2, all_threads=True)
    code = main()
    # Training is over and saved. Run the exit hooks libraries registered (wandb finishes its run there: nanotron
    # 0.4 never calls wandb.finish), then skip the interpreter's teardown of torch and transformers: ~1.3 s per
    # process, which every rank of a node pays, on its cores, before the job can end. (An exception, or the
    # SystemExit of a stop, never gets here: those exit the usual way.)
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
