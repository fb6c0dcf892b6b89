#!/usr/bin/env bash
# Builds bench_fields (the framework-free CUDA harness of benchmarks/embedding/run.py --harness)
# with the CUDA runtime linked statically, so the binary can be carried to a GPU machine whose
# driver supports this CUDA (13). sm_90 code + compute_90 PTX (CMakeLists.txt).
# Usage: benchmarks/gpu/build_harness.sh [build_dir]   (default benchmarks/gpu/build/fields)
# Prints the binary's path last.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-$here/build/fields}
nvcc=${CUDACXX:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
gen=()
command -v ninja >/dev/null && gen=(-G Ninja)
cmake "${gen[@]}" -S "$here" -B "$build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_COMPILER="$nvcc" \
  -DSOK_STATIC_CUDART=ON >/dev/null
cmake --build "$build" --target bench_fields -j "$(nproc)"
if ldd "$build/bench_fields" | grep -q libcudart; then
  echo "build_harness.sh: bench_fields links libcudart dynamically" >&2
  exit 1
fi
echo "$build/bench_fields"
