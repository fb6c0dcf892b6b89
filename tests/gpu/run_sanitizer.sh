#!/usr/bin/env bash
# compute-sanitizer over a subset of test_gpu_core (the big growth / two-stream cases are left
# out: memcheck slows kernels down by 10-100x). memcheck: out-of-bounds and misaligned accesses,
# leaks; racecheck: shared-memory hazards (the backward chunk/fixup kernels use shared memory).
# Usage: tests/gpu/run_sanitizer.sh [build_dir]   (after tests/gpu/run.sh built it)
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-$here/build}
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
status=0
for f in "sum weighted dim 32 " "bad ids" "find_or_insert/find vs CPU int64 uniform" "insert_or_assign / erase / re-insert vs CPU int64" \
         "export/import round trips (GPU<->GPU, CPU<->GPU) + errors int64" "optimizer adam 20 steps int32" \
         "training step pipeline vs CPU int64 mean" "counter filter int64" "static pooled + gather int64 mean dim 32" \
         "long samples + hot row mean weighted dim 32"; do
  echo "== memcheck: $f"
  "$CS" --tool memcheck --leak-check full --error-exitcode 9 "$build/test_gpu_core" 0 "$f" 2>&1 | grep -v "^PASS" || status=1
done
for f in "long samples + hot row sum weighted dim 128" "training step pipeline vs CPU int64 sum"; do
  echo "== racecheck: $f"
  "$CS" --tool racecheck --error-exitcode 9 "$build/test_gpu_core" 0 "$f" 2>&1 | grep -v "^PASS" || status=1
done
echo "sanitizer status: $status"
exit $status
