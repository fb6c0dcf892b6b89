#!/usr/bin/env bash
# Configures, builds (CMake + ninja) and runs the GPU correctness tests of the core:
#   test_*.cu       (one GPU: GPU vs the CPU core; one program per part of core/cuda/gpu_api.h,
#                    each run in turn), then, when 2+ GPUs are visible,
#   test_multi_gpu  (model-parallel lookup over NCCL vs the one-GPU pipeline).
# Usage: tests/gpu/run.sh [build_dir] [seed]      (NCCL_ROOT=... if nccl.h is not in /usr/include)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-$here/build}
seed=${2:-}
export NCCL_NVLS_ENABLE=0  # never NVLink multicast
cmake -G Ninja -S "$here" -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
ninja -C "$build"
status=0
for src in "$here"/test_*.cu; do
  name=$(basename "$src" .cu)
  [ "$name" = test_multi_gpu ] && continue
  "$build/$name" $seed || status=1
done
ngpu=$(nvidia-smi -L 2>/dev/null | wc -l || echo 0)
if [ "$ngpu" -ge 2 ]; then
  if [ -x "$build/test_multi_gpu" ]; then
    "$build/test_multi_gpu" $seed || status=1
  else
    echo "test_multi_gpu was not built (NCCL not found)"; status=1
  fi
fi
exit $status
