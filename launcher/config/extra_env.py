"""--extra_env: shell variable names, values that would not expand, secrets, and the job's own settings."""

from __future__ import annotations

from launcher import protocol as P
from launcher.config.slurm_values import ENV_NAME
from launcher.config.spec import RunSpec
from launcher.problems import Problem
from launcher.secrets_guard import is_secret_assignment


def problems(spec: RunSpec) -> list[Problem]:
    """--extra_env's names, values that would not expand, and secrets (which would be written to the bundle)."""
    out = []
    odd = [k for k in spec.extra_env if not ENV_NAME.fullmatch(k)]
    if odd:
        out.append(
            Problem("extra_env", f"{', '.join(odd)} is not a shell variable name", "use ASCII letters, digits and '_'")
        )
    referencing = [f"{k}={v}" for k, v in spec.extra_env.items() if "$" in v]
    if referencing:
        out.append(
            Problem(
                "extra_env",
                f"{', '.join(referencing)}: values are written as they are, so the job would see the text, not "
                "the variable's value",
                "the job inherits your shell's environment: export it there, or set it in --pre_launch_commands "
                '(export NAME="$OTHER"), where the job\'s shell expands it',
            )
        )
    every = spec.extra_env.get(P.ENV_STOP_FILE_EVERY)
    if every is not None and not _positive_number(every):
        out.append(
            Problem(
                "extra_env",
                f"{P.ENV_STOP_FILE_EVERY}={every} is not a number of seconds above 0",
                f"give seconds, e.g. {P.ENV_STOP_FILE_EVERY}=1 (the default is 5)",
            )
        )
    secrets = [k for k, v in spec.extra_env.items() if is_secret_assignment(k, v)]
    if secrets:
        out.append(
            Problem(
                "extra_env",
                f"{', '.join(secrets)} looks like a secret; flags are written to the bundle",
                "export it in your shell instead: the job inherits your environment without a file",
            )
        )
    return out


def _positive_number(text: str) -> bool:
    try:
        return 0 < float(text) < float("inf")
    except ValueError:
        return False
