"""The Slurm client's own rules, with stand-in commands on PATH (the real controller, dead: tests/test_slurm_e2e.py's
test_dead_controller_names_dry_run)."""

from __future__ import annotations

from pathlib import Path

import pytest

from launcher.errors import SlurmUnavailable
from launcher.slurm import client


def test_inside_fail_fast_a_dead_controller_is_asked_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    calls = tmp_path / "calls"
    for name in ("sinfo", "squeue", "sbatch"):
        fake = tmp_path / name
        said = f"{name}: error: Unable to contact slurm controller (connect failure)"
        fake.write_text(f"#!/bin/sh\necho {name} >> {calls}\necho '{said}' >&2\nexit 1\n")
        fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    monkeypatch.delenv("SLURM_CONF", raising=False)
    with client.fail_fast():
        with pytest.raises(SlurmUnavailable) as first:
            client.node_states(None)
        with pytest.raises(SlurmUnavailable) as again:
            client.live_jobs("x")
        with pytest.raises(SlurmUnavailable):
            client.check_submission("#!/bin/sh\n")
    assert calls.read_text().split() == ["sinfo"] and again.value is first.value
    assert "sinfo cannot reach the Slurm controller" in str(first.value) and "localcluster up" in str(first.value)
    assert "--dry_run" not in str(first.value)  # (the launcher's door and `jobs rerun` add their own --dry_run)
    with pytest.raises(SlurmUnavailable):  # outside (following a job): every question asked
        client.live_jobs("x")
    assert calls.read_text().split() == ["sinfo", "squeue"]
