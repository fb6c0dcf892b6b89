"""sok.lookup_sparse against tf.nn.embedding_lookup_sparse on tf.Variables: forward values and
gradients, in TF2 eager, inside tf.function and in TF1 graphs.

An Embedding Variable (EV) is compared with a dense tf.Variable whose row i holds the EV's initial
row of key vocab[i]; ids of the EV are vocab[positions], ids of the reference are the positions.
"""
import numpy as np
import pytest
import tensorflow as tf

import sparse_operation_kit as sok
from sparse_operation_kit.runtime._ops import ops
from tests.python.support import (
    densify_by_key,
    ev_rows,
    graph_session,
    random_ragged,
    to_ragged,
    to_sparse,
    unique_name,
)

DIM = 4
# Keys far apart, negative and beyond 32 bits: the EV is a hash table, not an array.
VOCAB64 = np.array(
    [0, 7, -3, 2**40 + 5, 123456789012, -(2**35), 42, 99, 5, 1 << 50, 11, -1], np.int64
)
VOCAB32 = np.array([0, 7, -3, 2**30 + 5, 1234567, -(2**20), 42, 99, 5, 1 << 29, 11, -1], np.int32)


def make_ev(key_dtype=tf.int64, dim=DIM, name=None):
    return sok.get_embedding_variable(name or unique_name(), dim, key_dtype=key_dtype,
                                      initializer=tf.random_uniform_initializer(-1.0, 1.0, seed=7))


def reference_table(ev, vocab, sess=None):
    """A tf.Variable holding the EV's initial rows of `vocab`, in that order."""
    return ev_rows(ev, vocab, sess)


def reference_lookup(table, rows, weights, combiner, dtype=tf.int64):
    """tf.nn.embedding_lookup_sparse, padded with zero rows for trailing empty samples."""
    sp = to_sparse(rows, dtype)
    sp_w = None
    if weights is not None:
        sp_w = tf.SparseTensor(sp.indices, tf.constant([w for r in weights for w in r], tf.float32),
                               sp.dense_shape)
    out = tf.nn.embedding_lookup_sparse(table, sp, sp_w, combiner=combiner)
    missing = len(rows) - tf.shape(out)[0]
    return tf.concat([out, tf.zeros([missing, tf.shape(out)[1]])], 0)


def sok_ids(rows, vocab, fmt, dtype):
    keyed = [[vocab[p] for p in r] for r in rows]
    return to_sparse(keyed, dtype) if fmt == "sparse" else to_ragged(keyed, dtype)


def sok_weights(weights, fmt, rows):
    if weights is None:
        return None
    if fmt == "sparse":
        sp = to_sparse(rows)
        return tf.SparseTensor(sp.indices, tf.constant([w for r in weights for w in r], tf.float32),
                               sp.dense_shape)
    return to_ragged(weights, tf.float32)


def make_batch(rng, batch=6, max_len=5, vocab=None, empty_rows=(1, 5), weighted=True):
    vocab = len(VOCAB64) if vocab is None else vocab
    rows = random_ragged(rng, batch, max_len, vocab, empty_rows)
    first = next(b for b in range(batch) if rows[b])
    rows[first] = rows[first] + [rows[first][0]]  # a repeated id inside one sample
    weights = (
        [[float(w) for w in rng.uniform(0.5, 2.0, len(r))] for r in rows] if weighted else None
    )
    return rows, weights


@pytest.mark.parametrize("key_dtype", [tf.int64, tf.int32])
@pytest.mark.parametrize("fmt", ["sparse", "ragged"])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
def test_forward_matches_tf(rng, combiner, weighted, fmt, key_dtype):
    vocab = VOCAB64 if key_dtype == tf.int64 else VOCAB32
    ev = make_ev(key_dtype)
    table = tf.constant(reference_table(ev, vocab))
    assert int(ev.size()) == 0  # evaluation reads insert nothing
    rows, weights = make_batch(rng, weighted=weighted)
    got = sok.lookup_sparse([ev], [sok_ids(rows, vocab, fmt, key_dtype)],
                            sp_weights=[sok_weights(weights, fmt, rows)], combiners=[combiner])
    assert isinstance(got, list) and len(got) == 1
    want = reference_lookup(table, rows, weights, combiner)
    np.testing.assert_allclose(got[0].numpy(), want.numpy(), rtol=1e-5, atol=1e-6)
    # Empty samples read zeros, and training lookups inserted exactly the distinct keys.
    assert not got[0].numpy()[[1, 5]].any()
    assert int(ev.size()) == len({p for r in rows for p in r})


@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
def test_static_tables_match_tf(rng, combiner):
    """tf.Variable and sok.Variable tables, int32 and int64 ids."""
    values = rng.normal(size=[12, 3]).astype(np.float32)
    tf_var = tf.Variable(values)
    sok_var = sok.Variable(values, mode="localized:0")
    rows, weights = make_batch(rng)
    got = sok.lookup_sparse(
        [tf_var, sok_var],
        [to_sparse(rows, tf.int32), to_ragged(rows, tf.int64)],
        sp_weights=[None, to_ragged(weights, tf.float32)],
        combiners=[combiner] * 2,
    )
    np.testing.assert_allclose(
        got[0].numpy(), reference_lookup(values, rows, None, combiner).numpy(), rtol=1e-5, atol=1e-6
    )
    np.testing.assert_allclose(
        got[1].numpy(),
        reference_lookup(values, rows, weights, combiner).numpy(),
        rtol=1e-5,
        atol=1e-6,
    )


def test_single_table_not_in_a_list_returns_a_tensor(rng):
    ev = make_ev()
    table = tf.constant(reference_table(ev, VOCAB64))
    rows, _ = make_batch(rng, weighted=False)
    got = sok.lookup_sparse(ev, sok_ids(rows, VOCAB64, "sparse", tf.int64), combiners="mean")
    assert isinstance(got, tf.Tensor)
    np.testing.assert_allclose(
        got.numpy(), reference_lookup(table, rows, None, "mean").numpy(), rtol=1e-5
    )


def test_all_samples_empty():
    ev = make_ev()
    ids = tf.SparseTensor(tf.zeros([0, 2], tf.int64), tf.zeros([0], tf.int64), [3, 4])
    with tf.GradientTape() as tape:
        out = sok.lookup_sparse([ev], [ids], combiners=["mean"])[0]
        loss = tf.reduce_sum(out)
    np.testing.assert_array_equal(out.numpy(), np.zeros([3, DIM], np.float32))
    grad = tape.gradient(loss, ev)
    assert grad is None or int(tf.size(grad.indices)) == 0
    assert int(ev.size()) == 0


def test_evaluation_lookup_inserts_nothing_and_reads_initial_values(rng):
    ev = make_ev()
    table = tf.constant(reference_table(ev, VOCAB64))
    rows, weights = make_batch(rng)
    got = sok.lookup_sparse(
        [ev],
        [sok_ids(rows, VOCAB64, "ragged", tf.int64)],
        sp_weights=[to_ragged(weights, tf.float32)],
        combiners=["sqrtn"],
        training=False,
    )
    np.testing.assert_allclose(
        got[0].numpy(),
        reference_lookup(table, rows, weights, "sqrtn").numpy(),
        rtol=1e-5,
        atol=1e-6,
    )
    assert int(ev.size()) == 0


# ---------------------------------------------------------------------------------------------
# Several tables of different dimensions in one call, EVs mixed with static tables
# ---------------------------------------------------------------------------------------------
def _mixed_setup(rng):
    ev_a = make_ev(tf.int64, dim=4)
    ev_b = make_ev(tf.int32, dim=2)
    dyn = sok.DynamicVariable(dimension=5, initializer="random", name=unique_name("dyn"))
    static_values = rng.normal(size=[12, 3]).astype(np.float32)
    tf_var = tf.Variable(static_values)
    sok_var = sok.Variable(rng.normal(size=[12, 6]).astype(np.float32), mode="localized:0")
    refs = [
        tf.Variable(reference_table(ev_a, VOCAB64)),
        tf.Variable(reference_table(ev_b, VOCAB32)),
        tf.Variable(reference_table(dyn, VOCAB64)),
        tf.Variable(static_values),
        tf.Variable(sok_var.numpy()),
    ]
    params = [ev_a, ev_b, dyn, tf_var, sok_var]
    vocabs = [VOCAB64, VOCAB32, VOCAB64, None, None]
    dtypes = [tf.int64, tf.int32, tf.int64, tf.int32, tf.int64]
    combiners = ["sum", "mean", "sqrtn", "mean", "sum"]
    batches = [make_batch(rng, empty_rows=e) for e in [(1,), (0, 5), (), (2, 3), (5,)]]
    weights_on = [True, False, True, True, False]
    return params, refs, vocabs, dtypes, combiners, batches, weights_on


def _mixed_inputs(params, vocabs, dtypes, batches, weights_on, fmts):
    ids, ws = [], []
    for _p, vocab, dt, (rows, weights), on, fmt in zip(
        params, vocabs, dtypes, batches, weights_on, fmts
    ):
        keyed = rows if vocab is None else [[vocab[x] for x in r] for r in rows]
        ids.append(to_sparse(keyed, dt) if fmt == "sparse" else to_ragged(keyed, dt))
        ws.append(sok_weights(weights, fmt, rows) if on else None)
    return ids, ws


def _reference_outputs(refs, combiners, batches, weights_on):
    return [reference_lookup(r, rows, weights if on else None, c)
            for r, c, (rows, weights), on in zip(refs, combiners, batches, weights_on)]


def _check_grads(params, ref_dims, vocabs, grads, ref_grads):
    """grads: (indices, values) numpy pairs of each table's IndexedSlices; ref_grads: dense
    numpy gradients of the reference tables (row i <-> key vocab[i], or id i for static tables)."""
    for p, dim, vocab, g, dense_ref in zip(params, ref_dims, vocabs, grads, ref_grads):
        got = densify_by_key(g, dim)
        keys = range(len(dense_ref)) if vocab is None else [int(k) for k in vocab]
        want = {k: dense_ref[i] for i, k in enumerate(keys) if dense_ref[i].any()}
        assert set(want) <= set(got) <= set(keys), (
            f"table {p.name}: keys {sorted(got)} vs {sorted(want)}"
        )
        for k, v in got.items():
            np.testing.assert_allclose(v, want.get(k, np.zeros(dim)), rtol=1e-5, atol=1e-6,
                                       err_msg=f"table {p.name}, key {k}")


def _slices(grads, params):
    for p, g in zip(params, grads):
        assert isinstance(g, tf.IndexedSlices), f"gradient of {p.name} is {type(g).__name__}"
    return [(g.indices.numpy(), g.values.numpy()) for g in grads]


@pytest.mark.parametrize("mode", ["eager", "function"])
def test_mixed_tables_forward_and_gradients_tf2(rng, mode):
    params, refs, vocabs, dtypes, combiners, batches, weights_on = _mixed_setup(rng)
    fmts = ["sparse", "ragged", "ragged", "sparse", "ragged"]
    ids, ws = _mixed_inputs(params, vocabs, dtypes, batches, weights_on, fmts)
    targets = [tf.constant(rng.normal(size=[6, int(r.shape[1])]).astype(np.float32)) for r in refs]

    def sok_step(ids, ws):
        with tf.GradientTape() as tape:
            outs = sok.lookup_sparse(params, ids, sp_weights=ws, combiners=combiners)
            loss = tf.add_n([tf.reduce_sum(o * t) for o, t in zip(outs, targets)])
        return outs, tape.gradient(loss, params)

    if mode == "function":
        sok_step = tf.function(sok_step)
    outs, grads = sok_step(ids, ws)
    with tf.GradientTape() as tape:
        ref_outs = _reference_outputs(refs, combiners, batches, weights_on)
        ref_loss = tf.add_n([tf.reduce_sum(o * t) for o, t in zip(ref_outs, targets)])
    ref_grads = tape.gradient(ref_loss, refs)
    for o, r in zip(outs, ref_outs):
        np.testing.assert_allclose(o.numpy(), r.numpy(), rtol=1e-5, atol=1e-6)
    _check_grads(params, [int(r.shape[1]) for r in refs], vocabs, _slices(grads, params),
                 [tf.convert_to_tensor(g).numpy() for g in ref_grads])


def test_mixed_tables_forward_and_gradients_tf1(rng):
    """The same in a TF1 graph with tf.gradients (ids fed through sparse placeholders)."""
    with graph_session() as sess:
        ev_a = make_ev(tf.int64, dim=4)
        ev_b = make_ev(tf.int32, dim=2)
        static_values = rng.normal(size=[12, 3]).astype(np.float32)
        tf_var = tf.compat.v1.get_variable("static", initializer=static_values, use_resource=True)
        sess.run(tf.compat.v1.global_variables_initializer())
        sess.run([ev_a.initializer, ev_b.initializer])
        init_a, init_b = reference_table(ev_a, VOCAB64, sess), reference_table(ev_b, VOCAB32, sess)
        params = [ev_a, ev_b, tf_var]
        vocabs = [VOCAB64, VOCAB32, None]
        dtypes = [tf.int64, tf.int32, tf.int64]
        combiners = ["mean", "sqrtn", "sum"]
        batches = [make_batch(rng, empty_rows=e) for e in [(1,), (5,), (0,)]]
        weights_on = [True, True, False]
        ids, ws = _mixed_inputs(
            params, vocabs, dtypes, batches, weights_on, ["sparse", "ragged", "sparse"]
        )
        outs = sok.lookup_sparse(params, ids, sp_weights=ws, combiners=combiners)
        targets = [tf.constant(rng.normal(size=[6, d]).astype(np.float32)) for d in (4, 2, 3)]
        loss = tf.add_n([tf.reduce_sum(o * t) for o, t in zip(outs, targets)])
        grads = tf.gradients(loss, params)
        assert all(isinstance(g, tf.IndexedSlices) for g in grads)
        refs = [tf.compat.v1.get_variable(f"ref{i}", initializer=v, use_resource=True)
                for i, v in enumerate([init_a, init_b, static_values])]
        ref_outs = _reference_outputs(refs, combiners, batches, weights_on)
        ref_loss = tf.add_n([tf.reduce_sum(o * t) for o, t in zip(ref_outs, targets)])
        ref_grads = [tf.convert_to_tensor(g) for g in tf.gradients(ref_loss, refs)]
        sess.run([r.initializer for r in refs])
        outs_v, ref_outs_v, grads_v, ref_grads_v = sess.run(
            [outs, ref_outs, [(g.indices, g.values) for g in grads], ref_grads])
    for o, r in zip(outs_v, ref_outs_v):
        np.testing.assert_allclose(o, r, rtol=1e-5, atol=1e-6)
    _check_grads(params, [4, 2, 3], vocabs, grads_v, ref_grads_v)


@pytest.mark.parametrize("combiner", ["mean", "sqrtn"])
def test_weights_summing_to_zero_read_zeros_like_tf(combiner):
    """TensorFlow divides with div_no_nan: a sample whose weights sum to 0 pools to zeros."""
    values = np.arange(12, dtype=np.float32).reshape(4, 3)
    table = tf.Variable(values)
    rows = [[0, 1], [2, 3], [1]]
    weights = [[1.0, -1.0], [0.5, 2.0], [0.0]]
    got = sok.lookup_sparse([table], [to_ragged(rows)], sp_weights=[to_ragged(weights, tf.float32)],
                            combiners=[combiner])[0].numpy()
    want = reference_lookup(values, rows, weights, combiner).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    if combiner == "mean":
        assert not got[0].any() and not got[2].any()


def test_unordered_sparse_ids_forward_and_gradient(rng):
    """A SparseTensor whose entries are not in row-major order pools like its reordered copy."""
    ev = make_ev()
    rows, weights = make_batch(rng, empty_rows=(2,))
    sp = sok_ids(rows, VOCAB64, "sparse", tf.int64)
    sp_w = sok_weights(weights, "sparse", rows)
    perm = rng.permutation(int(tf.size(sp.values)))
    shuffled = tf.SparseTensor(
        tf.gather(sp.indices, perm), tf.gather(sp.values, perm), sp.dense_shape
    )
    shuffled_w = tf.SparseTensor(
        tf.gather(sp_w.indices, perm), tf.gather(sp_w.values, perm), sp_w.dense_shape
    )
    outs, grads = [], []
    for ids, w in ((sp, sp_w), (shuffled, shuffled_w)):
        with tf.GradientTape() as tape:
            out = sok.lookup_sparse([ev], [ids], sp_weights=[w], combiners=["sqrtn"])[0]
            loss = tf.reduce_sum(out * tf.range(1.0, 1.0 + out.shape[1]))
        outs.append(out.numpy())
        g = tape.gradient(loss, ev)
        grads.append(densify_by_key((g.indices.numpy(), g.values.numpy()), DIM))
    np.testing.assert_allclose(outs[1], outs[0], rtol=1e-6, atol=1e-6)
    assert grads[0].keys() == grads[1].keys()
    for k in grads[0]:
        np.testing.assert_allclose(grads[1][k], grads[0][k], rtol=1e-6, atol=1e-6)


def test_one_table_in_several_features(rng):
    """One EV listed twice (two features sharing a table): rows and the summed gradient match TF."""
    ev = make_ev()
    table = tf.Variable(reference_table(ev, VOCAB64))
    (rows_a, w_a), (rows_b, _) = make_batch(rng), make_batch(rng, weighted=False)
    with tf.GradientTape() as tape:
        a, b = sok.lookup_sparse(
            [ev, ev],
            [
                sok_ids(rows_a, VOCAB64, "ragged", tf.int64),
                sok_ids(rows_b, VOCAB64, "sparse", tf.int64),
            ],
            sp_weights=[sok_weights(w_a, "ragged", rows_a), None],
            combiners=["sum", "mean"],
        )
        loss = tf.reduce_sum(a * a) + tf.reduce_sum(3.0 * b)
    grad = tape.gradient(loss, ev)
    with tf.GradientTape() as tape:
        ra = reference_lookup(table, rows_a, w_a, "sum")
        rb = reference_lookup(table, rows_b, None, "mean")
        ref_loss = tf.reduce_sum(ra * ra) + tf.reduce_sum(3.0 * rb)
    ref_grad = tf.convert_to_tensor(tape.gradient(ref_loss, table)).numpy()
    np.testing.assert_allclose(a.numpy(), ra.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(b.numpy(), rb.numpy(), rtol=1e-5, atol=1e-6)
    _check_grads([ev], [DIM], [VOCAB64], [(grad.indices.numpy(), grad.values.numpy())], [ref_grad])
    assert int(ev.size()) == len({p for r in rows_a + rows_b for p in r})


@pytest.mark.parametrize("mode", ["eager", "function"])
@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
def test_dense_ids_pool_like_the_same_ids_ragged(rng, mode, combiner):
    """[batch] and [batch, k] id tensors (k ids per sample, every entry an id) give the values and
    gradients of the same ids as a RaggedTensor, weights included."""
    ev1, evk = make_ev(), make_ev()
    one = VOCAB64[rng.integers(0, len(VOCAB64), 5)]
    many = VOCAB64[rng.integers(0, len(VOCAB64), (5, 3))]
    w = rng.uniform(0.5, 2.0, (5, 3)).astype(np.float32)

    def step(ids1, idsk, wk):
        with tf.GradientTape() as tape:
            a, b = sok.lookup_sparse([ev1, evk], [ids1, idsk], sp_weights=[None, wk],
                                     combiners=["sum", combiner])
            loss = tf.reduce_sum(a * a) + tf.reduce_sum(b * tf.range(1.0, 1.0 + DIM))
        g1, gk = tape.gradient(loss, [ev1, evk])
        return a, b, g1.indices, g1.values, gk.indices, gk.values

    run = tf.function(step) if mode == "function" else step
    dense = run(tf.constant(one), tf.constant(many), tf.constant(w))
    ragged = step(tf.RaggedTensor.from_tensor(tf.constant(one)[:, None]),
                  tf.RaggedTensor.from_tensor(tf.constant(many)),
                  tf.RaggedTensor.from_tensor(tf.constant(w)))
    for got, want in zip(dense[:2], ragged[:2]):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-6, atol=1e-6)
    for keys, vals in ((2, 3), (4, 5)):
        got = densify_by_key((dense[keys].numpy(), dense[vals].numpy()), DIM)
        want = densify_by_key((ragged[keys].numpy(), ragged[vals].numpy()), DIM)
        assert got.keys() == want.keys()
        for k in want:
            np.testing.assert_allclose(got[k], want[k], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("mode", ["eager", "function"])
def test_dense_ids_of_int32_and_int64_tables_in_one_call(mode):
    """Dense ids of different dtypes in one call: each table reads its own keys' rows."""
    ev64, ev32 = make_ev(), make_ev(key_dtype=tf.int32)
    ids64 = tf.constant([[3, 2**40 + 1], [3, 7]], tf.int64)
    ids32 = tf.constant([[5], [9]], tf.int32)
    call = lambda: sok.lookup_sparse([ev64, ev32], [ids64, ids32], training=False)  # noqa: E731
    a, b = (tf.function(call) if mode == "function" else call)()
    rows64 = ev64.sparse_read(ids64, training=False).numpy()
    np.testing.assert_allclose(a.numpy(), rows64.sum(axis=1), rtol=1e-6)
    np.testing.assert_allclose(b.numpy(), ev32.sparse_read(ids32, training=False).numpy()[:, 0])


def _dense_as_sparse(ids):
    """A [batch, c] id tensor as the SparseTensor of all its entries."""
    batch, c = tf.shape(ids, out_type=tf.int64)[0], ids.shape[1]
    rows = tf.repeat(tf.range(batch), c)
    cols = tf.tile(tf.range(c, dtype=tf.int64), [batch])
    return tf.SparseTensor(tf.stack([rows, cols], 1), tf.reshape(ids, [-1]),
                           tf.stack([batch, tf.constant(c, tf.int64)]))


def test_dense_ids_train_like_tf_in_a_tf1_session(rng):
    """[batch] and [batch, k] id placeholders in a TF1 graph: three Adagrad steps through
    sok.OptimizerWrapper give the losses and rows of tf.nn.embedding_lookup_sparse on a
    tf.Variable with TF's Adagrad."""
    k = 3
    with graph_session() as sess:
        ev1, evk = make_ev(), make_ev()
        ids1 = tf.compat.v1.placeholder(tf.int64, [None])
        idsk = tf.compat.v1.placeholder(tf.int64, [None, k])
        a, b = sok.lookup_sparse([ev1, evk], [ids1, idsk], combiners=["sum", "mean"])
        target = tf.constant(rng.normal(size=[DIM]).astype(np.float32))
        loss = tf.reduce_sum(a * a) + tf.reduce_sum(b * target)
        opt = sok.OptimizerWrapper(tf.compat.v1.train.AdagradOptimizer(0.1))
        train = opt.minimize(loss, var_list=[ev1, evk])
        sess.run(tf.compat.v1.global_variables_initializer())
        sess.run([ev1.initializer, evk.initializer])
        refs = [tf.compat.v1.get_variable(f"ref{i}", use_resource=True,
                                          initializer=reference_table(ev, VOCAB64, sess))
                for i, ev in enumerate([ev1, evk])]
        pos1 = tf.compat.v1.placeholder(tf.int64, [None])
        posk = tf.compat.v1.placeholder(tf.int64, [None, k])
        ref_a = tf.nn.embedding_lookup_sparse(refs[0], _dense_as_sparse(pos1[:, None]), None,
                                              combiner="sum")
        ref_b = tf.nn.embedding_lookup_sparse(refs[1], _dense_as_sparse(posk), None,
                                              combiner="mean")
        ref_loss = tf.reduce_sum(ref_a * ref_a) + tf.reduce_sum(ref_b * target)
        ref_train = tf.compat.v1.train.AdagradOptimizer(0.1).minimize(ref_loss, var_list=refs)
        sess.run([r.initializer for r in refs])
        sess.run(tf.compat.v1.variables_initializer(
            [v for v in tf.compat.v1.global_variables() if "Adagrad" in v.name]))
        for step in range(3):
            p1 = rng.integers(0, len(VOCAB64), 6)
            pk = rng.integers(0, len(VOCAB64), (6, k))
            got, _ = sess.run([loss, train], {ids1: VOCAB64[p1], idsk: VOCAB64[pk]})
            want, _ = sess.run([ref_loss, ref_train], {pos1: p1, posk: pk})
            np.testing.assert_allclose(got, want, rtol=1e-5, err_msg=f"step {step}")
        for ev, ref in zip([ev1, evk], refs):
            np.testing.assert_allclose(reference_table(ev, VOCAB64, sess), sess.run(ref),
                                       rtol=1e-5, atol=1e-6)


def test_lookup_graph_ops_do_not_grow_per_dense_table():
    """The graph of a lookup over dense ids adds at most two ops per table (its ids' reshape and
    table handle): sizes, checks and segment ids are built once per call."""

    def num_ops(n):
        graph = tf.Graph()
        with graph.as_default():
            evs = [make_ev(name=f"t{i}") for i in range(n)]
            ids = tf.compat.v1.placeholder(tf.int64, [None, n])
            before = len(graph.get_operations())
            sok.lookup_sparse(evs, tf.unstack(ids, axis=1))
            return len(graph.get_operations()) - before

    assert num_ops(10) - num_ops(2) <= 2 * 8, (num_ops(2), num_ops(10))


def _unique_reference(keys):
    """Distinct keys in order of first appearance, the inverse map and the counts."""
    where, unique, counts = {}, [], []
    inverse = []
    for k in keys.tolist():
        if k not in where:
            where[k] = len(unique)
            unique.append(k)
            counts.append(0)
        inverse.append(where[k])
        counts[where[k]] += 1
    return unique, inverse, counts


def _unique_keys_case(rng):
    """Eight tables: int32 and int64 ids, empty ones, SparseTensor positions in and out of sample
    order, and RaggedTensor row ids ([n, 1] within [nrows])."""
    keys, positions, shapes = [], [], []
    for t, n in enumerate([50, 0, 300, 1, 0, 1000, 7, 64]):
        dtype = np.int32 if t % 3 == 1 else np.int64
        keys.append(tf.constant(rng.integers(-20, 20, n), dtype))
        batch = max(1, n // 3)
        samples = rng.integers(0, batch, n)
        if t % 2 == 0:  # the others out of order (unless too short to be)
            samples = np.sort(samples)
        if t == 7:
            positions.append(tf.constant(samples.reshape(-1, 1), tf.int64))
            shapes.append(tf.constant([batch], tf.int64))
        else:
            cols = rng.integers(0, 5, n)
            positions.append(tf.constant(np.stack([samples, cols], 1).reshape(-1, 2), tf.int64))
            shapes.append(tf.constant([batch, 5], tf.int64))
    return keys, positions, shapes


def _check_unique_keys_outputs(keys, positions, outs, shapes=None):
    unique, inverse, counts, order = outs[:4]
    if shapes is not None:  # batch_sizes: dim 0 of each dense shape, in host memory
        np.testing.assert_array_equal(np.asarray(outs[4]), [np.asarray(s)[0] for s in shapes])
    for t, k in enumerate(keys):
        want_u, want_inv, want_c = _unique_reference(np.asarray(k))
        np.testing.assert_array_equal(np.asarray(unique[t]), want_u)
        np.testing.assert_array_equal(np.asarray(inverse[t]), want_inv)
        np.testing.assert_array_equal(np.asarray(counts[t]), want_c)
        assert np.asarray(unique[t]).dtype == np.asarray(k).dtype
        samples = np.asarray(positions[t])[:, 0]
        if np.all(np.diff(samples) >= 0):
            assert np.asarray(order[t]).shape == (0,)
        else:  # the stable permutation into sample order
            np.testing.assert_array_equal(
                np.asarray(order[t]), np.argsort(samples, kind="stable")
            )


def test_unique_keys_op_many_tables_eager_function_and_session(rng):
    """SokUniqueKeys with positions (M == N): per-table dedup like a plain Python reference and
    segment_order = the stable sample order of the out-of-order tables; M == 0 dedups alike."""
    keys, positions, shapes = _unique_keys_case(rng)
    assert any(not np.all(np.diff(np.asarray(p)[:, 0]) >= 0) for p in positions)
    n = len(keys)
    names = [f"t{i}" for i in range(n)]
    _check_unique_keys_outputs(
        keys, positions, ops.sok_unique_keys(keys, positions, shapes, N=n, table_names=names),
        shapes
    )
    fn = tf.function(lambda: ops.sok_unique_keys(keys, positions, shapes, N=n, table_names=names))
    _check_unique_keys_outputs(keys, positions, fn(), shapes)
    unchecked = ops.sok_unique_keys(keys, [], [], N=n)  # M == 0: no checks, no order outputs
    assert len(unchecked) == 6 and len(unchecked[3]) == 0 and unchecked[4].shape == [0]
    assert unchecked.valid.numpy().tolist() == [len(u) for u in unchecked.unique]
    _check_unique_keys_outputs(keys, positions, list(unchecked[:3]) + [[
        np.zeros([0]) if np.all(np.diff(np.asarray(p)[:, 0]) >= 0)
        else np.argsort(np.asarray(p)[:, 0], kind="stable") for p in positions]])
    values = [np.asarray(x) for x in keys + positions + shapes]
    with graph_session() as sess:
        ph = [tf.compat.v1.placeholder(tf.as_dtype(v.dtype), [None] * v.ndim) for v in values]
        out = ops.sok_unique_keys(ph[:n], ph[n:2 * n], ph[2 * n:], N=n, table_names=names)
        got = sess.run(list(out), feed_dict=dict(zip(ph, values)))
    _check_unique_keys_outputs(values[:n], values[n:2 * n], got, values[2 * n:])


def test_unique_keys_padded_holds_the_distinct_keys_first(rng):
    """padded (dense ids): unique and counts keep every entry, the distinct ones first as the
    exact op gives them, and valid says how many."""
    keys = [tf.constant(rng.integers(0, 20, 50), tf.int64), tf.constant([7, 7, 7], tf.int32),
            tf.zeros([0], tf.int64)]
    exact = ops.sok_unique_keys(keys, [], [], N=3)
    padded = ops.sok_unique_keys(keys, [], [], N=3, padded=True)
    assert padded.valid.numpy().tolist() == [len(u) for u in exact.unique]
    for t, k in enumerate(keys):
        v = len(exact.unique[t])
        assert padded.unique[t].shape == k.shape and padded.counts[t].shape == k.shape
        np.testing.assert_array_equal(padded.unique[t].numpy()[:v], exact.unique[t].numpy())
        np.testing.assert_array_equal(padded.counts[t].numpy()[:v], exact.counts[t].numpy())
        np.testing.assert_array_equal(padded.inverse[t].numpy(), exact.inverse[t].numpy())


def test_unique_keys_deferred_position_errors_go_to_valid(rng):
    """defer_position_errors (lookup_sparse under Horovod): no error here; valid is -1 for a
    table with an index outside its dense shape (the exchange's header carries it to every rank)
    and that table gets no order; the other tables' outputs are the same as without deferring.
    padded, which needs no position checks, refuses positions."""
    n = 40
    ordered = np.stack([np.sort(rng.integers(0, 8, n)), rng.integers(0, 5, n)], 1)
    shuffled = np.stack([rng.integers(0, 8, n), rng.integers(0, 5, n)], 1)
    bad = shuffled.copy()
    bad[7, 1] = 5  # beyond dense_shape [8, 5]
    keys = [tf.constant(rng.integers(0, 9, n), tf.int64) for _ in range(3)] + [
        tf.constant([4, 4, 2], tf.int32)]
    positions = [tf.constant(p, tf.int64) for p in (ordered, shuffled, bad)] + [
        tf.zeros([0, 0], tf.int64)]
    shapes = [tf.constant([8, 5], tf.int64)] * 3 + [tf.constant([3], tf.int64)]
    names = ["ordered", "shuffled", "bad", "dense"]
    exact = ops.sok_unique_keys(keys[:2], positions[:2], shapes[:2], N=2)
    deferred = ops.sok_unique_keys(keys, positions, shapes, N=4, table_names=names,
                                   defer_position_errors=True)
    assert deferred.valid.numpy().tolist() == [len(exact.unique[0]), len(exact.unique[1]), -1, 2]
    assert deferred.segment_order[0].shape == [0] and deferred.segment_order[2].shape == [0]
    np.testing.assert_array_equal(deferred.segment_order[1].numpy(),
                                  np.argsort(shuffled[:, 0], kind="stable"))
    for t in range(2):
        np.testing.assert_array_equal(deferred.unique[t].numpy(), exact.unique[t].numpy())
        np.testing.assert_array_equal(deferred.inverse[t].numpy(), exact.inverse[t].numpy())
    with pytest.raises(tf.errors.InvalidArgumentError, match="ids of table 'bad'"):
        ops.sok_unique_keys(keys, positions, shapes, N=4, table_names=names)
    with pytest.raises(tf.errors.InvalidArgumentError, match="padded needs dense ids, table 'p'"):
        ops.sok_unique_keys([keys[0]], [positions[0]], [shapes[0]], N=1, table_names=["p"],
                            padded=True)


def test_unique_keys_batch_sizes_of_dense_tables():
    """Dense tables (positions [0, 0]) give dim 0 of the shape passed as their dense shape; an
    empty one (a graph that passes no dense shape) gives -1, which SokPooledCombine refuses as a
    negative batch size."""
    keys = [tf.constant([3, 1, 3], tf.int64), tf.constant([5, 5], tf.int64)]
    positions = [tf.zeros([0, 0], tf.int64)] * 2
    shapes = [tf.constant([3], tf.int64), tf.zeros([0], tf.int64)]
    out = ops.sok_unique_keys(keys, positions, shapes, N=2, table_names=["a", "b"])
    assert out.batch_sizes.numpy().tolist() == [3, -1]
    with pytest.raises(tf.errors.InvalidArgumentError, match="table 'b': negative batch size -1"):
        ops.sok_pooled_combine([tf.ones([2, 4]), tf.ones([1, 4])], list(out.inverse),
                               [tf.zeros([0], tf.int64)] * 2, [tf.zeros([0])] * 2, [],
                               out.batch_sizes, combiners=["sum"] * 2, table_names=["a", "b"])


@pytest.mark.parametrize("mode", ["eager", "tf1"])
def test_all2all_dense_embedding_gradient_is_one_row_per_key(mode):
    """Its rows are expanded from the distinct keys' with tf.gather: the table's gradient sums the
    occurrences of each key into one [keys, dim] row (not an IndexedSlices nested in another)."""
    ids = np.array([[5, 5], [7, 5]], np.int64)
    weights = np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)

    def grad_of(ev, tape=None):
        rows = sok.all2all_dense_embedding(ev, tf.constant(ids))
        loss = tf.reduce_sum(rows * weights[..., None])
        return tape.gradient(loss, ev) if tape else tf.gradients(loss, ev)[0]

    if mode == "eager":
        ev = make_ev()
        with tf.GradientTape() as tape:
            g = grad_of(ev, tape)
        indices, values = g.indices.numpy(), g.values.numpy()
    else:
        with graph_session() as sess:
            ev = make_ev()
            g = grad_of(ev)
            sess.run(tf.compat.v1.global_variables_initializer())
            indices, values = sess.run([g.indices, g.values])
    assert sorted(indices.tolist()) == [5, 7]
    by_key = dict(zip(indices.tolist(), values))
    np.testing.assert_array_equal(by_key[5], [7.0] * DIM)
    np.testing.assert_array_equal(by_key[7], [3.0] * DIM)
