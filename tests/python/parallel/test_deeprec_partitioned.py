"""Partitioned Embedding Variables (get_embedding_variable(partitioner=...)): DeepRec's key rule,
lookups and training against a plain tf.Variable reference, Saver round trips into the same and
another number of parts, and TF2 reads."""

import numpy as np
import pytest
import tensorflow as tf

import sparse_operation_kit as sok
from tests.python.support import ev_rows, exported, graph_session, sparse_value, unique_name

DIM = 3
UNIFORM = tf.random_uniform_initializer(-1.0, 1.0, seed=11)
KEYS = [0, 1, 2, 3, 7, 1001, 2003, -5, 999, 12]
BATCHES = [[[1, 2, 1001], [3], [-5, 7]], [[2003, 999], [12, 0], [1]], [[7, 7, 3], [2], [999, 1001]]]


def _part(k, n):
    return (k % 1000) % n  # Python's % is floor modulo, as TensorFlow's floormod


def test_keys_live_in_deeprec_parts():
    ev = sok.get_embedding_variable(
        unique_name("pev"),
        DIM,
        initializer=UNIFORM,
        partitioner=tf.compat.v1.fixed_size_partitioner(3),
    )
    assert isinstance(ev, sok.PartitionedEmbeddingVariable) and len(ev) == 3
    assert [p.name for p in ev] == [f"{ev.name}/part_{i}" for i in range(3)]
    ev.sparse_read(tf.constant(KEYS, tf.int64))
    for i, part in enumerate(ev):
        assert sorted(exported(part)) == sorted(k for k in KEYS if _part(k, 3) == i)
    assert int(ev.size()) == len(KEYS)
    # One table to a reader: a key reads the row its part holds.
    rows = ev.sparse_read(tf.constant([[1001, 2], [-5, 1001]], tf.int64), training=False).numpy()
    assert rows.shape == (2, 2, DIM)
    np.testing.assert_array_equal(rows[0, 0], ev_rows(ev[_part(1001, 3)], [1001])[0])
    np.testing.assert_array_equal(rows[0, 0], rows[1, 1])
    via_tf = tf.nn.embedding_lookup(ev, tf.constant([-5, 2], tf.int64)).numpy()
    np.testing.assert_array_equal(via_tf, rows[[1, 0], [0, 1]])


def _training_graph(partitioner, name="user_emb"):
    ids = tf.compat.v1.sparse_placeholder(tf.int64, name="ids")
    labels = tf.constant([[0.5], [-1.0], [2.0]])
    with tf.compat.v1.variable_scope("model", partitioner=partitioner):
        ev = sok.get_embedding_variable(name, DIM, initializer=UNIFORM)
    head = tf.compat.v1.get_variable("head", initializer=tf.constant([[0.3], [-0.2], [0.5]]))
    pooled = sok.lookup_sparse(ev, ids, combiners="mean")
    loss = tf.reduce_sum((tf.matmul(pooled, head) - labels) ** 2)
    train = sok.OptimizerWrapper(tf.compat.v1.train.AdagradOptimizer(0.1)).minimize(loss)
    return ids, ev, head, pooled, train


def _reference(initial, batches):
    """Plain tf.Variable + embedding_lookup_sparse + Adagrad over the same batches."""
    keys = sorted(initial)
    pos = {k: i for i, k in enumerate(keys)}
    outs = []
    with graph_session() as sess:
        table = tf.compat.v1.get_variable("table", initializer=np.stack([initial[k] for k in keys]))
        head = tf.compat.v1.get_variable("head", initializer=tf.constant([[0.3], [-0.2], [0.5]]))
        ids = tf.compat.v1.sparse_placeholder(tf.int64)
        pooled = tf.compat.v1.nn.embedding_lookup_sparse(table, ids, None, combiner="mean")
        loss = tf.reduce_sum((tf.matmul(pooled, head) - tf.constant([[0.5], [-1.0], [2.0]])) ** 2)
        train = tf.compat.v1.train.AdagradOptimizer(0.1).minimize(loss)
        sess.run(tf.compat.v1.global_variables_initializer())
        for rows in batches:
            out, _ = sess.run(
                [pooled, train], {ids: sparse_value([[pos[k] for k in r] for r in rows])}
            )
            outs.append(out)
        final = sess.run(table)
    return outs, {k: final[pos[k]] for k in keys}


def test_training_matches_plain_tf_and_saver_round_trip_into_other_part_counts(tmp_path):
    path = str(tmp_path / "model.ckpt")
    with graph_session() as sess:
        ids, ev, _head, pooled, train = _training_graph(tf.compat.v1.fixed_size_partitioner(4))
        assert ev.name == "model/user_emb" and len(ev) == 4
        # The parts train, the partitioned table is the one global variable saved.
        assert all(p in tf.compat.v1.trainable_variables() for p in ev)
        assert (
            ev in tf.compat.v1.global_variables() and ev[0] not in tf.compat.v1.global_variables()
        )
        sess.run(tf.compat.v1.global_variables_initializer())
        all_keys = sorted({k for b in BATCHES for r in b for k in r})
        initial = {k: ev_rows(ev, [k], sess)[0] for k in all_keys}
        outs = [sess.run([pooled, train], {ids: sparse_value(b)})[0] for b in BATCHES]
        trained = exported(ev, sess)
        tf.compat.v1.train.Saver().save(sess, path)
    ref_outs, ref_table = _reference(initial, BATCHES)
    for got, want in zip(outs, ref_outs):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert sorted(trained) == sorted(ref_table)
    for k in ref_table:
        np.testing.assert_allclose(trained[k], ref_table[k], rtol=1e-5, atol=1e-6)
    names = dict(tf.train.list_variables(path))
    assert "model/user_emb/keys" in names and "model/user_emb/slots" in names

    for partitioner in (
        tf.compat.v1.fixed_size_partitioner(4),
        tf.compat.v1.fixed_size_partitioner(3),
        None,
    ):
        with graph_session() as sess:
            ids, ev, _head, pooled, train = _training_graph(partitioner)
            tf.compat.v1.train.Saver().restore(sess, path)
            restored = exported(ev, sess)
            assert sorted(restored) == sorted(trained)
            for k in trained:
                np.testing.assert_array_equal(restored[k], trained[k])
            if partitioner is not None:
                for i, part in enumerate(ev):
                    assert all(_part(k, len(ev)) == i for k in exported(part, sess))
            # Lookups read the restored rows.
            got = sess.run(pooled, {ids: sparse_value(BATCHES[0])})
            want = np.stack([np.mean([trained[k] for k in r], axis=0) for r in BATCHES[0]])
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


def test_restored_slots_continue_training_exactly(tmp_path):
    path = str(tmp_path / "model.ckpt")
    with graph_session() as sess:
        ids, ev, _head, _pooled, train = _training_graph(tf.compat.v1.fixed_size_partitioner(2))
        sess.run(tf.compat.v1.global_variables_initializer())
        for b in BATCHES[:2]:
            sess.run(train, {ids: sparse_value(b)})
        tf.compat.v1.train.Saver().save(sess, path)
        sess.run(train, {ids: sparse_value(BATCHES[2])})
        want = exported(ev, sess)
    with graph_session() as sess:
        ids, ev, _head, _pooled, train = _training_graph(tf.compat.v1.fixed_size_partitioner(5))
        tf.compat.v1.train.Saver().restore(sess, path)
        sess.run(train, {ids: sparse_value(BATCHES[2])})
        got = exported(ev, sess)
    assert sorted(got) == sorted(want)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-6, atol=1e-7)


def test_variable_scope_reuse_and_errors():
    with graph_session():
        part = tf.compat.v1.fixed_size_partitioner(2)
        a = sok.get_embedding_variable("t", DIM, partitioner=part)
        with tf.compat.v1.variable_scope(tf.compat.v1.get_variable_scope(), reuse=True):
            assert sok.get_embedding_variable("t", DIM, partitioner=part) is a
        with pytest.raises(ValueError, match="'t' already exists"):
            sok.get_embedding_variable("t", DIM, partitioner=part)
    with pytest.raises(ValueError, match="partitioner must split axis 0"):
        sok.get_embedding_variable(unique_name("bad"), DIM, partitioner=lambda shape, dtype: [2, 2])


def test_tf2_checkpoint_round_trip(tmp_path):
    ev = sok.get_embedding_variable(
        unique_name("pev2"),
        DIM,
        initializer=UNIFORM,
        partitioner=tf.compat.v1.fixed_size_partitioner(3),
    )
    ev.sparse_read(tf.constant(KEYS, tf.int64))
    want = exported(ev)
    path = tf.train.Checkpoint(table=ev).save(str(tmp_path / "ckpt"))
    other = sok.get_embedding_variable(
        unique_name("pev2"),
        DIM,
        initializer=UNIFORM,
        partitioner=tf.compat.v1.fixed_size_partitioner(2),
    )
    tf.train.Checkpoint(table=other).restore(path)
    got = exported(other)
    assert sorted(got) == sorted(want)
    for k in want:
        np.testing.assert_array_equal(got[k], want[k])
