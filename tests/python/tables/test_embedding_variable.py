"""The Embedding Variable: creation and options, sparse_read / tf.nn.embedding_lookup and their
gradients (TF1 and TF2), size, export / assign, deterministic initial values, default_value_dim,
evaluation reads, the counter filter and eviction."""
import json
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import sparse_operation_kit as sok
from tests.python.support import (
    REPO_ROOT,
    ev_rows,
    exported,
    graph_session,
    subprocess_env,
    unique_name,
)

UNIFORM = tf.random_uniform_initializer(-1.0, 1.0, seed=5)


def make_ev(dim=3, key_dtype=tf.int64, initializer=UNIFORM, name=None, **kwargs):
    return sok.get_embedding_variable(name or unique_name(), dim, key_dtype=key_dtype,
                                      initializer=initializer, **kwargs)


# ---------------------------------------------------------------------------------------------
# Creation and options
# ---------------------------------------------------------------------------------------------
def test_attributes_eager():
    ev = make_ev(dim=5, key_dtype=tf.int32, name="attrs_ev")
    assert ev.name == "attrs_ev"
    assert ev.embedding_dim == 5 and ev.key_dtype == tf.int32 and ev.dtype == tf.float32
    assert ev.shape.as_list() == [None, 5] and ev.trainable
    assert bool(ev.is_initialized()) and int(ev.size()) == 0


def test_graph_collections_and_variable_scope_reuse():
    with graph_session() as sess:
        with tf.compat.v1.variable_scope("tower"):
            ev = sok.get_embedding_variable("emb", 4)
        assert ev.name == "tower/emb"
        assert ev in tf.compat.v1.trainable_variables() and ev in tf.compat.v1.global_variables()
        with tf.compat.v1.variable_scope("tower", reuse=True):
            assert sok.get_embedding_variable("emb", 4) is ev
        with pytest.raises(ValueError, match="'tower/emb' already exists"):
            with tf.compat.v1.variable_scope("tower"):
                sok.get_embedding_variable("emb", 4)
        frozen = sok.get_embedding_variable("frozen", 4, trainable=False)
        assert frozen not in tf.compat.v1.trainable_variables()
        assert not sess.run(ev.is_initialized())
        sess.run(tf.compat.v1.global_variables_initializer())
        assert sess.run(ev.is_initialized()) and sess.run(ev.size()) == 0


def test_option_types_are_checked():
    with pytest.raises(TypeError, match="filter_option must be sok.CounterFilter"):
        sok.EmbeddingVariableOption(filter_option=sok.GlobalStepEvict(3))
    with pytest.raises(TypeError, match="evict_option must be"):
        sok.EmbeddingVariableOption(evict_option=sok.CounterFilter(3))
    with pytest.raises(ValueError, match="default_value_dim must be >= 0"):
        sok.InitializerOption(default_value_dim=-1)
    # DRAM alone is today's table (tests/python/tables/test_storage_option.py: the other types).
    ev = make_ev(ev_option=sok.EmbeddingVariableOption(storage_option=sok.StorageOption("DRAM")))
    assert ev.sparse_read(tf.constant([1], tf.int64)).shape == [1, 3]


# ---------------------------------------------------------------------------------------------
# sparse_read and tf.nn.embedding_lookup, and their gradients
# ---------------------------------------------------------------------------------------------
IDS = np.array([[4, 9, 4], [-2, 2**41, 9]], np.int64)


def _reference(ev_initial, ids):
    """A dense table of the EV's initial rows of the distinct ids, and the ids as positions."""
    keys = sorted({int(k) for k in ids.reshape(-1)})
    pos = np.vectorize({k: i for i, k in enumerate(keys)}.get)(ids)
    return keys, ev_initial(keys), pos


def _check_grad(keys, grad_indices, grad_values, ref_grad, dim):
    got = {}
    for k, v in zip(grad_indices.reshape(-1), grad_values.reshape(-1, dim)):
        got[int(k)] = got.get(int(k), 0) + v
    assert sorted(got) == keys
    for i, k in enumerate(keys):
        np.testing.assert_allclose(got[k], ref_grad[i], rtol=1e-6)


@pytest.mark.parametrize("how", ["sparse_read", "embedding_lookup", "embedding_lookup_list"])
@pytest.mark.parametrize("mode", ["eager", "function"])
def test_read_and_gradient_tf2(how, mode):
    ev = make_ev()
    keys, init, pos = _reference(lambda k: ev_rows(ev, k), IDS)
    ref = tf.Variable(init)
    weights = tf.constant(np.arange(IDS.size * 3, dtype=np.float32).reshape(2, 3, 3))

    def read(var, ids):
        if how == "sparse_read":
            return var.sparse_read(ids)
        if how == "embedding_lookup":
            return tf.nn.embedding_lookup(var, ids)
        return tf.compat.v1.nn.embedding_lookup([var], ids)

    def step(ids):
        with tf.GradientTape() as tape:
            rows = read(ev, ids)
            loss = tf.reduce_sum(rows * weights)
        return rows, tape.gradient(loss, ev)

    if mode == "function":
        step = tf.function(step)
    rows, grad = step(tf.constant(IDS))
    assert rows.shape == [2, 3, 3]
    np.testing.assert_allclose(rows.numpy(), init[pos], rtol=1e-6)
    assert isinstance(grad, tf.IndexedSlices)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.nn.embedding_lookup(ref, pos) * weights)
    ref_grad = tf.convert_to_tensor(tape.gradient(loss, ref)).numpy()
    _check_grad(keys, grad.indices.numpy(), grad.values.numpy(), ref_grad, 3)
    assert int(ev.size()) == len(keys)


@pytest.mark.parametrize("how", ["sparse_read", "embedding_lookup"])
def test_read_and_gradient_tf1(how):
    with graph_session() as sess:
        ev = make_ev(name="tf1_ev")
        sess.run(tf.compat.v1.global_variables_initializer())
        keys, init, pos = _reference(lambda k: ev_rows(ev, k, sess), IDS)
        ids = tf.constant(IDS)
        rows = (
            ev.sparse_read(ids)
            if how == "sparse_read"
            else tf.compat.v1.nn.embedding_lookup(ev, ids)
        )
        weights = tf.constant(np.arange(IDS.size * 3, dtype=np.float32).reshape(2, 3, 3))
        (grad,) = tf.gradients(tf.reduce_sum(rows * weights), [ev])
        assert isinstance(grad, tf.IndexedSlices)
        ref = tf.compat.v1.get_variable("ref", initializer=init, use_resource=True)
        (ref_grad,) = tf.gradients(tf.reduce_sum(tf.gather(ref, pos) * weights), [ref])
        sess.run(ref.initializer)
        rows_v, gi, gv, rg = sess.run(
            [rows, grad.indices, grad.values, tf.convert_to_tensor(ref_grad)]
        )
        assert sess.run(ev.size()) == len(keys)
    np.testing.assert_allclose(rows_v, init[pos], rtol=1e-6)
    _check_grad(keys, gi, gv, rg, 3)


def test_ragged_ids_and_max_norm_in_embedding_lookup():
    ev = make_ev(initializer=tf.constant_initializer(3.0))
    ragged = tf.ragged.constant([[1, 2], [], [3]], dtype=tf.int64)
    out = tf.nn.embedding_lookup(ev, ragged)
    assert isinstance(out, tf.RaggedTensor)
    np.testing.assert_allclose(out.flat_values.numpy(), np.full([3, 3], 3.0))
    clipped = tf.nn.embedding_lookup(ev, tf.constant([1], tf.int64), max_norm=1.0)
    np.testing.assert_allclose(np.linalg.norm(clipped.numpy(), axis=-1), [1.0], rtol=1e-5)


def test_partitioned_list_of_embedding_variables_is_rejected():
    with pytest.raises(ValueError, match="list of 2 Embedding Variables"):
        tf.nn.embedding_lookup([make_ev(), make_ev()], tf.constant([1], tf.int64))


# ---------------------------------------------------------------------------------------------
# size, evaluation reads, export and assign
# ---------------------------------------------------------------------------------------------
def test_size_counts_distinct_keys():
    ev = make_ev()
    ev.sparse_read(tf.constant([1, 1, 2, 3, 2], tf.int64))
    assert int(ev.size()) == 3
    sok.lookup_sparse([ev], [tf.ragged.constant([[3, 4], [5, 5]], dtype=tf.int64)])
    assert int(ev.size()) == 5


def test_evaluation_reads_never_insert_and_return_initial_values():
    ev = make_ev()
    keys = tf.constant([10, 11, -12, 2**45], tf.int64)
    before = ev.sparse_read(keys, training=False).numpy()
    assert int(ev.size()) == 0
    evaluated = sok.lookup_sparse([ev], [tf.ragged.constant([[10], [11, -12]], dtype=tf.int64)],
                                  combiners=["sum"], training=False)[0].numpy()
    np.testing.assert_allclose(evaluated, [before[0], before[1] + before[2]], rtol=1e-6)
    assert int(ev.size()) == 0
    inserted = ev.sparse_read(keys).numpy()  # a training read inserts the same initial values
    np.testing.assert_array_equal(inserted, before)
    assert int(ev.size()) == 4
    # After an update, evaluation reads see the stored row.
    ev.assign(tf.constant([10], tf.int64), tf.constant([[7.0, 8.0, 9.0]]))
    np.testing.assert_array_equal(
        ev.sparse_read(keys[:1], training=False).numpy(), [[7.0, 8.0, 9.0]]
    )


def test_export_and_assign():
    ev = make_ev(key_dtype=tf.int32)
    sok.assign(
        ev,
        tf.constant([5, -7, 9], tf.int32),
        tf.constant(np.arange(9, dtype=np.float32).reshape(3, 3)),
    )
    ev.sparse_read(tf.constant([11], tf.int32))
    table = exported(ev)
    assert sorted(table) == [-7, 5, 9, 11]
    np.testing.assert_array_equal(table[-7], [3.0, 4.0, 5.0])
    np.testing.assert_array_equal(table[11], ev_rows(ev, [11])[0])
    ev.assign(tf.constant([9], tf.int32), tf.constant([[1.0, 1.0, 1.0]]))  # overwrite, no new key
    keys, values = sok.export(ev)
    assert keys.dtype == tf.int32 and values.shape == [4, 3]
    np.testing.assert_array_equal(exported(ev)[9], [1.0, 1.0, 1.0])
    np.testing.assert_array_equal(ev.sparse_read(tf.constant([5, 9], tf.int32)).numpy(),
                                  [[0.0, 1.0, 2.0], [1.0, 1.0, 1.0]])


def test_export_and_assign_tf1():
    with graph_session() as sess:
        ev = make_ev(name="assign_tf1")
        assign = sok.assign(ev, tf.constant([3, 4], tf.int64), tf.ones([2, 3]))
        sess.run(tf.compat.v1.global_variables_initializer())
        sess.run(assign)
        table = exported(ev, sess)
    assert sorted(table) == [3, 4] and all((v == 1.0).all() for v in table.values())


# ---------------------------------------------------------------------------------------------
# Deterministic initial values
# ---------------------------------------------------------------------------------------------
INITIALIZERS = {
    "uniform": lambda: tf.random_uniform_initializer(-1.0, 1.0),
    "normal": lambda: tf.random_normal_initializer(0.0, 0.5),
    "truncated_normal": lambda: tf.compat.v1.truncated_normal_initializer(0.0, 1.0),
    "glorot_keras": lambda: tf.keras.initializers.GlorotUniform(),
    "glorot_v1": lambda: tf.compat.v1.glorot_uniform_initializer(),
    "default": lambda: None,
}
KEYS = list(range(-5, 15)) + [2**40, -(2**40)]


@pytest.mark.parametrize("init", sorted(INITIALIZERS))
def test_initial_values_do_not_depend_on_lookup_order_or_batching(init):
    a = make_ev(dim=4, initializer=INITIALIZERS[init](), name=f"determinism_{init}")
    b = make_ev(dim=4, initializer=INITIALIZERS[init](), name=f"determinism_{init}")
    other = make_ev(dim=4, initializer=INITIALIZERS[init](), name=f"other_{init}")
    in_order = a.sparse_read(tf.constant(KEYS, tf.int64)).numpy()
    reversed_batches = [b.sparse_read(tf.constant(KEYS[i:i + 3][::-1], tf.int64)).numpy()[::-1]
                        for i in range(0, len(KEYS), 3)][::-1]
    np.testing.assert_array_equal(in_order, np.concatenate(reversed_batches[::-1]))
    # Through lookup_sparse with repeated ids in random sample order: the same rows.
    perm = np.random.default_rng(0).permutation(len(KEYS))
    c = make_ev(dim=4, initializer=INITIALIZERS[init](), name=f"determinism_{init}")
    sok.lookup_sparse([c], [tf.RaggedTensor.from_row_lengths(
        tf.constant(np.array(KEYS)[np.concatenate([perm, perm])], tf.int64), [7, 9, 3, 25])])
    table = exported(c)
    np.testing.assert_array_equal(np.stack([table[k] for k in KEYS]), in_order)
    # Another name draws other values; rows of keys in distinct default-value rows differ (the
    # keys +-2**40 share row 0 of the 4096-row default-value matrix with key 0).
    assert not np.allclose(other.sparse_read(tf.constant(KEYS, tf.int64)).numpy(), in_order)
    assert len({tuple(r) for r in in_order}) == len(KEYS) - 2


def test_initial_values_are_the_same_in_two_graphs():
    rows = []
    for _ in range(2):
        with graph_session() as sess:
            evs = [
                make_ev(dim=4, initializer=INITIALIZERS[k](), name=f"graphs_{k}")
                for k in sorted(INITIALIZERS)
            ]
            sess.run(tf.compat.v1.global_variables_initializer())
            rows.append(sess.run([ev.sparse_read(tf.constant(KEYS, tf.int64)) for ev in evs]))
    for r1, r2 in zip(*rows):
        np.testing.assert_array_equal(r1, r2)
    # And the same as an eager table of that name.
    eager = [
        make_ev(dim=4, initializer=INITIALIZERS[k](), name=f"graphs_{k}")
        for k in sorted(INITIALIZERS)
    ]
    for ev, r in zip(eager, rows[0]):
        np.testing.assert_array_equal(ev_rows(ev, KEYS), r)


_CHILD = """
import json, sys
import tensorflow as tf
import sparse_operation_kit as sok
sys.path.insert(0, {tests!r})
from tests.python.tables.test_embedding_variable import INITIALIZERS, KEYS
out = {{}}
for k in sorted(INITIALIZERS):
    ev = sok.get_embedding_variable("process_" + k, 4, initializer=INITIALIZERS[k]())
    out[k] = ev.sparse_read(tf.constant(KEYS[::-1], tf.int64)).numpy()[::-1].tolist()
dyn = sok.DynamicVariable(dimension=4, initializer="random", name="process_dyn")
out["dyn"] = dyn.sparse_read(tf.constant(KEYS, tf.int64)).numpy().tolist()
print("ROWS" + json.dumps(out))
"""


def test_initial_values_are_the_same_in_another_process():
    code = _CHILD.format(tests=REPO_ROOT)
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=subprocess_env(),
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    child = json.loads(proc.stdout.split("ROWS", 1)[1])
    for k in sorted(INITIALIZERS):
        ev = make_ev(dim=4, initializer=INITIALIZERS[k](), name="process_" + k)
        np.testing.assert_array_equal(
            np.array(child[k], np.float32),
            ev.sparse_read(tf.constant(KEYS, tf.int64)).numpy(),
            err_msg=k,
        )
    dyn = sok.DynamicVariable(dimension=4, initializer="random", name="process_dyn")
    np.testing.assert_array_equal(
        np.array(child["dyn"], np.float32), dyn.sparse_read(tf.constant(KEYS, tf.int64)).numpy()
    )


def test_default_value_dim():
    opt = sok.EmbeddingVariableOption(
        init_option=sok.InitializerOption(UNIFORM, default_value_dim=8)
    )
    ev = make_ev(ev_option=opt)
    rows = ev.sparse_read(tf.constant([3, 11, 19, -5, 4], tf.int64)).numpy()
    # key k starts from row k mod 8 (floor modulo: -5 -> 3)
    np.testing.assert_array_equal(rows[0], rows[1])
    np.testing.assert_array_equal(rows[0], rows[2])
    np.testing.assert_array_equal(rows[0], rows[3])
    assert not np.array_equal(rows[0], rows[4])
    # A matrix initializer is evaluated into [default_value_dim, dim] rows, and keys wrap the same.
    opt = sok.EmbeddingVariableOption(init_option=sok.InitializerOption(
        tf.keras.initializers.Orthogonal(seed=1), default_value_dim=4))
    m = make_ev(dim=4, ev_option=opt).sparse_read(tf.constant([0, 1, 2, 3, 4, 5], tf.int64)).numpy()
    np.testing.assert_allclose(
        m[:4] @ m[:4].T, np.eye(4), atol=1e-5
    )  # the orthogonal matrix itself
    np.testing.assert_array_equal(m[4:], m[:2])
    # default_value_dim=0 (DynamicVariable): every key its own row.
    dyn = sok.DynamicVariable(dimension=3, initializer="random", name=unique_name("dyn"))
    d = dyn.sparse_read(tf.constant([3, 4099, 3 + 8], tf.int64)).numpy()
    assert not np.array_equal(d[0], d[1]) and not np.array_equal(d[0], d[2])


# ---------------------------------------------------------------------------------------------
# Counter filter and eviction
# ---------------------------------------------------------------------------------------------
def test_counter_filter():
    opt = sok.EmbeddingVariableOption(
        filter_option=sok.CounterFilter(filter_freq=3),
        init_option=sok.InitializerOption(
            tf.constant_initializer(2.0), default_value_no_permission=-1.0
        ),
    )
    ev = make_ev(ev_option=opt)
    sgd = sok.SGD(lr=1.0)
    key = tf.constant([7], tf.int64)
    seen = []
    for _ in range(4):
        with tf.GradientTape() as tape:
            rows = ev.sparse_read(key)  # one training lookup: frequency + 1
            loss = tf.reduce_sum(rows)
        seen.append(rows.numpy()[0, 0])
        sgd.apply_gradients([(tape.gradient(loss, ev), ev)])
    # Lookups 1 and 2: not admitted, read the no-permission value and the updates are dropped;
    # lookup 3 admits the key (initial value 2); its update and the next one land.
    assert seen == [-1.0, -1.0, 2.0, 1.0]
    np.testing.assert_array_equal(exported(ev)[7], [0.0, 0.0, 0.0])
    assert int(ev.export()[3].numpy()[0]) == 4  # frequency
    # Evaluation reads do not count: an unseen key stays below the threshold.
    other = tf.constant([8], tf.int64)
    for _ in range(5):
        np.testing.assert_array_equal(ev.sparse_read(other, training=False).numpy(), [[-1.0] * 3])
    assert exported(ev).keys() == {7}
    # lookup_sparse counts every occurrence of a key in the batch.
    sok.lookup_sparse([ev], [tf.ragged.constant([[9, 9], [9]], dtype=tf.int64)])
    np.testing.assert_array_equal(
        ev.sparse_read(tf.constant([9], tf.int64), training=False).numpy(), [[2.0] * 3]
    )


# A training read of a filtered table counts a key repeated in it once, with its count, as
# DeepRec's: every occurrence reads the same row and a key is admitted when its frequency reaches
# filter_freq. FILTER_BATCHES: three steps of [2, 2] ids, each position weighted by FILTER_WEIGHTS.
FILTER_BATCHES = [[[5, 5], [5, 9]], [[9, 7], [5, 5]], [[9, 9], [7, 7]]]
FILTER_WEIGHTS = np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)
FILTER_INIT, NO_PERMISSION, FILTER_LR = 0.5, -7.0, 0.1


def filtered_ev(filter_option, partitioned):
    opt = sok.EmbeddingVariableOption(
        filter_option=filter_option,
        init_option=sok.InitializerOption(tf.constant_initializer(FILTER_INIT),
                                          default_value_no_permission=NO_PERMISSION),
    )
    part = tf.compat.v1.fixed_size_partitioner(2) if partitioned else None
    return sok.get_embedding_variable(unique_name("filtered"), 2, ev_option=opt, partitioner=part)


def filtered_sgd_reference(filter_freq=3):
    """Per step the rows read ([2, 2, dim]) and at the end {key: row}, by hand: a key's count in
    the batch adds to its frequency at once; an admitted key reads its row and takes the summed
    gradient of its occurrences; a key below filter_freq reads NO_PERMISSION and takes none."""
    freq, rows, reads = {}, {}, []
    for batch in FILTER_BATCHES:
        ids = np.array(batch)
        for k in np.unique(ids):
            freq[k] = freq.get(k, 0) + int((ids == k).sum())
            if freq[k] >= filter_freq:
                rows.setdefault(k, np.full(2, FILTER_INIT, np.float32))
        reads.append(np.stack([[rows.get(k, np.full(2, NO_PERMISSION)) for k in r] for r in ids]))
        for k in rows:
            if k in ids:
                rows[k] = rows[k] - FILTER_LR * FILTER_WEIGHTS[ids == k].sum()
    return reads, rows


def filtered_loss(rows):
    return tf.reduce_sum(rows * FILTER_WEIGHTS[..., None])


@pytest.mark.parametrize("partitioned", [False, True])
def test_filter_counts_repeated_ids_of_one_dense_read_tf1(partitioned):
    want_reads, want_rows = filtered_sgd_reference()
    with graph_session() as sess:
        ev = filtered_ev(sok.CounterFilter(filter_freq=3), partitioned)
        ids = tf.compat.v1.placeholder(tf.int64, [2, 2])
        rows = tf.nn.embedding_lookup(ev, ids)
        opt = sok.OptimizerWrapper(tf.compat.v1.train.GradientDescentOptimizer(FILTER_LR))
        train = opt.minimize(filtered_loss(rows))
        sess.run(tf.compat.v1.global_variables_initializer())
        for batch, want in zip(FILTER_BATCHES, want_reads):
            got, _ = sess.run([rows, train], {ids: batch})
            np.testing.assert_allclose(got, want, rtol=1e-6)
        got_rows = exported(ev, sess)
    assert got_rows.keys() == want_rows.keys()
    for k, row in want_rows.items():
        np.testing.assert_allclose(got_rows[k], row, rtol=1e-6)


@pytest.mark.parametrize("partitioned", [False, True])
@pytest.mark.parametrize("filter_option", [sok.CounterFilter(3), sok.CBFFilter(3)],
                         ids=["counter", "cbf"])
def test_filter_counts_repeated_ids_of_one_dense_read_eager(filter_option, partitioned):
    want_reads, want_rows = filtered_sgd_reference()
    ev = filtered_ev(filter_option, partitioned)
    tables = ev.parts if partitioned else [ev]
    sgd = sok.SGD(lr=FILTER_LR)
    for batch, want in zip(FILTER_BATCHES, want_reads):
        with tf.GradientTape() as tape:
            rows = tf.nn.embedding_lookup(ev, tf.constant(batch, tf.int64))
            loss = filtered_loss(rows)
        np.testing.assert_allclose(rows.numpy(), want, rtol=1e-6)
        sgd.apply_gradients(zip(tape.gradient(loss, tables), tables))
    got_rows = exported(ev)
    assert got_rows.keys() == want_rows.keys()
    for k, row in want_rows.items():
        np.testing.assert_allclose(got_rows[k], row, rtol=1e-6)


@pytest.mark.parametrize("partitioned", [False, True])
def test_filter_repeated_new_id_reads_one_row_and_gradient_is_per_key(partitioned):
    ev = filtered_ev(sok.CounterFilter(filter_freq=3), partitioned)
    # Two occurrences: frequency 2 < 3, both read the no-permission value.
    np.testing.assert_array_equal(ev.sparse_read(tf.constant([4, 4], tf.int64)).numpy(),
                                  [[NO_PERMISSION] * 2] * 2)
    # Three more in one read: admitted together, every one reads the initial row.
    with tf.GradientTape() as tape:
        rows = ev.sparse_read(tf.constant([[8, 4], [8, 8]], tf.int64))
        loss = tf.reduce_sum(rows * tf.constant([[1.0, 2.0], [3.0, 4.0]])[..., None])
    np.testing.assert_array_equal(rows.numpy(), np.full([2, 2, 2], FILTER_INIT))
    tables = ev.parts if partitioned else [ev]
    by_key = {}
    for g in tape.gradient(loss, tables):
        for k, v in zip(g.indices.numpy(), g.values.numpy()):
            assert k not in by_key  # one gradient row per distinct key
            by_key[int(k)] = v
    assert by_key.keys() == {4, 8}
    np.testing.assert_array_equal(by_key[8], [8.0, 8.0])
    np.testing.assert_array_equal(by_key[4], [2.0, 2.0])
    freqs = dict(zip(*[t.numpy() for t in (sok.export(ev)[0], ev.export()[3])]))
    assert freqs == {4: 3, 8: 3}


def test_global_step_evict_tf1():
    opt = sok.EmbeddingVariableOption(evict_option=sok.GlobalStepEvict(steps_to_live=2))
    with graph_session() as sess:
        ev = make_ev(name="evict_ev", ev_option=opt)
        ids = tf.compat.v1.placeholder(tf.int64, [None])
        loss = tf.reduce_sum(ev.sparse_read(ids))
        global_step = tf.compat.v1.train.get_or_create_global_step()
        wrapper = sok.OptimizerWrapper(tf.compat.v1.train.GradientDescentOptimizer(0.1))
        train = wrapper.minimize(loss, global_step=global_step)
        shrink = ev.shrink(global_step)
        sess.run(tf.compat.v1.global_variables_initializer())
        for batch in ([1, 2], [2, 3], [3], [3, 4]):  # steps 0..3
            sess.run(train, {ids: batch})
        assert sess.run(global_step) == 4
        versions = dict(zip(*sess.run([ev.export()[0], ev.export()[4]])))
        assert versions == {1: 0, 2: 1, 3: 3, 4: 3}
        # At step 4: keys last updated more than 2 steps ago (1 at step 0, 2 at step 1) go.
        assert sess.run(shrink) == 2
        assert sorted(exported(ev, sess)) == [3, 4]
        assert sess.run(shrink) == 0


def test_l2_weight_evict():
    opt = sok.EmbeddingVariableOption(evict_option=sok.L2WeightEvict(l2_weight_threshold=1.0))
    ev = make_ev(ev_option=opt)
    # DeepRec's L2 weight: half the squared norm (key 4: norm 1.2 over the threshold, weight 0.72
    # under it, so it goes).
    ev.assign(
        tf.constant([1, 2, 3, 4], tf.int64),
        tf.constant([[0.1, 0.1, 0.1], [1.0, 1.0, 1.0], [0.5, 0.5, 0.6], [1.2, 0.0, 0.0]]),
    )
    assert int(ev.shrink(0)) == 3
    assert sorted(exported(ev)) == [2]


@pytest.mark.parametrize("optimizer", ["adagrad", "adam", "momentum"])
def test_rows_record_the_given_global_step_tf1(optimizer):
    """DeepRec's rows record the global step given to minimize: a warm start (global_step at 1000)
    keeps them at shrink(global_step); the optimizer's own step (Adam's bias correction) does not
    follow it, so the values equal a run from global_step 0 (fused and generic paths)."""
    make = {
        "adagrad": lambda: tf.compat.v1.train.AdagradOptimizer(0.1),
        "adam": lambda: tf.compat.v1.train.AdamOptimizer(0.1),
        "momentum": lambda: tf.compat.v1.train.MomentumOptimizer(0.1, 0.9),
    }[optimizer]
    opt = sok.EmbeddingVariableOption(evict_option=sok.GlobalStepEvict(steps_to_live=10))
    runs = {}
    for start in (0, 1000):
        with graph_session() as sess:
            ev = make_ev(name=f"stamped_{optimizer}_{start}", ev_option=opt)
            ids = tf.compat.v1.placeholder(tf.int64, [None])
            loss = tf.reduce_sum(ev.sparse_read(ids))
            global_step = tf.compat.v1.train.get_or_create_global_step()
            train = sok.OptimizerWrapper(make()).minimize(loss, global_step=global_step)
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(global_step.assign(start))
            for batch in ([1, 2], [2, 3], [3]):
                sess.run(train, {ids: batch})
            keys, values, _, _, versions = sess.run(ev.export()[:5])
            assert dict(zip(keys.tolist(), versions.tolist())) == {
                1: start, 2: start + 1, 3: start + 2}
            runs[start] = dict(zip(keys.tolist(), values.tolist()))
            assert sess.run(ev.shrink(global_step)) == 0
    assert runs[0] == runs[1000]

