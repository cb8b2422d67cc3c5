"""A real terminal for the tests of `--interactive`: a tmux session on a server of its own."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

from test_e2e_training import wait_for


class Terminal:
    """A real terminal: a tmux session on a server of its own, everything it shows copied to a file."""

    def __init__(self, tmp_path: Path, command: str) -> None:
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
