#!/usr/bin/env bash
# Everything a fresh Debian (bookworm) machine needs, idempotent: Debian packages (Bazel, a C++
# toolchain, googletest's sources for the C++ tests), a virtual environment in .venv with
# TensorFlow 2.21 and Horovod, the Bazel build of the ops library and the wheel, installed into
# .venv.
# Where a CUDA toolkit (nvcc) is found (tools/install_horovod.sh --cuda-home), TensorFlow is PyPI's
# `tensorflow` (the GPU build, which runs without a GPU too) and Horovod gets NCCL for GPU tensors
# besides Gloo; elsewhere `tensorflow-cpu` and Horovod with Gloo only. SOK_HOROVOD_GPU=0 forces the
# latter.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
PY="${PYTHON:-python3}"
TF_VERSION=2.21.0

log() { echo "[setup] $*"; }
SUDO=""
[ "$(id -u)" = 0 ] || SUDO="sudo"

need_apt=()
for pkg in bazel-bootstrap bazel-rules-java g++ cmake make googletest; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need_apt+=("$pkg")
done
"$PY" -m venv --help >/dev/null 2>&1 || need_apt+=(python3-venv)
if [ ${#need_apt[@]} -gt 0 ]; then
  log "apt-get install ${need_apt[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get install -y -q "${need_apt[@]}" >/dev/null 2>&1 || {
    $SUDO apt-get update -q >/dev/null && $SUDO apt-get install -y -q "${need_apt[@]}" >/dev/null; }
fi

if [ ! -x .venv/bin/python ]; then
  log "creating .venv with $("$PY" --version)"
  "$PY" -m venv .venv
fi
VPY="$ROOT/.venv/bin/python"

# TensorFlow: one of tensorflow / tensorflow-cpu, never both (they install the same files, and
# tf_keras depends on `tensorflow`, hence its --no-deps).
CUDA_DIR=$(bash tools/install_horovod.sh --cuda-home)
if [ -n "$CUDA_DIR" ]; then
  TF_DIST=tensorflow TF_OTHER=tensorflow-cpu HVD_KIND="Gloo + NCCL; nvcc in $CUDA_DIR"
else
  TF_DIST=tensorflow-cpu TF_OTHER=tensorflow HVD_KIND="Gloo"
fi
dist_version() {  # installed version of a distribution, or nothing
  "$VPY" -c 'import importlib.metadata as m, sys
try: print(m.version(sys.argv[1]))
except m.PackageNotFoundError: pass' "$1" 2>/dev/null || true
}
if [ "$(dist_version "$TF_DIST")" != "$TF_VERSION" ] || [ -n "$(dist_version "$TF_OTHER")" ] ||
   ! "$VPY" -c "import tensorflow, tf_keras, pytest, wheel" >/dev/null 2>&1; then
  log "pip install $TF_DIST==$TF_VERSION tf_keras pytest"
  "$VPY" -m pip install -q --upgrade pip >/dev/null
  swapped=0
  if [ -n "$(dist_version "$TF_OTHER")" ]; then
    log "pip uninstall $TF_OTHER (replaced by $TF_DIST)"
    "$VPY" -m pip uninstall -q -y "$TF_OTHER"
    swapped=1
  fi
  "$VPY" -m pip install -q "$TF_DIST==$TF_VERSION" pytest setuptools wheel numpy
  # The uninstall removed files the two share: put them back.
  [ "$swapped" = 0 ] || "$VPY" -m pip install -q --force-reinstall --no-deps "$TF_DIST==$TF_VERSION"
  "$VPY" -m pip install -q --no-deps "tf_keras~=${TF_VERSION%.*}.0"
fi

# Tools pinned so every machine formats, lints and plots alike: ruff (Python lint), clang-format
# (C++/CUDA format check), matplotlib (the Criteo job's plot).
TOOLS_PIN=(ruff==0.17.6 clang-format==23.1.5 matplotlib==3.11.2)
if ! "$VPY" -c "import ruff, clang_format, matplotlib" >/dev/null 2>&1; then
  log "pip install ${TOOLS_PIN[*]}"
  "$VPY" -m pip install -q "${TOOLS_PIN[@]}"
fi

log "Horovod ($HVD_KIND) for this TensorFlow"
bash tools/install_horovod.sh "$VPY"

log "Bazel build of the ops library and the wheel"
./configure.sh "$VPY"
bazel build --noshow_progress --ui_event_filters=-info,-warning //tools/pip_package:build_sok
rm -rf dist && ./bazel-bin/tools/pip_package/build_sok dist
"$VPY" -m pip install -q --force-reinstall --no-deps dist/sparse_operation_kit-*.whl
"$VPY" -c "import sparse_operation_kit as sok; print('[setup] sparse_operation_kit', sok.__version__, 'on TensorFlow', sok.tf_version)" 2>/dev/null | tail -n 1
