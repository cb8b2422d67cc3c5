"""Each test file's own marks, its `pytestmark`, read from its source (no import): tests/test_architecture.py holds
them to the file's use of the local cluster, and `make test`'s Slurm parts collect only the files marked `slurm`
(`python tests/marks.py slurm` prints them), where collecting every file cost each of their twelve workers ~6 CPU s
of imports (torch, datasets, transformers) for tests the part deselects."""

from __future__ import annotations

import ast
import sys
from pathlib import Path


def file_marks(tree: ast.Module) -> set[str]:
    """The marks a test module's top-level `pytestmark` names (`pytest.mark.X`, alone or in a list)."""
    return {
        node.attr
        for top in tree.body
        if isinstance(top, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in top.targets)
        for node in ast.walk(top.value)
        if isinstance(node, ast.Attribute) and ast.unparse(node.value) == "pytest.mark"
    }


def marked(mark: str, folder: Path) -> list[Path]:
    """The test files in `folder` whose `pytestmark` names `mark`."""
    return [p for p in sorted(folder.glob("test_*.py")) if mark in file_marks(ast.parse(p.read_text()))]


if __name__ == "__main__":
    print(" ".join(str(p) for p in marked(sys.argv[1], Path("tests"))))
