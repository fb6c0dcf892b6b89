#!/usr/bin/env bash
# CI check of the TensorFlow GPU kernels. TensorFlow cannot run on the GPU machines and there is
# no GPU where TensorFlow runs, so this proves what can be proven here:
#   1. the CUDA core compiles with nvcc (sm_90 + compute_90 PTX), and the CPU core, the op
#      registrations, the CPU kernels and the GPU kernels compile with g++ (GOOGLE_CUDA=1);
#   2. they LINK into _sparse_operation_kit_ops_gpu.so with -Wl,--no-undefined against
#      libtensorflow_framework.so.2 and the CUDA runtime, and `ldd -r` finds nothing unresolved;
#   3. every op registered in tf/ops/*.cc has a GPU kernel: the library is loaded into (CPU)
#      TensorFlow, which lists each op's registered kernels (nothing is run).
# The kernels the GPU ops call are run and tested on the H200s by the framework-free harness in
# tests/gpu (CMakeLists.txt), not here.
#
# Environment: PYTHON (default <repo>/.venv/bin/python), CUDA_HOME (default /usr/local/cuda),
# JOBS (default 2). Build outputs go to tests/gpu/build/tf_gpu_ops (git-ignored); rebuilds are
# incremental.
set -uo pipefail
REPO="$(cd "$(dirname "$0")/../.." && pwd)"
export PYTHON="${PYTHON:-$REPO/.venv/bin/python}"
export CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}"
export BUILD_DIR="$REPO/tests/gpu/build/tf_gpu_ops"
export JOBS="${JOBS:-2}"
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-2}"

fail() {
  echo "GPU kernels: FAILED ($*)"
  exit 1
}
start=$SECONDS

echo "-- building the CUDA core, the CPU glue and the GPU kernels (make -j$JOBS; nvcc takes minutes)"
lib="$(bash "$REPO/tools/build_gpu_ops.sh" | tail -n 1)" || fail "compile or link error above"
[ -f "$lib" ] || fail "no library at '$lib'"
echo "-- built in $((SECONDS - start)) s: $lib"

# 2. Nothing unresolved once loaded next to TensorFlow's framework library. (-Wl,--no-undefined
#    already proved it at link time; this checks the file actually shipped.)
tf_lib="$("$PYTHON" -c 'import tensorflow as tf; print(tf.sysconfig.get_lib())' 2>/dev/null)" ||
  fail "cannot import tensorflow with $PYTHON"
unresolved="$(LD_LIBRARY_PATH="$tf_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" ldd -r "$lib" 2>&1 |
  grep -E 'undefined symbol|not found' || true)"
[ -z "$unresolved" ] || { echo "$unresolved"; fail "unresolved symbols or libraries (ldd -r)"; }
echo "-- ldd -r: every symbol resolved; needs: $(LD_LIBRARY_PATH="$tf_lib" ldd "$lib" | awk '{print $1}' | tr '\n' ' ')"

# 3. A GPU kernel for every registered op.
log="$BUILD_DIR/kernel_check.log"
"$PYTHON" - "$lib" "$REPO/addons/sparse_operation_kit/tf/ops" >"$log" 2>&1 <<'EOF' || { cat "$log"; fail "missing GPU kernels or the library does not load"; }
import glob, re, sys
import tensorflow as tf
from tensorflow.python.framework import kernels

lib, ops_dir = sys.argv[1], sys.argv[2]
ops = sorted({m for f in glob.glob(ops_dir + "/*.cc")
              for m in re.findall(r'REGISTER_OP\("(\w+)"\)', open(f).read())})
tf.load_op_library(lib)
missing = []
for op in ops:
    devices = {k.device_type for k in kernels.get_registered_kernels_for_op(op).kernel}
    if "GPU" not in devices or "CPU" not in devices:
        missing.append("%s (kernels on: %s)" % (op, ", ".join(sorted(devices)) or "none"))
if missing:
    print("ops without a CPU and a GPU kernel:\n  " + "\n  ".join(missing))
    sys.exit(1)
print("-- CPU and GPU kernels registered for all %d ops: %s" % (len(ops), " ".join(ops)))
EOF
grep '^-- ' "$log"

echo "-- compile_check took $((SECONDS - start)) s"
echo "GPU kernels: compiled and linked OK ($lib)"
