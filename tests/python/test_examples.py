"""User examples run as scripts, their printed numbers checked against hand-computed values."""
import ast
import math
import os
import re
import subprocess
import sys

import numpy as np

from tests.python.support import TEST_DEVICE, subprocess_env

EXAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "examples")
# TF1 scripts run in graph mode, as on DeepRec (TensorFlow 1.x); nothing else is changed.
# The last line reports where SOK's kernels ran.
_RUN_IN_GRAPH_MODE = (
    "import runpy, sys, tensorflow as tf; tf.compat.v1.disable_eager_execution(); "
    "runpy.run_path(sys.argv[1], run_name='__main__'); import sparse_operation_kit as sok; "
    "c = sok.kernel_run_counts(); print('SOK kernels ran: CPU', c['CPU'], 'GPU', c['GPU'], "
    "sok.kernel_run_counts(by_op=True))"
)


def run_example(name):
    proc = subprocess.run([sys.executable, "-c", _RUN_IN_GRAPH_MODE, os.path.join(EXAMPLES, name)],
                          capture_output=True, text=True, env=subprocess_env(), timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return proc.stdout


def deeprec_expected():
    """Ones-initialised dim-3 rows; sample 0 holds key 1 twice, sample 1 keys 3, 4, 5; sum combiner;
    loss = sum(2 * emb), so d loss / d row = 2 per occurrence: 4 for key 1, 2 for keys 3, 4, 5.
    Adagrad(0.1), initial accumulator 0.1: acc += g^2; row -= 0.1 g / sqrt(acc)."""
    v1, v3, acc1, acc3 = 1.0, 1.0, 0.1, 0.1
    lines = []
    for _ in range(3):
        emb = [[2 * v1] * 3, [3 * v3] * 3]  # read before this step's update
        lines.append(emb[0] + emb[1] + [2 * (sum(emb[0]) + sum(emb[1]))])
        acc1 += 4.0 ** 2
        acc3 += 2.0 ** 2
        v1 -= 0.1 * 4.0 / math.sqrt(acc1)
        v3 -= 0.1 * 2.0 / math.sqrt(acc3)
    return lines


def assert_ran_on_test_device(out):
    cpu, gpu = (int(x) for x in re.search(r"SOK kernels ran: CPU (\d+) GPU (\d+)", out).groups())
    if TEST_DEVICE == "gpu":  # the example's tables and steps on GPU:0, nothing of SOK on the CPU
        # except the dedup of its constant ids, which Grappler folds on the host (see conftest)
        per_op = ast.literal_eval(
            out[out.index("{", out.index("SOK kernels ran")) :].splitlines()[0]
        )
        assert gpu > 0 and cpu == per_op.get("SokUniqueKeys", {}).get("CPU", 0), out[
            out.index("SOK kernels") :
        ]
        assert (
            per_op["SokPooledCombine"]["GPU"] == 3
            and per_op["SokEmbeddingVariableSparseApply"]["GPU"] == 3
        )
    else:
        assert cpu > 0 and gpu == 0, (cpu, gpu)


def test_deeprec_embedding_variable_example():
    out = run_example("deeprec_ev_lookup_sparse.py")
    assert_ran_on_test_device(out)
    out = out[:out.index("SOK kernels ran:")]
    printed = [line for line in out.splitlines() if line.strip()]
    # Each print shows [[emb], None, loss]; numpy may wrap the array over several lines.
    text = " ".join(printed)
    runs = [r for r in text.split("[[array(")[1:]]
    assert len(runs) == 3, out
    numbers = [[float(x) for x in re.findall(r"-?\d+\.\d*(?:e[-+]?\d+)?", r)] for r in runs]
    expected = deeprec_expected()
    assert expected[0] == [2.0, 2.0, 2.0, 3.0, 3.0, 3.0, 30.0]
    for got, want in zip(numbers, expected):
        np.testing.assert_allclose(got, want, rtol=1e-5)
