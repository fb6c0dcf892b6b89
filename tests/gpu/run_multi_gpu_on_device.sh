#!/usr/bin/env bash
# On a device machine with 2 or more GPUs (see device_env.sh for what it needs): tests/distributed
# with every rank on its own GPU and NCCL between them (SOK_TEST_DEVICE=gpu): the model-parallel
# jobs at 2 ranks and at SOK_TEST_MORE_RANKS (default: every GPU), the program and failure jobs
# at SOK_TEST_RANKS (default 2; 4 on a 4-GPU machine). Logs go to $OUT (or build/gpu_logs).
#   bash tests/gpu/run_multi_gpu_on_device.sh [pytest args...]
set -uo pipefail
cd "$(dirname "$0")/../.."
. tests/gpu/device_env.sh
out="${OUT:-build/gpu_logs}"; mkdir -p "$out"
nvidia-smi -L | tee "$out/gpus.txt"
export SOK_TEST_DEVICE=gpu
export SOK_TEST_MORE_RANKS="${SOK_TEST_MORE_RANKS:-$(nvidia-smi -L | wc -l)}"
python3 -m pytest -q -p no:cacheprovider -o console_output_style=classic \
  "${@:-tests/distributed}" > "$out/tests_distributed_gpu.txt" 2>&1
rc=$?
grep -E "passed|failed|error|FAILED" "$out/tests_distributed_gpu.txt" | tail -n 30
echo "tests/distributed on the GPUs (2 and $SOK_TEST_MORE_RANKS ranks; programs on ${SOK_TEST_RANKS:-2}): exit $rc"
exit $rc
