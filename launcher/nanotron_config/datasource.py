"""What a --dataset / --tokenizer value means: a local path or a Hugging Face hub name.

One rule for the launcher (which checks that a local path exists before the queue) and the training job (which
loads it), so the two cannot disagree. Imports nothing heavy: the dry run uses it.
"""

from __future__ import annotations

import os
from pathlib import Path

# Data files the training job loads with `datasets` builders, by suffix.
DATA_FILE_BUILDERS = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv", ".txt": "text"}


def is_local_path(value: str) -> bool:
    """A value meant as a path: absolute, ./ ../ or ~ relative, a data file by its suffix, or an existing path."""
    return (
        os.path.isabs(value)
        or value.startswith((".", "~"))
        or Path(value).suffix in DATA_FILE_BUILDERS
        or os.path.exists(os.path.expanduser(value))
    )
