"""Placement: Embedding Variables live on the device they were created under, their ops run there,
and a process without a GPU still works. Runs on the CPU here and on the H200 with
SOK_TEST_DEVICE=gpu."""
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf

import sparse_operation_kit as sok
from sparse_operation_kit.optimizers import step_clock
from tests.python.support import (
    TEST_DEVICE,
    graph_session,
    sparse_value,
    subprocess_env,
    to_ragged,
    unique_name,
)

HAS_GPU = bool(tf.config.list_physical_devices("GPU"))


def _train_step(ev, opt, ids):
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(sok.lookup_sparse([ev], [ids], combiners=["sum"])[0])
    opt.apply_gradients(zip(tape.gradient(loss, [ev]), [ev]))
    return loss


def _ran_on(fn):
    before = sok.kernel_run_counts()
    fn()
    after = sok.kernel_run_counts()
    return {d: after[d] - before[d] for d in after}


def test_kernel_run_counts_see_the_ops_of_a_training_step():
    ev = sok.get_embedding_variable(unique_name(), 4)
    opt = sok.OptimizerWrapper(tf.keras.optimizers.Adagrad(0.1))
    ran = _ran_on(lambda: _train_step(ev, opt, to_ragged([[1, 2], [3]])))
    device = "GPU" if TEST_DEVICE == "gpu" else "CPU"
    # unique, gather, pooled combine, its gradient and the fused update at least
    assert ran[device] >= 5, ran
    assert int(ev.size()) == 3


@pytest.mark.parametrize("device, other", [
    pytest.param("CPU", "GPU", marks=pytest.mark.cpu_placement),
    pytest.param("GPU", "CPU", marks=pytest.mark.skipif(
        not HAS_GPU, reason="needs a GPU (runs on the H200 through the device tool)")),
])
def test_a_table_created_under_tf_device_lives_and_trains_there(device, other):
    with tf.device(f"/{device}:0"):
        ev = sok.get_embedding_variable(unique_name(), 4, initializer=tf.ones_initializer())
        opt = sok.OptimizerWrapper(tf.keras.optimizers.SGD(0.5))
        ran = _ran_on(lambda: _train_step(ev, opt, to_ragged([[1, 1], [2]])))
    assert device in ev.device
    assert ran[other] == 0 and ran[device] >= 5, ran
    rows = ev.sparse_read(tf.constant([1, 2], tf.int64), training=False).numpy()
    np.testing.assert_allclose(rows, [[0.0] * 4, [0.5] * 4])  # 1 - 0.5 * 2 and 1 - 0.5 * 1


def test_a_process_that_hides_every_gpu_runs_on_the_cpu():
    code = textwrap.dedent("""
        import tensorflow as tf
        tf.config.set_visible_devices([], "GPU")
        import sparse_operation_kit as sok
        ev = sok.get_embedding_variable("hidden_gpu", 4, initializer=tf.ones_initializer())
        before = sok.kernel_run_counts()
        ids = tf.RaggedTensor.from_row_lengths(tf.constant([1, 2, 3], tf.int64), [2, 1])
        out = sok.lookup_sparse([ev], [ids], combiners=["sum"])[0].numpy()
        after = sok.kernel_run_counts()
        assert out.tolist() == [[2.0] * 4, [1.0] * 4], out
        assert after["GPU"] == before["GPU"] and after["CPU"] > before["CPU"], (before, after)
        print("OK", ev.device)
    """)
    r = subprocess.run(
        [sys.executable, "-c", code],
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "OK" in r.stdout and "CPU" in r.stdout


@pytest.mark.skipif(not HAS_GPU, reason="needs a GPU (runs on the H200 through the device tool)")
def test_a_gpu_table_too_large_for_memory_names_itself_the_size_and_the_free_memory():
    # 1024 initial slots of 40M floats: about 164 GB, more than an H200 holds.
    name = unique_name("too_big")
    with tf.device("/GPU:0"):
        with pytest.raises(
            tf.errors.InvalidArgumentError,
            match=rf"table '{name}': cannot allocate \d+ bytes .* on GPU 0 \(.*bytes free",
        ):
            sok.get_embedding_variable(name, 40_000_000)
    # TensorFlow's allocator is intact: a normal table still works on the GPU.
    with tf.device("/GPU:0"):
        ev = sok.get_embedding_variable(unique_name(), 4, initializer=tf.ones_initializer())
        out = sok.lookup_sparse([ev], [to_ragged([[1, 2]])], combiners=["sum"])[0]
    np.testing.assert_allclose(out.numpy(), [[2.0] * 4])


@pytest.mark.skipif(not HAS_GPU, reason="needs a GPU (runs on the H200 through the device tool)")
def test_a_tf1_training_step_with_fed_ids_runs_every_sok_kernel_on_the_gpu():
    with graph_session() as sess:
        ids = tf.compat.v1.sparse_placeholder(tf.int64)
        ev = sok.get_embedding_variable("tf1_on_gpu", 4, initializer=tf.ones_initializer())
        loss = tf.reduce_sum(sok.lookup_sparse([ev], [ids], combiners=["mean"])[0])
        train = sok.OptimizerWrapper(tf.compat.v1.train.AdagradOptimizer(0.1)).minimize(loss)
        sess.run(tf.compat.v1.global_variables_initializer())
        before = sok.kernel_run_counts(by_op=True)
        for _ in range(3):
            sess.run(train, {ids: sparse_value([[1, 2], [3]])})
        after = sok.kernel_run_counts(by_op=True)
    ran = {op: {d: c[d] - before.get(op, {}).get(d, 0) for d in c} for op, c in after.items()}
    for op in (
        "SokUniqueKeys",
        "SokEmbeddingVariableGather",
        "SokPooledCombine",
        "SokPooledCombineGrad",
        "SokEmbeddingVariableSparseApply",
    ):
        assert ran[op] == {"CPU": 0, "GPU": 3}, (op, ran[op])


def test_gradients_under_op_determinism_are_bitwise_repeatable_and_match_the_default_path():
    code = textwrap.dedent("""
        import sys
        import numpy as np
        import tensorflow as tf
        import sparse_operation_kit as sok
        deterministic = sys.argv[1] == "1"
        if deterministic:
            tf.config.experimental.enable_op_determinism()
        rng = np.random.default_rng(5)
        ids = tf.RaggedTensor.from_row_lengths(tf.constant(rng.integers(0, 50, 4000), tf.int64),
                                               tf.constant([4] * 1000, tf.int64))
        w = tf.RaggedTensor.from_row_lengths(tf.constant(rng.random(4000), tf.float32),
                                             tf.constant([4] * 1000, tf.int64))
        up = tf.constant(rng.standard_normal([1000, 8]), tf.float32)
        ev = sok.get_embedding_variable("det", 8)
        grads = []
        for _ in range(2):
            with tf.GradientTape() as tape:
                out = sok.lookup_sparse([ev], [ids], sp_weights=[w], combiners=["mean"])[0]
                loss = tf.reduce_sum(out * up)
            g = tape.gradient(loss, ev)
            order = np.argsort(g.indices.numpy())
            grads.append(g.values.numpy()[order])
        np.save(sys.argv[2], np.stack(grads))
    """)
    import os
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        results = {}
        for det in ("1", "0"):
            path = os.path.join(d, f"g{det}.npy")
            r = subprocess.run(
                [sys.executable, "-c", code, det, path],
                env=subprocess_env(),
                capture_output=True,
                text=True,
                timeout=300,
            )
            assert r.returncode == 0, r.stderr[-3000:]
            results[det] = np.load(path)
    det, default = results["1"], results["0"]
    np.testing.assert_array_equal(det[0], det[1])  # bit-for-bit repeatable
    np.testing.assert_allclose(default[0], det[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(default[1], det[0], rtol=1e-5, atol=1e-6)


@pytest.mark.skipif(TEST_DEVICE != "gpu", reason="a GPU step's partition graphs (SOK_TEST_DEVICE=gpu)")
def test_a_tf1_gpu_training_step_sends_nothing_from_the_gpu_to_the_host():
    """The step's partition graphs hold no device-to-host copy (a _Send on the GPU received by a
    _HostRecv: what TensorFlow inserts when a host-memory input is made on the GPU) and no CPU
    op but variables, constants and transfers: a size computed on the CPU for the GPU is a round
    trip each step. (SokUniqueKeys' read of the distinct counts is inside the op.)"""
    with graph_session() as sess:
        sparse = [tf.compat.v1.sparse_placeholder(tf.int64) for _ in range(3)]
        dense = tf.compat.v1.placeholder(tf.int64, [None, 2])
        evs = [sok.get_embedding_variable(unique_name(), 4) for _ in range(4)]
        embs = sok.lookup_sparse(evs, sparse + [dense], combiners=["sum", "mean", "sqrtn", "sum"])
        loss = tf.add_n([tf.reduce_sum(e) for e in embs])
        train = sok.OptimizerWrapper(tf.compat.v1.train.AdagradOptimizer(0.1)).minimize(loss)
        sess.run(tf.compat.v1.global_variables_initializer())
        feed = {s: sparse_value([[1, 2], [3]]) for s in sparse}
        feed[dense] = np.array([[4, 5], [6, 4]])
        meta = tf.compat.v1.RunMetadata()
        sess.run(train, feed, options=tf.compat.v1.RunOptions(output_partition_graphs=True),
                 run_metadata=meta)
    nodes = [n for g in meta.partition_graphs for n in g.node]
    gpu = [n for n in nodes if "GPU" in n.device]
    assert any(n.op == "SokUniqueKeys" for n in gpu)
    sent = {n.attr["tensor_name"].s for n in gpu if n.op == "_Send"}
    copies = [n.name for n in gpu if n.op == "_HostRecv" and n.attr["tensor_name"].s in sent]
    assert not copies, copies
    transfers = {"_Arg", "_Retval", "_Send", "_Recv", "_HostSend", "_HostRecv", "NoOp", "Identity"}
    variables = {"Const", "VarHandleOp", "ReadVariableOp", "AssignAddVariableOp", "Placeholder"}
    # The step clock stamps the step number on the host by design (it reads no device data).
    clock = {n.name for n in nodes if n.name.startswith(step_clock.SCOPE)}
    cpu_ops = sorted({n.op for n in nodes if "GPU" not in n.device and n.name not in clock}
                     - transfers - variables)
    assert not cpu_ops, cpu_ops
