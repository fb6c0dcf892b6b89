"""A DRAM_SSDHASH table as users reach it from Keras and from serving: `compile`/`fit`, `.keras`
files and `load_model`, evaluate/predict, and the stock-ops SavedModel (read-only lookups, a
counter filter) give what the same table in DRAM gives, while most rows sit in the SSD tier."""
import os

import numpy as np
import pytest
import tensorflow as tf

import sparse_operation_kit as sok
from sparse_operation_kit.optimizers import keras_support
from tests.python.serving.test_serving import saved_op_types, serve_in_fresh_process
from tests.python.support import unique_name
from tests.python.tables.tier_support import assert_same_table

pytestmark = pytest.mark.cpu_placement  # DRAM_SSDHASH is a CPU tier
DIM = 4
ROW = 4 * DIM * 2 + 32  # a row with Adagrad's slot


@pytest.fixture(autouse=True)
def _eager_ops_on_the_cpu():
    with tf.device("/CPU:0"):
        yield


def ssd(path, rows=4):
    return sok.StorageOption(sok.StorageType.DRAM_SSDHASH, str(path), [rows * ROW])


def ssd_rows_bytes(path):
    return sum(os.path.getsize(os.path.join(path, d, "rows.log"))
               for d in os.listdir(path) if d.startswith("sok_ev_"))


def keras_model(keras, name, option):
    inp = keras.Input(shape=(None,), dtype="int64", ragged=True)
    emb = sok.Embedding(DIM, combiner="sum", name=name,
                        initializer=tf.random_uniform_initializer(-0.1, 0.1, seed=5),
                        ev_option=sok.EmbeddingVariableOption(storage_option=option))
    dense = keras.layers.Dense(1, activation="sigmoid",
                               kernel_initializer=keras.initializers.GlorotUniform(seed=1))
    model = keras.Model(inp, dense(emb(inp)))
    model.compile(optimizer=sok.OptimizerWrapper(keras.optimizers.Adagrad(0.3)),
                  loss="binary_crossentropy")
    return model, emb.embedding_variable


def parity_data(n, seed):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 2, n)
    rows = [[int(2 * rng.integers(0, 100) + y) for _ in range(rng.integers(1, 4))] for y in labels]
    ids = tf.ragged.constant(rows, dtype=tf.int64)
    return tf.data.Dataset.from_tensor_slices((ids, labels.astype(np.float32))).batch(32)


def test_keras_fit_save_and_load_model_equal_the_dram_table(tmp_path):
    keras = pytest.importorskip("keras")
    if not keras_support.keras_is_v3():
        pytest.skip("Keras 3 only (tf_keras: tests/python/keras/test_keras_fit.py's subprocess)")
    (tmp_path / "ssd").mkdir()
    name = unique_name("tiered_keras")
    tiered, table = keras_model(keras, name, ssd(tmp_path / "ssd"))
    plain, plain_table = keras_model(keras, name, None)
    train, probe = parity_data(256, seed=1), parity_data(64, seed=2)
    for model in (tiered, plain):
        model.fit(train, epochs=2, verbose=0, shuffle=False)
    assert_same_table(table, plain_table)
    assert ssd_rows_bytes(str(tmp_path / "ssd")) > 50 * ROW  # most rows are in the file
    size = int(table.size())
    expected = tiered.predict(probe, verbose=0)
    assert expected.tobytes() == plain.predict(probe, verbose=0).tobytes()
    tiered.evaluate(probe, verbose=0)
    assert int(table.size()) == size  # predict and evaluate inserted nothing

    path = str(tmp_path / "model.keras")
    tiered.save(path)
    loaded = keras.models.load_model(path)
    loaded_table = loaded.get_layer(name).embedding_variable
    assert loaded_table._storage.tiered and loaded_table._storage.sizes == [4 * ROW]
    assert_same_table(loaded_table, table)
    assert loaded.predict(probe, verbose=0).tobytes() == expected.tobytes()
    loaded.fit(train, epochs=1, verbose=0, shuffle=False)  # slots and step came back too
    plain.fit(train, epochs=1, verbose=0, shuffle=False)
    assert_same_table(loaded_table, plain_table)


class Scorer(tf.Module):
    """A pooled lookup of a tiered table and of a filtered tiered table, then a dense weight."""

    def __init__(self, path):
        super().__init__()
        self.table = sok.get_embedding_variable(
            unique_name("tiered_serve"), DIM,
            initializer=tf.random_uniform_initializer(-0.5, 0.5, seed=3),
            ev_option=sok.EmbeddingVariableOption(storage_option=ssd(path)))
        self.filtered = sok.get_embedding_variable(
            unique_name("tiered_filtered"), DIM,
            initializer=tf.random_uniform_initializer(-0.5, 0.5, seed=4),
            ev_option=sok.EmbeddingVariableOption(
                storage_option=ssd(path), filter_option=sok.CounterFilter(filter_freq=2),
                init_option=sok.InitializerOption(default_value_no_permission=-0.5)))
        self.w = tf.Variable(np.linspace(-1, 1, 2 * DIM, dtype=np.float32).reshape(2 * DIM, 1))

    def features(self, ids, training):
        sp = tf.sparse.from_dense(ids)  # 0 = no id
        pooled = sok.lookup_sparse([self.table, self.filtered], [sp, sp],
                                   combiners=["sum", "mean"], training=training)
        return tf.concat(pooled, axis=1)

    @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.int64)])
    def serve(self, ids):
        feats = self.features(ids, training=False)
        return {"score": tf.matmul(feats, self.w), "features": feats}


def test_stock_saved_model_serves_the_tiered_tables(tmp_path):
    (tmp_path / "ssd").mkdir()
    model = Scorer(str(tmp_path / "ssd"))
    rng = np.random.default_rng(0)
    train_ids = rng.integers(1, 60, [32, 3])
    for _ in range(2):  # inserts keys; the filtered table admits keys seen twice
        model.features(tf.constant(train_ids), training=True)
    for t in (model.table, model.filtered):  # trained-looking rows, then most of them on SSD
        keys = sok.export(t)[0]
        t.assign(keys, tf.random.stateless_uniform([tf.size(keys), DIM], [1, 2]))
    assert ssd_rows_bytes(str(tmp_path / "ssd")) > 20 * ROW
    ids = np.concatenate([train_ids[:6], rng.integers(50, 90, [6, 3])])  # seen and unseen keys
    ids[2, 1:] = 0
    sizes = [int(model.table.size()), int(model.filtered.size())]
    expected = model.serve(tf.constant(ids))
    assert [int(model.table.size()), int(model.filtered.size())] == sizes

    export_dir = tmp_path / "stock"
    frozen = sok.save_stock_saved_model(model.serve, str(export_dir), model.serve.input_signature)
    assert frozen == [model.table.name, model.filtered.name]
    assert not {t for t in saved_op_types(export_dir) if t.startswith("Sok")}
    served = serve_in_fresh_process(tmp_path, export_dir, {"ids": ids})
    np.testing.assert_allclose(served["features"], expected["features"].numpy(), rtol=2e-6,
                               atol=2e-6)
    np.testing.assert_allclose(served["score"], expected["score"].numpy(), rtol=1e-5, atol=1e-5)
