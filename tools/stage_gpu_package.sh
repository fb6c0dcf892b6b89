#!/usr/bin/env bash
# Stages the package for a GPU machine that has TensorFlow's GPU build but a Python our cp311
# wheel does not install on (the device machines run Python 3.12): the Python sources plus the
# Bazel-built ops library (with its GPU kernels) in build/sok_pkg, to put on PYTHONPATH there.
#   bash tools/stage_gpu_package.sh        (after tools/setup.sh or bazel build)
#   SOK_STAGE_FROM=HEAD bash tools/stage_gpu_package.sh   (the committed Python sources)
#   bash tools/stage_gpu_package.sh --base REV   (build/sok_pkg_base: commit REV built in a git
#       worktree, build/base_src, with REV's benchmarks/, for benchmarks/gpu/run_scaling.sh's A/B
#       runs against it)
#   bash tools/stage_gpu_package.sh --horovod PY312   (also build/horovod: Horovod's wheel for the
#       device's Python and its dependencies' wheels; PY312 is a python3.12 venv's interpreter
#       with TensorFlow 2.21 (`tensorflow` for Horovod with NCCL; `tensorflow-cpu` and
#       SOK_HOROVOD_GPU=0 for Gloo only); the first build takes minutes and is cached)
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--base" ]; then
  rev=${2:?usage: $0 --base REV}
  src=build/base_src
  [ -d "$src" ] || git worktree add -f --detach "$src" "$rev" >/dev/null
  git -C "$src" checkout -q --detach "$rev"
  [ -f .configure.bazelrc ] && cp .configure.bazelrc "$src/"
  bash "$src/tools/stage_gpu_package.sh"
  rm -rf build/sok_pkg_base && mv "$src/build/sok_pkg" build/sok_pkg_base
  # The base's own benchmarks too: an A/B of a benchmark's change runs each side's script.
  git -C "$src" archive "$rev" benchmarks | tar -x -C build/sok_pkg_base --exclude='benchmarks/gpu/raw'
  echo "build/sok_pkg_base: $(git rev-parse --short "$rev")"
  exit 0
fi
if [ "${1:-}" = "--horovod" ]; then
  py=${2:?usage: $0 --horovod /path/to/python3.12-venv/bin/python}
  bash tools/install_horovod.sh "$py"
  tag=$("$py" -c 'import sys; print("cp%d%d" % sys.version_info[:2])')
  rm -rf build/horovod && mkdir -p build/horovod
  # The wheel the script just built or found (the newest of this Python's).
  cp "$(ls -t "${SOK_CACHE_DIR:-$HOME/.cache/sok}"/wheels/horovod-*-"$tag"/horovod-*.whl | head -n 1)" \
    build/horovod/
  "$py" -m pip download -q --only-binary=:all: -d build/horovod cloudpickle psutil pyyaml packaging
  echo "build/horovod: $(ls build/horovod | tr '\n' ' ')"
fi
bazel build --noshow_progress --ui_event_filters=-info,-warning //addons/sparse_operation_kit/tf:_sparse_operation_kit_ops.so
out=build/sok_pkg
rm -rf "$out" && mkdir -p "$out"
if [ -n "${SOK_STAGE_FROM:-}" ]; then  # a commit's Python sources (e.g. HEAD), not the working tree's
  git archive "$SOK_STAGE_FROM" addons/sparse_operation_kit/python/sparse_operation_kit |
    tar -x -C "$out" --strip-components=3
else
  cp -r addons/sparse_operation_kit/python/sparse_operation_kit "$out/"
fi
rm -f "$out/sparse_operation_kit/_build_info.py"
find "$out" -name __pycache__ -prune -exec rm -rf {} +
install -m 0755 bazel-bin/addons/sparse_operation_kit/tf/_sparse_operation_kit_ops.so "$out/sparse_operation_kit/"
echo "$out (PYTHONPATH=$PWD/$out)"
