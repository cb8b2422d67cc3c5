"""The node checks before training (launcher/node/nodecheck.py), here on one machine: each check, and the
nodes meeting at the rendezvous port (threads standing in for nodes; the end-to-end tests run it on the cluster)."""

from __future__ import annotations

import os
import resource
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from launcher_helpers import free_port

from launcher.node import nodecheck


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
    assert code == nodecheck.FAILED and "node check failed on node1: cannot write" in out
    assert report.read_text().startswith(f"node1: cannot write {tmp_path / 'f' / 'x'}")


def limited_head(port: int, nodes: list[str], files: int, report: Path) -> subprocess.Popen:
    """The head as the job runs it (a module, the project on PYTHONPATH), with an open-file limit of `files`, soft
    and hard."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (files, files))

    argv = [sys.executable, "-m", nodecheck.__name__, "--head", "127.0.0.1", "--port", str(port), "--nodes",
            ",".join(nodes), "--node", nodes[0], "--gpus", "8", "--timeout", "60", "--report", str(report)]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(Path(nodecheck.__file__).parents[2])}
    return subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, preexec_fn=limit, env=env)


def test_many_peers_under_a_low_file_limit_get_the_verdict_and_the_limit_is_named(tmp_path: Path):
    # 600 nodes against a head allowed 256 open files: a head holding a socket per node ran out of files at ~250
    # and called it a taken port. Now every node gets the verdict, and the verdict names the limit itself.
    port, nodes = free_port(), ["head"] + [f"n{i}" for i in range(600)]
    head = limited_head(port, nodes, 256, tmp_path / "report")
    verdicts: dict[str, dict] = {}

    def peer(node: str) -> None:
        verdicts[node] = nodecheck.ask("127.0.0.1", port, nodes, node, ["disk full"] if node == "n7" else [], 60)

    threads = [threading.Thread(target=peer, args=(n,)) for n in nodes[1:]]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    out, _ = head.communicate(timeout=60)
    assert head.returncode == nodecheck.FAILED and "taken" not in out, out
    assert len(verdicts) == 600 and all(set(v) == set(nodes) for v in verdicts.values())
    assert verdicts["n3"]["n7"] == ["disk full"] and verdicts["n3"]["n3"] == []
    (limit_line,) = verdicts["n1"]["head"]
    assert (
        limit_line.startswith("the open-file limit is 256 (ulimit -n, hard limit 256)")
        and "601 nodes x 8 processes needs about 5665" in limit_line
    )
    assert (tmp_path / "report").read_text().splitlines()[0].startswith("head: the open-file limit is 256")


def test_a_head_that_cannot_listen_for_another_reason_says_why(capsys: pytest.CaptureFixture[str]):
    code = nodecheck.main(["--head", "127.0.0.1", "--port", "1", "--nodes", "node1,node2", "--node", "node1",
                           "--timeout", "1"])  # fmt: skip
    out = capsys.readouterr().out
    if os.geteuid() == 0:  # root may listen on port 1; nothing to show then
        assert code in (0, nodecheck.FAILED)
        return
    assert code == nodecheck.FAILED and "cannot listen on port 1 (Permission denied)" in out and "taken" not in out
