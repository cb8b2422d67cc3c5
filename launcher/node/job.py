"""The job's settings, in one file of the bundle (`job.json`, protocol.JOB_FILE): written once by the launcher with the
bundle's other files, read by the job's supervisor and by the node step on every node. The batch script names the
file and nothing else of the run (`exec PYTHON -m launcher.node.supervisor BUNDLE/job.json`).

What the job reads of Slurm (SLURM_JOB_ID, SLURM_RESTART_COUNT, the allocation's nodes) comes from its environment,
as Slurm sets it. The run's files in the bundle are named by the protocol (`Job.file`), not listed here.

Standard library and `launcher.protocol` only, like every node helper.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

from launcher import protocol as P
from launcher.evals.settings import EvalSettings
from launcher.remote.settings import RemoteSettings
from launcher.retention.rules import Rules

VERSION = 3  # the file's format: a job refuses a file of another (written by another release of the launcher)
PATHS = ("bundle", "log", "checkpoints", "python", "project", "train_script", "config", "tmp_dir")
KINDS: dict[str, tuple[type, ...]] = {  # a field's annotation -> what its JSON value may be
    "str": (str,), "Path": (str,), "int": (int,), "float": (int, float), "float | None": (int, float, type(None)),
    "bool": (bool,), "tuple[str, ...]": (list,), "dict[str, str]": (dict,), "Rules": (dict,),
    "EvalSettings | None": (dict, type(None)), "RemoteSettings | None": (dict, type(None)),
}  # fmt: skip


class JobFileError(ValueError):
    """job.json cannot be read as this release writes it."""


@dataclass(frozen=True)
class Job:
    """One job's settings, as the launcher resolved them."""

    run_name: str
    bundle: Path  # the bundle directory: the run's files by the protocol's names (`file`)
    log: Path  # the job's log (#SBATCH --output); the GPU monitor's logs and the stack dumps go beside it
    checkpoints: Path  # the run's checkpoints (the one-writer lock lies there)
    python: Path  # the job's Python, absolute: the supervisor, the node step, torchrun and training run with it
    project: Path  # the directory that holds the launcher package (PYTHONPATH of the supervisor and the node step)
    train_script: Path
    config: Path  # the nanotron config training reads
    engine: str  # --engine: auto | torch | nanotron
    nodes: int  # the nodes the layout trains on
    gpus_per_node: int  # training processes per node
    tmp_dir: Path  # TMPDIR of the node step, training and the eval jobs
    train_steps: int = 0  # the run's last step
    tokens_per_step: int = 0  # the tokens a step trains on (the global batch)
    spare_nodes: int = 0  # nodes the allocation holds beyond the layout's (restarts without a failed node)
    max_requeues: int = 0  # requeues after time limits the job may make
    max_restarts: int = 0  # restarts and failure requeues the job may make
    signal_grace: int = 0  # seconds the time-limit warning comes early (0: the job does not requeue itself)
    rdzv_backend: str = "c10d"  # torchrun's rendezvous: c10d | static
    compile_layers: bool = False  # --compile_layers: the nanotron engine compiles its decoder layers
    hang_timeout: float = 0.0  # the watchdog's floor in seconds (0: no watchdog)
    hang_factor: float = 10.0  # the watchdog's limit between steps: this x the median step time
    startup_timeout: float | None = None  # the watchdog's limit before the first step (None: hang_timeout)
    node_check: bool = True  # the node check before training (--preflight)
    modules: tuple[str, ...] = ()  # what the engine imports: the node check looks for them in the job's Python
    inputs: tuple[str, ...] = ()  # local paths training reads besides its config and script (data, tokenizer)
    image: str = ""  # --container_image ("": the node step runs on the host)
    container_options: tuple[str, ...] = ()  # srun's pyxis options for the node step (mounts, workdir, env)
    debug: bool = False
    wandb_disabled: bool = False
    extra_env: dict[str, str] = field(default_factory=dict)  # --extra_env: the last word on training's environment
    heartbeat_s: float = 60.0  # the supervisor's heartbeat line, this often
    retention: Rules = field(default_factory=Rules)  # --keep_last/--keep_every (none: every checkpoint stays)
    evals: EvalSettings | None = None  # --eval_tasks: the eval job submitted for each evaluated step (None: none)
    remote: RemoteSettings | None = None  # --checkpoints_remote: the bucket each checkpoint is copied to (None: none)
    version: int = VERSION

    def file(self, name: str) -> Path:
        """A file of the run in the bundle, by its protocol name (P.STOP_FILE, P.OUTCOME_FILE, ...)."""
        return self.bundle / name

    @property
    def log_dir(self) -> Path:
        return self.log.parent

    def evaluated(self, step: int) -> bool:
        """Whether --eval_tasks evaluates `step`'s checkpoint (every --eval_every, and the last step)."""
        return self.evals is not None and self.evals.evaluated(step, self.train_steps)

    def eval_name(self, step: int) -> str:
        """An eval job's Slurm name: what the submitter names it and looks it up by."""
        return f"{self.run_name}-eval-{step}"

    def eval_log(self, step: int | str) -> Path:
        """An eval job's log, beside the run's (`<stamp>.eval-<step>.out`)."""
        stem = self.log.name.removesuffix(P.LOG_SUFFIX)
        return self.log.with_name(stem + P.EVAL_LOG_SUFFIX.replace("{step}", str(step)))

    @property
    def allocated(self) -> int:
        """The nodes the job asks for: the layout's and the spares."""
        return self.nodes + self.spare_nodes

    @property
    def max_excluded(self) -> int:
        """Nodes a requeue may leave out: one in fifty, at least one."""
        return max(1, self.nodes // 50)

    @property
    def node_check_timeout(self) -> float:
        """Seconds the node check waits for every node to report."""
        return float(max(60, self.nodes // 20))

    def watchdog_options(self) -> list[str]:
        """The watchdog's options (`python -m launcher.node.watchdog`), none without a watchdog."""
        if not self.hang_timeout:
            return []
        options = ["--factor", f"{self.hang_factor:g}", "--floor", f"{self.hang_timeout:g}"]
        return options + (["--startup", f"{self.startup_timeout:g}"] if self.startup_timeout is not None else [])

    def to_json(self) -> str:
        data = dataclasses.asdict(self)
        data.update({name: str(getattr(self, name)) for name in PATHS})
        return json.dumps(data, indent=2, sort_keys=True) + "\n"


def from_json(text: str) -> Job:
    """A job from its file's text; JobFileError where it is not this release's format."""
    try:
        data = json.loads(text)
    except ValueError as e:
        raise JobFileError(f"not JSON ({e})") from None
    if not isinstance(data, dict):
        raise JobFileError("not a JSON object")
    if data.get("version") != VERSION:
        raise JobFileError(f"format {data.get('version')!r}, where this launcher reads format {VERSION}")
    kinds = {f.name: KINDS[str(f.type)] for f in dataclasses.fields(Job)}
    if unknown := sorted(set(data) - set(kinds)):
        raise JobFileError(f"unknown settings {', '.join(unknown)}")
    if wrong := [f"{name} {data[name]!r}" for name in data if not isinstance(data[name], kinds[name])]:
        raise JobFileError(f"settings of the wrong kind: {', '.join(wrong)}")
    data.update({name: Path(data[name]) for name in PATHS if name in data})
    data.update({name: tuple(data[name]) for name in ("modules", "inputs", "container_options") if name in data})
    if "retention" in data:
        data["retention"] = Rules.from_dict(data["retention"])
    try:
        if data.get("evals") is not None:
            data["evals"] = EvalSettings.from_dict(data["evals"])
        if data.get("remote") is not None:
            data["remote"] = RemoteSettings.from_dict(data["remote"])
        return Job(**data)
    except (TypeError, ValueError) as e:
        raise JobFileError(str(e)) from None


def load(path: Path | str) -> Job:
    """The job's settings from its file (job.json, or the bundle directory that holds it)."""
    path = Path(path)
    if path.is_dir():
        path = path / P.JOB_FILE
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise JobFileError(f"cannot read {path} ({e.strerror or e})") from None
    try:
        return from_json(text)
    except JobFileError as e:
        raise JobFileError(f"{path}: {e}") from None
