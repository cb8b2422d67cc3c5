"""A real terminal for the tests of `--interactive`: a tmux session on a server of its own."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from cluster_runs import wait_for
from launcher_helpers import LAUNCHER


class Terminal:
    """A real terminal: a tmux session on a server of its own, everything it shows copied to a file."""

    def __init__(self, tmp_path: Path, command: str) -> None:
        if shutil.which("tmux") is None:
            missing = "tmux is not installed (scripts/install_slurm.sh installs it)"
            if os.environ.get("CI") == "true":
                pytest.fail(missing)
            pytest.skip(missing)
        self.socket, self.file = f"launcher-test-{os.getpid()}", tmp_path / "terminal.txt"
        self.tmux("new-session", "-d", "-s", "t", "-x", "200", "-y", "50", command)
        self.tmux("pipe-pane", "-t", "t", "-o", f"cat >> {shlex.quote(str(self.file))}")

    def tmux(self, *argv: str) -> None:
        subprocess.run(["tmux", "-L", self.socket, *argv], check=True, timeout=30)

    def send(self, *keys: str) -> None:
        self.tmux("send-keys", "-t", "t", *keys)

    def shown(self) -> str:
        return self.file.read_text(errors="replace") if self.file.exists() else ""

    def wait(self, text: str, timeout: float) -> None:
        try:
            wait_for(lambda: text in self.shown(), timeout=timeout, every=0.5)
        except AssertionError:
            raise AssertionError(f"{text!r} not shown in {timeout} s:\n{self.shown()[-3000:]}") from None

    def close(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True, timeout=30)


def launcher_in_terminal(tmp_path: Path, env: dict, demo_data, run_name: str, *flags: str) -> Terminal:
    """A terminal that runs `--interactive` for a tiny run from tmp_path, says the launcher's exit code and stays."""
    argv = [sys.executable, str(LAUNCHER), "--run_name", run_name, "--gpus_per_node", "2", "--model_size", "tiny",
            "--dataset", str(demo_data.dataset), "--tokenizer", str(demo_data.tokenizer), "--warmup_steps", "2",
            "--wandb_disabled", "true", "--time_limit", "5:00", *flags, "--interactive"]  # fmt: skip
    keep = {k: env[k] for k in ("SLURM_CONF", "PYTHONPATH", "HF_HUB_OFFLINE", "PATH") if k in env}
    command = f"cd {shlex.quote(str(tmp_path))} && env {shlex.join(f'{k}={v}' for k, v in keep.items())} "
    return Terminal(tmp_path, command + f"{shlex.join(argv)}; echo LAUNCHER-EXIT=$?; sleep 600")
