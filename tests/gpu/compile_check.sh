#!/usr/bin/env bash
# CI check of the TensorFlow GPU kernels in the ops library the Bazel build ships (built with
# nvcc when ./configure.sh found it: see //third_party/cuda). TensorFlow cannot run on the GPU
# machines and there is no GPU where TensorFlow runs, so this proves what can be proven here:
#   1. the library is a CUDA build whose CUDA runtime is linked in statically (no libcudart
#      needed at load time) and `ldd -r` resolves every symbol next to libtensorflow_framework.so.2
#      (the build also links it with -Wl,--no-undefined);
#   2. every op registered in tf/ops/*.cc has a CPU and a GPU kernel (the NCCL ops: as ONLY says): the library is loaded into
#      (CPU) TensorFlow, which lists each op's registered kernels (nothing is run).
# It compiles nothing: build first (tools/setup.sh, or bazel build //tools/pip_package:build_sok).
# The kernels the GPU ops call are run and tested on the H200s by the framework-free harness in
# tests/gpu (CMakeLists.txt), not here.
#
# Usage: tests/gpu/compile_check.sh [LIBRARY]
#   LIBRARY defaults to the library of the sparse_operation_kit installed in PYTHON's environment
#   (the wheel), else bazel-bin/addons/sparse_operation_kit/tf/_sparse_operation_kit_ops.so.
# Environment: PYTHON (default <repo>/.venv/bin/python).
set -uo pipefail
REPO="$(cd "$(dirname "$0")/../.." && pwd)"
PYTHON="${PYTHON:-$REPO/.venv/bin/python}"
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-2}"
BAZEL_LIB="$REPO/bazel-bin/addons/sparse_operation_kit/tf/_sparse_operation_kit_ops.so"

fail() {
  echo "GPU kernels: FAILED ($*)"
  exit 1
}
start=$SECONDS

lib="${1:-}"
if [ -z "$lib" ]; then
  # The installed package's directory, without importing it (run outside the repo).
  pkg="$(cd / && "$PYTHON" -c 'import importlib.util as u; s = u.find_spec("sparse_operation_kit"); print(s.submodule_search_locations[0] if s else "")' 2>/dev/null)"
  if [ -n "$pkg" ] && [ -f "$pkg/_sparse_operation_kit_ops.so" ]; then
    lib="$pkg/_sparse_operation_kit_ops.so"
    if [ -f "$BAZEL_LIB" ] && ! cmp -s "$lib" "$BAZEL_LIB"; then
      echo "-- note: the installed wheel's library differs from $BAZEL_LIB (rebuild the wheel?)"
    fi
  else
    lib="$BAZEL_LIB"
  fi
fi
[ -f "$lib" ] || fail "no library at $lib: build it first (bash tools/setup.sh)"
lib="$(cd "$(dirname "$lib")" && pwd)/$(basename "$lib")"
echo "-- checking $lib"

# 1. A CUDA build, its runtime static, nothing unresolved next to TensorFlow's framework library.
if ! readelf -SW "$lib" | grep -q '\.nv_fatbin'; then
  grep -q "SOK_WITH_CUDA=1" "$REPO/.configure.bazelrc" 2>/dev/null ||
    echo "-- .configure.bazelrc does not configure CUDA: ./configure.sh found no nvcc (CUDA_HOME?) or SOK_WITH_CUDA=0"
  fail "no GPU code in the library (no .nv_fatbin section): a CPU-only build"
fi
tf_lib="$(cd / && "$PYTHON" -c 'import tensorflow as tf; print(tf.sysconfig.get_lib())' 2>/dev/null | tail -n 1)" ||
  fail "cannot import tensorflow with $PYTHON"
needs="$(LD_LIBRARY_PATH="$tf_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" ldd -r "$lib" 2>&1)"
unresolved="$(grep -E 'undefined symbol|not found' <<<"$needs" || true)"
[ -z "$unresolved" ] || { echo "$unresolved"; fail "unresolved symbols or libraries (ldd -r)"; }
! grep -q 'libcudart' <<<"$needs" || fail "the library needs a shared libcudart: the CUDA runtime must be linked statically"
nm -D --defined-only "$lib" 2>/dev/null | grep -q ' cuda[A-Z]' &&
  fail "the library exports CUDA runtime symbols (they must stay hidden: -Wl,--exclude-libs)"
echo "-- ldd -r: every symbol resolved; needs: $(awk '/=>|^\t\//{print $1}' <<<"$needs" | tr '\n' ' ')"

# 2. A CPU and a GPU kernel for every registered op.
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
(cd / && "$PYTHON" - "$lib" "$REPO/addons/sparse_operation_kit/tf/ops") >"$log" 2>&1 <<'PYEOF' || { cat "$log"; fail "missing kernels (is this a CUDA build?) or the library does not load"; }
import glob, re, sys
import tensorflow as tf
from tensorflow.python.framework import kernels

lib, ops_dir = sys.argv[1], sys.argv[2]
ops = sorted({m for f in glob.glob(ops_dir + "/*.cc")
              for m in re.findall(r'REGISTER_OP\("(\w+)"\)', open(f).read())})
if not ops:
    print("no REGISTER_OP in %s/*.cc" % ops_dir)
    sys.exit(1)
tf.load_op_library(lib)
# The collectives between GPUs: NCCL's bootstrap runs on the host, its collectives on the GPU.
# The wall clock reads the host's clock.
ONLY = {"SokNcclUniqueId": {"CPU"}, "SokNcclInit": {"CPU"}, "SokAllToAll": {"GPU"},
        "SokAllToAllSized": {"GPU"}, "SokAllReduce": {"GPU"}, "SokWallClock": {"CPU"}}
missing = []
for op in ops:
    devices = {k.device_type for k in kernels.get_registered_kernels_for_op(op).kernel}
    if devices != ONLY.get(op, {"CPU", "GPU"}):
        missing.append("%s (kernels on: %s)" % (op, ", ".join(sorted(devices)) or "none"))
if missing:
    print("ops without their kernels (a CPU and a GPU one, or as ONLY says):\n  "
          + "\n  ".join(missing))
    sys.exit(1)
print("-- kernels registered for all %d ops: %s" % (len(ops), " ".join(ops)))
PYEOF
grep '^-- ' "$log"

echo "-- compile_check took $((SECONDS - start)) s"
echo "GPU kernels: built, linked and registered OK ($lib)"
