#!/usr/bin/env bash
# The test suite (after tools/setup.sh): C++ core tests, the TensorFlow ops and API against plain
# TensorFlow (installed wheel), multi-process Horovod tests, and the check of the GPU kernels.
set -euo pipefail
cd "$(dirname "$0")/.."
VPY="$PWD/.venv/bin/python"
export PATH="$PWD/.venv/bin:$PATH"
export TF_CPP_MIN_LOG_LEVEL=2

echo "== Lint: ruff (Python, ruff.toml) and clang-format (C++/CUDA, .clang-format)"
bash tools/lint_python.sh
bash tools/lint_cpp.sh

echo "== C++ core (bazel test)"
bazel test --noshow_progress --ui_event_filters=-info //tests/core/...

# The Bazel build (tools/setup.sh) compiled the CUDA core and the GPU kernels into the ops library
# when ./configure.sh found nvcc: check that library (links, loads, a GPU kernel for every op).
if [ -f tests/gpu/compile_check.sh ] && grep -q "SOK_WITH_CUDA=1" .configure.bazelrc 2>/dev/null; then
  echo "== TF GPU kernels in the ops library: linked, loaded, registered (no GPU here: the CUDA core runs on the H200 harness)"
  bash tests/gpu/compile_check.sh
fi

echo "== Python tests against the installed wheel"
dirs=()
for d in tests/python tests/distributed tests/benchmarks; do [ -d "$d" ] && dirs+=("$d"); done
"$VPY" -m pytest -q -p no:cacheprovider "${dirs[@]}"
