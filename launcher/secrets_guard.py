"""Secrets never reach a file or a terminal: flags that carry one are refused, and messages are redacted.

Every flag is written to the bundle (the manifest's command line, the sbatch script), so a token typed as a flag
would sit in a file for as long as the bundle lives. The advice is always the same: export it in the shell that
launches; sbatch passes that environment to the job, and the job logs an allowlist of variables, never all.
"""

from __future__ import annotations

import re

# Environment variable names that hold secrets (WANDB_API_KEY, HF_TOKEN, AWS_SECRET_ACCESS_KEY, MY_KEY, ...).
SECRET_NAME = re.compile(
    r"(TOKEN|API_?KEY|SECRET|PASSW(OR)?D|CREDENTIAL|PRIVATE_KEY|ACCESS_KEY|(^|_)KEY$|(^|_)AUTH($|_))", re.IGNORECASE
)
# An assignment of such a variable inside shell text (--pre_launch_commands).
SECRET_ASSIGNMENT = re.compile(
    r"\b\w*(TOKEN|API_?KEY|SECRET|PASSW(OR)?D|CREDENTIAL|ACCESS_KEY|PRIVATE_KEY|_KEY)\w*\s*=\s*\S", re.IGNORECASE
)
# Values that are secrets whatever they are called: well-known token formats, and what follows a token option.
SECRET_VALUE = re.compile(
    r"hf_[A-Za-z0-9]{20,}"  # Hugging Face
    r"|sk-[A-Za-z0-9_-]{20,}"  # OpenAI-style API keys
    r"|gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}"  # GitHub
    r"|xox[abprs]-[A-Za-z0-9-]{10,}"  # Slack
    r"|AKIA[0-9A-Z]{16}"  # AWS access key ids
    r"|--(token|password|api[_-]?key)(=|\s+)\S+"  # huggingface-cli login --token X, ...
    r"|wandb\s+login\s+(--\S+\s+)*[0-9a-f]{40}",  # wandb login KEY
    re.IGNORECASE,
)
REDACTED = "<redacted>"


def has_secret_value(text: str) -> bool:
    return SECRET_VALUE.search(text) is not None


def redact(text: str) -> str:
    """`text` with every secret-looking value replaced: safe to print or write."""
    return SECRET_VALUE.sub(REDACTED, text)
