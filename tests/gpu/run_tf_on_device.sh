#!/usr/bin/env bash
# On a device machine (after ../shared/tools/tf-gpu's device-setup.sh), from the project's root,
# with build/sok_pkg carried (tools/stage_gpu_package.sh): the TF test suite on the GPU with the
# placement check (SOK_TEST_DEVICE=gpu), then the Criteo job on the GPU with TensorFlow's default
# memory settings. Full logs go to $OUT (or build/gpu_logs); the last lines summarise.
#   bash tests/gpu/run_tf_on_device.sh [pytest args...]
# The whole suite takes about 520 s on an H200, so within a call's 600 s:
#   SOK_DEVICE_CRITEO=0   leaves the Criteo job out;
#   SOK_DEVICE_ONLY_LARGE=1   runs only the larger-than-GPU test of
#       tests/python/tables/test_storage_larger_than_tier.py, with SOK_TEST_LARGE_TABLE_GB and
#       SOK_TEST_GPU_MEMORY_GB as that file says (its tables' dump goes under /tmp).
set -uo pipefail
cd "$(dirname "$0")/../.."
. /opt/tfgpu/env.sh
export PYTHONPATH="$PWD/build/sok_pkg${PYTHONPATH:+:$PYTHONPATH}"
export TF_CPP_MIN_LOG_LEVEL=2
out="${OUT:-build/gpu_logs}"; mkdir -p "$out"
nvidia-smi -L | tee "$out/gpu.txt"
python3 -c 'import tensorflow as tf, sparse_operation_kit as sok; print("TF", tf.__version__, "GPUs", tf.config.list_physical_devices("GPU"), "SOK GPU kernels:", sok.gpu_kernels_built())'
if [ "${SOK_DEVICE_ONLY_LARGE:-0}" = 1 ]; then
  dir=$(mktemp -d)
  SOK_TEST_DEVICE=gpu SOK_TEST_LARGE_TABLE_DIR="$dir" python3 -m pytest -s -q -p no:cacheprovider \
    tests/python/tables/test_storage_larger_than_tier.py -k gpu > "$out/larger_than_gpu.txt" 2>&1
  rc=$?
  rm -rf "$dir"
  grep -E "larger than|passed|failed|Error" "$out/larger_than_gpu.txt" | tail -n 12
  exit $rc
fi
SOK_TEST_DEVICE=gpu python3 -m pytest -q -p no:cacheprovider -o console_output_style=classic "${@:-tests/python}" \
  > "$out/tests_python_gpu.txt" 2>&1
rc=$?
grep -E "passed|failed|error" "$out/tests_python_gpu.txt" | tail -n 40
echo "tests/python on the GPU: exit $rc"
[ "${SOK_DEVICE_CRITEO:-1}" = 0 ] && exit $rc
for bs in 16384 65536; do
  python3 benchmarks/criteo/run.py --batch_size $bs --steps 60 --warmup_steps 20 --log_every 0 \
    > "$out/criteo_gpu_bs$bs.txt" 2>&1
  echo "criteo batch $bs: exit $?"; grep -E "^(device|throughput|eval):|Error|error" "$out/criteo_gpu_bs$bs.txt" | tail -n 5
done
exit $rc
