"""The templates' compiled code is kept between launches (launcher.bundle.template_cache): the scripts rendered
from it are the scripts rendered without it, a warm cache compiles nothing, and a cache that cannot be written
or holds damaged files changes nothing but the time."""

from __future__ import annotations

from pathlib import Path

import jinja2
import pytest
from launcher_helpers import fixed_paths, spec_for

from launcher.bundle import render, template_cache


def rendered() -> tuple[str, str]:
    spec, problems = spec_for("--nodes", "2", "--dataset", "none")
    assert problems == []
    paths = fixed_paths("t")
    return render.sbatch_script(spec, paths), render.export_script(spec, paths)


@pytest.fixture
def cache_home(tmp_path: Path, monkeypatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache"


def without_cache(monkeypatch) -> tuple[str, str]:
    with monkeypatch.context() as m:
        m.setattr(template_cache, "cache_for", lambda options: None)
        return rendered()


def test_a_warm_cache_renders_the_same_scripts_and_compiles_nothing(cache_home: Path, monkeypatch):
    plain = without_cache(monkeypatch)
    assert rendered() == plain  # cold: compiled, and the code kept
    kept = list((cache_home / "nanotron-launcher/templates").iterdir())
    assert len(kept) == 2  # sbatch.sh.j2, export.sh.j2
    monkeypatch.setattr(jinja2.Environment, "compile", lambda *a, **k: pytest.fail("compiled with a warm cache"))
    assert rendered() == plain


def test_a_template_changed_since_is_compiled_afresh(cache_home: Path, tmp_path: Path, monkeypatch):
    copy = tmp_path / "templates"
    copy.mkdir()
    for template in render.TEMPLATES.iterdir():
        (copy / template.name).write_text(template.read_text())
    monkeypatch.setattr(render, "TEMPLATES", copy)
    rendered()  # the copy's code kept, under the copy's paths
    for template in copy.iterdir():
        template.write_text(template.read_text() + "# changed\n")
    assert all(text.endswith("# changed\n") for text in rendered())


def test_other_environment_options_never_share_compiled_code(cache_home: Path):
    assert (
        template_cache.cache_for(render.OPTIONS).pattern
        != template_cache.cache_for(  # type: ignore[union-attr]
            {**render.OPTIONS, "trim_blocks": False}
        ).pattern
    )


def test_an_unusable_or_damaged_cache_changes_nothing_but_the_time(cache_home: Path, monkeypatch):
    plain = without_cache(monkeypatch)
    cache_home.write_text("a file where the cache's directory should be")
    assert template_cache.cache_for(render.OPTIONS) is None
    assert rendered() == plain
    cache_home.unlink()
    rendered()
    for kept in (cache_home / "nanotron-launcher/templates").iterdir():
        kept.write_bytes(kept.read_bytes()[:100])  # cut short
    assert rendered() == plain
    (cache_home / "nanotron-launcher/templates").chmod(0o500)  # read-only (root writes anyway: still a run)
    try:
        assert rendered() == plain
    finally:
        (cache_home / "nanotron-launcher/templates").chmod(0o700)
