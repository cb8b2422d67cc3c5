"""docs/README.md is the one index of the docs: every page under docs/ listed there once, and no link to a page that
is not there."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

DOCS = Path(__file__).resolve().parent.parent / "docs"


def test_every_page_is_listed_once():
    listed = Counter(re.findall(r"^\| \[[^]]+\]\(([\w.-]+\.md)\) \|", (DOCS / "README.md").read_text(), re.M))
    pages = {p.name for p in DOCS.glob("*.md") if p.name != "README.md"}
    assert {page: n for page, n in listed.items() if n > 1} == {}
    assert set(listed) == pages
