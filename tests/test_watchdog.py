"""The hang verdict (launcher/node/watchdog.py --suspects) on thousands of synthetic py-spy dumps: the node whose
processes differ from the great majority, not every node whose stacks lack a collective's name."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from synthetic_stacks import IN_COLLECTIVE, node_name, write_dumps

from launcher.node import watchdog


def test_the_odd_node_out_of_2000_processes_waiting_host_side(tmp_path: Path):
    # 250 nodes x 8: every rank waits on the host side of an async collective (no collective's name in its stack),
    # node 17 reads data. The rule "no collective keyword" made all 250 nodes suspects.
    write_dumps(tmp_path, nodes=250, per_node=8, stuck={17})
    assert watchdog.suspects(tmp_path, max_suspects=5) == ([node_name(17)], "")


def test_pipeline_stages_are_not_suspects(tmp_path: Path):
    write_dumps(tmp_path, nodes=120, per_node=4, stuck={3}, stages=4)  # four groups of ~30 nodes, all normal
    assert watchdog.suspects(tmp_path, max_suspects=5)[0] == [node_name(3)]


def test_too_many_differing_nodes_point_at_no_one(tmp_path: Path):
    write_dumps(tmp_path, nodes=200, per_node=2, stuck={1, 2, 3, 4, 5, 6, 7})
    assert watchdog.suspects(tmp_path, max_suspects=0)[0] == [node_name(i) for i in range(1, 8)]
    found, why = watchdog.suspects(tmp_path, max_suspects=4)
    assert found == [] and why == "7 nodes' stacks differ from the others': more than 4, so no one node"


def test_a_few_processes_the_one_outside_a_collective(tmp_path: Path):
    # one node, two ranks (the end-to-end test's hang): no group is a minority of ten; the rank outside any
    # collective, while the other waits in one, is the one
    write_dumps(tmp_path, nodes=2, per_node=1, stuck={1}, majority=IN_COLLECTIVE)
    assert watchdog.suspects(tmp_path, max_suspects=1) == ([node_name(1)], "")
    (tmp_path / "all").mkdir()
    write_dumps(tmp_path / "all", nodes=3, per_node=2, stuck=set())
    assert watchdog.suspects(tmp_path / "all") == ([], "no node's processes stand out (1 kinds of stacks, none rare)")


def test_the_script_prints_suspects_and_says_why_there_are_none(tmp_path: Path):
    write_dumps(tmp_path, nodes=40, per_node=2, stuck=set(range(20)), majority=IN_COLLECTIVE)
    out = subprocess.run([sys.executable, watchdog.__file__, "--suspects", str(tmp_path), "--max-suspects", "1"],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert out.returncode == 0 and out.stdout.strip() == ""
    assert "no suspected node: 20 nodes' stacks differ from the others': more than 1" in out.stderr
