"""`--interactive`: the run's allocation and a shell on its first node, to debug what the batch job would do.

salloc asks for the resources of the bundle's batch script (its #SBATCH lines: the file that would be submitted), then
a shell opens on the first node with the run's environment (TMPDIR, --extra_env, the launcher on PYTHONPATH), in the
container where --container_image gives one. From there the bundle's node step starts by hand: `node_step` on this
node, or on every node with srun from a host shell of the allocation (the banner prints both). Ctrl-D (the shell's
end) ends salloc, which releases the allocation.
"""

from __future__ import annotations

import re
import shlex
import subprocess

from launcher import protocol as P
from launcher.bundle import files
from launcher.bundle.files import BundlePaths
from launcher.bundle.render import PROJECT, container_options, job_settings
from launcher.config.spec import RunSpec

# #SBATCH options salloc takes as they are (the others are the batch job's own: output, signal, requeue, mail)
SALLOC_OPTIONS = {
    "job-name", "nodes", "ntasks-per-node", "gpus-per-node", "cpus-per-task", "time", "partition", "qos", "account",
    "constraint", "reservation", "nodelist", "exclude", "mem", "exclusive", "dependency",
}  # fmt: skip
SBATCH_LINE = re.compile(r"^#SBATCH --([\w-]+)(?:=(.*))?$")

# Run by salloc on the login node, inside the allocation: the rendezvous address as the batch script derives it,
# then the shell on the first node (the container options come as arguments). The port: launcher/protocol.py's.
RDZV_WINDOW = f"rdzv_low={P.RDZV_PORT_LOW} rdzv_span={P.RDZV_PORT_SPAN}\n"
HOST_SIDE = (
    RDZV_WINDOW
    + r"""rc=$1; shift
mapfile -t nodes < <(scontrol show hostnames "$SLURM_JOB_NODELIST")
addr=$(scontrol show node "${nodes[0]}" | sed -n 's/.*NodeAddr=\([^ ]*\).*/\1/p')
export LAUNCHER_RDZV="${addr:-${nodes[0]}}:$(( rdzv_low + SLURM_JOB_ID % rdzv_span ))"
LAUNCHER_NODES=$(printf '%s\n' "${nodes[@]}" | paste -sd,)
export LAUNCHER_NODES LAUNCHER_CONTAINER_OPTIONS="$*"
srun --pty --nodes=1 --ntasks=1 --nodelist="${nodes[0]}" --export=ALL "$@" /bin/bash --rcfile "$rc" -i
"""
)


def salloc_options(script_text: str) -> list[str]:
    """The batch script's resources, as salloc options."""
    out = []
    for line in script_text.splitlines():
        match = SBATCH_LINE.match(line.strip())
        if match and match.group(1) in SALLOC_OPTIONS:
            value = match.group(2)
            out.append(f"--{match.group(1)}" + (f"={value.strip(chr(34))}" if value is not None else ""))
    return out


def rc_text(spec: RunSpec, paths: BundlePaths) -> str:
    """The shell's start-up file: the run's environment, a prompt, and how to start the node step."""
    a, job = spec.args, job_settings(spec, paths)
    exports = {"TMPDIR": a.slurm.tmp_dir, **spec.extra_env, "LAUNCHER_PYTHON": str(job.python),
               "LAUNCHER_JOB": str(paths.job)}  # fmt: skip
    lines = [f"# The shell of `--interactive` for {a.run_name} (written by the launcher; read by bash --rcfile)."]
    lines += [f"export {k}={shlex.quote(str(v))}" for k, v in exports.items()]
    lines += [f"export PYTHONPATH={shlex.quote(str(PROJECT))}${{PYTHONPATH:+:$PYTHONPATH}}"]
    step = '"$LAUNCHER_PYTHON" -m launcher.node.step "$LAUNCHER_JOB"'
    shown = "env PYTHONPATH=${PYTHONPATH} ${LAUNCHER_PYTHON} -m launcher.node.step ${LAUNCHER_JOB}"  # from any shell
    where = "srun is not in the container" if a.container.container_image else "this one"
    lines += [
        f"PS1={shlex.quote(f'[{a.run_name} interactive] ')}'\\h:\\w\\$ '",
        f'node_step() {{ {step} run "$LAUNCHER_RDZV" "$LAUNCHER_NODES"; }}',
        'echo "Job ${SLURM_JOB_ID} on ${SLURM_JOB_NODELIST}: a shell on ${SLURMD_NODENAME:-$(hostname)} with the '
        "run's environment. Ctrl-D releases the allocation.\"",
        'echo "  node_step       runs the bundle\'s node step on this node (torchrun; rendezvous ${LAUNCHER_RDZV})"',
        f'echo "  on every node:  srun --jobid=${{SLURM_JOB_ID}} --overlap --nodes={a.slurm.nodes} '
        f"--ntasks={a.slurm.nodes} --export=ALL ${{LAUNCHER_CONTAINER_OPTIONS}} "
        f'{shown} run ${{LAUNCHER_RDZV}} ${{LAUNCHER_NODES}}"',
        f"echo {shlex.quote('                 (from a shell on the host: ' + where + ')')}",
    ]
    return "\n".join(lines) + "\n"


def run(spec: RunSpec, paths: BundlePaths) -> int:
    """salloc with the run's resources and the shell on its first node; returns salloc's exit code."""
    rc = paths.bundle_dir / P.INTERACTIVE_RC
    files.write_new(rc, rc_text(spec, paths))
    options = salloc_options(paths.script.read_text(encoding="utf-8"))
    argv = ["salloc", *options, "--", "/bin/bash", "-c", HOST_SIDE, "interactive", str(rc)]
    argv += container_options(spec, paths)
    print(f"Interactive: {shlex.join(['salloc', *options])} (Ctrl-D in the shell releases it)", flush=True)
    return subprocess.run(argv, check=False).returncode
