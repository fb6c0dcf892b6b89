"""The fused update skips its dedup exactly when the gradient's keys were declared distinct by
the lookup that made them (sparse_operation_kit/tables/uniqueness.py), and reserves no room for
them exactly when a training lookup inserted them; the results are the same."""
import numpy as np
import tensorflow as tf

import sparse_operation_kit as sok
from tests.python.support import graph_session, unique_name


def _apply_ops(graph):
    return [op for op in graph.get_operations() if op.type == "SokEmbeddingVariableSparseApply"]


def test_lookup_gradients_are_declared_distinct_in_a_graph():
    with graph_session() as sess:
        var = sok.get_embedding_variable(
            unique_name("uniq_lookup"), 2, initializer=tf.ones_initializer()
        )
        ids = tf.RaggedTensor.from_row_lengths(tf.constant([4, 4, 9, 4], tf.int64), [3, 1])
        loss = tf.reduce_sum(sok.lookup_sparse(var, ids))
        opt = sok.OptimizerWrapper(tf.compat.v1.train.GradientDescentOptimizer(0.5))
        train = opt.apply_gradients(opt.compute_gradients(loss, [var]))
        (update,) = _apply_ops(sess.graph)
        assert update.get_attr("keys_unique")
        assert update.get_attr("keys_present")
        sess.run(tf.compat.v1.global_variables_initializer())
        sess.run(train)
        rows = sess.run(var.sparse_read(tf.constant([4, 9], tf.int64), training=False))
    # key 4 occurs 3 times (gradient 3 per column), key 9 once.
    np.testing.assert_allclose(rows, [[1 - 0.5 * 3] * 2, [1 - 0.5] * 2])


def test_hand_made_gradients_with_repeated_keys_are_deduplicated():
    with graph_session() as sess:
        var = sok.get_embedding_variable(
            unique_name("uniq_manual"), 2, initializer=tf.ones_initializer()
        )
        grad = tf.IndexedSlices(tf.ones([3, 2]), tf.constant([7, 7, 8], tf.int64))
        opt = sok.OptimizerWrapper(tf.compat.v1.train.GradientDescentOptimizer(0.5))
        train = opt.apply_gradients([(grad, var)])
        (update,) = _apply_ops(sess.graph)
        assert not update.get_attr("keys_unique")
        assert not update.get_attr("keys_present")
        sess.run(tf.compat.v1.global_variables_initializer())
        sess.run(var.sparse_read(tf.constant([7, 8], tf.int64)))
        sess.run(train)
        rows = sess.run(var.sparse_read(tf.constant([7, 8], tf.int64), training=False))
    np.testing.assert_allclose(rows, [[0.0, 0.0], [0.5, 0.5]])


def test_gradients_of_an_evaluation_lookup_are_not_declared_inserted():
    """An evaluation lookup inserts nothing: an update of its gradient inserts the keys itself."""
    with graph_session() as sess:
        var = sok.get_embedding_variable(
            unique_name("uniq_eval"), 2, initializer=tf.ones_initializer()
        )
        ids = tf.RaggedTensor.from_row_lengths(tf.constant([5, 6, 5], tf.int64), [2, 1])
        loss = tf.reduce_sum(sok.lookup_sparse(var, ids, training=False))
        opt = sok.OptimizerWrapper(tf.compat.v1.train.GradientDescentOptimizer(0.5))
        train = opt.apply_gradients(opt.compute_gradients(loss, [var]))
        (update,) = _apply_ops(sess.graph)
        assert update.get_attr("keys_unique")
        assert not update.get_attr("keys_present")
        sess.run(tf.compat.v1.global_variables_initializer())
        sess.run(train)
        assert sess.run(var.size()) == 2
        rows = sess.run(var.sparse_read(tf.constant([5, 6], tf.int64), training=False))
    np.testing.assert_allclose(rows, [[1 - 0.5 * 2] * 2, [1 - 0.5] * 2])


def test_a_cast_of_distinct_keys_is_not_distinct():
    from sparse_operation_kit.tables import uniqueness
    with tf.Graph().as_default():
        keys = tf.constant([1, 2], tf.int64)
        uniqueness.declare_distinct([keys])
        assert uniqueness.is_distinct(keys) and not uniqueness.is_inserted(keys)
        assert not uniqueness.is_distinct(tf.concat([keys, keys], 0))
        inserted = tf.constant([3], tf.int64)
        uniqueness.declare_distinct([inserted], inserted=True)
        assert uniqueness.is_inserted(inserted)
        assert not uniqueness.is_inserted(tf.identity(inserted))
    assert not uniqueness.is_distinct(tf.constant([1, 2], tf.int64))  # eager: never declared
