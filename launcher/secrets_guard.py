"""Secrets never reach a file or a terminal: flags that carry one are refused, and messages are redacted.

Every flag is written to the bundle (the manifest's command line, the sbatch script), so a token typed as a flag
would sit in a file for as long as the bundle lives. The advice is always the same: export it in the shell that
launches; sbatch passes that environment to the job, and the job logs an allowlist of variables, never all.
A reference to a variable (`--token "$HF_TOKEN"`, `HF_TOKEN=$(cat ~/.hf_token)`) is not a secret: it is how
scripts should pass one.
"""

from __future__ import annotations

import re

# Whole parts of a variable name that mark a secret: HF_TOKEN, WANDB_API_KEY, AWS_SECRET_ACCESS_KEY, DB_PASSWORD;
# not TOKENIZERS_PARALLELISM or SSH_KEY_PATH (KEY counts only as the last part).
SECRET_PARTS = frozenset({"TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "CREDENTIALS", "APIKEY"})
# Values that say nothing secret, whatever the name (HF_HUB_DISABLE_IMPLICIT_TOKEN=1).
PLAIN_VALUES = frozenset({"", "0", "1", "true", "false", "yes", "no", "on", "off"})
# NAME=VALUE inside shell text, where NAME is a whole word (not the tail of --max_tokens=...).
ASSIGNMENT = re.compile(r"(?<![\w-])([A-Za-z_][A-Za-z0-9_]*)=(\S*)")
# Values that are secrets whatever they are called: well-known token formats, what follows a token option, a
# bearer token, credentials in a URL. Never a $reference.
SECRET_VALUE = re.compile(
    r"(?<![A-Za-z0-9])(?:"
    r"hf_[A-Za-z0-9]{20,}"  # Hugging Face
    r"|sk-[A-Za-z0-9_-]{20,}"  # OpenAI-style API keys
    r"|gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}"  # GitHub
    r"|xox[abprs]-[A-Za-z0-9-]{10,}"  # Slack
    r"|AKIA[0-9A-Z]{16}"  # AWS access key ids
    r")"
    r"|--(?:token|password|api[_-]?key)(?:=|\s+)(?![\"']?\$)\S+"  # huggingface-cli login --token X, ...
    r"|wandb\s+login\s+(?:--\S+\s+)*[0-9a-f]{40}"  # wandb login KEY
    r"|\bBearer\s+(?!\$)[A-Za-z0-9._~+/=-]{16,}"  # Authorization: Bearer ...
    r"|://[^/\s:@]+:(?![\"']?\$)[^/\s@]+@",  # https://user:password@host
    re.IGNORECASE,
)
REDACTED = "<redacted>"


def is_secret_name(name: str) -> bool:
    parts = name.upper().split("_")
    return bool(SECRET_PARTS.intersection(parts)) or (len(parts) > 1 and parts[-1] == "KEY") or name.upper() == "KEY"


def is_secret_assignment(name: str, value: str) -> bool:
    """A variable that holds a secret, given a literal value (not a $reference, not a plain flag value)."""
    value = value.strip("'\"")
    return is_secret_name(name) and value.lower() not in PLAIN_VALUES and not value.startswith("$")


def secret_assignments(shell_text: str) -> list[str]:
    """Names assigned a literal secret in shell text (`export WANDB_API_KEY=abc`)."""
    return [name for name, value in ASSIGNMENT.findall(shell_text) if is_secret_assignment(name, value)]


def has_secret_value(text: str) -> bool:
    return SECRET_VALUE.search(text) is not None


def redact(text: str) -> str:
    """`text` with every secret-looking value replaced: safe to print or write."""
    return SECRET_VALUE.sub(REDACTED, text)
