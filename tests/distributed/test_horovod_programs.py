"""Programs as users launch them: `horovodrun -np N python <program>` (N: SOK_TEST_RANKS, 2 by
default; CPUs here, GPUs with SOK_TEST_DEVICE=gpu): DeepRec's Embedding Variable example with its
Horovod lines, and the Criteo job with --horovod, with and without --xla, against one process on
the same global batches."""
import os
import re

import numpy as np
import pytest
from launch import RANKS, TEST_DEVICE, _tail, horovodrun

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FLOAT = r"-?\d+\.\d*(?:e[-+]?\d+)?"


def test_deeprec_example_under_horovodrun():
    """examples/deeprec_ev_horovod.py: three Adagrad steps of one sharded Embedding Variable; every
    rank feeds the same batch, so each key's gradient is summed over the ranks at its owner."""
    rc, out, _ = horovodrun(RANKS, os.path.join(ROOT, "examples", "deeprec_ev_horovod.py"))
    assert rc == 0, _tail(out)
    # Expected: ones initializer; d(loss)/d(emb) = 2; id 1 twice in sample 0, ids 3, 4, 5 once in
    # sample 1; tf.compat.v1 Adagrad (lr 0.1, initial accumulator 0.1); loss summed over ranks.
    row = {1: 1.0, 3: 1.0}
    acc = {1: 0.1, 3: 0.1}
    want = []
    for _ in range(3):
        emb = np.array([[2 * row[1]] * 3, [3 * row[3]] * 3])
        want.append((emb, RANKS * 2 * emb.sum()))
        for k, per_rank in ((1, 4.0), (3, 2.0)):
            g = RANKS * per_rank
            acc[k] += g * g
            row[k] -= 0.1 * g / np.sqrt(acc[k])
    for r in range(RANKS):
        lines = [ln for ln in out.splitlines() if ln.startswith(f"[{r}]<stdout>:")]
        text = " ".join(ln.split(":", 1)[1] for ln in lines)
        num = rf"\s*({FLOAT})\s*"
        steps = re.findall(rf"\[\[array\(\[\[{num},{num},{num}\],\s*\[{num},{num},{num}\]\], "
                           rf"dtype=float32\)\], None, np\.float32\({num}\)\]", text)
        assert len(steps) == 3, f"rank {r}:\n{text}\n{_tail(out)}"
        for (emb, loss), got in zip(want, steps, strict=True):
            vals = np.array([float(x) for x in got])
            np.testing.assert_allclose(vals[:6].reshape(2, 3), emb, rtol=1e-5)
            np.testing.assert_allclose(vals[6], loss, rtol=1e-5)


def _criteo(np_, tmp_path, *extra, env=None):
    env = {"TF_DETERMINISTIC_OPS": "1", **(env or {})}
    args = ["--no_plot", "--steps", "30", "--batch_size", "1024", "--synthetic_eval_samples",
            "8192", "--warmup_steps", "5", "--bottom_mlp", "32", "--top_mlp", "64", "--seed", "1",
            "--log_every", "0", "--eval_every", "0", *extra]
    out_dir = tmp_path / f"np{np_}{'_'.join(extra)}"
    args += ["--out_dir", str(out_dir)]
    run_py = os.path.join(ROOT, "benchmarks", "criteo", "run.py")
    if np_ == 1:
        import subprocess
        import sys
        proc = subprocess.run([sys.executable, run_py, *args], capture_output=True, text=True,
                              timeout=600, env={**os.environ, **env})
        rc, out = proc.returncode, proc.stdout + proc.stderr
    else:
        rc, out, _ = horovodrun(np_, run_py, "--horovod", *args, env=env)
    assert rc == 0, _tail(out)
    m = re.search(r"RESULT .*eval_auc=(\S+)", out)
    assert m, _tail(out)
    return float(m.group(1)), out


def test_criteo_job_on_several_ranks_equals_one_process(tmp_path):
    """The Criteo job under horovodrun -np N (--horovod) trains the same global batches as one
    process: the same AUC within 0.002; with the training split resident in device memory (each
    rank takes its slice of the batch there) and with --xla (XLA auto-clustering, also on the
    CPU) too."""
    one, _ = _criteo(1, tmp_path)
    several, _ = _criteo(RANKS, tmp_path)
    assert abs(several - one) < 0.002, (one, several)
    several_resident, _ = _criteo(RANKS, tmp_path, "--input", "resident")
    assert abs(several_resident - one) < 0.002, (one, several_resident)
    xla_env = None if TEST_DEVICE == "gpu" else {"TF_XLA_FLAGS": "--tf_xla_cpu_global_jit"}
    several_xla, out = _criteo(RANKS, tmp_path, "--xla", env=xla_env)
    assert abs(several_xla - one) < 0.002, (one, several_xla)


@pytest.mark.skipif(TEST_DEVICE != "gpu", reason="partition graphs of GPU ranks (SOK_TEST_DEVICE=gpu)")
def test_a_multi_gpu_training_step_copies_nothing_to_the_host():
    """workers/step_copies.py on N ranks: no GPU-to-host copy in the step, the exchange's kernels
    on the GPUs."""
    rc, out, _ = horovodrun(RANKS, "step_copies.py")
    assert rc == 0, _tail(out)
    assert out.count("OK step copies") == RANKS, _tail(out)
