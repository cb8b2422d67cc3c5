"""The local S3 server's figures (docs/s3-server.md): its start-up, its memory, and s5cmd's throughput against it,
beside the local disk's. Not a test.

    python bench/bench_s3_server.py [--dir DIR] [--sizes 200,1000] [--runs 3]

As root, with the `s3` extra (s5cmd). Makes a server anew in DIR (default: a temporary directory, removed at the
end) and times: making it (`up` on an empty directory, until radosgw answers), its restart (`down`, then `up`), and
radosgw's SIGKILL to its next answer (what the fault tests do); the three daemons' resident memory, idle and after
the transfers. Then, for each size in MB, a file of random bytes: copied on the local disk (cp and fsync, the
floor), uploaded with s5cmd (its defaults: multipart in parts of 50 MiB, 5 at a time) and downloaded again
(compared byte for byte); the median of --runs. The load average is printed with the figures: on a shared machine
they move with it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from launcher.localcluster import s3, s3_access
from launcher.localcluster.s3_conf import S3Spec


def _rss_mb(spec: S3Spec) -> dict[str, int]:
    """Each daemon's resident memory in MB."""
    rss = {}
    for name, pid in s3.daemon_pids(spec).items():
        status = Path(f"/proc/{pid}/status").read_text()
        rss[name] = int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:"))) // 1024
    return rss


def _timed(argv: list[str], env: dict[str, str] | None = None) -> float:
    start = time.perf_counter()
    subprocess.run(argv, env=env, check=True, capture_output=True)
    return time.perf_counter() - start


def _load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, help="the server's directory (default: a temporary one)")
    parser.add_argument("--sizes", default="200,1000", help="file sizes in MB, comma-separated")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-s3-"))
    spec = S3Spec(args.dir or work / "server")
    try:
        s3.root()  # built (once) before anything is timed
        start = time.perf_counter()
        spec = s3.up(spec)
        made = time.perf_counter() - start
        user = s3_access.S3User("BENCH" + os.urandom(6).hex().upper(), os.urandom(20).hex())
        s3_access.add_user(spec, user)
        s3_access.create_bucket(spec, user, "bench")
        idle = _rss_mb(spec)
        s3.down(spec)
        start = time.perf_counter()
        s3.up(spec)
        restarted = time.perf_counter() - start
        start = time.perf_counter()
        s3.kill_gateway(spec)
        s3.start_gateway(spec)
        gateway = time.perf_counter() - start
        print(f"\nload average {_load()}")
        print(f"made and answering in {made:.1f} s; up again after down in {restarted:.1f} s; radosgw SIGKILLed to "
              f"answering again in {gateway:.1f} s")  # fmt: skip
        print(f"resident memory idle (MB): {idle}, {sum(idle.values())} in all")
        env = {**os.environ, **s3_access.client_env(spec, user)}
        s5cmd = [s3_access.s5cmd(), "--endpoint-url", spec.endpoint]
        for size in (int(n) for n in args.sizes.split(",")):
            source, back, copy = work / f"{size}MB", work / f"{size}MB.back", work / f"{size}MB.copy"
            with source.open("wb") as f:
                for _ in range(size):
                    f.write(os.urandom(1_000_000))
            key = f"s3://bench/step-{size}/model/weights.safetensors"
            local, up, down = [], [], []
            for _ in range(args.runs):
                local.append(_timed(["sh", "-c", 'cp "$0" "$1" && sync "$1"', str(source), str(copy)]))
                up.append(_timed([*s5cmd, "cp", str(source), key], env))
                down.append(_timed([*s5cmd, "cp", key, str(back)], env))
                assert back.read_bytes() == source.read_bytes(), f"{key} came back other than it went"
                copy.unlink()
                back.unlink()
            t = {name: statistics.median(v) for name, v in (("local", local), ("up", up), ("down", down))}
            print(f"{size} MB: local disk copy {t['local']:.2f} s ({size / t['local']:.0f} MB/s); s5cmd upload "
                  f"{t['up']:.2f} s ({size / t['up']:.0f} MB/s), download {t['down']:.2f} s "
                  f"({size / t['down']:.0f} MB/s); load average {_load()}")  # fmt: skip
            source.unlink()
        after = _rss_mb(spec)
        print(f"resident memory after the transfers (MB): {after}, {sum(after.values())} in all")
    finally:
        s3.down(spec)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
