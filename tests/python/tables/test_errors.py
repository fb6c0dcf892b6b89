"""Misuse raises a clear error that names the table and the problem."""
import numpy as np
import pytest
import tensorflow as tf

import sparse_operation_kit as sok
from tests.python.support import graph_session, unique_name


def ragged(rows, dtype=tf.int64):
    return tf.ragged.constant(rows, dtype=dtype)


# ---------------------------------------------------------------------------------------------
# Creation
# ---------------------------------------------------------------------------------------------
def test_bad_creation_arguments():
    with pytest.raises(
        TypeError, match="'bad_keys': key_dtype must be int32 or int64, got float32"
    ):
        sok.get_embedding_variable("bad_keys", 4, key_dtype=tf.float32)
    with pytest.raises(TypeError, match="'bad_values': value_dtype must be float32, got float64"):
        sok.get_embedding_variable("bad_values", 4, value_dtype=tf.float64)
    with pytest.raises(ValueError, match="'bad_dim': embedding_dim must be positive, got 0"):
        sok.get_embedding_variable("bad_dim", 0)
    with pytest.raises(
        ValueError, match="table 'bad_init': unknown initializer string 'uniformly'"
    ):
        sok.DynamicVariable(dimension=2, initializer="uniformly", name="bad_init")


def test_reuse_with_another_dimension():
    with graph_session():
        with tf.compat.v1.variable_scope("s"):
            sok.get_embedding_variable("emb", 4)
        with tf.compat.v1.variable_scope("s", reuse=True):
            with pytest.raises(ValueError, match="'s/emb' has dimension 4, not 8"):
                sok.get_embedding_variable("emb", 8)


def test_no_dense_value():
    ev = sok.get_embedding_variable(unique_name("dense"), 2)
    with pytest.raises(TypeError, match="Embedding Variable 'dense_.*' has no dense value"):
        ev.read_value()


def test_lookup_before_initialization_tf1():
    with graph_session() as sess:
        ev = sok.get_embedding_variable("not_yet", 2)
        rows = ev.sparse_read(tf.constant([1], tf.int64))
        with pytest.raises(
            tf.errors.FailedPreconditionError,
            match="Embedding Variable 'not_yet' is not initialized",
        ):
            sess.run(rows)


# ---------------------------------------------------------------------------------------------
# lookup_sparse arguments
# ---------------------------------------------------------------------------------------------
def test_wrong_key_dtype():
    ev = sok.get_embedding_variable("keys64", 2)
    with pytest.raises(
        TypeError, match="table 'keys64' has key dtype int64, but its ids are int32"
    ):
        sok.lookup_sparse([ev], [ragged([[1]], tf.int32)])
    with pytest.raises(
        TypeError, match="'keys64' has key dtype int64, but ids of dtype int32 were given"
    ):
        ev.sparse_read(tf.constant([1], tf.int32))
    with pytest.raises(
        TypeError, match="'keys64' has key dtype int64, but ids of dtype int32 were given"
    ):
        tf.nn.embedding_lookup(ev, tf.constant([1], tf.int32))
    with pytest.raises(TypeError, match="ids of table 'keys64' must be int32 or int64, got string"):
        sok.lookup_sparse([ev], [tf.ragged.constant([["a"]])])
    with pytest.raises(
        TypeError, match="ids of table 'keys64' must be a tf.SparseTensor, a tf.RaggedTensor or a "
        r"\[batch\] / \[batch, k\] tensor, got list"
    ):
        sok.lookup_sparse([ev], [[[1]]])
    with pytest.raises(
        ValueError, match=r"dense ids of table 'keys64' must be \[batch\] \(one id per sample\) "
        r"or \[batch, k\] \(k ids per sample\), got shape \(1, 1, 1\)"
    ):
        sok.lookup_sparse([ev], [tf.constant([[[1]]], tf.int64)])


def test_unknown_combiner():
    ev = sok.get_embedding_variable("comb", 2)
    with pytest.raises(ValueError, match="unknown combiner 'max' for table 'comb'"):
        sok.lookup_sparse([ev], [ragged([[1]])], combiners=["max"])


def test_lists_of_different_lengths():
    a = sok.get_embedding_variable("len_a", 2)
    b = sok.get_embedding_variable("len_b", 2)
    with pytest.raises(ValueError, match="2 tables but 1 id tensors"):
        sok.lookup_sparse([a, b], [ragged([[1]])])
    with pytest.raises(ValueError, match="2 tables but 3 combiners"):
        sok.lookup_sparse([a, b], [ragged([[1]]), ragged([[2]])], combiners=["sum"] * 3)
    with pytest.raises(ValueError, match="2 tables but 1 weight tensors"):
        sok.lookup_sparse([a, b], [ragged([[1]]), ragged([[2]])], sp_weights=[None])


def test_weights_that_do_not_match_the_ids():
    ev = sok.get_embedding_variable("weights", 2)
    with pytest.raises(
        tf.errors.InvalidArgumentError, match="table 'weights': 3 weights for 2 ids"
    ):
        sok.lookup_sparse(
            [ev], [ragged([[1, 2]])], sp_weights=[tf.ragged.constant([[1.0, 2.0, 3.0]])]
        )
    with pytest.raises(TypeError, match="weights of table 'weights' must be float32, got float64"):
        sok.lookup_sparse(
            [ev], [ragged([[1, 2]])], sp_weights=[tf.ragged.constant([[1.0, 2.0]], tf.float64)]
        )


# ---------------------------------------------------------------------------------------------
# Dimension mismatches
# ---------------------------------------------------------------------------------------------
def test_assign_values_of_another_dimension():
    ev = sok.get_embedding_variable("assign_dim", 3)
    for bad in (np.ones([2, 4], np.float32), np.ones([3, 2], np.float32)):
        with pytest.raises(
            ValueError, match="'assign_dim' has dimension 3, but the values have shape"
        ):
            sok.assign(ev, tf.constant([1, 2], tf.int64), bad)
    with pytest.raises(
        tf.errors.InvalidArgumentError,
        match="assign to 'assign_dim': values of shape \\[3,3\\] for 2 keys",
    ):
        ev.assign(tf.constant([1, 2], tf.int64), np.ones([3, 3], np.float32))
    assert int(ev.size()) == 0


def test_gradient_of_another_dimension():
    ev = sok.get_embedding_variable("grad_dim", 3)
    opt = sok.OptimizerWrapper(tf.keras.optimizers.SGD(0.1))
    bad = tf.IndexedSlices(tf.ones([2, 4]), tf.constant([1, 2], tf.int64))
    with pytest.raises(
        ValueError, match="gradient of Embedding Variable 'grad_dim' has shape \\(2, 4\\)"
    ):
        opt.apply_gradients([(bad, ev)])
    with pytest.raises(
        TypeError, match="gradient of Embedding Variable 'grad_dim' must be tf.IndexedSlices"
    ):
        opt.apply_gradients([(tf.ones([2, 3]), ev)])


# ---------------------------------------------------------------------------------------------
# Static tables: ids out of range
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("bad_id, what", [(-1, "negative id"), (6, "id out of range \\[0, 6\\)")])
def test_static_table_ids_out_of_range_eager(bad_id, what):
    table = tf.Variable(np.ones([6, 2], np.float32), name="static_items")
    sok_table = sok.Variable(np.ones([6, 2], np.float32), name="sok_items", mode="localized:0")
    for t, name in ((table, "static_items"), (sok_table, "sok_items")):
        with pytest.raises(
            tf.errors.InvalidArgumentError, match=f"lookup of static table {name}: {what}"
        ):
            sok.lookup_sparse([t], [ragged([[0, bad_id]])])


def test_a_static_lookup_checks_its_ids_once():
    """lookup_sparse over a sok.Variable runs one SokCheckRowIds, not a second one in the table's
    own sparse_read (on a GPU each run waits for the stream)."""
    table = sok.Variable(np.ones([6, 2], np.float32), name="once_items")
    sok.lookup_sparse(table, ragged([[0, 1], [5]]))  # the first call may trace
    before = sum(sok.kernel_run_counts(by_op=True).get("SokCheckRowIds", {}).values())
    sok.lookup_sparse(table, ragged([[0, 1], [5]]))
    after = sum(sok.kernel_run_counts(by_op=True)["SokCheckRowIds"].values())
    assert after - before == 1


def test_keras_variable_as_a_static_table_checks_its_ids():
    """A Keras 3 Variable (no `device` attribute) looks up like a tf.Variable, its ids checked."""
    import keras
    table = keras.Variable(np.arange(12, dtype=np.float32).reshape(6, 2), name="keras_items")
    out = sok.lookup_sparse(table, ragged([[0, 1], [5]]))
    np.testing.assert_array_equal(out.numpy(), [[2, 4], [10, 11]])
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match="lookup of static table .*keras_items.*: id out of range \\[0, 6\\): 7"):
        sok.lookup_sparse(table, ragged([[0, 7]]))


@pytest.mark.parametrize("bad_id, what", [(-3, "negative id"), (60, "id out of range")])
def test_static_table_ids_out_of_range_in_functions_and_graphs(bad_id, what):
    table = tf.Variable(np.ones([6, 2], np.float32), name="fn_items")

    @tf.function
    def lookup(ids):
        return sok.lookup_sparse([table], [ids])[0]

    with pytest.raises(tf.errors.InvalidArgumentError, match=f"static table fn_items: {what}"):
        lookup(ragged([[bad_id]], tf.int32))
    with graph_session() as sess:
        t = tf.compat.v1.get_variable(
            "graph_items", initializer=np.ones([6, 2], np.float32), use_resource=True
        )
        out = sok.lookup_sparse([t], [ragged([[1], [bad_id]])])[0]
        sess.run(t.initializer)
        with pytest.raises(
            tf.errors.InvalidArgumentError, match=f"static table graph_items: {what}"
        ):
            sess.run(out)


# ---------------------------------------------------------------------------------------------
# Optimizers
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("make, match", [
    (lambda: object(), "object is not supported"),
    (lambda: "adam", "str is not supported"),
])
def test_unsupported_optimizer(make, match):
    with pytest.raises(ValueError, match=f"sok.OptimizerWrapper: {match}"):
        sok.OptimizerWrapper(make())


def test_two_optimizers_on_one_table():
    ev = sok.get_embedding_variable("two_opts", 2)
    grad = tf.IndexedSlices(tf.ones([1, 2]), tf.constant([1], tf.int64))
    sok.OptimizerWrapper(tf.keras.optimizers.Adagrad(0.1)).apply_gradients([(grad, ev)])
    with pytest.raises(
        tf.errors.InvalidArgumentError,
        match="table 'two_opts' already carries the slots of optimizer adagrad; it cannot also be "
        "trained by optimizer adam",
    ):
        sok.OptimizerWrapper(tf.keras.optimizers.Adam(0.1)).apply_gradients([(grad, ev)])


def test_ftrl_beta_needs_a_known_learning_rate_in_graphs():
    ev = sok.get_embedding_variable("ftrl_beta_fn", 2)
    wrapper = sok.OptimizerWrapper(tf.keras.optimizers.Ftrl(0.1, beta=0.5))

    @tf.function
    def step():
        wrapper.apply_gradients(
            [(tf.IndexedSlices(tf.ones([1, 2]), tf.constant([1], tf.int64)), ev)]
        )

    with pytest.raises(
        ValueError, match="FTRL with beta > 0 on SOK variables needs a learning rate known"
    ):
        step()
