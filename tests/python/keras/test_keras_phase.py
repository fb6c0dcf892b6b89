"""Keras 3 models whose call() takes no `training` argument: Keras gives their layers
training=None in fit, evaluate and predict alike. SOK's layers train under fit's GradientTape and
insert nothing outside one (evaluate, predict, a plain call)."""
import numpy as np
import pytest
import tensorflow as tf

import sparse_operation_kit as sok
from sparse_operation_kit.optimizers import keras_support
from tests.python.support import unique_name

keras = pytest.importorskip("keras")
if not keras_support.keras_is_v3():
    pytest.skip("Keras 3 behaviour (tf_keras passes fit's flag down itself)",
                allow_module_level=True)

UNIFORM = tf.random_uniform_initializer(-0.5, 0.5, seed=3)


class NoTrainingArg(keras.Model):
    """call(self, x): no `training`, so Keras's train_step calls self(x) without one."""

    def __init__(self, layer):
        super().__init__()
        self.emb = layer
        # A fixed sum of the pooled row: the tables' SGD step has a closed form.
        self.head = keras.layers.Dense(1, kernel_initializer="ones", trainable=False)

    def call(self, x):
        return self.head(self.emb(x))


def _layer(kind):
    name = unique_name("phase")
    if kind == "embedding":
        return sok.Embedding(4, combiner="sum", initializer=UNIFORM, name=name)
    return sok.SparseEmbedding(4, combiners="sum", initializers=UNIFORM, name=name)


@pytest.mark.parametrize("kind", ["embedding", "sparse"])
def test_fit_trains_tables_of_a_model_whose_call_takes_no_training(kind):
    ids = np.arange(60, dtype=np.int64).reshape(20, 3)
    y = np.ones([20, 1], np.float32)
    model = NoTrainingArg(_layer(kind))
    model.compile(optimizer=sok.OptimizerWrapper(keras.optimizers.SGD(0.1)), loss="mse")
    table = model.emb.embedding_variables[0]
    before = table.sparse_read(tf.constant(ids.reshape(-1)), training=False).numpy()
    model.fit(ids, y, epochs=1, batch_size=10, shuffle=False, verbose=0)
    assert int(table.size()) == 60
    after = table.sparse_read(tf.constant(ids.reshape(-1)), training=False).numpy()
    # out = the sum of a sample's 3 rows; mse over batches of 10: d loss / d row = 2 (out - 1) / 10
    # in every column, and SGD moves each row (every id is in one sample) by -0.1 times that.
    out = before.reshape(20, 12).sum(axis=1)
    expected = np.repeat(-0.1 * 2 * (out - 1) / 10, 3)[:, None].repeat(4, axis=1)
    np.testing.assert_allclose(after - before, expected, rtol=1e-4, atol=1e-6)

    # Outside a tape (evaluate, predict, a plain call) None stays an inference lookup.
    state = [t.numpy() for t in table.export()[:4]]
    unseen = ids + 1000
    model.evaluate(unseen, y, verbose=0)
    model.predict(unseen, verbose=0)
    model(tf.constant(unseen))
    assert int(table.size()) == 60
    for a, b in zip(state, table.export()[:4]):
        np.testing.assert_array_equal(a, b.numpy())


def test_explicit_false_under_a_tape_inserts_nothing():
    layer = _layer("embedding")
    ids = tf.constant([[1, 2]], tf.int64)
    with tf.GradientTape():
        layer(ids, training=False)
    assert int(layer.embedding_variable.size()) == 0
    with tf.GradientTape():
        layer(ids)  # None under a tape: a training lookup
    assert int(layer.embedding_variable.size()) == 2
