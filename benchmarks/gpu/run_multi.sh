#!/usr/bin/env bash
# Multi-GPU: build, then the model-parallel correctness test and the weak-scaling benchmark (d)
# on every visible GPU. Usage: benchmarks/gpu/run_multi.sh [build_dir] [tests_build_dir]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-$here/build}
tbuild=${2:-$here/../../tests/gpu/build}
export NCCL_NVLS_ENABLE=0  # never NVLink multicast
cmake -G Ninja -S "$here" -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake -G Ninja -S "$here/../../tests/gpu" -B "$tbuild" -DCMAKE_BUILD_TYPE=Release >/dev/null
ninja -C "$build" bench_multi_gpu & b1=$!
ninja -C "$tbuild" test_multi_gpu & b2=$!
wait $b1
wait $b2
nvidia-smi topo -m || true
"$tbuild/test_multi_gpu"
"$build/bench_multi_gpu"
