"""The torch engine's reader of tokenized folders (`launcher.train.tokenized.FolderWindows`) against datatrove's
`DatatroveFolderDataset` (datatrove 0.10, what nanotron main's Nanoset reads folders with), on one folder: the
windows each cuts, the time to open the folder, and the time to read windows in the order training reads them
(shuffled) and in file order (not a test).

    python bench/bench_folder_windows.py --work /tmp/bench-windows [--tokens 200_000_000] [--files 8] [--seq 2048]

The folder is made here as datatrove's DocumentTokenizer lays one out (X.ds tokens, uint16; X.ds.index document
ends; X.ds.metadata), random tokens in documents of 300-3000 tokens, so that `nanoset.inspect` reads it whole. Each
reader opens it in a process of its own (the imports it needs counted apart: numpy for one, torch and datatrove for
the other). The figures go in docs/data.md.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]
READS = 4096  # windows read in each order


def make_folder(where: Path, tokens: int, files: int) -> Path:
    import numpy as np

    folder = where / "tokenized"
    if (folder / "done").exists():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    per_file = tokens // files
    for n in range(files):
        name = folder / f"{n:05d}_tokens.ds"
        rng.integers(0, 50_000, per_file, dtype=np.uint16).tofile(name)
        ends = np.cumsum(rng.integers(300, 3000, per_file // 300 + 1, dtype=np.uint64))
        ends = np.append(ends[ends < per_file], np.uint64(per_file))
        ends.astype("<u8").tofile(f"{name}.index")
        Path(f"{name}.metadata").write_text(f"bench-tokenizer|2\n{per_file}\n{per_file / 1e6:.1f}M\n")
    (folder / "done").write_text("")
    return folder


# one reader, in a process of its own: {"imports_s", "open_s", "windows", "shuffled_s", "in_order_s", "first"}
READER = """
import json, sys, time
started = time.perf_counter()
import numpy as np
kind, folder, seq, reads = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
if kind == "launcher":
    from launcher.train.tokenized import FolderWindows
    imported = time.perf_counter()
    data = FolderWindows([(folder, 1.0)], seq)
    read = lambda rows: data[rows]
else:
    from datatrove.utils.dataset import DatatroveFolderDataset
    imported = time.perf_counter()
    data = DatatroveFolderDataset(folder, seq_len=seq, filename_pattern="*.ds", recursive=False, token_size=2)
    read = lambda rows: np.stack([data[r]["input_ids"].numpy() for r in rows])
opened = time.perf_counter()
rng = np.random.default_rng(1)
shuffled = rng.permutation(len(data))[:reads].tolist()
t = time.perf_counter()
for k in range(0, reads, 8):
    read(shuffled[k : k + 8])
t_shuffled = time.perf_counter() - t
t = time.perf_counter()
for k in range(0, reads, 8):
    read(list(range(k, k + 8)))
t_in_order = time.perf_counter() - t
first = read([0, 1]).tolist()
print(json.dumps({"imports_s": imported - started, "open_s": opened - imported, "windows": len(data),
                  "shuffled_s": t_shuffled, "in_order_s": t_in_order, "first": [w[:3] + w[-3:] for w in first]}))
"""


def measure(kind: str, folder: Path, seq: int) -> dict:
    done = subprocess.run([sys.executable, "-c", READER, kind, str(folder), str(seq), str(READS)],
                          capture_output=True, text=True, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
                          check=True)  # fmt: skip
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--tokens", type=int, default=200_000_000)
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--seq", type=int, default=2048)
    args = parser.parse_args()
    folder = make_folder(args.work, args.tokens, args.files)
    import numpy as np

    first_file = np.fromfile(sorted(folder.glob("*.ds"))[0], dtype="<u2")
    per_file = len(first_file)
    rows = []
    for kind in ("launcher", "datatrove"):
        measure(kind, folder, args.seq)  # the page cache warm for both
        m = measure(kind, folder, args.seq)
        rows.append((kind, m))
    seq = args.seq
    lines = [
        f"{args.tokens / 1e6:.0f}M tokens in {args.files} files of {per_file / 1e6:.1f}M, uint16; windows of "
        f"{seq} + 1 tokens; {READS} windows read 8 at a time, page cache warm",
        "",
        "| reader | windows | imports | open | shuffled reads | in-order reads |",
        "| --- | --- | --- | --- | --- | --- |",
        *(
            f"| {k} | {m['windows']:,} | {m['imports_s']:.2f} s | {m['open_s'] * 1e3:.1f} ms | "
            f"{m['shuffled_s'] / READS * 1e6:.0f} us a window | {m['in_order_s'] / READS * 1e6:.0f} us a window |"
            for k, m in rows
        ),  # fmt: skip
        "",
        f"windows a file: launcher (tokens - 1) // {seq} = {(per_file - 1) // seq:,}; datatrove tokens // {seq + 1} ="
        f" {per_file // (seq + 1):,}",
        f"window 1 starts at token {seq} (launcher: the last token of window 0 again) or {seq + 1} (datatrove); "
        f"window 0 alike: {rows[0][1]['first'][0] == rows[1][1]['first'][0]}, window 1 alike: "
        f"{rows[0][1]['first'][1] == rows[1][1]['first'][1]}",
    ]
    print("\n".join(lines))


if __name__ == "__main__":
    main()
