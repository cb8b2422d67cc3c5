"""Each value parsed once, the YAML built once, the manifest read once: one real launch with a mixture, data stages
and a dependency, followed to its end on the local cluster, counted on the real functions (wrapped, not faked)."""

from __future__ import annotations

import collections
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from launcher.bundle import manifest
from launcher.config import dependency_syntax
from launcher.nanotron_config import dialect, mixture, schema, stages
from launcher.runs import launch

pytestmark = pytest.mark.slurm


def counting(monkeypatch: pytest.MonkeyPatch, calls: collections.Counter, module: Any, name: str) -> None:
    """Count each call of `module.name` with its first argument (callers look the name up on the module)."""
    real: Callable = getattr(module, name)

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls[(name, args[0] if args and isinstance(args[0], str) else None)] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, counted)


def test_a_followed_launch_parses_each_value_once_builds_each_file_once_and_reads_the_manifest_once(
    tmp_path: Path, slurm_env: dict, demo_data, second_dataset, monkeypatch: pytest.MonkeyPatch, capsys
):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LAUNCHER_POLL_SECONDS", "2")  # the follower's quiet cadence: the test need not wait 30 s
    first = subprocess.run(["sbatch", "--parsable", "--wrap", "true", "--output", "/dev/null"], env=slurm_env,
                           capture_output=True, text=True, check=True).stdout.strip().split(";")[0]  # fmt: skip
    a, b = str(demo_data.dataset), str(second_dataset)
    datasets, later, after = f"{a}:0.5,{b}:1.0", f"anneal@3={b}:1.0,{a}:0.25", f"afterany:{first}"
    calls: collections.Counter = collections.Counter()
    for module, name in ((mixture, "parse"), (stages, "parse"), (dependency_syntax, "parse"),
                         (schema, "build_config"), (schema, "written"), (dialect, "to_main"), (dialect, "to_04"),
                         (schema, "dump")):  # fmt: skip
        counting(monkeypatch, calls, module, name)
    manifests: list[Path] = []
    real_read = Path.read_text
    monkeypatch.setattr(Path, "read_text", lambda self, *a, **k: (manifests.append(self) if self.name ==
                        "manifest.json" else None) or real_read(self, *a, **k))  # fmt: skip

    code = launch.main(
        ["--run_name", "once", "--nodes", "1", "--gpus_per_node", "2", "--model_size", "tiny", "--dataset", datasets,
         "--data_stages", later, "--nanotron_dialect", "main", "--dependency", after, "--tokenizer",
         str(demo_data.tokenizer), "--train_steps", "4", "--warmup_steps", "1", "--grad_accum_steps", "1",
         "--wandb_disabled", "true", "--time_limit", "5:00", "--show_logs"]
    )  # fmt: skip

    out = capsys.readouterr().out
    assert code == 0 and "ended COMPLETED" in out, out[-3000:]
    assert "data: stage anneal begins at step 3" in out  # the stages trained, from the typed values
    parsed = {key: n for key, n in calls.items() if key[0] == "parse"}
    assert parsed == {("parse", datasets): 1, ("parse", f"{b}:1.0,{a}:0.25"): 1, ("parse", later): 1,
                      ("parse", after): 1}, parsed  # fmt: skip
    built = {key[0]: n for key, n in calls.items() if key[0] != "parse"}
    assert built == {"build_config": 1, "written": 1, "to_main": 1, "dump": 1}, built  # one dialect's file
    (bundle,) = (tmp_path / "logs/configs/once").iterdir()
    assert manifests == [bundle / "manifest.json"]  # once, as the job id was recorded: then handed down
    data = manifest.load(bundle).data
    assert data["slurm"]["job_id"] and data["ended"]["state"] == "COMPLETED" and data["ledger"]["attempts"]
