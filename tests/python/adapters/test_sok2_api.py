"""The rest of NVIDIA SOK 2.x's public API on one CPU process, in TF2 and TF1 Sessions, against
plain-TensorFlow references: sok.tf_version, sok.set_comm_tool, the DynamicVariable surface
(scatter_*, indices, key_map, repr, Session fetches), DistributedVariable / LocalizedVariable,
sok.sparse_read_and_evict and the incremental dump (docs/COMPATIBILITY_SOK.md)."""

import numpy as np
import pytest
import tensorflow as tf

import sparse_operation_kit as sok
from tests.python.support import graph_session, unique_name


def test_tf_version_is_numbers_like_sok2():
    assert sok.tf_version == [int(p) for p in tf.__version__.split("-")[0].split(".")[:3]]
    assert sok.tf_version[0] == 2 and sok.tf_version[1] >= 17  # SOK 2.x programs branch so
    from sparse_operation_kit.runtime.version import parse_tf_version
    assert parse_tf_version("2.22.0-rc1") == [2, 22, 0]
    assert parse_tf_version("2.21.0.dev20250101") == [2, 21, 0]
    with pytest.raises(ValueError, match="TensorFlow's version"):
        parse_tf_version("nightly")


def test_set_comm_tool():
    sok.set_comm_tool("horovod")
    assert sok.num_ranks() == 1
    with pytest.raises(ValueError, match="unknown communication tool 'nccl'.*horovod"):
        sok.set_comm_tool("nccl")


def test_distributed_and_localized_variable_classes():
    values = np.arange(12, dtype=np.float32).reshape(4, 3)
    spread, local = sok.Variable(values), sok.Variable(values, mode="localized:0")
    assert isinstance(spread, sok.DistributedVariable) and not isinstance(spread, sok.LocalizedVariable)
    assert isinstance(local, sok.LocalizedVariable) and not isinstance(local, sok.DistributedVariable)
    assert not isinstance(tf.Variable(values), (sok.DistributedVariable, sok.LocalizedVariable))
    made = sok.LocalizedVariable(values, target_gpu=0)
    assert isinstance(made, sok.StaticTable) and made.mode == "localized:0"
    np.testing.assert_array_equal(sok.DistributedVariable(values).numpy(), values)
    assert sok.filter_variables([spread, local, tf.Variable(1.0)])[0] == [spread, local]


def _scatter_program(var, ref, ops):
    """Applies [(method, IndexedSlices)] to a DynamicVariable and a tf.Variable reference."""
    out = []
    for method, delta in ops:
        out.append(getattr(var, method)(delta))
        out.append(getattr(ref, method)(delta))
    return out


def _scatters():
    return [
        ("scatter_add", tf.IndexedSlices(tf.constant([[1.0, 2.0], [3.0, 4.0], [0.5, 0.5]]),
                                         tf.constant([3, 7, 3], tf.int64))),
        ("scatter_sub", tf.IndexedSlices(tf.constant([[1.0, 1.0], [2.0, -2.0]]),
                                         tf.constant([7, 9], tf.int64))),
        ("scatter_update", tf.IndexedSlices(tf.constant([[-5.0, 6.0]]), tf.constant([11], tf.int64))),
        ("scatter_add", tf.IndexedSlices(tf.constant([[0.25, 0.25]]), tf.constant([11], tf.int64))),
    ]


def test_dynamic_variable_scatter_ops_match_tf_variable_eager():
    v = sok.DynamicVariable(dimension=2, initializer="13", name=unique_name("dyn_scatter"))
    ref = tf.Variable(tf.fill([16, 2], 13.0))
    _scatter_program(v, ref, _scatters())
    keys = np.array([3, 7, 9, 11])
    np.testing.assert_array_equal(sorted(v.indices.numpy()), keys)
    np.testing.assert_allclose(v.sparse_read(keys, training=False).numpy(), ref.numpy()[keys])
    # Repeated keys: scatter_update keeps the last value (TensorFlow leaves the order open).
    v.scatter_update(tf.IndexedSlices(tf.constant([[1.0, 1.0], [2.0, 2.0]]), tf.constant([5, 5])))
    np.testing.assert_array_equal(v.sparse_read([5], training=False).numpy(), [[2.0, 2.0]])
    assert v.key_map(keys) is keys and v.dimension == 2 and v.backend_type == "hbm"
    with pytest.raises(TypeError, match="'dyn_scatter_.*'.scatter_add takes tf.IndexedSlices"):
        v.scatter_add(tf.constant([[1.0, 1.0]]))
    with pytest.raises(ValueError, match="has dimension 2, but the values have shape"):
        v.scatter_update(tf.IndexedSlices(tf.ones([1, 3]), tf.constant([1], tf.int64)))


def test_dynamic_variable_in_a_session():
    """TF1: scatter ops as graph ops against the reference; tf.convert_to_tensor(var) is a clear
    error (SOK 2.x's DynamicVariable has no dense value either)."""
    with graph_session() as sess:
        v = sok.DynamicVariable(dimension=2, initializer="13", name="dyn_session")
        ref = tf.compat.v1.get_variable("ref", initializer=tf.fill([16, 2], 13.0), use_resource=True)
        program = _scatter_program(v, ref, _scatters())
        keys = tf.constant([3, 7, 9, 11], tf.int64)
        sess.run(tf.compat.v1.global_variables_initializer())
        for op in program:
            sess.run(op)
        rows, expected, size = sess.run(
            [v.sparse_read(keys, training=False), tf.gather(ref, keys), v.size])
        np.testing.assert_allclose(rows, expected)
        np.testing.assert_array_equal(size, [4, 2])
        assert "<sok.DynamicVariable 'dyn_session' shape=(None, 2) dtype=float32" in repr(v)
        with pytest.raises(TypeError, match="'dyn_session' is a hash table without a dense value"):
            tf.convert_to_tensor(v)


def _rows_by_key(keys, values):
    order = np.argsort(keys)
    return keys[order], values[order]


def test_session_fetches_tables_as_variables():
    """sess.run of a DynamicVariable, a sok.Variable, an Embedding Variable and a partitioned one,
    alone, in lists and dicts, through make_callable and filter_variables (SOK 2.x's
    tf1/variable/filter_variables_test.py): a table's fetch is its rows on this rank."""
    with graph_session() as sess:
        dense = tf.compat.v1.Variable([[0, 1, 2]])
        static = sok.Variable([[3.0, 4.0, 5.0], [6.0, 7.0, 8.0]])
        dynamic = sok.DynamicVariable(dimension=3, initializer="13", name="fetch_dyn")
        ev = sok.get_embedding_variable("fetch_ev", embedding_dim=3, initializer=tf.ones_initializer())
        parts = sok.get_embedding_variable(
            "fetch_parts", embedding_dim=3, initializer=tf.zeros_initializer(),
            partitioner=tf.compat.v1.fixed_size_partitioner(2))
        writes = [dynamic.scatter_update(tf.IndexedSlices(tf.fill([2, 3], 2.0),
                                                          tf.constant([5, 9], tf.int64))),
                  ev.sparse_read(tf.constant([4], tf.int64)),
                  parts.sparse_read(tf.constant([1, 2, 3], tf.int64))]
        sess.run(tf.compat.v1.global_variables_initializer())
        empty = sess.run(dynamic)
        assert empty.shape == (0, 3) and empty.dtype == np.float32
        sess.run(writes)
        keys, values = sess.run(sok.export(dynamic))
        fetched = sess.run(dynamic)
        np.testing.assert_array_equal(fetched, values)
        np.testing.assert_array_equal(_rows_by_key(keys, fetched)[1], np.full([2, 3], 2.0))
        got = sess.run({"static": static, "list": [dynamic, ev], "parts": parts})
        np.testing.assert_array_equal(got["static"], [[3, 4, 5], [6, 7, 8]])
        np.testing.assert_array_equal(got["list"][1], np.ones([1, 3]))
        np.testing.assert_array_equal(got["parts"], np.zeros([3, 3]))
        with tf.control_dependencies([dynamic]):
            after = tf.constant(1)
        assert len(after.op.control_inputs) == 1
        fetch = sess.make_callable([dynamic, static])
        np.testing.assert_array_equal(fetch()[0], fetched)
        sok_vars, other_vars = sess.run(sok.filter_variables([dense, static, dynamic]))
        assert len(sok_vars) == 2 and len(other_vars) == 1
        before = len(tf.compat.v1.get_default_graph().get_operations())
        sess.run(dynamic)
        assert len(tf.compat.v1.get_default_graph().get_operations()) == before  # made once
        unfetched = sok.DynamicVariable(dimension=3, name="fetch_late")
        sess.run(unfetched.initializer)
        tf.compat.v1.get_default_graph().finalize()
        np.testing.assert_array_equal(sess.run(dynamic), fetched)
        with pytest.raises(TypeError, match="'fetch_late': fetch it once before the graph is "
                                            "finalized"):
            sess.run(unfetched)


def test_dynamic_variable_initializer_strings():
    dim, keys = 16, np.arange(2000)
    uniform = sok.DynamicVariable(dimension=dim, initializer="uniform", name=unique_name("u"))
    rows = uniform.sparse_read(keys).numpy()
    assert np.abs(rows).max() <= 0.05 and abs(rows.mean()) < 0.005 and rows.std() > 0.02
    normal = sok.DynamicVariable(dimension=dim, initializer="normal", name=unique_name("n"))
    rows = normal.sparse_read(keys).numpy()
    assert abs(rows.mean()) < 0.005 and abs(rows.std() - 0.05) < 0.005
    np.testing.assert_array_equal(normal.sparse_read(keys[:5]).numpy(), rows[:5])  # per key
    assert normal.initializer_str == "normal"
    constant = sok.DynamicVariable(dimension=2, initializer="-2.5", name=unique_name("c"))
    np.testing.assert_array_equal(constant.sparse_read([4]).numpy(), [[-2.5, -2.5]])
    with pytest.raises(ValueError, match="unknown initializer string 'lecun'"):
        sok.DynamicVariable(dimension=2, initializer="lecun", name=unique_name("bad"))
    with pytest.raises(ValueError, match="max_capacity must be a positive integer"):
        sok.DynamicVariable(dimension=2, max_capacity=0, name=unique_name("cap"))


def _evict_expectations(i, batch, evicted_keys, evicted_values, size):
    """Each step inserts `batch` new keys into a table of capacity 2*batch: from step 2 on the
    rows of step i-2 (the oldest update) leave, holding 11 - 1 (one SGD step of a sum loss)."""
    if i < 2:
        assert evicted_keys.size == 0 and evicted_values.shape == (0, 4)
    else:
        np.testing.assert_array_equal(np.sort(evicted_keys), np.arange((i - 2) * batch, (i - 1) * batch))
        np.testing.assert_array_equal(evicted_values, np.full([batch, 4], 10.0))
    assert size == min(i + 1, 2) * batch


def test_sparse_read_and_evict_tf2():
    batch = 8
    v = sok.DynamicVariable(dimension=4, initializer="11", var_type="hybrid", init_capacity=batch,
                            max_capacity=2 * batch, name=unique_name("evict"))
    optimizer = sok.OptimizerWrapper(tf.keras.optimizers.SGD(learning_rate=1.0))
    for i in range(5):
        ids = tf.constant(np.arange(i * batch, (i + 1) * batch), tf.int64)
        with tf.GradientTape() as tape:
            rows, keys, values = sok.sparse_read_and_evict(v, tf.RaggedTensor.from_uniform_row_length(ids, 2))
            loss = tf.reduce_sum(rows.flat_values)
        np.testing.assert_array_equal(rows.flat_values.numpy(), np.full([batch, 4], 11.0))
        optimizer.apply_gradients(zip(tape.gradient(loss, [v]), [v]))
        _evict_expectations(i, batch, keys.numpy(), values.numpy(), int(v.size[0]))
    # The batch's own rows stay even when they alone exceed the capacity.
    rows, keys, _ = sok.sparse_read_and_evict(v, tf.constant(np.arange(100, 100 + 3 * batch)))
    assert rows.shape == (3 * batch, 4) and keys.shape[0] == 2 * batch
    assert int(v.size[0]) == 3 * batch
    unbounded = sok.DynamicVariable(dimension=4, name=unique_name("no_cap"))
    assert sok.sparse_read_and_evict(unbounded, tf.range(10, dtype=tf.int64))[1].shape[0] == 0


def test_sparse_read_and_evict_in_a_session():
    batch = 8
    with graph_session() as sess:
        v = sok.DynamicVariable(dimension=4, initializer="11", max_capacity=2 * batch, name="evict_s")
        ids = tf.compat.v1.placeholder(tf.int64, [None])
        rows, keys, values = sok.sparse_read_and_evict(v, ids)
        optimizer = sok.OptimizerWrapper(tf.compat.v1.train.GradientDescentOptimizer(1.0))
        train = optimizer.apply_gradients(zip(tf.gradients(tf.reduce_sum(rows), [v]), [v]))
        sess.run(tf.compat.v1.global_variables_initializer())
        for i in range(4):
            feed = {ids: np.arange(i * batch, (i + 1) * batch)}
            _, k, val = sess.run([train, keys, values], feed)
            _evict_expectations(i, batch, k, val, int(sess.run(v.size)[0]))


def _adagrad_steps(rng, steps, batch, vocab):
    return [rng.choice(vocab, batch, replace=False) for _ in range(steps)]


def _train(var, optimizer, ids):
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.nn.embedding_lookup(var, tf.constant(ids)) ** 2)
    optimizer.apply_gradients(zip(tape.gradient(loss, [var]), [var]))


def _step_increment(v, ref, optimizer, reference, ids):
    """One step of `ids` on `v` and on its reference `ref`; v's increment since that step (keys,
    rows), in key order."""
    since = sok.update_step(optimizer)
    _train(v, optimizer, ids)
    _train(ref, reference, ids)
    keys, values = sok.incremental_model_dump([v], since)
    order = np.argsort(keys[0])
    return keys[0][order], values[0][order]


def test_incremental_model_dump_tf2_matches_reference():
    """Adagrad (fused) on a DynamicVariable vs Keras Adagrad on a tf.Variable: after each step the
    increment since that step holds exactly its ids, with the reference's rows."""
    rng = np.random.default_rng(3)
    vocab, dim = 40, 4
    v = sok.DynamicVariable(dimension=dim, initializer="0.5", name=unique_name("inc"))
    ref = tf.Variable(tf.fill([vocab, dim], 0.5))
    optimizer = sok.OptimizerWrapper(tf.keras.optimizers.Adagrad(learning_rate=0.1))
    reference = tf.keras.optimizers.Adagrad(learning_rate=0.1)
    for ids in _adagrad_steps(rng, 4, 6, vocab):
        keys, values = _step_increment(v, ref, optimizer, reference, ids)
        np.testing.assert_array_equal(keys, np.unique(ids))
        np.testing.assert_allclose(values, ref.numpy()[np.unique(ids)], rtol=1e-6)
    everything = sok.incremental_model_dump([v], 0)[0][0]
    assert everything.size == int(v.size[0])
    with pytest.raises(TypeError, match="is an optimizer step .* or a datetime"):
        sok.incremental_model_dump([v], 1.5)  # the datetime form: checkpoint/test_incremental.py
    with pytest.raises(TypeError, match="records no update steps"):
        sok.incremental_model_dump([sok.Variable(np.zeros([2, 2], np.float32))], 0)


def test_incremental_model_dump_in_a_session():
    rng = np.random.default_rng(4)
    vocab, dim = 30, 3
    with graph_session() as sess:
        v = sok.DynamicVariable(dimension=dim, initializer="1", name="inc_session")
        ref = tf.compat.v1.get_variable("ref", initializer=tf.ones([vocab, dim]), use_resource=True)
        ids = tf.compat.v1.placeholder(tf.int64, [None])
        train = []
        for var in (v, ref):
            opt = tf.compat.v1.train.AdagradOptimizer(0.2)
            loss = tf.reduce_sum(tf.nn.embedding_lookup(var, ids) ** 2)
            if var is v:
                opt = sok.OptimizerWrapper(opt)
                wrapper = opt
            train.append(opt.apply_gradients(zip(tf.gradients(loss, [var]), [var])))
        sess.run(tf.compat.v1.global_variables_initializer())
        for batch in _adagrad_steps(rng, 3, 5, vocab):
            since = sess.run(sok.update_step(wrapper))
            sess.run(train, {ids: batch})
            keys, values = sok.incremental_model_dump([v], since, sess)
            order = np.argsort(keys[0])
            np.testing.assert_array_equal(keys[0][order], np.unique(batch))
            np.testing.assert_allclose(values[0][order], sess.run(ref)[np.unique(batch)], rtol=1e-6)
        with pytest.raises(ValueError, match="pass the session"):
            sok.incremental_model_dump([v], 0)


def _sorted_snapshot(var):
    snap = {f: t.numpy() for f, t in var.snapshot().items()}
    order = np.argsort(snap["keys"])
    return {f: a[order] if f in ("keys", "values", "slots", "freqs", "versions") else a
            for f, a in snap.items()}


def test_full_dump_then_increment_restores_the_latest_state(tmp_path):
    """sok.load(full dump) + sok.incremental_model_load(increment) gives the trained table: rows,
    Adagrad slots and update steps; rows the increment lacks come from the full dump."""
    rng = np.random.default_rng(6)
    name = unique_name("inc_load")
    v = sok.DynamicVariable(dimension=3, initializer="0.5", name=name)
    optimizer = sok.OptimizerWrapper(tf.keras.optimizers.Adagrad(learning_rate=0.1))
    for _ in range(2):
        _train(v, optimizer, rng.integers(0, 30, 8))
    sok.dump(str(tmp_path / "full"), [v])
    since = sok.update_step(optimizer)
    for _ in range(2):
        _train(v, optimizer, rng.integers(20, 40, 8))  # some old keys, some new ones
    keys, _ = sok.incremental_model_dump([v], since, path=str(tmp_path / "increment"))
    assert 0 < keys[0].size < int(v.size[0])
    restored = sok.DynamicVariable(dimension=3, initializer="0.5", name=name)
    sok.load(str(tmp_path / "full"), [restored])
    sok.incremental_model_load(str(tmp_path / "increment"), [restored])
    want, got = _sorted_snapshot(v), _sorted_snapshot(restored)
    for field in ("keys", "values", "slots", "versions", "slot_kind", "slot_init"):
        np.testing.assert_array_equal(got[field], want[field], err_msg=field)
    wrong_dim = sok.DynamicVariable(dimension=5, name=name)
    with pytest.raises(ValueError, match="has dimension 5 but .* holds dimension 3"):
        sok.incremental_model_load(str(tmp_path / "increment"), [wrong_dim])


@pytest.mark.parametrize("make", [
    lambda: tf.compat.v1.train.MomentumOptimizer(0.1, momentum=0.9),
    lambda: tf.keras.optimizers.SGD(learning_rate=0.1, momentum=0.9),
], ids=["v1_momentum", "keras_sgd_momentum"])
def test_incremental_model_dump_sees_generic_optimizer_updates(make):
    """Optimizers without a fused kernel (the generic path) record their steps too."""
    rng = np.random.default_rng(8)
    v = sok.DynamicVariable(dimension=2, initializer="1", name=unique_name("inc_generic"))
    with tf.device("/CPU:0"):  # TF has CPU kernels only for v1 Momentum's sparse update
        ref = tf.Variable(tf.ones([30, 2]))
    optimizer, reference = sok.OptimizerWrapper(make()), make()
    for ids in _adagrad_steps(rng, 3, 5, 30):
        keys, values = _step_increment(v, ref, optimizer, reference, ids)
        np.testing.assert_array_equal(keys, np.sort(ids))
        if isinstance(reference, tf.compat.v1.train.Optimizer):  # both lazy: rows are equal
            np.testing.assert_allclose(values, ref.numpy()[np.sort(ids)], rtol=1e-6)
