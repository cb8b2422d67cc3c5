"""Slurm hostlists expanded by the launcher, and --nodelist judged against --nodes before Slurm is asked (Slurm
22.05 refuses a list longer than --nodes, 24.11 runs on part of it: tests/test_slurm_e2e.py shows both)."""

from __future__ import annotations

import pytest
from launcher_helpers import spec_for

from launcher.config.hostlist import expand
from launcher.config.validate import validate


@pytest.mark.parametrize(
    "text,names",
    [
        ("node1", ["node1"]),
        ("node[1-3]", ["node1", "node2", "node3"]),
        ("gpu[01-02,07],login1", ["gpu01", "gpu02", "gpu07", "login1"]),  # the width of a range's bound kept
        ("gpu[8-10]", ["gpu8", "gpu9", "gpu10"]),
        ("rack[1-2]-n[1-2]", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]),  # every combination
        ("a,b,a", ["a", "b"]),  # each once
        ("n[1-2],n2", ["n1", "n2"]),
    ],
)
def test_hostlists_expand_as_slurm_reads_them(text: str, names: list[str]) -> None:
    assert expand(text) == names


@pytest.mark.parametrize("text", ["", "n[", "n]", "n[3-1]", "n[a]", "n[1-2", "n[[1]]", "a,,b", "n[1-]", "n[1-200000]"])
def test_what_is_no_hostlist_is_none(text: str) -> None:
    assert expand(text) is None


@pytest.mark.parametrize(
    "flags,problem",
    [
        (("--nodes", "1", "--nodelist", "node[1-2]"), "--nodelist: node[1-2] names 2 nodes, more than --nodes 1"),
        (("--nodes", "3", "--nodelist", "g[01-04],g07"), "--nodelist: g[01-04],g07 names 5 nodes, more than --nodes 3"),
        (("--nodes", "2", "--nodelist", "n[1-2]", "--exclude", "n2"), "--exclude: n2 is in both --nodelist and"),
        (
            ("--nodes", "2", "--spare_nodes", "1", "--nodelist", "n[1-4]"),
            "--nodelist: n[1-4] names 4 nodes, more "
            "than the job's 3 (--nodes 2 + --spare_nodes 1) (a job runs on every node its --nodelist names); raise "
            "--spare_nodes to 2, or name at most 3 nodes",
        ),
    ],
)
def test_a_nodelist_that_cannot_be_met_is_a_problem(flags: tuple[str, ...], problem: str) -> None:
    spec, found = spec_for(*flags, "--dataset", "none")
    problems = found + validate(spec)
    (said,) = [str(p) for p in problems if p.flag in ("nodelist", "exclude")]
    assert said.startswith(problem)


@pytest.mark.parametrize(
    "flags",
    [
        ("--nodes", "2", "--nodelist", "node[1-2]"),
        ("--nodes", "4", "--nodelist", "node1"),
        ("--nodes", "1"),
        ("--nodes", "2", "--spare_nodes", "1", "--nodelist", "node[1-3]"),
    ],
)
def test_a_nodelist_within_nodes_is_taken(flags: tuple[str, ...]) -> None:
    spec, found = spec_for(*flags, "--dataset", "none")
    assert found + validate(spec) == []


def test_spares_are_refused_with_a_shell_and_bounded(tmp_path) -> None:
    spec, found = spec_for("--nodes", "2", "--spare_nodes", "1", "--interactive", "--dataset", "none")
    (said,) = [str(p) for p in found + validate(spec) if p.flag == "spare_nodes"]
    assert said.endswith("leave out --spare_nodes with --interactive")
    spec, found = spec_for("--spare_nodes", "9" * 20, "--max_restarts", "9" * 20, "--dataset", "none")
    flags = [p.flag for p in found + validate(spec)]
    assert flags[:2] == ["spare_nodes", "max_restarts"] and "beyond any run" in str((found + validate(spec))[0])
