"""What the storage-tier tests share: a table under a StorageOption, a few eager training steps,
and the comparison of two tables' exports."""
import numpy as np
import tensorflow as tf

import sparse_operation_kit as sok
from tests.python.support import sorted_export, unique_name

DIM = 4


def make(option, name=None, dim=DIM):
    """An Embedding Variable with `option` (None: no StorageOption), deterministic initial rows."""
    name = name or unique_name("tiered")
    return sok.EmbeddingVariable(
        name, dim, initializer=tf.random_uniform_initializer(-1, 1, seed=3),
        ev_option=sok.EmbeddingVariableOption(storage_option=option))


def train(ev, new_optimizer, ids_batches):
    """One eager step per batch through sok.OptimizerWrapper(new_optimizer()); the rows each
    step read."""
    opt = sok.OptimizerWrapper(new_optimizer())
    outs = []
    for ids in ids_batches:
        with tf.GradientTape() as tape:
            rows = ev.sparse_read(tf.constant(ids))
            loss = tf.reduce_sum(rows * rows * tf.range(1.0, ev.embedding_dim + 1.0))
        opt.apply_gradients([(tape.gradient(loss, ev), ev)])
        outs.append(rows.numpy())
    return outs


def assert_same_table(a, b):
    ea, eb = sorted_export(a), sorted_export(b)
    assert set(ea) == set(eb)
    for field in ea:
        np.testing.assert_array_equal(ea[field], eb[field], err_msg=field)
