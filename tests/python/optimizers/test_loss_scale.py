"""sok.LossScaleOptimizer (Keras 3's mixed-precision loss scaling around sok.OptimizerWrapper):
under the "mixed_float16" policy `fit` trains SOK tables; one SGD step moves a table's rows as the
float32 step does (the gradient unscaled); a step whose table gradient is not finite changes no row
and halves the scale; `.keras` files restore it without custom_objects."""
import numpy as np
import pytest
import tensorflow as tf

import sparse_operation_kit as sok
from sparse_operation_kit.optimizers import keras_support
from tests.python.support import unique_name

keras = pytest.importorskip("keras")
if not keras_support.keras_is_v3():
    pytest.skip("sok.LossScaleOptimizer is for Keras 3", allow_module_level=True)

UNIFORM = tf.random_uniform_initializer(-0.1, 0.1, seed=5)
VOCAB = 200


@pytest.fixture
def policy():
    """Sets a global dtype policy for the test and restores float32 after it."""
    yield keras.mixed_precision.set_global_policy
    keras.mixed_precision.set_global_policy("float32")


def parity_data(n, seed):
    """Samples of 1-3 ids sharing a parity, which is the label (learnable only by the rows)."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 2, n)
    rows = [[int(2 * rng.integers(0, VOCAB // 2) + y) for _ in range(rng.integers(1, 4))]
            for y in labels]
    ids = tf.ragged.constant(rows, dtype=tf.int64)
    return tf.data.Dataset.from_tensor_slices((ids, labels.astype(np.float32))).batch(32), rows


def model_of(optimizer):
    inp = keras.Input(shape=(None,), dtype="int64", ragged=True)
    emb = sok.SparseEmbedding(8, combiners="mean", initializers=UNIFORM, name=unique_name("f"))
    hidden = keras.layers.Dense(4, kernel_initializer="ones")(emb(inp))
    out = keras.layers.Dense(1, activation="sigmoid", dtype="float32",
                             kernel_initializer="ones")(hidden)
    model = keras.Model(inp, out)
    model.compile(optimizer=optimizer, loss="binary_crossentropy", metrics=["accuracy"])
    return model, emb.embedding_variables[0]


def rows_of(table, keys):
    return table.sparse_read(tf.constant(keys), training=False).numpy()


def test_fit_under_mixed_float16_trains_tables(policy):
    policy("mixed_float16")
    ds, rows = parity_data(1024, seed=1)
    opt = sok.LossScaleOptimizer(sok.OptimizerWrapper(keras.optimizers.Adam(0.05)))
    model, table = model_of(opt)
    assert model.optimizer is opt  # Keras does not wrap it again
    keys = np.array(sorted({k for r in rows for k in r}), np.int64)
    before = rows_of(table, keys)
    history = model.fit(ds, epochs=4, verbose=0)
    after = rows_of(table, keys)
    assert np.isfinite(after).all()
    assert (np.abs(after - before) > 1e-6).any(axis=1).all()
    assert history.history["accuracy"][-1] > 0.9


def test_one_step_moves_rows_as_float32_does(policy):
    """SGD's step is proportional to the gradient: a gradient left scaled (by 2**15) would move
    the rows 32,768 times as far."""
    ds, rows = parity_data(32, seed=4)
    keys = np.array(sorted({k for r in rows for k in r}), np.int64)
    moved = {}
    for name in ("float32", "mixed_float16"):
        policy(name)
        opt = sok.OptimizerWrapper(keras.optimizers.SGD(0.5))
        if name == "mixed_float16":
            opt = sok.LossScaleOptimizer(opt)
        model, table = model_of(opt)
        before = rows_of(table, keys)
        model.fit(ds, epochs=1, verbose=0)
        moved[name] = rows_of(table, keys) - before
    assert np.abs(moved["float32"]).max() > 1e-4
    np.testing.assert_allclose(moved["mixed_float16"], moved["float32"], rtol=2e-2, atol=2e-5)


def test_a_table_gradient_that_is_not_finite_skips_the_step(policy):
    policy("mixed_float16")
    ds, rows = parity_data(64, seed=6)
    opt = sok.LossScaleOptimizer(sok.OptimizerWrapper(keras.optimizers.SGD(0.5)))
    model, table = model_of(opt)
    model.fit(ds, epochs=1, verbose=0)
    keys = np.array(sorted({k for r in rows for k in r}), np.int64)
    before, scale = rows_of(table, keys), float(opt.dynamic_scale.numpy())
    grads = [tf.zeros_like(v) for v in model.trainable_weights]
    carrier = next(i for i, v in enumerate(model.trainable_weights)
                   if keras_support.is_carrier(v))
    bad = np.zeros([len(keys), 8], np.float32)
    bad[3, 2] = np.inf
    grads[carrier] = tf.IndexedSlices(tf.constant(bad), tf.constant(keys))
    opt.apply(grads, model.trainable_weights)
    np.testing.assert_array_equal(rows_of(table, keys), before)
    assert float(opt.dynamic_scale.numpy()) == scale / 2


def test_keras_file_restores_it(policy, tmp_path):
    policy("mixed_float16")
    ds, _ = parity_data(64, seed=7)
    opt = sok.LossScaleOptimizer(sok.OptimizerWrapper(keras.optimizers.Adam(0.05)))
    model, _ = model_of(opt)
    model.fit(ds, epochs=1, verbose=0)
    path = str(tmp_path / "m.keras")
    model.save(path)
    loaded = keras.models.load_model(path)  # no custom_objects
    assert type(loaded.optimizer) is type(opt)
    assert isinstance(loaded.optimizer.inner_optimizer, sok.OptimizerWrapper)
    loaded.fit(ds, epochs=1, verbose=0)
