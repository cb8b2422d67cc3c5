"""The house's shape holds: the layering contract of pyproject.toml (import-linter), no import circles anywhere in
the package, no runaway module, thin doors, no loose module beside the packages but the ground floor's, a contract
for each package; and in the tests, every file that uses the local cluster says so."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import grimp
from marks import file_marks, marked
from slurm_cluster import CLUSTER_FIXTURES

ROOT = Path(__file__).resolve().parent.parent
# A ceiling that catches a runaway module, not a length modules stop at: a module is split where its concept ends.
MAX_MODULE_LINES = 500
GROUND_FLOOR = {"protocol", "checkpoint_layout", "atomic", "jsonl", "commands", "errors", "problems", "secrets_guard"}
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


def _fixtures_standing_on(base: set[str], trees: list[ast.Module]) -> set[str]:
    """`base` and, by name, every fixture of the tests that takes one of them, or one that does, and so on."""
    fixtures: dict[str, set[str]] = {}
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and any("fixture" in ast.unparse(d) for d in node.decorator_list):
                fixtures[node.name] = {a.arg for a in node.args.args}
    standing = set(base)
    while more := {name for name, takes in fixtures.items() if takes & standing} - standing:
        standing |= more
    return standing


def cluster_marker_problems(sources: dict[str, str]) -> list[str]:
    """Each test file (name -> source) whose `pytestmark` disagrees with its use of the local cluster: a test or
    fixture that takes one of the cluster's fixtures (tests/slurm_cluster.py), or a fixture that stands on one, or a
    cluster of its own (`ClusterSpec`), needs `pytest.mark.slurm` at the file's top (`make test` picks its parts by
    it), and `accounting` beside it where it is the cluster with accounting; a file that says `slurm` uses one."""
    trees = {name: ast.parse(source) for name, source in sources.items()}
    on_cluster = _fixtures_standing_on(set(CLUSTER_FIXTURES), list(trees.values()))
    on_accounting = _fixtures_standing_on({"slurm_accounting_spec", "slurm_accounting"}, list(trees.values()))
    problems = []
    for name, tree in sorted(trees.items()):
        marks = file_marks(tree)
        takes = {a.arg for node in ast.walk(tree) if isinstance(node, ast.FunctionDef) for a in node.args.args}
        own = any(isinstance(node, ast.Name) and node.id == "ClusterSpec" for node in ast.walk(tree))
        if (bool(takes & on_cluster) or own) != ("slurm" in marks):
            problems.append(f"{name}: uses the cluster: {bool(takes & on_cluster) or own}; pytestmark: {sorted(marks)}")
        if takes & on_accounting and "accounting" not in marks:
            problems.append(f"{name}: uses the cluster with accounting; pytestmark: {sorted(marks)}")
    return problems


def test_every_test_file_that_uses_the_cluster_says_so():
    """`pytestmark = pytest.mark.slurm` at the top of every test file that uses the local cluster, and of no other
    (tests/slurm_cluster.py also stops a session where a test that uses it is not marked)."""
    sources = {p.name: p.read_text() for p in (ROOT / "tests").glob("test_*.py")}
    assert cluster_marker_problems(sources) == []
    unmarked = "import pytest\n\n@pytest.fixture\ndef on(slurm_env): ...\n\ndef test_x(on): ...\n"
    marked = "import pytest\n\npytestmark = [pytest.mark.slurm]\n\ndef test_y(tmp_path): ...\n"
    problems = cluster_marker_problems({**sources, "test_unmarked.py": unmarked, "test_marked.py": marked})
    assert [p.split(":")[0] for p in problems] == ["test_marked.py", "test_unmarked.py"], problems


def test_the_slurm_parts_collect_the_files_marked_slurm_and_a_test_is_never_marked_so_alone():
    """`make test`'s Slurm parts collect only tests/marks.py's files marked `slurm`; the host part deselects
    `slurm`: a test marked `slurm` by a decorator, in a file that is not, would run in no part."""
    alone = [p.name for p in (ROOT / "tests").glob("test_*.py") if "@pytest.mark.slurm\n" in p.read_text()]
    assert alone == []
    commands = subprocess.run(["make", "-n", "-o", "setup", "test"], cwd=ROOT, capture_output=True, text=True).stdout
    parts = [line for line in commands.replace("\\\n", " ").splitlines() if " -m pytest " in line]
    assert len(parts) == 4, commands  # the host part, then 22.05's, 24.11's and 26.05's Slurm parts
    files = {f"tests/{p.name}" for p in marked("slurm", ROOT / "tests")}
    assert "tests/test_slurm_e2e.py" in files and "tests/test_cli_parse.py" not in files
    for part in parts[1:]:
        assert {word for word in part.split() if word.startswith("tests/test_")} == files, part
    assert not any(word.startswith("tests/") for word in parts[0].split())  # the host part collects every file


def test_the_checkpoints_folders_names_have_one_home():
    """The lock, a purge's leftovers, the leases and the eval submissions are named by checkpoint_layout alone."""
    import re

    folder_names = re.compile(r"\bP\.(LOCK|LOCK_HOLDER|PURGING|EVALS_SUBMITTED|LEASES)\b")
    named = [p.name for p in (ROOT / "launcher").rglob("*.py") if folder_names.search(p.read_text())]
    assert named == ["checkpoint_layout.py"]
