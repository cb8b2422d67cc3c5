"""How the job runs on the nodes: the training engine, and how torchrun's agents meet: c10d (the rendezvous torchrun
and nanotron's own launcher use), or a static one for jobs too large for c10d's keep-alive. Pure.

c10d keeps one rendezvous state of ~125 bytes a node in the store on the first node; every agent reads it every
second and compare-and-sets it every 5 s as its keep-alive, for the whole run. Measured with torch's TCPStore on
the 2-core machine (`bench/bench_scale_rendezvous.py`, docs/performance.md): one round (every agent reads the
state once) takes 0.02-0.06 s at 128 nodes, 0.07-0.14 s at 256, 0.09-0.26 s at 512 and 0.45-5.3 s at 1,000, where
the store no longer keeps up. `auto` takes c10d up to C10D_MAX_NODES, where a round stays within ~15% of its
one-second interval, and the static rendezvous beyond (each agent sets one key and reads one, once: 1,000 agents
joined in 0.3-3.6 s), where a node's rank is its place in the job's node list.
"""

from __future__ import annotations

from launcher.config.flags import JobArgs, ParallelismArgs
from launcher.problems import Problem

ENGINES = ("auto", "nanotron", "torch")  # run_train.py's --engine
BACKENDS = ("auto", "c10d", "static")
C10D_MAX_NODES = 256


def choose(asked: str, nodes: int) -> tuple[str, str]:
    """(the rendezvous the job uses, why): `asked` is --rdzv_backend."""
    if asked == "c10d":
        return "c10d", "--rdzv_backend c10d"
    if asked == "static":
        return "static", "--rdzv_backend static"
    if nodes <= C10D_MAX_NODES:
        return "c10d", f"auto: {nodes} node(s), c10d's keep-alive fits its interval up to {C10D_MAX_NODES}"
    return "static", (
        f"auto: {nodes} nodes, more than the {C10D_MAX_NODES} c10d's keep-alive serves within its one-second "
        "interval (every agent reads the whole rendezvous state each second): each agent joins once instead"
    )


def problems(j: JobArgs, p: ParallelismArgs) -> list[Problem]:
    """--engine and --rdzv_backend: known values; the torch engine trains data parallel only."""
    out: list[Problem] = []
    if j.engine not in ENGINES:
        out.append(Problem("engine", f"{j.engine!r} is not an engine", "use auto, nanotron or torch"))
    elif j.engine == "torch" and ((p.tp or 1) > 1 or (p.pp or 1) > 1):
        out.append(
            Problem(
                "engine",
                f"the torch engine trains data parallel only, and this layout has tp {p.tp or 1} x pp {p.pp or 1}",
                "use --tp 1 --pp 1 with --engine torch, or --engine auto (nanotron's trainer on GPU nodes)",
            )
        )
    if j.rdzv_backend not in BACKENDS:
        out.append(Problem("rdzv_backend", f"{j.rdzv_backend!r} is not a rendezvous", "use auto, c10d or static"))
    return out
