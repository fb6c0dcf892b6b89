"""The names that cross the Python / C++ boundary agree: schema.py against the built library's own
name tables (the SokSchema op), and the ops that take them by name refuse others."""
import numpy as np
import pytest
import tensorflow as tf

import sparse_operation_kit as sok
from sparse_operation_kit.runtime import schema
from sparse_operation_kit.runtime._ops import ops
from tests.python.support import unique_name


def _cpp_tables():
    with tf.device("/CPU:0"):
        init_kinds, optimizers, fields = ops.sok_schema()
    return ([s.decode() for s in init_kinds.numpy()], [s.decode() for s in optimizers.numpy()],
            [s.decode() for s in fields.numpy()])


def test_python_and_cpp_name_tables_agree():
    init_kinds, optimizers, fields = _cpp_tables()
    assert [k.value for k in schema.InitKind] == init_kinds
    assert [o.value for o in schema.Optimizer] == optimizers
    assert list(schema.EXPORT_FIELDS) == fields


def test_export_op_outputs_are_named_by_the_schema():
    var = sok.EmbeddingVariable(unique_name("schema_fields"), 2)
    var.assign(tf.constant([3], tf.int64), [[1.0, 2.0]])
    snap = var.snapshot()
    assert list(snap) == list(schema.EXPORT_FIELDS)
    np.testing.assert_array_equal(snap["keys"].numpy(), [3])
    assert int(snap["slot_kind"]) == schema.NO_SLOTS


def test_slot_kind_names_the_optimizer():
    var = sok.EmbeddingVariable(unique_name("schema_slots"), 2, initializer=tf.zeros_initializer())
    opt = sok.OptimizerWrapper(tf.compat.v1.train.AdagradOptimizer(0.1))
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(var.sparse_read(tf.constant([1, 2], tf.int64)))
    opt.apply_gradients(zip(tape.gradient(loss, [var]), [var]))
    slot_kind = int(var.snapshot()["slot_kind"])
    assert schema.optimizer_of_slot_kind(slot_kind) == "adagrad"


def test_an_unknown_initializer_kind_is_refused_by_name():
    with tf.device("/CPU:0"):
        handle = ops.sok_embedding_variable_handle(
            key_dtype=tf.int64, shared_name=unique_name("schema_bad")
        )
        with pytest.raises(
            (tf.errors.InvalidArgumentError, ValueError), match="unknown initializer kind 'spiral'"
        ):
            ops.sok_embedding_variable_initialize(
                handle,
                tf.zeros([0, 2]),
                key_dtype=tf.int64,
                table_name="t",
                dim=2,
                init_kind="spiral",
            )


def test_an_unknown_optimizer_is_refused_by_name():
    var = sok.EmbeddingVariable(unique_name("schema_opt"), 2)
    with pytest.raises(
        (tf.errors.InvalidArgumentError, ValueError), match="unknown optimizer 'rmsprop'"
    ):
        ops.sok_embedding_variable_sparse_apply(
            [var.handle],
            [tf.constant([1], tf.int64)],
            [tf.ones([1, 2])],
            0.1,
            tf.constant(0, tf.int64),
            tf.zeros([0], tf.int64),
            [],
            optimizer="rmsprop",
        )
