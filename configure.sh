#!/usr/bin/env bash
# Records the build's choices in .configure.bazelrc: which python (with TensorFlow installed) the
# Bazel build uses, and whether it compiles the GPU kernels with nvcc.
#   ./configure.sh [PYTHON]
# Environment: PYTHON_BIN_PATH (when no argument), CUDA_HOME (default /usr/local/cuda),
# SOK_WITH_CUDA: auto (default: CUDA when $CUDA_HOME/bin/nvcc runs), 1 (require it), 0 (CPU only).
# A single build can also say `bazel build --config=cpu ...` (see .bazelrc).
set -euo pipefail
PYTHON="${1:-${PYTHON_BIN_PATH:-$(command -v python3)}}"
PYTHON="$(cd "$(dirname "$PYTHON")" && pwd)/$(basename "$PYTHON")"
"$PYTHON" -c "import tensorflow" 2>/dev/null || { echo "configure.sh: $PYTHON has no TensorFlow" >&2; exit 1; }
cd "$(dirname "$0")"

CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}"
CUDA_HOME="${CUDA_HOME%/}"
WITH_CUDA="${SOK_WITH_CUDA:-auto}"
cuda_version=""
case "$WITH_CUDA" in
  0) ;;
  1|auto)
    cuda_version="$("$CUDA_HOME/bin/nvcc" --version 2>/dev/null | sed -n 's/.*release \([0-9.]*\),.*/\1/p' || true)"
    if [ -z "$cuda_version" ] && [ "$WITH_CUDA" = 1 ]; then
      echo "configure.sh: SOK_WITH_CUDA=1 but $CUDA_HOME/bin/nvcc does not run (set CUDA_HOME)" >&2; exit 1
    fi ;;
  *) echo "configure.sh: SOK_WITH_CUDA must be 0, 1 or auto" >&2; exit 1 ;;
esac
WITH_CUDA=0
[ -z "$cuda_version" ] || WITH_CUDA=1

cat > .configure.bazelrc <<EOR
build --repo_env=PYTHON_BIN_PATH=$PYTHON
build --action_env=PYTHON_BIN_PATH=$PYTHON
build --repo_env=CUDA_HOME=$CUDA_HOME
build --repo_env=SOK_WITH_CUDA=$WITH_CUDA
EOR
echo "configure.sh: building against TensorFlow $("$PYTHON" -c 'import tensorflow as tf; print(tf.__version__)' 2>/dev/null | tail -n 1) at $PYTHON"
if [ "$WITH_CUDA" = 1 ]; then
  echo "configure.sh: GPU kernels with CUDA $cuda_version ($CUDA_HOME/bin/nvcc)"
elif [ "${SOK_WITH_CUDA:-auto}" = 0 ]; then
  echo "configure.sh: CPU kernels only (SOK_WITH_CUDA=0)"
else
  echo "configure.sh: CPU kernels only (no nvcc at $CUDA_HOME/bin/nvcc; set CUDA_HOME)"
fi
