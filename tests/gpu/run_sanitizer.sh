#!/usr/bin/env bash
# compute-sanitizer over a subset of the single-GPU core tests (the big growth / two-stream cases
# are left out: memcheck slows kernels down by 10-100x). memcheck: out-of-bounds and misaligned
# accesses, leaks; racecheck: shared-memory hazards (the backward chunk/fixup kernels use shared
# memory). Each case is "<program>|<name filter>".
# Usage: tests/gpu/run_sanitizer.sh [build_dir]   (after tests/gpu/run.sh built it)
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-$here/build}
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
status=0
for c in "test_pooled|sum weighted dim 32 " "test_pooled|bad ids" \
         "test_table|find_or_insert/find vs CPU int64 uniform" \
         "test_table|insert_or_assign / erase / re-insert vs CPU int64" \
         "test_table|export/import round trips (GPU<->GPU, CPU<->GPU) + errors int64" \
         "test_optimizer|optimizer adam 20 steps int32" \
         "test_pipeline|training step pipeline vs CPU int64 mean" "test_table|counter filter int64" \
         "test_static_pooled|static pooled + gather int64 mean dim 32" \
         "test_pooled|long samples + hot row mean weighted dim 32"; do
  echo "== memcheck: $c"
  "$CS" --tool memcheck --leak-check full --error-exitcode 9 "$build/${c%%|*}" 0 "${c#*|}" 2>&1 | grep -v "^PASS" || status=1
done
for c in "test_pooled|long samples + hot row sum weighted dim 128" \
         "test_pipeline|training step pipeline vs CPU int64 sum"; do
  echo "== racecheck: $c"
  "$CS" --tool racecheck --error-exitcode 9 "$build/${c%%|*}" 0 "${c#*|}" 2>&1 | grep -v "^PASS" || status=1
done
echo "sanitizer status: $status"
exit $status
