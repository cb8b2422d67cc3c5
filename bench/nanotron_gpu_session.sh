#!/usr/bin/env bash
# The nanotron engine on one GPU, in stages (docs/nanotron-gpu.md has the plan and the device-tool calls).
# Run from the repository root on the GPU machine, with the wheels of docs/nanotron-gpu.md in .whl/:
#
#   bench/nanotron_gpu_session.sh bench OUT        both engines side by side (bench/bench_nanotron.py)
#   bench/nanotron_gpu_session.sh resume OUT       run_train.py --engine nanotron: checkpoint, stop, resume
#   bench/nanotron_gpu_session.sh build-fa OUT     flash-attn from .sdist/, built in the background
#   bench/nanotron_gpu_session.sh fidelity OUT     once built: nanotron's loss through flash_attn vs the stand-in
set -euo pipefail
stage=$1
out=$2
mkdir -p "$out"

python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 WANDB_MODE=disabled CUDA_DEVICE_MAX_CONNECTIONS=1
python3 -c 'import datasets, nanotron, pyarrow, torch; print("torch", torch.__version__, "datasets",
datasets.__version__, "pyarrow", pyarrow.__version__, "nanotron", nanotron.__version__, torch.cuda.get_device_name())'

train() {  # CONFIG [ENV=VALUE...]: one nanotron job as the batch script starts it, on one GPU
    local config=$1
    shift
    env "$@" python3 -m torch.distributed.run --standalone --nproc_per_node 1 run_train.py \
        --config-file "$config" --engine nanotron
}

resume() {
    local work=/tmp/resume
    rm -rf "$work" && mkdir -p "$work"
    python3 - "$work" <<'PY'
import sys
from pathlib import Path

import yaml

sys.path.insert(0, "bench")
import bench_nanotron

work = Path(sys.argv[1])
for name, steps, ckpt in (("straight", 60, "a"), ("first", 30, "b"), ("rest", 60, "b")):
    path = bench_nanotron.write_config("tiny:1024:local", steps, 2, work / name, save_interval=20)
    config = yaml.safe_load(path.read_text())
    config["checkpoints"]["checkpoints_path"] = str(work / ckpt)
    config["optimizer"]["learning_rate_scheduler"]["lr_decay_steps"] = 50  # one schedule for 30 and 60 steps
    (work / f"{name}.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
PY
    train "$work/straight.yaml" LAUNCHER_METRICS_FILE="$work/a.jsonl"
    train "$work/first.yaml" LAUNCHER_METRICS_FILE="$work/b.jsonl"  # saves 20 and 30, the last step
    ls "$work/b"
    # a stop request once step 40 is logged, as the batch script makes one on Slurm's warning
    (until grep -q '"step": 40,' "$work/b.jsonl"; do sleep 0.2; done; touch "$work/STOP") &
    train "$work/rest.yaml" LAUNCHER_METRICS_FILE="$work/b.jsonl" LAUNCHER_STOP_FILE="$work/STOP" \
        LAUNCHER_OUTCOME_FILE="$work/OUTCOME"
    cat "$work/OUTCOME" "$work/b/latest.txt" && echo
    train "$work/rest.yaml" LAUNCHER_METRICS_FILE="$work/b.jsonl" LAUNCHER_OUTCOME_FILE="$work/OUTCOME"
    cat "$work/OUTCOME"
    python3 - "$work" <<'PY'
import json
import sys
from pathlib import Path

from launcher.train.config import load_train_config
from launcher.train.schedule import lr_at

work = Path(sys.argv[1])
a, b = ({m["step"]: m for m in map(json.loads, (work / f).read_text().splitlines())} for f in ("a.jsonl", "b.jsonl"))
schedule = load_train_config(str(work / "rest.yaml")).lr
assert sorted(a) == sorted(b) == list(range(1, 61)), (sorted(a), sorted(b))
for run in (a, b):
    assert all(m["lr"] == lr_at(s, schedule) for s, m in run.items()), "every step's LR is the schedule's"
print("checkpoints:", sorted(p.name for p in (work / "b").iterdir()), "latest.txt:", (work / "b/latest.txt").read_text())
print("largest loss difference, straight vs stopped and resumed:", max(abs(a[s]["loss"] - b[s]["loss"]) for s in a))
print("loss at 1, 30, 31, 60:", [(round(a[s]["loss"], 4), round(b[s]["loss"], 4)) for s in (1, 30, 31, 60)])
PY
}

case $stage in
bench)
    python3 bench/bench_nanotron.py --out /tmp/bench --steps 40
    cp /tmp/bench/table.txt "$out/"
    tar czf "$out/bench.tgz" -C /tmp/bench --exclude=work .
    ;;
resume)
    resume 2>&1 | tee /tmp/resume.log
    tail -c 15000000 /tmp/resume.log >"$out/resume.log"
    ;;
build-fa)  # ~10-25 min on 16 cores: a process of its own session outlives this call (not the machine's loan)
    setsid nohup env FLASH_ATTN_CUDA_ARCHS=90 MAX_JOBS=16 python3 -m pip install --no-build-isolation --no-deps \
        --no-cache-dir --target /tmp/fa-site .sdist/flash_attn-2.8.3.tar.gz >/tmp/fa-build.log 2>&1 &
    sleep 540
    tail -c 2000 /tmp/fa-build.log
    ;;
fidelity)
    until [ -d /tmp/fa-site/flash_attn ] || ! pgrep -f "pip install --no-build-isolation" >/dev/null; do sleep 10; done
    tail -c 2000 /tmp/fa-build.log
    cases=(tiny:1024:local 1b:4096:local)
    python3 bench/bench_nanotron.py --out /tmp/fid --engines nanotron --cases "${cases[@]}"
    cp /tmp/fid/table.txt "$out/table-sdpa.txt"
    PYTHONPATH=/tmp/fa-site:$PYTHONPATH python3 bench/bench_nanotron.py --out /tmp/fid --engines nanotron \
        --cases "${cases[@]}"
    cp /tmp/fid/table.txt "$out/" && tar czf "$out/fidelity.tgz" -C /tmp/fid --exclude=work .
    ;;
*)
    echo "unknown stage $stage: bench, resume, build-fa or fidelity" >&2
    exit 2
    ;;
esac
