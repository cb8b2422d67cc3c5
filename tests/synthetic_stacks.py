"""Synthetic py-spy dumps (`py-spy dump` output, one file a process, named NODE-PID.txt) for the hang verdict at
thousands of nodes: tests/test_watchdog.py and bench/bench_scale_hang.py."""

from __future__ import annotations

from pathlib import Path

HEADER = (
    "Process {pid}: /usr/bin/python3 -u run_train.py --config-file config.yaml\n"
    "Python v3.11.2 (/usr/bin/python3.11)\n\n"
)
LOADER = (
    'Thread {tid} (idle): "Thread-1 (_pin_memory_loop)"\n    wait (threading.py:331)\n    get (queue.py:180)\n'
    "    _pin_memory_loop (torch/utils/data/_utils/pin_memory.py:{line})\n"
)
# Where most ranks wait in a hang: on the host side of an async collective (the loss's .item() after DDP's
# backward), no collective's name in sight. Line numbers vary (a loop's iterations; two torch builds).
WAITING = (
    'Thread {pid} (active): "MainThread"\n    _local_scalar_dense (torch/_tensor.py:{line})\n'
    "    train_step (launcher/train/torch_engine/engine.py:201)\n"
    "    train (launcher/train/torch_engine/engine.py:252)\n"
    "    run (launcher/train/main.py:88)\n    <module> (run_train.py:30)\n"
)
IN_COLLECTIVE = (
    'Thread {pid} (active): "MainThread"\n    all_reduce (torch/distributed/distributed_c10d.py:{line})\n'
    "    agreed (launcher/train/stop.py:51)\n    train (launcher/train/torch_engine/engine.py:252)\n"
    "    run (launcher/train/main.py:88)\n    <module> (run_train.py:30)\n"
)
IN_DDP_BACKWARD = (  # waiting for DDP's gradient all-reduce: py-spy shows only autograd's frame
    'Thread {pid} (idle): "MainThread"\n    _engine_run_backward (torch/autograd/graph.py:{line})\n'
    "    backward (torch/autograd/__init__.py:395)\n    Tensor.backward (torch/_tensor.py:623)\n"
    "    TorchTrainer.train_step (launcher/train/torch_engine/engine.py:239)\n    <module> (run_train.py:30)\n"
)
STUCK = (
    'Thread {pid} (active): "MainThread"\n    read (multiprocessing/connection.py:{line})\n'
    "    next_batch (launcher/train/data.py:140)\n    train (launcher/train/torch_engine/engine.py:245)\n"
    "    run (launcher/train/main.py:88)\n    <module> (run_train.py:30)\n"
)


def node_name(i: int) -> str:
    return f"gpu-node-{i:05d}"  # a dash inside, as many sites name them


def write_dumps(directory: Path, nodes: int, per_node: int, stuck: set[int], majority: str = WAITING,
                stages: int = 1) -> int:  # fmt: skip
    """Dumps of `nodes` x `per_node` processes: the nodes in `stuck` read data while the others wait (`majority`,
    in `stages` pipeline stages that differ by the frame under train_step). Returns the bytes written."""
    directory.mkdir(parents=True, exist_ok=True)
    written = 0
    for i in range(nodes):
        for local in range(per_node):
            pid = 1000 + i * per_node + local
            body = STUCK if i in stuck else majority
            text = HEADER.format(pid=pid) + body.format(pid=pid, line=2000 + (pid % 7))
            if stages > 1 and i not in stuck:
                text = text.replace("train_step (", f"stage_{i % stages} (launcher/train/pp.py:1)\n    train_step (")
            text += LOADER.format(tid=pid + 50000, line=50 + pid % 3)
            written += (directory / f"{node_name(i)}-{pid}.txt").write_text(text)
    return written
