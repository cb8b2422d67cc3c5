"""Slurm's value formats, pure: the alphabets of values that reach #SBATCH lines (validation checks them, rendering
relies on them), and time limits.

Patterns are matched whole (`fullmatch`): a trailing line break is not a safe run name.
"""

from __future__ import annotations

import re

RUN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
EMAIL = re.compile(r"[^@\s]+@[^@\s]+\.[^@\s]+")
# Slurm --time: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS; 0, UNLIMITED or INFINITE for no limit
TIME_LIMIT = re.compile(r"\d+-\d{1,2}(:\d{1,2}){0,2}|\d+(:\d{1,2}){0,2}", re.ASCII)  # no Unicode digits
NO_TIME_LIMIT = ("0", "UNLIMITED", "INFINITE")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
SBATCH_UNSAFE = re.compile(r'["%\\\n\r]')  # characters an #SBATCH --output path cannot carry
# Slurm --mem (str_to_mbytes): megabytes, or K, M, G or T in either case, each optionally followed by B or b.
# ASCII digits only, as `\d` takes '١٢'. (Slurm's strtoll also skips a leading space or '+'; that is not taken.)
MEM = re.compile(r"[0-9]+(?:[KMGTkmgt][Bb]?)?")
# Node placement values, each on an #SBATCH line: Slurm's own alphabets, with no space, quote, % or line break.
PLACEMENT = {  # flag -> (its alphabet, what it is, an example)
    "nodelist": (re.compile(r"[A-Za-z0-9._\-\[\],]+"), "a Slurm hostlist", "gpu[01-04],gpu07"),
    "exclude": (re.compile(r"[A-Za-z0-9._\-\[\],]+"), "a Slurm hostlist", "gpu[01-04],gpu07"),
    "constraint": (re.compile(r"[A-Za-z0-9._\-&|\[\]*:(),!]+"), "a feature expression", "h100 or h100&ib"),
    "reservation": (re.compile(r"[A-Za-z0-9._\-]+(,[A-Za-z0-9._\-]+)*"), "a reservation name", "maintenance_1"),
    "mem": (MEM, "a memory size", "500G, 500GB, 4096 (megabytes), or 0 for all of a node's memory"),
}


def time_limit_seconds(text: str) -> int:
    """Seconds in a valid Slurm time limit (minutes, MM:SS, HH:MM:SS, D-HH[:MM[:SS]])."""
    days, _, rest = text.rpartition("-")
    parts = [int(p) for p in rest.split(":")]
    if days:
        h, m, s = (parts + [0, 0])[:3]
    elif len(parts) == 1:
        h, m, s = 0, parts[0], 0
    elif len(parts) == 2:
        h, m, s = 0, parts[0], parts[1]
    else:
        h, m, s = parts
    return ((int(days or 0) * 24 + h) * 60 + m) * 60 + s
