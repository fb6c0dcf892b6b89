#!/usr/bin/env bash
# Developer loop: rebuilds the ops library with Bazel (with the GPU kernels when ./configure.sh
# found nvcc; `bash tools/dev_build.sh --config=cpu` skips them) and drops it into the source
# package, so `PYTHONPATH=addons/sparse_operation_kit/python` imports the fresh build without a wheel.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -f .configure.bazelrc ] || ./configure.sh "${PYTHON:-$PWD/.venv/bin/python}"
bazel build "$@" //addons/sparse_operation_kit/tf:_sparse_operation_kit_ops.so
install -m 0755 bazel-bin/addons/sparse_operation_kit/tf/_sparse_operation_kit_ops.so \
  addons/sparse_operation_kit/python/sparse_operation_kit/_sparse_operation_kit_ops.so
