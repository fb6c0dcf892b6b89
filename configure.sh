#!/usr/bin/env bash
# Records which python (with TensorFlow installed) the Bazel build uses.
set -euo pipefail
PYTHON="${1:-${PYTHON_BIN_PATH:-$(command -v python3)}}"
PYTHON="$(cd "$(dirname "$PYTHON")" && pwd)/$(basename "$PYTHON")"
"$PYTHON" -c "import tensorflow" 2>/dev/null || { echo "configure.sh: $PYTHON has no TensorFlow" >&2; exit 1; }
cd "$(dirname "$0")"
cat > .configure.bazelrc <<EOR
build --repo_env=PYTHON_BIN_PATH=$PYTHON
build --action_env=PYTHON_BIN_PATH=$PYTHON
EOR
echo "configure.sh: building against $("$PYTHON" -c 'import tensorflow as tf; print(tf.__version__)' 2>/dev/null) at $PYTHON"
