"""The node checks before training (launcher/train/nodecheck.py), here on one machine: each check, and the
nodes meeting at the rendezvous port (threads standing in for nodes; the end-to-end tests run it on the cluster)."""

from __future__ import annotations

import os
import socket
import threading
from pathlib import Path

import pytest

from launcher.train import nodecheck


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def test_paths_and_modules(tmp_path: Path):
    (tmp_path / "file").write_text("x")
    problems = nodecheck.path_problems([str(tmp_path / "new" / "ckpt"), str(tmp_path / "file" / "sub")],
                                       [str(tmp_path / "file"), str(tmp_path / "gone")])  # fmt: skip
    assert len(problems) == 2
    assert problems[0].startswith(f"cannot write {tmp_path / 'file' / 'sub'}") and "not there" in problems[1]
    assert (tmp_path / "new" / "ckpt").is_dir() and not list((tmp_path / "new" / "ckpt").iterdir())
    assert nodecheck.module_problems(["json", "no_such_module_x"]) == [f"{os.sys.executable} lacks no_such_module_x"]


def test_gpus_as_nvidia_smi_lists_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    fake = tmp_path / "nvidia-smi"
    fake.write_text(
        "#!/bin/bash\necho 'GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-1)'\necho 'GPU 1: NVIDIA H100 (UUID: GPU-2)'\n"
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    assert nodecheck.gpu_problems(2) == []
    assert nodecheck.gpu_problems(8) == ["sees 2 GPUs (nvidia-smi -L), the job runs 8 processes on it"]
    fake.write_text(
        "#!/bin/bash\necho 'Unable to determine the device handle for GPU0000:3B:00.0: Unknown Error' >&2\nexit 15\n"
    )
    assert nodecheck.gpu_problems(2) == [
        "nvidia-smi -L fails: Unable to determine the device handle for GPU0000:3B:00.0: Unknown Error"
    ]


def run_nodes(
    port: int, nodes: list[str], problems: dict[str, list[str]], absent: set[str] = frozenset(), timeout: float = 10
):
    results: dict[str, dict] = {}

    def one(node: str) -> None:
        results[node] = nodecheck.gather("127.0.0.1", port, nodes, node, problems.get(node, []), timeout)

    threads = [threading.Thread(target=one, args=(n,)) for n in reversed(nodes) if n not in absent]  # peers first
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def test_every_node_learns_every_nodes_problems():
    nodes = ["node1", "node2", "node3"]
    results = run_nodes(free_port(), nodes, {"node2": ["cannot write /ckpt (Read-only file system)"]})
    expected = {"node1": [], "node2": ["cannot write /ckpt (Read-only file system)"], "node3": []}
    assert results == {n: expected for n in nodes}


def test_a_node_that_never_comes_is_named():
    port = free_port()
    results = run_nodes(port, ["node1", "node2"], {}, absent={"node2"}, timeout=1)
    assert results["node1"]["node2"] == [f"never reached the rendezvous host 127.0.0.1:{port} within 1 s"]


def test_the_head_says_so_when_its_port_is_taken(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    with socket.create_server(("", 0)) as taken:
        port = taken.getsockname()[1]
        code = nodecheck.main(["--head", "127.0.0.1", "--port", str(port), "--nodes", "node1,node2", "--node",
                               "node1", "--timeout", "1"])  # fmt: skip
    assert code == nodecheck.PORT_TAKEN and f"rendezvous port {port} on node1 is taken" in capsys.readouterr().out


def test_the_head_reports_for_all(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    report = tmp_path / "preflight"
    (tmp_path / "f").write_text("x")  # a file where a directory should be made
    argv = ["--head", "127.0.0.1", "--port", str(free_port()), "--nodes", "node1", "--node", "node1",
            "--writable", str(tmp_path / "f" / "x"), "--report", str(report)]  # fmt: skip
    code = nodecheck.main(argv)
    out = capsys.readouterr().out
    assert code == nodecheck.FAILED and "preflight failed on node1: cannot write" in out
    assert report.read_text().startswith(f"node1: cannot write {tmp_path / 'f' / 'x'}")
