#!/usr/bin/env bash
# Assembles the package (Python sources + the ops library) and builds a wheel into $1.
set -euo pipefail
OUT="${1:?usage: build_sok OUTDIR}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
RUNFILES="${RUNFILES_DIR:-$0.runfiles}/sparse_operation_kit"
PYTHON="${PYTHON_BIN_PATH:-}"
if [ -z "$PYTHON" ]; then
  # Run from the workspace root (as README says): the configure step recorded the python.
  PYTHON="$(sed -n 's/^build --repo_env=PYTHON_BIN_PATH=//p' .configure.bazelrc 2>/dev/null || true)"
fi
PYTHON="${PYTHON:-python3}"
STAGE="$(mktemp -d)"
trap 'rm -rf "$STAGE"' EXIT
cp -r "$RUNFILES/addons/sparse_operation_kit/python/sparse_operation_kit" "$STAGE/"
chmod -R u+w "$STAGE"
cp "$RUNFILES/addons/sparse_operation_kit/tf/_sparse_operation_kit_ops.so" "$STAGE/sparse_operation_kit/"
cp "$RUNFILES/tools/pip_package/setup.py" "$STAGE/"
TF_VERSION="$("$PYTHON" -c 'import tensorflow as tf; print(tf.__version__)' 2>/dev/null | tail -n 1)"
echo "BUILT_FOR_TF = \"$TF_VERSION\"" > "$STAGE/sparse_operation_kit/_build_info.py"
(cd "$STAGE" && "$PYTHON" setup.py -q bdist_wheel --dist-dir "$OUT" >/dev/null)
ls "$OUT"/sparse_operation_kit-*.whl
