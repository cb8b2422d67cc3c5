"""The house's shape holds: the layering contract of pyproject.toml (import-linter), no import circles anywhere in
the package, no runaway module, thin doors, no loose module beside the packages but the ground floor's, a contract
for each package."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parent.parent
# A ceiling that catches a runaway module, not a length modules stop at: a module is split where its concept ends.
MAX_MODULE_LINES = 500
GROUND_FLOOR = {"protocol", "checkpoint_layout", "atomic", "jsonl", "errors", "problems", "secrets_guard"}
MAX_DOOR_LINES = 100


def test_layering_contract_holds():
    lint = shutil.which("lint-imports") or str(Path(sys.executable).parent / "lint-imports")
    out = subprocess.run([lint], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "0 broken" in out.stdout


def test_no_import_circles():
    graph = grimp.build_graph("launcher")
    circles = []
    for module in sorted(graph.modules):
        for imported in sorted(graph.find_modules_directly_imported_by(module)):
            if imported.startswith("launcher") and graph.chain_exists(importer=imported, imported=module):
                circles.append(" -> ".join(graph.find_shortest_chain(importer=imported, imported=module) or ()))
    assert circles == []


def test_no_runaway_module():
    long = {
        str(p.relative_to(ROOT)): n
        for p in (ROOT / "launcher").rglob("*.py")
        if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert long == {}


def test_only_the_ground_floor_stands_loose_beside_the_packages():
    loose = {p.stem for p in (ROOT / "launcher").glob("*.py") if p.stem != "__init__"}
    assert loose == GROUND_FLOOR


def test_every_package_is_named_by_a_contract():
    """A room added later is placed in the house on purpose: pyproject.toml's contracts name every package, or, for a
    package whose modules stand at several levels (evals, retention: a job side on the standard library, a launcher
    side above), every module of it."""
    import re

    import tomllib

    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    named = set()
    for contract in contracts:
        for key in ("layers", "source_modules", "protected_modules", "allowed_modules"):
            for entry in contract.get(key, []):
                named |= {part.strip() for part in re.split(r"[|:]", entry)}
    unplaced = []
    for init in (ROOT / "launcher").glob("*/__init__.py"):
        package = f"launcher.{init.parent.name}"
        if package in named:
            continue
        modules = {f"{package}.{p.stem}" for p in init.parent.glob("*.py") if p.stem != "__init__"}
        modules |= {f"{package}.{p.parent.name}" for p in init.parent.glob("*/__init__.py")}
        unplaced += sorted(modules - named) or ([] if modules else [package])
    assert unplaced == []


def test_the_doors_stay_thin():
    for door in ("slurm_launcher.py", "run_train.py"):
        assert len((ROOT / door).read_text().splitlines()) <= MAX_DOOR_LINES, door


def test_the_allow_list_contract_names_each_import_it_does_not_allow():
    """pyproject.toml's `allowed` contracts (lint_contracts.py): what a source imports of the root package is its
    own, an allowed module's, or a broken contract, whatever room is added later."""
    from grimp import ImportGraph

    from lint_contracts import AllowedContract

    graph = ImportGraph()
    for module in ("pkg", "pkg.job", "pkg.job.engine", "pkg.door", "pkg.door.rules", "pkg.new_room"):
        graph.add_module(module)
    imports = [("pkg.job.engine", "pkg.job"), ("pkg.job.engine", "pkg.door.rules"), ("pkg.job", "pkg"),
               ("pkg.job.engine", "pkg.new_room")]  # fmt: skip
    for line, (importer, imported) in enumerate(imports, start=1):
        graph.add_import(importer=importer, imported=imported, line_number=line, line_contents="import ...")
    options = {"source_modules": ["pkg.job"], "allowed_modules": ["pkg.door"]}
    check = AllowedContract("the job", {"root_packages": ["pkg"]}, options).check(graph, verbose=False)
    assert not check.kept and check.metadata["broken"] == ["pkg.job.engine -> pkg.new_room (l.4)"]


def test_the_console_scripts_are_the_commands_users_type():
    """pyproject.toml's console scripts run the same functions as `python slurm_launcher.py`, `python -m
    launcher.jobs` and `python -m launcher.data`; each answers --help (exit 0) without a traceback."""
    import tomllib

    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert set(scripts) == {"slurm-launcher", "slurm-launcher-jobs", "slurm-launcher-data"}
    for name, target in scripts.items():
        module, _, function = target.partition(":")
        code = f"import sys; sys.argv = [{name!r}, '--help']; from {module} import {function}; sys.exit({function}())"
        out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0 and "usage" in out.stdout.lower() and "Traceback" not in out.stderr, (name, out)
