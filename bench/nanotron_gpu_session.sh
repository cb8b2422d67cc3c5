#!/usr/bin/env bash
# One GPU session (docs/nanotron-gpu.md has the plan and the device-tool calls). Run from the repository root on the
# GPU machine, with .gpu/ carried (the wheels the GPU image lacks, and nanotron main's vendored source):
#
#   bench/nanotron_gpu_session.sh session OUT [SECONDS [ARGS...]]   nanotron 0.4 and main beside the torch engine;
#                         stop and resume; memory vs the estimate (bench/gpu_session.py; ARGS: its --parts, --only)
#   bench/nanotron_gpu_session.sh fa4-libs OUT            call 1 of 2: the first half of FA4's CUDA 13 libraries
#                         (nvidia-cutlass-dsl-libs-cu13: 92 MB as a wheel, over one call's 64 MiB carry, so its files
#                         travel as one .tar.xz split in two: .gpu-libs-a/ here, .gpu-libs-b/ with call 2), kept in /tmp
#   bench/nanotron_gpu_session.sh fa4 OUT [SECONDS [ARGS...]]   call 2, on the warm machine: FlashAttention 4 against
#                         the SDPA stand-in (bench/fa4_probe.py, cold and from its disk cache), then `session`
#   bench/nanotron_gpu_session.sh data-export OUT [SECONDS [ARGS...]]   a Nanoset against the same text tokenized at
#                         start, and the export of a GPU-trained checkpoint against nanotron's forward
#                         (bench/gpu_data_export.py; .gpu/data/ made on the CPU machine, docs/nanotron-gpu.md)
#   bench/nanotron_gpu_session.sh build-fa OUT            flash-attn from .gpu/sdist/, built in the background
#   bench/nanotron_gpu_session.sh fidelity OUT            once built: nanotron's loss through flash_attn vs the stand-in
set -euo pipefail
stage=$1
out=$2
mkdir -p "$out"
if [ "$stage" = fa4-libs ]; then  # nothing else is carried in this call
    cp .gpu-libs-a/* /tmp/ && ls -la /tmp/cutlass-libs-cu13.tar.xz.* && exit 0
fi

python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .gpu/whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 WANDB_MODE=disabled CUDA_DEVICE_MAX_CONNECTIONS=1
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1  # nothing can be reached from there
# datasets 5.2 needs pyarrow >= 24: the image's, else the carried wheel
if ! python3 -c 'import pyarrow, sys; sys.exit(int(pyarrow.__version__.split(".")[0]) < 24)'; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        .gpu/fallback/pyarrow-*.whl
fi
if [ -d .gpu/fa4 ] && [ "$stage" != data-export ]; then  # FlashAttention 4 and what it needs beyond the image (docs/nanotron-gpu.md)
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        .gpu/fa4/*.whl
    if [ -f /tmp/cutlass-libs-cu13.tar.xz.aa ] && [ -d .gpu-libs-b ]; then  # the two halves, joined and unpacked
        cat /tmp/cutlass-libs-cu13.tar.xz.aa .gpu-libs-b/cutlass-libs-cu13.tar.xz.ab | python3 -c 'import sys, tarfile
tarfile.open(fileobj=sys.stdin.buffer, mode="r|xz").extractall("/tmp/site")'  # Python's: the image may lack xz
    else
        echo "FA4's CUDA libraries are not on this machine (the fa4-libs call first): its kernels cannot load"
    fi
    # the wheel's .pth puts the DSL's packages on sys.path; a --target folder's .pth files are not read
    export PYTHONPATH=/tmp/site/nvidia_cutlass_dsl/dsl_packages:$PYTHONPATH
    export FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1 FLASH_ATTENTION_CUTE_DSL_CACHE_DIR=/tmp/fa4-cache
fi
mkdir -p /tmp/nanotron-main && tar xzf .gpu/nanotron-main-*.tar.gz -C /tmp/nanotron-main
python3 -c 'import datasets, nanotron, pyarrow, torch, transformers; print("torch", torch.__version__, "datasets",
datasets.__version__, "pyarrow", pyarrow.__version__, "transformers", transformers.__version__, "nanotron",
nanotron.__version__, torch.cuda.get_device_name())'
work=/tmp/gpu-session  # checkpoints (a 1b one is ~15 GB, deleted after each run) in memory where it has room
if [ "$(df --output=avail -B1G /dev/shm 2>/dev/null | tail -1)" -ge 60 ] 2>/dev/null; then work=/dev/shm/gpu-session; fi

case $stage in
session)
    python3 bench/gpu_session.py --out "$out" --work "$work" --main-src /tmp/nanotron-main/src --deadline "${3:-450}" \
        "${@:4}"
    ;;
data-export)  # the data was tokenized at /tmp/gpu-data, which its metadata names: the same path here
    mkdir -p /tmp/gpu-data && cp -r .gpu/data/. /tmp/gpu-data/
    python3 bench/gpu_data_export.py --out "$out" --data /tmp/gpu-data --work "$work" \
        --main-src /tmp/nanotron-main/src --deadline "${3:-420}" "${@:4}"
    ;;
fa4)
    rm -rf /tmp/fa4-cache
    for pass in cold cached; do  # the kernels compiled at first use, then read from the disk cache
        python3 bench/fa4_probe.py 2>&1 | tee "$out/fa4-probe-$pass.txt" | tail -25 || true
        if ! grep -q '"backend": "fa4"' "$out/fa4-probe-$pass.txt"; then  # say why, and spend no more time
            python3 -c 'import flash_attn.cute' 2>&1 | tail -20
            exit 1
        fi
    done
    python3 bench/gpu_session.py --out "$out" --work "$work" --main-src /tmp/nanotron-main/src --deadline "${3:-420}" \
        "${@:4}"
    ;;
build-fa)  # ~10-25 min on 16 cores: a process of its own session outlives this call (not the machine's loan)
    setsid nohup env FLASH_ATTN_CUDA_ARCHS=90 MAX_JOBS=16 python3 -m pip install --no-build-isolation --no-deps \
        --no-cache-dir --target /tmp/fa-site .gpu/sdist/flash_attn-2.8.3.tar.gz >/tmp/fa-build.log 2>&1 &
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
    echo "unknown stage $stage: session, build-fa or fidelity" >&2
    exit 2
    ;;
esac
