"""Keras's own training loop trains SOK tables: `model.compile(optimizer=sok.OptimizerWrapper(
keras_optimizer))` + `model.fit` on tf.data pipelines of ragged (and dense) ids, for Keras 3 (this
process) and tf_keras (a subprocess with TF_USE_LEGACY_KERAS=1); a plain Keras optimizer is an
error naming the layer and the fix; evaluate/predict insert nothing; `.keras` files and
save_weights/load_weights keep every row, slot and counter, to the bit."""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf

import sparse_operation_kit as sok
from sparse_operation_kit.optimizers import keras_support, slot_weights
from tests.python.support import TEST_DEVICE, subprocess_env, unique_name

keras = pytest.importorskip("keras")
if not keras_support.keras_is_v3():
    pytest.skip("this process runs tf_keras (TF_USE_LEGACY_KERAS=1); the subprocess test covers it",
                allow_module_level=True)

VOCAB = 200
UNIFORM = tf.random_uniform_initializer(-0.1, 0.1, seed=5)


def parity_data(n, seed, offset=0):
    """Samples of 1-3 ids that share a parity; the label is that parity (learnable only through
    the embeddings: every id has its own row)."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 2, n)
    rows = [[int(2 * rng.integers(0, VOCAB // 2) + y + offset) for _ in range(rng.integers(1, 4))]
            for y in labels]
    return rows, labels.astype(np.float32)


def ragged_dataset(rows, labels, batch=32):
    ids = tf.ragged.constant(rows, dtype=tf.int64)
    return tf.data.Dataset.from_tensor_slices((ids, labels)).batch(batch)


def ragged_model(optimizer, layer="sparse", name=None):
    inp = keras.Input(shape=(None,), dtype="int64", ragged=True)
    name = name or unique_name("features")
    if layer == "sparse":
        emb = sok.SparseEmbedding(8, combiners="mean", initializers=UNIFORM, name=name)
    else:
        emb = sok.Embedding(8, combiner="sum", initializer=UNIFORM, name=name)
    out = keras.layers.Dense(1, activation="sigmoid")(emb(inp))
    model = keras.Model(inp, out)
    model.compile(optimizer=optimizer, loss="binary_crossentropy", metrics=["accuracy"])
    return model, emb


def table_state(table):
    """Every field of the table's export, rows sorted by key (a GPU table exports in slot order)."""
    fields = [t.numpy() for t in table.export()]
    order = np.argsort(fields[0], kind="stable")
    per_row = 5  # keys, values, slots, freqs, versions; then slot_kind, slot_init
    return [f[order] for f in fields[:per_row]] + fields[per_row:]


def assert_tables_bit_equal(a, b):
    for x, y in zip(table_state(a), table_state(b)):
        assert x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes()


def assert_rows_bit_equal(a, b):
    """Every row's fields (keys, values, slots, freqs, versions): a table whose rows carry no
    slots exports slot_kind -1 after an import (whatever update it had), until it trains again."""
    for x, y in zip(table_state(a)[:5], table_state(b)[:5]):
        assert x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes()


def assert_trained_alike(a, b):
    """Tables trained on from equal states are equal: to the bit on the CPU; on the GPU the
    backward sums rows with atomics (unless op determinism is on), so to float precision."""
    if TEST_DEVICE == "gpu":
        for x, y in zip(table_state(a), table_state(b)):
            np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-7)
    else:
        assert_tables_bit_equal(a, b)


@pytest.mark.parametrize("layer", ["sparse", "embedding"])
@pytest.mark.parametrize(
    "make_opt",
    [lambda: keras.optimizers.Adam(0.05), lambda: keras.optimizers.Adagrad(0.3)],
    ids=["adam", "adagrad"],
)
def test_fit_trains_sok_tables(layer, make_opt):
    rows, labels = parity_data(1024, seed=1)
    model, emb = ragged_model(sok.OptimizerWrapper(make_opt()), layer)
    assert isinstance(model.optimizer, keras.optimizers.Optimizer)
    assert isinstance(model.optimizer, sok.OptimizerWrapper)
    assert not isinstance(keras.optimizers.Adam(), sok.OptimizerWrapper)
    table = emb.embedding_variables[0]
    keys = np.array(sorted({k for r in rows for k in r}), np.int64)
    before = table.sparse_read(tf.constant(keys), training=False).numpy()
    history = model.fit(ragged_dataset(rows, labels), epochs=4, verbose=0)
    assert int(table.size()) == len(keys)
    after = table.sparse_read(tf.constant(keys), training=False).numpy()
    changed = (np.abs(after - before) > 1e-6).any(axis=1)
    assert changed.all(), f"{(~changed).sum()} of {len(keys)} rows did not train"
    exported = table_state(table)
    assert exported[2].shape[1] > 0  # the optimizer's slots live beside the rows
    assert history.history["accuracy"][-1] > 0.9
    test_rows, test_labels = parity_data(256, seed=2)
    _, accuracy = model.evaluate(ragged_dataset(test_rows, test_labels), verbose=0)
    assert accuracy > 0.85  # chance is 0.5
    assert int(model.optimizer.iterations) == 4 * 32


def test_fit_with_dense_ids():
    rng = np.random.default_rng(3)
    labels = rng.integers(0, 2, 512)
    ids = (2 * rng.integers(0, VOCAB // 2, [512, 3]) + labels[:, None]).astype(
        np.int32
    )  # Keras-style int32
    inp = keras.Input(shape=(3,), dtype="int32")
    emb = sok.Embedding(4, initializer=UNIFORM, name=unique_name("dense_ids"))
    pooled = keras.layers.GlobalAveragePooling1D()(emb(inp))
    model = keras.Model(inp, keras.layers.Dense(1, activation="sigmoid")(pooled))
    model.compile(
        optimizer=sok.OptimizerWrapper(keras.optimizers.Adam(0.05)),
        loss="binary_crossentropy",
        metrics=["accuracy"],
    )
    before = emb.embedding_variable.sparse_read(
        tf.constant(ids.reshape(-1), tf.int64), training=False
    ).numpy()
    ds = tf.data.Dataset.from_tensor_slices((ids, labels.astype(np.float32))).batch(32)
    history = model.fit(ds, epochs=4, verbose=0)
    after = emb.embedding_variable.sparse_read(
        tf.constant(ids.reshape(-1), tf.int64), training=False
    ).numpy()
    assert (np.abs(after - before) > 1e-6).any(axis=1).all()
    assert history.history["accuracy"][-1] > 0.9


def test_plain_keras_optimizer_is_an_error_naming_the_layer_and_fix():
    rows, labels = parity_data(64, seed=4)
    model, emb = ragged_model(keras.optimizers.Adam(0.05), name=unique_name("plain"))
    with pytest.raises(TypeError, match=f"layer '{emb.name}': its SOK table '{emb.name}/table_0'.*"
                                        r"sok\.OptimizerWrapper\(keras\.optimizers\.Adam"):
        model.fit(ragged_dataset(rows, labels), epochs=1, verbose=0)
    # The error comes while Keras traces the first step: nothing ran, nothing was half-trained.
    assert int(emb.embedding_variables[0].size()) == 0
    assert int(model.optimizer.iterations) == 0


def test_evaluate_and_predict_insert_nothing():
    rows, labels = parity_data(256, seed=5)
    model, emb = ragged_model(sok.OptimizerWrapper(keras.optimizers.Adam(0.05)))
    table = emb.embedding_variables[0]
    model.fit(ragged_dataset(rows, labels), epochs=1, verbose=0)
    size, state = int(table.size()), table_state(table)
    unseen_rows, unseen_labels = parity_data(128, seed=6, offset=10 * VOCAB)
    model.predict(ragged_dataset(unseen_rows, unseen_labels), verbose=0)
    model.evaluate(ragged_dataset(unseen_rows, unseen_labels), verbose=0)
    model(tf.ragged.constant(unseen_rows, dtype=tf.int64))  # training=None: inference
    assert int(table.size()) == size
    for a, b in zip(state, table_state(table)):
        assert a.tobytes() == b.tobytes()  # frequencies untouched too
    with pytest.raises(TypeError, match="`training` must be True, False or None, got 'no'"):
        emb(tf.ragged.constant([[1]], dtype=tf.int64), training="no")


def test_layers_are_registered_serializables():
    for cls in (sok.Embedding, sok.SparseEmbedding):
        assert keras.saving.get_registered_object(f"sok>{cls.__name__}") is cls
    layer = sok.SparseEmbedding(
        [3, 2],
        combiners=["sum", "mean"],
        initializers=UNIFORM,
        name=unique_name("cfg"),
        ev_options=sok.EmbeddingVariableOption(filter_option=sok.CounterFilter(2)),
    )
    clone = sok.SparseEmbedding.from_config(layer.get_config())
    assert [t.embedding_dim for t in clone.embedding_variables] == [3, 2]
    assert [t.name for t in clone.embedding_variables] == [
        t.name for t in layer.embedding_variables
    ]
    assert clone.embedding_variables[0]._filter_freq == 2
    ids = tf.constant([1, 7, 123456789], tf.int64)
    for a, b in zip(layer.embedding_variables, clone.embedding_variables):  # same initial rows
        np.testing.assert_array_equal(
            a.sparse_read(ids, training=False), b.sparse_read(ids, training=False)
        )


def _trained_model(path_name, layer="sparse"):
    rows, labels = parity_data(512, seed=7)
    model, emb = ragged_model(
        sok.OptimizerWrapper(keras.optimizers.Adam(0.05)), layer, name=unique_name(path_name)
    )
    model.fit(ragged_dataset(rows, labels), epochs=2, verbose=0)
    probe_rows, probe_labels = parity_data(128, seed=8)
    unseen_rows, _ = parity_data(128, seed=9, offset=4 * VOCAB)
    probe = ragged_dataset(probe_rows + unseen_rows, np.concatenate([probe_labels, probe_labels]))
    return model, emb, probe, ragged_dataset(rows, labels)


@pytest.mark.parametrize("layer", ["sparse", "embedding"])
def test_keras_file_round_trip_is_bit_exact(tmp_path, layer):
    model, emb, probe, train = _trained_model("saved", layer)
    expected = model.predict(probe, verbose=0)
    path = str(tmp_path / "model.keras")
    model.save(path)
    loaded = keras.models.load_model(path)  # no custom_objects
    layer = loaded.get_layer(emb.name)
    assert type(layer) is type(emb)
    assert_tables_bit_equal(emb.embedding_variables[0], layer.embedding_variables[0])
    got = loaded.predict(probe, verbose=0)
    assert got.tobytes() == expected.tobytes()
    assert type(loaded.optimizer).__name__ == type(model.optimizer).__name__
    assert int(loaded.optimizer.iterations) == int(model.optimizer.iterations)
    for a, b in zip(model.optimizer.variables, loaded.optimizer.variables):
        assert np.asarray(a).tobytes() == np.asarray(b).tobytes()
    # Both go on training identically (slots and step restored).
    model.fit(train, epochs=1, verbose=0, shuffle=False)
    loaded.fit(train, epochs=1, verbose=0, shuffle=False)
    assert_trained_alike(emb.embedding_variables[0], layer.embedding_variables[0])


def test_average_over_ranks_is_kept_by_keras_files_and_is_exact_in_one_process(tmp_path):
    """average_over_ranks (Keras's fit under horovodrun: tests/distributed/workers/keras_fit.py)
    changes nothing in one process, to the bit, and a .keras file keeps it."""
    rows, labels = parity_data(256, seed=8)
    states = []
    for average in (False, True):
        keras.utils.set_random_seed(3)
        inp = keras.Input(shape=(None,), dtype="int64", ragged=True)
        # A constant initializer: the two tables' rows start equal (a seeded one mixes in the
        # table's name).
        emb = sok.SparseEmbedding(8, combiners="mean", initializers=tf.constant_initializer(0.05),
                                  name=unique_name("avg"))
        model = keras.Model(inp, keras.layers.Dense(1, activation="sigmoid")(emb(inp)))
        model.compile(loss="binary_crossentropy", optimizer=sok.OptimizerWrapper(
            keras.optimizers.Adagrad(0.3), average_over_ranks=average))
        model.fit(ragged_dataset(rows, labels), epochs=1, verbose=0, shuffle=False)
        states.append((table_state(emb.embedding_variables[0]),
                       [v.numpy() for v in model.trainable_variables]))
    for a, b in zip(states[0][0] + states[0][1], states[1][0] + states[1][1]):
        assert np.asarray(a).tobytes() == np.asarray(b).tobytes()
    path = str(tmp_path / "avg.keras")
    model.save(path)
    assert keras.models.load_model(path).optimizer.get_config()["average_over_ranks"] is True


def test_save_weights_round_trip_is_bit_exact(tmp_path):
    model, emb, probe, _ = _trained_model("weights")
    expected = model.predict(probe, verbose=0)
    path = str(tmp_path / "model.weights.h5")
    model.save_weights(path)
    fresh, fresh_emb = ragged_model(
        sok.OptimizerWrapper(keras.optimizers.Adam(0.05)), name=emb.name
    )
    assert int(fresh_emb.embedding_variables[0].size()) == 0
    fresh.load_weights(path)
    assert_tables_bit_equal(emb.embedding_variables[0], fresh_emb.embedding_variables[0])
    assert fresh.predict(probe, verbose=0).tobytes() == expected.tobytes()


# Optimizers without a fused kernel train SOK tables on the wrapper's generic path: their slots
# live in slot stores (Embedding Variables keyed like the table) that weights files keep too.
GENERIC = {
    "rmsprop": lambda: keras.optimizers.RMSprop(0.01),
    "momentum": lambda: keras.optimizers.SGD(0.1, momentum=0.9),
}


def generic_model(make_opt, name, train_head=True):
    """A functional model over a table named `<name>/table_0`; train_head=False freezes the head,
    so that the wrapped optimizer keeps no variables (only the table's slot stores)."""
    inp = keras.Input(shape=(None,), dtype="int64", ragged=True)
    emb = sok.SparseEmbedding(8, combiners="mean", initializers=UNIFORM, name=name)
    head = keras.layers.Dense(1, activation="sigmoid", kernel_initializer="ones",
                              trainable=train_head)
    model = keras.Model(inp, head(emb(inp)))
    model.compile(optimizer=sok.OptimizerWrapper(make_opt()), loss="binary_crossentropy")
    return model, emb.embedding_variables[0]


def slot_stores(model, table):
    optimizer = model.optimizer
    return {n: optimizer.get_slot(table, n) for n in optimizer.get_slot_names()}


def assert_same_training_state(a, table_a, b, table_b, compare=assert_rows_bit_equal):
    compare(table_a, table_b)
    slots_a, slots_b = slot_stores(a, table_a), slot_stores(b, table_b)
    assert slots_a and sorted(slots_a) == sorted(slots_b)
    for name, store in slots_a.items():
        assert int(store.size()) == int(table_a.size())  # every row has its slot
        compare(store, slots_b[name])


def generic_training_data():
    rows, labels = parity_data(256, seed=14)
    return ragged_dataset(rows, labels)


@pytest.mark.parametrize("via", ["keras_file", "save_weights"])
@pytest.mark.parametrize("make_opt", GENERIC.values(), ids=GENERIC.keys())
def test_weights_files_keep_generic_path_slots(tmp_path, make_opt, via):
    train = generic_training_data()
    name = unique_name("generic")
    model, table = generic_model(make_opt, name)
    model.fit(train, epochs=1, verbose=0, shuffle=False)
    if via == "keras_file":
        model.save(str(tmp_path / "m.keras"))
        loaded = keras.models.load_model(str(tmp_path / "m.keras"))
        loaded_table = loaded.get_layer(name).embedding_variables[0]
    else:
        model.save_weights(str(tmp_path / "m.weights.h5"))
        loaded, loaded_table = generic_model(make_opt, name)
        loaded.optimizer.build(loaded.trainable_variables)  # Keras restores a built optimizer
        loaded.load_weights(str(tmp_path / "m.weights.h5"))
    assert_same_training_state(model, table, loaded, loaded_table)
    model.fit(train, epochs=1, verbose=0, shuffle=False)
    loaded.fit(train, epochs=1, verbose=0, shuffle=False)
    assert_same_training_state(model, table, loaded, loaded_table, assert_trained_alike)


@pytest.mark.parametrize("make_opt", GENERIC.values(), ids=GENERIC.keys())
def test_generic_path_slots_loaded_before_they_exist_are_restored_at_creation(tmp_path, make_opt):
    train = generic_training_data()
    name = unique_name("deferred")
    model, table = generic_model(make_opt, name, train_head=False)
    model.fit(train, epochs=1, verbose=0, shuffle=False)
    model.save_weights(str(tmp_path / "m.weights.h5"))
    loaded, loaded_table = generic_model(make_opt, name, train_head=False)
    loaded.load_weights(str(tmp_path / "m.weights.h5"))
    assert slot_stores(loaded, loaded_table) == {}  # the optimizer is not built yet
    loaded.optimizer.build(loaded.trainable_variables)  # as fit does first
    assert_same_training_state(model, table, loaded, loaded_table)
    model.fit(train, epochs=1, verbose=0, shuffle=False)
    loaded.fit(train, epochs=1, verbose=0, shuffle=False)
    assert_same_training_state(model, table, loaded, loaded_table, assert_trained_alike)


def test_keras_file_without_slot_entries_loads_with_fresh_slots(tmp_path, monkeypatch):
    """Files of versions that did not save the slot stores still load."""
    name = unique_name("old_file")
    model, table = generic_model(GENERIC["rmsprop"], name)
    model.fit(generic_training_data(), epochs=1, verbose=0)
    with monkeypatch.context() as m:
        m.setattr(slot_weights.SlotWeights, "save", lambda self, store: None)
        model.save(str(tmp_path / "old.keras"))
    loaded = keras.models.load_model(str(tmp_path / "old.keras"))
    loaded_table = loaded.get_layer(name).embedding_variables[0]
    assert_rows_bit_equal(table, loaded_table)
    slots = slot_stores(loaded, loaded_table)
    assert list(slots) == ["velocity"] and int(slots["velocity"].size()) == 0


def test_slot_entries_of_other_tables_are_an_error_naming_the_table(tmp_path):
    model, _ = generic_model(GENERIC["rmsprop"], unique_name("saved_slots"))
    model.fit(generic_training_data(), epochs=1, verbose=0)
    path = str(tmp_path / "m.weights.h5")
    model.save_weights(path)
    built, _ = generic_model(GENERIC["rmsprop"], unique_name("other"))
    built.optimizer.build(built.trainable_variables)
    with pytest.raises(ValueError, match=f"holds no slot 'velocity' of table '{built.layers[1].name}"
                                         "/table_0'"):
        built.load_weights(path)
    # The slot stores created after the load: the error comes when they are.
    later, _ = generic_model(GENERIC["rmsprop"], unique_name("later"))
    later.load_weights(path)
    with pytest.raises(ValueError, match=f"holds no slot 'velocity' of table '{later.layers[1].name}"
                                         "/table_0'"):
        later.optimizer.build(later.trainable_variables)


def test_custom_loop_with_model_trainable_variables_updates_each_table_once():
    """A custom loop may pass model.trainable_variables (gradient carriers included) and the
    tables too: each table gets one update."""
    rows, labels = parity_data(32, seed=10)
    results = []
    name = unique_name("loop")  # one name: the same initial rows in both tables
    for with_tables in (False, True):
        keras.utils.set_random_seed(0)  # the same Dense initial weights
        model, emb = ragged_model(None, name=name)
        opt = sok.OptimizerWrapper(keras.optimizers.SGD(0.5))
        ids = tf.ragged.constant(rows, dtype=tf.int64)
        with tf.GradientTape() as tape:
            loss = keras.losses.binary_crossentropy(labels[:, None], model(ids, training=True))
        variables = model.trainable_variables + (emb.embedding_variables if with_tables else [])
        opt.apply_gradients(zip(tape.gradient(loss, variables), variables))
        keys, values = table_state(emb.embedding_variables[0])[:2]
        results.append((keys, values))
    initial = sok.EmbeddingVariable(f"{name}/table_0", 8, initializer=UNIFORM).sparse_read(
        tf.constant(results[0][0]), training=False).numpy()
    assert (np.abs(results[0][1] - initial) > 1e-7).any(axis=1).all()  # every row moved once...
    np.testing.assert_array_equal(results[0][0], results[1][0])
    np.testing.assert_allclose(results[0][1], results[1][1], rtol=1e-6)  # ...and not twice


TF_KERAS_SCRIPT = textwrap.dedent("""
    import numpy as np, tensorflow as tf
    import sparse_operation_kit as sok
    keras = tf.keras
    assert keras.layers.Layer.__module__.startswith("tf_keras"), keras.layers.Layer.__module__
    rng = np.random.default_rng(1)
    labels = rng.integers(0, 2, 1024)
    rows = [[int(2 * rng.integers(0, 100) + y) for _ in range(rng.integers(1, 4))] for y in labels]
    ds = tf.data.Dataset.from_tensor_slices((tf.ragged.constant(rows, dtype=tf.int64),
                                             labels.astype(np.float32))).batch(32)

    def build(opt):
        inp = keras.Input(shape=(None,), dtype="int64", ragged=True)
        emb = sok.SparseEmbedding(8, combiners="mean", name="features",
                                  initializers=tf.random_uniform_initializer(-0.1, 0.1, seed=5))
        model = keras.Model(inp, keras.layers.Dense(1, activation="sigmoid")(emb(inp)))
        model.compile(optimizer=opt, loss="binary_crossentropy", metrics=["accuracy"])
        return model, emb

    model, emb = build(keras.optimizers.Adam(0.05))
    try:
        model.fit(ds, epochs=1, verbose=0)
        raise SystemExit("a plain tf_keras optimizer trained nothing without an error")
    except TypeError as e:
        assert "layer 'features'" in str(e) and "sok.OptimizerWrapper" in str(e), str(e)

    model, emb = build(sok.OptimizerWrapper(keras.optimizers.Adam(0.05)))
    table = emb.embedding_variables[0]
    keys = tf.constant(sorted({k for r in rows for k in r}), tf.int64)
    before = table.sparse_read(keys, training=False).numpy()
    history = model.fit(ds, epochs=4, verbose=0)
    after = table.sparse_read(keys, training=False).numpy()
    changed = (np.abs(after - before) > 1e-6).any(axis=1)
    assert changed.all(), f"{(~changed).sum()} rows did not train"
    assert history.history["accuracy"][-1] > 0.9, history.history
    size = int(table.size())
    expected = model.predict(ds, verbose=0)
    model.evaluate(ds.map(lambda x, y: (x + 100000, y)), verbose=0)
    assert int(table.size()) == size, "evaluate inserted keys"
    model.save(SAVE_DIR + "/m.keras")
    loaded = keras.models.load_model(SAVE_DIR + "/m.keras")
    assert loaded.predict(ds, verbose=0).tobytes() == expected.tobytes()
    model.save_weights(SAVE_DIR + "/w.weights.h5")
    fresh, _ = build(sok.OptimizerWrapper(keras.optimizers.Adam(0.05)))
    fresh.load_weights(SAVE_DIR + "/w.weights.h5")
    assert fresh.predict(ds, verbose=0).tobytes() == expected.tobytes()
    # Traces training calls: no carriers there.
    tf.saved_model.save(model, SAVE_DIR + "/saved_model")
    print("TF_KERAS_OK", history.history["accuracy"][-1])
""")


def test_tf_keras_fit_trains_sok_tables(tmp_path):
    pytest.importorskip("tf_keras")
    env = subprocess_env()
    env["TF_USE_LEGACY_KERAS"] = "1"
    script = "SAVE_DIR = " + repr(str(tmp_path)) + "\n" + TF_KERAS_SCRIPT
    proc = subprocess.run(
        [sys.executable, "-c", script],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=os.path.dirname(os.path.abspath(__file__)),
    )
    assert proc.returncode == 0 and "TF_KERAS_OK" in proc.stdout, (
        proc.stdout[-3000:] + proc.stderr[-5000:]
    )


def test_static_table_in_fit_is_an_error_not_a_silent_no_op():
    static = sok.Variable(np.ones([VOCAB, 2], np.float32), name=unique_name("static"))
    inp = keras.Input(shape=(None,), dtype="int64", ragged=True)
    emb = sok.SparseEmbedding(
        embedding_variables=[static], combiners="sum", name=unique_name("with_static")
    )
    model = keras.Model(inp, keras.layers.Dense(1)(emb(inp)))
    model.compile(optimizer=sok.OptimizerWrapper(keras.optimizers.SGD(0.1)), loss="mse")
    rows, labels = parity_data(32, seed=11)
    with pytest.raises(
        TypeError,
        match=f"layer '{emb.name}': its static table .* cannot be trained by Keras 3's fit",
    ):
        model.fit(ragged_dataset(rows, labels), epochs=1, verbose=0)
    np.testing.assert_array_equal(static.numpy(), np.ones([VOCAB, 2], np.float32))


@pytest.mark.parametrize("layer", ["sparse", "embedding"])
def test_fit_with_dense_padded_ids(layer):
    """Dense [batch, n] ids padded with padding_id: the padding is never looked up, inserted or
    pooled (without padding_id it would be an id like any other)."""
    rows, labels = parity_data(1024, seed=12)
    padded = np.full([len(rows), 3], -1, np.int64)
    for i, r in enumerate(rows):
        padded[i, :len(r)] = r
    name = unique_name("padded")
    inp = keras.Input(shape=(3,), dtype="int64")
    if layer == "sparse":
        emb = sok.SparseEmbedding(
            8, combiners="mean", initializers=UNIFORM, padding_id=-1, name=name
        )
    else:
        emb = sok.Embedding(8, combiner="mean", initializer=UNIFORM, padding_id=-1, name=name)
    model = keras.Model(inp, keras.layers.Dense(1, activation="sigmoid")(emb(inp)))
    model.compile(
        optimizer=sok.OptimizerWrapper(keras.optimizers.Adam(0.05)),
        loss="binary_crossentropy",
        metrics=["accuracy"],
    )
    table = emb.embedding_variables[0]
    # Pooling skips the padding: the same output as the ragged ids.
    ragged = tf.ragged.constant(rows[:8], dtype=tf.int64)
    np.testing.assert_array_equal(emb(tf.constant(padded[:8])), emb(ragged))
    history = model.fit(
        tf.data.Dataset.from_tensor_slices((padded, labels)).batch(32), epochs=4, verbose=0
    )
    keys = set(table.export()[0].numpy().tolist())
    assert -1 not in keys and keys == {k for r in rows for k in r}
    assert history.history["accuracy"][-1] > 0.9
    assert emb.get_config()["padding_id"] == -1
    assert type(emb).from_config(emb.get_config()).padding_id == -1


def test_embedding_without_combiner_gives_zero_rows_for_padding():
    emb = sok.Embedding(3, initializer=UNIFORM, padding_id=0, name=unique_name("pad_rows"))
    ids = tf.constant([[4, 0, 0], [5, 6, 0]], tf.int64)
    out = emb(ids, training=True).numpy()
    assert out.shape == (2, 3, 3)
    np.testing.assert_array_equal(out[0, 1:], 0.0)
    np.testing.assert_array_equal(out[1, 2], 0.0)
    np.testing.assert_array_equal(
        out[1, :2], emb.embedding_variable.sparse_read(tf.constant([5, 6], tf.int64))
    )
    assert sorted(emb.embedding_variable.export()[0].numpy().tolist()) == [4, 5, 6]


class ParityModel(keras.Model):
    def __init__(self, name):
        super().__init__()
        self.features = sok.SparseEmbedding(8, combiners="sum", initializers=UNIFORM, name=name)
        self.head = keras.layers.Dense(1, activation="sigmoid")

    def call(self, ids, training=None):
        return self.head(self.features(ids, training=training))


@pytest.mark.parametrize("run_eagerly", [False, True])
def test_fit_of_a_subclassed_model(run_eagerly):
    rows, labels = parity_data(512, seed=13)
    model = ParityModel(unique_name("subclassed"))
    model.compile(
        optimizer=sok.OptimizerWrapper(keras.optimizers.Adagrad(0.3)),
        loss="binary_crossentropy",
        metrics=["accuracy"],
        run_eagerly=run_eagerly,
    )
    history = model.fit(ragged_dataset(rows, labels), epochs=4, verbose=0)
    table = model.features.embedding_variables[0]
    assert int(table.size()) == len({k for r in rows for k in r})
    assert table_state(table)[2].shape[1] == 1  # Adagrad's accumulator beside each row
    assert history.history["accuracy"][-1] > 0.9


@pytest.mark.parametrize("make_init", [
    lambda: tf.compat.v1.truncated_normal_initializer(stddev=0.3, seed=3),
    lambda: tf.compat.v1.random_uniform_initializer(-0.2, 0.2, seed=4),
    lambda: tf.compat.v1.glorot_uniform_initializer(seed=2),
], ids=["truncated_normal", "random_uniform", "glorot_uniform"])
def test_tf1_initializers_round_trip_through_keras_files(tmp_path, make_init):
    """DeepRec and SOK 2.x programs pass tf.compat.v1 initializers: a `.keras` file rebuilds the
    same one, so unseen ids start from the same rows after load_model."""
    inp = keras.Input(shape=(None,), dtype="int64", ragged=True)
    emb = sok.Embedding(4, combiner="sum", initializer=make_init(), name=unique_name("tf1_init"))
    model = keras.Model(inp, emb(inp))
    unseen = tf.ragged.constant([[3, 7], [11]], dtype=tf.int64)
    expected = model.predict(unseen, verbose=0)
    path = str(tmp_path / "tf1_init.keras")
    model.save(path)
    got = keras.models.load_model(path).predict(unseen, verbose=0)
    assert got.tobytes() == expected.tobytes()
