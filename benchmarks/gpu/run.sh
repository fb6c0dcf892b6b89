#!/usr/bin/env bash
# One command: build + every single-GPU benchmark (copy ceiling, (a) static pooled forward,
# (b) hash table, (c) training step) + the PyTorch baseline on the same GPU and ids.
# Usage: benchmarks/gpu/run.sh [build_dir] [work_dir]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-$here/build}
work=${2:-/tmp/sok_bench}
mkdir -p "$work"
export NCCL_NVLS_ENABLE=0
cmake -G Ninja -S "$here" -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
ninja -C "$build" bench_gpu
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit --format=csv || true
"$build/bench_gpu" "$work" | tee "$work/bench_gpu.log"
PYTHONUNBUFFERED=1 python3 "$here/torch_baseline.py" "$work" "$work/bench_gpu.log"
