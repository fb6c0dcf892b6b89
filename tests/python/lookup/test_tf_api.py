"""TensorFlow's embedding_lookup_sparse and safe_embedding_lookup_sparse (v1 and v2) called on
Embedding Variables (lookup/tf_api.py) against the same calls on tf.Variables holding the EVs'
initial rows: forward values, gradients and Adagrad steps, eager, in tf.function and in TF1
Sessions.

The reference table's row i is the EV's row of key VOCAB[i]; the EV gets keys, the reference
positions (-1 stays -1: an invalid id for the safe lookup).
"""
import numpy as np
import pytest
import tensorflow as tf

import sparse_operation_kit as sok
from tests.python.support import densify_by_key, ev_rows, graph_session, unique_name

DIM = 4
# Non-negative keys (the safe lookup drops ids < 0), far apart and beyond 32 bits.
VOCAB = np.array([0, 7, 2**40 + 5, 123456789012, 42, 99, 5, 1 << 50, 11, 3], np.int64)
APIS = {
    "v2": (tf.nn.embedding_lookup_sparse, tf.nn.safe_embedding_lookup_sparse),
    "v1": (tf.compat.v1.nn.embedding_lookup_sparse, tf.compat.v1.nn.safe_embedding_lookup_sparse),
}


def make_ev():
    return sok.get_embedding_variable(unique_name(), DIM,
                                      initializer=tf.random_uniform_initializer(-1.0, 1.0, seed=3))


def as_keys(positions):
    return np.where(positions >= 0, VOCAB[np.maximum(positions, 0)], -1)


def sparse_batch(rng, batch=6, width=4, invalid=False):
    """(indices, positions, weights) of a [batch, width] SparseTensor in row-major order: sample 1
    and the last sample have no ids; with `invalid`, some ids are -1 and some weights <= 0."""
    indices, positions, weights = [], [], []
    for b in range(batch):
        if b in (1, batch - 1):
            continue
        for j in sorted(rng.choice(width, rng.integers(1, width + 1), replace=False)):
            indices.append([b, j])
            positions.append(int(rng.integers(0, len(VOCAB))))
            weights.append(float(rng.uniform(0.5, 2.0)))
    positions, weights = np.array(positions, np.int64), np.array(weights, np.float32)
    if invalid:
        positions[::4] = -1
        weights[1::5] = 0.0
        weights[2::7] = -1.0
    return np.array(indices, np.int64), positions, weights, [batch, width]


def sparse(indices, values, shape):
    return tf.SparseTensor(indices, values, shape)


def padded_to(out, rows):
    """TensorFlow's embedding_lookup_sparse leaves out trailing samples without ids."""
    missing = rows - tf.shape(out)[0]
    return tf.concat([out, tf.zeros([missing, tf.shape(out)[1]], out.dtype)], 0)


@pytest.mark.parametrize("api", ["v1", "v2"])
@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("max_norm", [None, 0.6])
def test_embedding_lookup_sparse_matches_tf(rng, api, combiner, weighted, max_norm):
    lookup = APIS[api][0]
    ev = make_ev()
    ref = tf.constant(ev_rows(ev, VOCAB))
    idx, pos, w, shape = sparse_batch(rng)
    sp_w = sparse(idx, w, shape) if weighted else None
    got = lookup(ev, sparse(idx, as_keys(pos), shape), sp_w, combiner=combiner, max_norm=max_norm)
    want = lookup(ref, sparse(idx, pos, shape), sp_w, combiner=combiner, max_norm=max_norm)
    np.testing.assert_allclose(got.numpy(), padded_to(want, shape[0]).numpy(), rtol=1e-5,
                               atol=1e-6)
    assert got.shape[0] == shape[0] and not got.numpy()[[1, shape[0] - 1]].any()
    assert int(ev.size()) == len(set(pos.tolist()))  # a training read inserts the ids


def test_embedding_lookup_sparse_ragged_ids_and_default_combiner(rng):
    """RaggedTensor ids and weights; combiner None is TensorFlow's "mean"; a list of one EV."""
    ev = make_ev()
    ref = tf.constant(ev_rows(ev, VOCAB))
    idx, pos, w, shape = sparse_batch(rng)
    ids = tf.RaggedTensor.from_value_rowids(as_keys(pos), idx[:, 0], nrows=shape[0])
    weights = tf.RaggedTensor.from_value_rowids(w, idx[:, 0], nrows=shape[0])
    got = tf.nn.embedding_lookup_sparse([ev], ids, weights)
    want = tf.nn.embedding_lookup_sparse(ref, sparse(idx, pos, shape), sparse(idx, w, shape),
                                         combiner="mean")
    np.testing.assert_allclose(got.numpy(), padded_to(want, shape[0]).numpy(), rtol=1e-5,
                               atol=1e-6)


@pytest.mark.parametrize("api", ["v1", "v2"])
@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
@pytest.mark.parametrize("default", [None, 3])
def test_safe_embedding_lookup_sparse_matches_tf(rng, api, combiner, default):
    """Invalid ids and weights <= 0 dropped as TensorFlow drops them; samples left empty read
    default_id's row or zeros."""
    safe = APIS[api][1]
    ev = make_ev()
    ref = tf.constant(ev_rows(ev, VOCAB))
    idx, pos, w, shape = sparse_batch(rng, invalid=True)
    sp_w = sparse(idx, w, shape)
    got = safe(ev, sparse(idx, as_keys(pos), shape), sp_w, combiner=combiner,
               default_id=None if default is None else int(VOCAB[default]))
    want = safe(ref, sparse(idx, pos, shape), sp_w, combiner=combiner, default_id=default)
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-6)


def test_safe_embedding_lookup_sparse_higher_rank_ids(rng):
    """ids [2, 3, width] pool along the last dimension into [2, 3, dim]."""
    ev = make_ev()
    ref = tf.constant(ev_rows(ev, VOCAB))
    idx, pos, _, (batch, width) = sparse_batch(rng, batch=6, invalid=True)
    idx3 = np.stack([idx[:, 0] // 3, idx[:, 0] % 3, idx[:, 1]], 1)
    got = tf.nn.safe_embedding_lookup_sparse(ev, sparse(idx3, as_keys(pos), [2, 3, width]))
    want = tf.nn.safe_embedding_lookup_sparse(ref, sparse(idx3, pos, [2, 3, width]))
    assert got.shape == (2, 3, DIM)
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mode", ["eager", "function"])
def test_gradients_match_tf(rng, mode):
    """Both lookups' gradients (max_norm's clipping included) reach the EV as IndexedSlices of
    the ids' rows, equal to the tf.Variable's."""
    ev = make_ev()
    ref = tf.Variable(ev_rows(ev, VOCAB))
    idx, pos, w, shape = sparse_batch(rng)
    sidx, spos, sw, _ = sparse_batch(rng, invalid=True)
    target = tf.constant(rng.normal(size=[shape[0], DIM]).astype(np.float32))

    def loss_of(table, ids, safe_ids):
        a = tf.nn.embedding_lookup_sparse(table, ids, sparse(idx, w, shape), combiner="sqrtn",
                                          max_norm=0.6)
        b = tf.nn.safe_embedding_lookup_sparse(table, safe_ids, sparse(sidx, sw, shape),
                                               combiner="mean")
        return tf.reduce_sum(padded_to(a, shape[0]) * target) + tf.reduce_sum(b * b)

    def grads(table, ids, safe_ids):
        with tf.GradientTape() as tape:
            loss = loss_of(table, ids, safe_ids)
        return loss, tape.gradient(loss, table)

    if mode == "function":
        grads = tf.function(grads)
    got_loss, got = grads(ev, sparse(idx, as_keys(pos), shape), sparse(sidx, as_keys(spos), shape))
    want_loss, want = grads(ref, sparse(idx, pos, shape), sparse(sidx, spos, shape))
    np.testing.assert_allclose(got_loss.numpy(), want_loss.numpy(), rtol=1e-5)
    by_key = densify_by_key((got.indices.numpy(), got.values.numpy()), DIM)
    want = tf.convert_to_tensor(want).numpy()
    for i, key in enumerate(VOCAB):
        np.testing.assert_allclose(by_key.get(int(key), np.zeros(DIM)), want[i], rtol=1e-5,
                                   atol=1e-6, err_msg=f"key {key}")


def test_adagrad_steps_in_a_tf1_session_match_tf(rng):
    """A DeepRec-style TF1 graph: both v1 lookups on two EVs, three Adagrad steps through
    sok.OptimizerWrapper against the same graph on tf.Variables with TF's Adagrad."""
    lookup, safe = APIS["v1"]
    with graph_session() as sess:
        evs = [make_ev(), make_ev()]
        holders = {name: tf.compat.v1.sparse_placeholder(dtype, [None, 4], name=name)
                   for name, dtype in [("ids", tf.int64), ("w", tf.float32), ("safe", tf.int64),
                                       ("pos", tf.int64), ("safe_pos", tf.int64)]}
        target = tf.constant(rng.normal(size=[6, DIM]).astype(np.float32))

        def loss_of(tables, ids, safe_ids, default_id):
            a = padded_to(lookup(tables[0], ids, holders["w"], combiner="mean"), 6)
            b = safe(tables[1], safe_ids, None, combiner="sum", default_id=default_id)
            return tf.reduce_sum(a * target) + tf.reduce_sum(b * b)

        loss = loss_of(evs, holders["ids"], holders["safe"], int(VOCAB[2]))
        opt = sok.OptimizerWrapper(tf.compat.v1.train.AdagradOptimizer(0.1))
        train = opt.minimize(loss, var_list=evs)
        sess.run(tf.compat.v1.global_variables_initializer())
        sess.run([ev.initializer for ev in evs])
        refs = [tf.compat.v1.get_variable(f"ref{i}", use_resource=True,
                                          initializer=ev_rows(ev, VOCAB, sess))
                for i, ev in enumerate(evs)]
        ref_loss = loss_of(refs, holders["pos"], holders["safe_pos"], 2)
        ref_train = tf.compat.v1.train.AdagradOptimizer(0.1).minimize(ref_loss, var_list=refs)
        sess.run([r.initializer for r in refs])
        sess.run(tf.compat.v1.variables_initializer(
            [v for v in tf.compat.v1.global_variables() if "Adagrad" in v.name]))
        for step in range(3):
            idx, pos, w, shape = sparse_batch(rng)
            sidx, spos, _, _ = sparse_batch(rng, invalid=True)
            feed = {holders["w"]: (idx, w, shape)}
            got, _ = sess.run([loss, train], {**feed, holders["ids"]: (idx, as_keys(pos), shape),
                                              holders["safe"]: (sidx, as_keys(spos), shape)})
            want, _ = sess.run([ref_loss, ref_train], {**feed, holders["pos"]: (idx, pos, shape),
                                                       holders["safe_pos"]: (sidx, spos, shape)})
            np.testing.assert_allclose(got, want, rtol=1e-5, err_msg=f"step {step}")
        for ev, ref in zip(evs, refs):
            np.testing.assert_allclose(ev_rows(ev, VOCAB, sess), sess.run(ref), rtol=1e-5,
                                       atol=1e-6)


def test_errors_name_the_api_and_the_table():
    ev = make_ev()
    ids = tf.SparseTensor([[0, 0]], tf.constant([7], tf.int64), [1, 1])
    with pytest.raises(ValueError, match="tf.nn.embedding_lookup_sparse: a list of 2"):
        tf.nn.embedding_lookup_sparse([ev, make_ev()], ids, None)
    with pytest.raises(ValueError, match=f"unknown combiner 'max' for table '{ev.name}"):
        tf.nn.safe_embedding_lookup_sparse(ev, ids, combiner="max")
    with pytest.raises(TypeError, match="key dtype int64, but its ids are int32"):
        tf.nn.embedding_lookup_sparse(ev, tf.SparseTensor([[0, 0]], tf.constant([7]), [1, 1]),
                                      None)


def test_partitioned_embedding_variable(rng):
    """DeepRec's partitioned table (partitioner=) through both sparse lookups and max_norm."""
    ev = sok.get_embedding_variable(unique_name(), DIM, partitioner=tf.compat.v1.fixed_size_partitioner(3),
                                    initializer=tf.random_uniform_initializer(-1.0, 1.0, seed=3))
    assert isinstance(ev, sok.PartitionedEmbeddingVariable)
    ref = tf.constant(ev_rows(ev, VOCAB))
    idx, pos, w, shape = sparse_batch(rng, invalid=True)
    valid = pos >= 0
    ids, keys = sparse(idx[valid], pos[valid], shape), sparse(idx[valid], as_keys(pos)[valid], shape)
    got = tf.nn.embedding_lookup_sparse(ev, keys, None, combiner="sum", max_norm=0.6)
    want = tf.nn.embedding_lookup_sparse(ref, ids, None, combiner="sum", max_norm=0.6)
    np.testing.assert_allclose(got.numpy(), padded_to(want, shape[0]).numpy(), rtol=1e-5, atol=1e-6)
    got = tf.nn.safe_embedding_lookup_sparse(ev, sparse(idx, as_keys(pos), shape), sparse(idx, w, shape))
    want = tf.nn.safe_embedding_lookup_sparse(ref, sparse(idx, pos, shape), sparse(idx, w, shape))
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-6)
