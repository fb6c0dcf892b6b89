#!/usr/bin/env bash
# The test suite (after tools/setup.sh): C++ core tests, the TensorFlow ops and API against plain
# TensorFlow (installed wheel), multi-process Horovod tests, and the CUDA build check.
set -euo pipefail
cd "$(dirname "$0")/.."
VPY="$PWD/.venv/bin/python"
export PATH="$PWD/.venv/bin:$PATH"
export TF_CPP_MIN_LOG_LEVEL=2

echo "== C++ core (bazel test)"
bazel test --noshow_progress --ui_event_filters=-info //tests/core/...

if [ -x tests/gpu/compile_check.sh ] && command -v nvcc >/dev/null 2>&1; then
  echo "== CUDA core and TF GPU kernels compile and link (no GPU here: they run on the H200 harness)"
  bash tests/gpu/compile_check.sh
fi

echo "== Python tests against the installed wheel"
dirs=()
for d in tests/tf tests/distributed tests/benchmarks; do [ -d "$d" ] && dirs+=("$d"); done
"$VPY" -m pytest -q -p no:cacheprovider "${dirs[@]}"
