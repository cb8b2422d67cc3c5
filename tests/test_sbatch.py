"""The rendered batch script and the job's settings beside it: golden files per preset, bash -n and shellcheck, quoting
of hostile values, at most 40 lines by default and no value the job reads from its job.json."""

from __future__ import annotations

import dataclasses
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from launcher_helpers import fixed_paths, spec_for

from launcher import protocol as P
from launcher.bundle import render
from launcher.config.validate import validate
from launcher.jobs.command import _bundle_of_script
from launcher.nanotron_config.presets import preset_names
from launcher.node import step
from launcher.node.job import from_json
from launcher.node.supervisor import decide

GOLDEN = Path(__file__).parent / "golden"
ROOT = Path(__file__).resolve().parent.parent
NODES = {"70b": "4"}
HOSTILE = ["a'; echo foo", "sp ace", "$(touch pwned)", "back`tick`", "new\nline", 'dq"uote', "semi;colon&amp"]
IN_CI = os.environ.get("CI") == "true"


GOLDEN_FLAGS = [
    "--python",
    "/usr/bin/python3",
    "--nanotron_dialect",  # the goldens are 0.4's; main's are judged by its parser (test_nanotron_dialects.py)
    "0.4",
    "--run_train_script",
    "/project/run_train.py",
    "--dataset",
    "none",
    "--wandb_disabled",
    "true",
]
# Scripts differ by the Slurm options, not by the model: one golden with the defaults, one with every option.
SCRIPT_CASES = {
    "default": [],
    "every-option": [
        "--partition", "gpu", "--qos", "high", "--account", "proj", "--cpus_per_node", "96", "--mem", "500G",
        "--constraint", "h100&ib", "--reservation", "maint", "--nodelist", "gpu[01-02]", "--exclude", "gpu07",
        "--exclusive", "true", "--dependency", "afterok:12345", "--email", "me@example.org",
        "--extra_env", "NCCL_DEBUG=INFO A='x y'", "--pre_launch_commands", "module load cuda/12.4",
        "--time_limit", "2-00:00:00", "--signal_grace", "300", "--max_requeues", "5", "--startup_timeout", "3600",
        "--rdzv_backend", "static", "--engine", "nanotron",
    ],
    "no-requeue": ["--max_requeues", "0"],
    "container": ["--container_image", "nvcr.io#nvidia/pytorch:24.01-py3", "--container_mounts", "/etc:/host-etc:ro",
                  "--container_env", "PATH", "--container_workdir", "/project", "--tmp_dir", "/scratch/tmp"],
}  # fmt: skip


def golden_spec(name: str, *flags: str):
    spec, problems = spec_for("--run_name", f"golden-{name}", *GOLDEN_FLAGS, *flags, cwd=Path("/project"))
    assert problems == []
    return spec


def golden_script(case: str) -> str:
    spec = golden_spec(case, *SCRIPT_CASES[case])
    return render.sbatch_script(spec, fixed_paths(spec.args.run_name))


def golden_config(preset: str) -> str:
    spec = golden_spec(preset, "--model_size", preset, "--nodes", NODES.get(preset, "2"))
    return render.config_yaml(spec, fixed_paths(spec.args.run_name))


def check_golden(path: Path, text: str) -> None:
    text = text.replace(str(ROOT), "/checkout")  # the job's helpers are named by where this checkout lies
    if os.environ.get("UPDATE_GOLDEN") == "1":
        path.write_text(text)
    assert text == path.read_text(), f"{path.name} changed; review and run UPDATE_GOLDEN=1 pytest {__file__}"


@pytest.mark.parametrize("case", SCRIPT_CASES)
def test_golden_sbatch(case: str):
    check_golden(GOLDEN / f"sbatch-{case}.sbatch", golden_script(case))


@pytest.mark.parametrize("preset", preset_names())
def test_golden_config_per_preset(preset: str):
    check_golden(GOLDEN / f"config-{preset}.yaml", golden_config(preset))


def lint(text: str, tmp_path: Path) -> None:
    script = tmp_path / "job.sbatch"
    script.write_text(text)
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    checker = shutil.which("shellcheck")
    if checker is None:
        assert not IN_CI, "shellcheck must be installed in CI (scripts/setup.sh)"
        pytest.skip("shellcheck not installed")
    out = subprocess.run([checker, "-S", "style", str(script)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout


def exec_argv(text: str, cwd: Path) -> list[str]:
    """What the script's last command execs, as bash reads it (printed, not run: the script up to there runs)."""
    at = text.rindex("\nPYTHONPATH=")  # (a quoted path with a line break in it spans lines)
    head, last = text[:at], text[at + 1 :]
    out = subprocess.run(["bash", "-c", head + "\n" + last.replace(" exec ", " printf '%s\\0' ", 1)], cwd=cwd,
                         env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert out.returncode == 0, out.stderr
    return out.stdout.split("\0")[:-1]


@pytest.mark.parametrize("case", SCRIPT_CASES)
def test_scripts_lint_clean(case: str, tmp_path: Path):
    lint(golden_script(case), tmp_path)


def test_the_default_script_is_its_header_and_one_exec_of_the_supervisor_with_the_bundles_job():
    """At most 40 lines; none of them (but comments) holds a value the job reads from job.json, besides what starts
    the supervisor: its Python, the launcher's package and job.json's path."""
    text = golden_script("default")
    assert len(text.splitlines()) <= 40
    spec = golden_spec("default")
    job = render.job_settings(spec, fixed_paths(spec.args.run_name))
    starts = {str(job.python), str(job.project), str(job.file(P.JOB_FILE))}
    values = {str(v) for k, v in vars(job).items() if isinstance(v, (str, Path)) and len(str(v)) > 3} - starts
    code = [line for line in text.splitlines() if not line.startswith("#") and line]
    assert code[0] == "set -euo pipefail" and code[-1].split()[1:3] == ["exec", str(job.python)], code
    # each line less what starts the supervisor (the checkout's own path may hold a value: a clone under /tmp, the
    # job's tmp_dir), longest first
    for start in sorted(starts, key=len, reverse=True):
        code = [line.replace(start, "") for line in code]
    assert [line for line in code for value in values if value in line] == []


@pytest.mark.parametrize("name", HOSTILE)
def test_hostile_paths_are_quoted(name: str, tmp_path: Path):
    root = tmp_path / name
    flags = [
        "--run_name",
        "h",
        "--checkpoints_path",
        str(root / "ck"),
        "--dataset",
        str(root / "data"),
        "--tokenizer",
        str(root / "tok"),
        "--python",
        str(root / "bin/python"),
        "--run_train_script",
        str(root / "train.py"),
        "--extra_env",
        f"X={name.replace(chr(10), '_').replace(' ', '_')}",
        "--configs_path",
        str(root / "cfg"),
    ]
    spec, _ = spec_for(*flags, cwd=tmp_path)
    paths = dataclasses.replace(fixed_paths("h", root=root), log=tmp_path / "logs" / "h.out")  # see next tests
    text = render.sbatch_script(spec, paths)
    lint(text, tmp_path)
    assert exec_argv(text, tmp_path) == [str(root / "bin/python"), "-m", "launcher.node.supervisor", str(paths.job)]
    job = render.job_settings(spec, paths)
    assert (job.train_script, job.config, job.checkpoints) == (root / "train.py", paths.config, paths.checkpoints)
    assert from_json(job.to_json()) == job  # job.json carries them as they are
    assert not (Path.cwd() / "pwned").exists() and not (tmp_path / "pwned").exists()
    for line in text.splitlines():
        if line.startswith("#") and not line.startswith(("#!", "#SBATCH")):
            assert "\n" not in line  # a line break in a path never escapes a comment


def test_hostile_run_names_are_refused():

    for name in HOSTILE:
        spec, _ = spec_for("--run_name", name)
        assert "run_name" in [p.flag for p in validate(spec)]


def test_log_dir_slurm_cannot_carry_is_refused(tmp_path: Path):

    for bad in ('dq"uote', "per%cent", "new\nline"):
        spec, _ = spec_for("--slurm_logs_path", str(tmp_path / bad))
        assert "slurm_logs_path" in [p.flag for p in validate(spec)]


def test_script_holds_the_operational_basics():
    text = golden_script("default")
    for needle in (
        "set -euo pipefail",
        " exec /usr/bin/python3 -m launcher.node.supervisor ",  # the job's supervisor, Slurm's signals its own
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --signal=B:USR1@120",
        "#SBATCH --open-mode=append",
    ):
        assert needle in text
    assert "printenv" not in text and "env |" not in text
    spec = golden_spec("default")
    job = render.job_settings(spec, fixed_paths("t"))
    argv = step.torchrun_argv(job, "7", "10.0.0.1:21234", None)  # torchrun's c10d rendezvous at 2 nodes (auto)
    assert "--rdzv_backend=c10d" in argv and "--nproc_per_node=8" in argv and argv[-2:] == ["--engine", "auto"]
    assert step.environment(job, {}, "7", "n1")["WANDB_MODE"] == "disabled"
    static = golden_spec("every-option", *SCRIPT_CASES["every-option"])  # --rdzv_backend static --engine nanotron
    argv = step.torchrun_argv(render.job_settings(static, fixed_paths("t")), "7", "10.0.0.1:21234", 1)
    assert "--node_rank=1" in argv and "--master_addr=10.0.0.1" in argv and argv[-1] == "nanotron"


def test_compile_layers_reaches_run_train_py_as_its_own_flag(tmp_path: Path) -> None:
    """--compile_layers true: job.json carries it, torchrun's command ends with run_train.py's flag, and
    run_train.py's own parser takes that command (it then fails on the missing config, in its one error line)."""
    job = render.job_settings(golden_spec("c", "--compile_layers", "true"), fixed_paths("c", tmp_path))
    assert from_json(job.to_json()).compile_layers is True
    argv = step.torchrun_argv(job, "7", "10.0.0.1:21234", None)
    assert argv[-3:] == ["--engine", "auto", "--compile_layers"]
    tail = argv[argv.index(str(job.train_script)) + 1 :]  # the golden runs lie in /project: this checkout's script
    script = str(ROOT / "run_train.py")
    done = subprocess.run([sys.executable, script, *tail], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 2 and done.stderr.startswith("error: "), done.stderr
    default = render.job_settings(golden_spec("d"), fixed_paths("d", tmp_path))
    assert step.torchrun_argv(default, "7", "10.0.0.1:21234", None)[-2:] == ["--engine", "auto"]


@pytest.mark.parametrize(("nodes", "flag", "backend"), [(2, "auto", "c10d"), (256, "auto", "c10d"),
                                                         (257, "auto", "static"), (4000, "c10d", "c10d"),
                                                         (2, "static", "static")])  # fmt: skip
def test_the_rendezvous_is_c10d_up_to_what_its_keep_alive_serves(nodes: int, flag: str, backend: str, tmp_path: Path):
    spec = golden_spec("r", "--nodes", str(nodes), "--rdzv_backend", flag)
    assert render.job_settings(spec, fixed_paths("r", tmp_path)).rdzv_backend == backend
    chosen, why = spec.rendezvous
    assert chosen == backend and (flag != "auto" or str(nodes) in why)
    if flag == "auto" and backend == "static":
        assert "more than the 256" in why
    lint(render.sbatch_script(spec, fixed_paths("r", tmp_path)), tmp_path)


def test_a_jobs_bundle_is_found_from_its_batch_script(tmp_path: Path):
    """`launcher.jobs` given a job id whose bundle is not under --configs_path: the script Slurm runs names it."""
    spec = golden_spec("default")
    paths = fixed_paths("t", tmp_path)
    script = tmp_path / "job.sbatch"
    script.write_text(render.sbatch_script(spec, paths))
    assert _bundle_of_script(script) == paths.bundle_dir
    script.write_text("#!/bin/bash\nexport LAUNCHER_NODE_SCRIPT=/old/bundle/node.sh\nexec python -m x\n")  # before
    assert _bundle_of_script(script) == Path("/old/bundle")
    script.write_text("#!/bin/bash\nsleep 1\n")
    assert _bundle_of_script(script) is None


def test_engine_and_rendezvous_values_are_checked():
    for flags, flag in ((("--engine", "jax"), "engine"), (("--rdzv_backend", "etcd"), "rdzv_backend"),
                        (("--engine", "torch", "--tp", "2"), "engine")):  # fmt: skip
        spec, problems = spec_for(*GOLDEN_FLAGS, *flags)
        assert flag in [p.flag for p in problems + validate(spec)], flags


def test_extra_env_values_with_spaces_and_lines(tmp_path: Path):
    spec, problems = spec_for("--extra_env", "NCCL_DEBUG=INFO\nMY_OPTS=\"--a 1 --b $(touch pwned)\"\nX='y z'")
    assert problems == [] and spec.extra_env == {
        "NCCL_DEBUG": "INFO",
        "MY_OPTS": "--a 1 --b $(touch pwned)",
        "X": "y z",
    }
    script = render.sbatch_script(spec, fixed_paths("t", tmp_path))
    exports = [line for line in script.splitlines() if line.startswith(("export MY_OPTS", "export X="))]
    # the values arrive intact in a shell, and nothing in them runs
    out = subprocess.run(["bash", "-c", "\n".join(exports) + '\nprintf "%s|%s" "$MY_OPTS" "$X"'], cwd=tmp_path,
                         capture_output=True, text=True)  # fmt: skip
    assert out.stdout == "--a 1 --b $(touch pwned)|y z" and not (tmp_path / "pwned").exists()
    assert spec_for("--extra_env", 'A="unclosed')[1][0].flag == "extra_env"


def test_node_placement_lines(tmp_path: Path):
    spec, problems = spec_for("--constraint", "h100&ib", "--reservation", "res1", "--nodelist", "gpu[01-02]",
                              "--exclude", "gpu07", "--exclusive", "true", "--mem", "0")  # fmt: skip
    assert problems == []
    text = render.sbatch_script(spec, fixed_paths("t"))
    for line in ("--nodelist=gpu[01-02]", "--exclude=gpu07", "--constraint=h100&ib", "--reservation=res1",
                 "--mem=0", "--exclusive"):  # fmt: skip
        assert f"\n#SBATCH {line}\n" in text
    lint(text, tmp_path)
    plain = golden_script("default")
    for option in ("--nodelist", "--exclude", "--constraint", "--reservation", "--mem", "--exclusive"):
        assert f"#SBATCH {option}" not in plain


@pytest.mark.parametrize("flag", ["nodelist", "exclude", "constraint", "reservation", "mem"])
def test_hostile_placement_values_are_refused(flag: str):

    for value in HOSTILE + ["a b", "x\n#SBATCH --wrap=id", "50%"]:
        spec, _ = spec_for(f"--{flag}", value)
        problems = [p for p in validate(spec) if p.flag == flag]
        assert problems and f"e.g. --{flag} " in problems[0].fix, value


def test_the_rendezvous_port_stays_in_its_window_below_the_ephemeral_range(tmp_path: Path):
    """The supervisor's first port, its fallback (the first free of the next 500, from the window's top: wrapping to
    its foot) and the port after one that was taken all lie in 20000-31999 (launcher/protocol.py), below the kernel's
    ephemeral range as /proc gives it, where outgoing connections may hold any port. The fallback for real: the
    command the supervisor runs on the rendezvous host (`python -m launcher.node.supervisor --free-port`)."""
    low, high = P.RDZV_PORT_LOW, P.RDZV_PORT_LOW + P.RDZV_PORT_SPAN - 1
    assert high < int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    firsts = [decide.first_port(job) for job in (1, 11999, 12000, 99999999)]
    assert firsts == [low + 1, low + 11999, low, low + 99999999 % P.RDZV_PORT_SPAN]
    assert (decide.next_port(high), decide.next_port(low)) == (low, low + 1)
    with socket.create_server(("", high)):  # the window's top is taken: the fallback goes on from its foot
        out = subprocess.run([sys.executable, "-m", "launcher.node.supervisor", "--free-port", str(high)],
                             capture_output=True, text=True, check=True, timeout=60,
                             env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip
    assert low <= int(out.stdout) < low + P.RDZV_PORT_TRIES
