"""Keras 3's compile/fit under horovodrun against one process: a model of two SOK layers (an
Embedding Variable spread over the ranks and one whole on the last rank) and two Dense layers,
compiled with sok.OptimizerWrapper(SGD, average_over_ranks=True), each rank fitting its slice of
every global batch. After the epoch every rank's Dense weights and the rows it owns equal plain
TensorFlow's steps on the global batches (tables as tf.Variables, the same Keras loss).

Then .keras files (with $SOK_TEST_KERAS_DIR): each rank saves rank<r>-of-<N>.keras and loads it
back to the bit; another rank's file is refused. $SOK_TEST_KERAS_WHOLE (a one-process file of
this model): every rank loads it and keeps exactly the rows it owns. $SOK_TEST_KERAS_SHARD (a
shard of another world): loading it is refused.

    python keras_fit.py      (under horovodrun -np N; one process is the world of one)
"""
import os

import keras
import numpy as np
import tensorflow as tf
from mp_common import GLOBAL_BATCH, check_ev_rows, close, done, main_guard, setup, specs

import sparse_operation_kit as sok

BATCHES = 4
LR = 0.5


def global_data(spec, seed):
    """BATCHES global batches: per sample 1-3 vocab positions, and a label."""
    rng = np.random.default_rng(seed)
    rows = [[int(p) for p in rng.integers(0, spec.rows, rng.integers(1, 4))]
            for _ in range(BATCHES * GLOBAL_BATCH)]
    return rows, rng.integers(0, 2, len(rows)).astype(np.float32)


def rank_rows(items, rank, world):
    """This rank's slice of every global batch, in order."""
    per = GLOBAL_BATCH // world
    return [items[b * GLOBAL_BATCH + rank * per + i] for b in range(BATCHES) for i in range(per)]


def main():
    _, rank, world = setup()
    keras.utils.set_random_seed(1)  # every rank draws the same Dense weights
    spread, local = [s for s in specs(world, prefix="fit_") if s.kind == "ev"]
    init = tf.random_uniform_initializer(-0.5, 0.5, seed=4)
    tables = [sok.get_embedding_variable(s.name, s.dim, key_dtype=s.key_dtype, initializer=init)
              for s in (spread, local)]
    tables[1].target_gpu = local.target
    a, b = global_data(spread, 1), global_data(local, 2)
    labels = a[1]

    inputs = [keras.Input(shape=(None,), dtype=s.key_dtype.name, ragged=True) for s in (spread, local)]
    embs = [sok.Embedding(embedding_variable=t, combiner=c)(x)
            for t, c, x in zip(tables, ["sum", "mean"], inputs)]
    layers = [keras.layers.Dense(4, activation="relu"), keras.layers.Dense(1, activation="sigmoid")]
    model = keras.Model(inputs, layers[1](layers[0](keras.layers.Concatenate()(embs))))
    dense_vars = [v for layer in layers for v in (layer.kernel, layer.bias)]
    model.compile(optimizer=sok.OptimizerWrapper(keras.optimizers.SGD(LR), average_over_ranks=True),
                  loss="binary_crossentropy")
    dense0 = [v.numpy() for v in dense_vars]
    # The reference's tables: their initial rows (any rank reads any key's) as tf.Variables.
    ref_tables = [tf.Variable(t.sparse_read(tf.constant(s.vocab, s.key_dtype), training=False))
                  for s, t in zip((spread, local), tables)]

    def keyed(spec, rows):
        return tf.ragged.constant([[spec.vocab[p] for p in r] for r in rows], dtype=spec.key_dtype)

    per = GLOBAL_BATCH // world
    x = tuple(keyed(s, rank_rows(d[0], rank, world)) for s, d in ((spread, a), (local, b)))
    y = np.array(rank_rows(list(labels), rank, world), np.float32)
    model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(per), epochs=1, shuffle=False,
              verbose=0)

    ref_dense = [tf.Variable(v) for v in dense0]
    bce = keras.losses.BinaryCrossentropy()
    for step in range(BATCHES):
        sl = slice(step * GLOBAL_BATCH, (step + 1) * GLOBAL_BATCH)
        with tf.GradientTape() as tape:
            pooled = []
            for ref, rows, combine in zip(ref_tables, (a[0][sl], b[0][sl]),
                                          (tf.reduce_sum, tf.reduce_mean)):
                ids = tf.ragged.constant(rows, dtype=tf.int64)
                pooled.append(combine(tf.gather(ref, ids), axis=1))
            w1, b1, w2, b2 = ref_dense
            h = tf.nn.relu(tf.matmul(tf.concat(pooled, 1), w1) + b1)
            loss = bce(labels[sl][:, None], tf.sigmoid(tf.matmul(h, w2) + b2))
        variables = ref_tables + ref_dense
        for v, g in zip(variables, tape.gradient(loss, variables)):
            v.assign_sub(LR * tf.convert_to_tensor(g))
    for got, want, what in zip(dense_vars, ref_dense, ["w1", "b1", "w2", "b2"]):
        close(f"fit: Dense weight {what}", got.numpy(), want.numpy())
    for s, t, ref, (rows, _) in zip((spread, local), tables, ref_tables, (a, b)):
        touched = np.zeros(s.rows, bool)
        touched[[p for r in rows for p in r]] = True
        check_ev_rows(f"fit: {s.name}", s, [v.numpy() for v in t.export()[:3]], ref.numpy(), [],
                      "sgd", touched, rank, world)
    done(f"keras fit on {world} ranks: Dense weights and table rows equal one process "
         f"({BATCHES} global batches of {GLOBAL_BATCH})")
    if os.environ.get("SOK_TEST_KERAS_DIR"):
        check_files(model, tables, os.environ["SOK_TEST_KERAS_DIR"], rank, world)
    if os.environ.get("SOK_TEST_KERAS_WHOLE"):
        check_whole_file(os.environ["SOK_TEST_KERAS_WHOLE"], tables, rank, world)
    if os.environ.get("SOK_TEST_KERAS_SHARD"):
        refused(os.environ["SOK_TEST_KERAS_SHARD"])
        done("keras files: a shard of another world is refused")


def rows_by_key(table):
    keys, values = (x.numpy() for x in table.export()[:2])
    order = np.argsort(keys)
    return keys[order], values[order]


def sok_tables(model):
    return [t for layer in model.layers if isinstance(layer, sok.Embedding)
            for t in layer.embedding_variables]


def refused(path):
    try:
        keras.models.load_model(path)
    except ValueError as e:
        assert "shard of table" in str(e) and "sok.dump" in str(e), e
        return
    raise AssertionError(f"loading {path} on rank {sok.rank()} of {sok.num_ranks()} was not refused")


def check_files(model, tables, out_dir, rank, world):
    """Each rank's file holds its shard and loads back on that rank to the bit."""
    path = os.path.join(out_dir, f"rank{rank}-of-{world}.keras")
    model.save(path)
    loaded = sok_tables(keras.models.load_model(path))
    for t, u in zip(tables, loaded, strict=True):
        for a, b in zip(rows_by_key(t), rows_by_key(u)):
            assert a.tobytes() == b.tobytes(), f"rank {rank}: {t.name} reloaded differs"
    if world > 1:
        # Every rank saved before any rank reads another's file: a barrier on the host (on GPUs
        # the all-reduce's launch returns at once; its value comes when every rank joined).
        sok.all_reduce([tf.zeros([1])])[0].numpy()
        refused(os.path.join(out_dir, f"rank{(rank + 1) % world}-of-{world}.keras"))
    done("keras files: each rank's shard saves and loads back to the bit")


def check_whole_file(path, trained, rank, world):
    """A one-process file of this model (rank0-of-1.keras) loads onto every rank: the spread
    table keeps the keys this rank owns, with the rows this rank trained (the one-process fit
    equals this one); the other table's rows lie on their owners too."""
    loaded = sok_tables(keras.models.load_model(path))
    (keys, values), (want_keys, want_values) = rows_by_key(loaded[0]), rows_by_key(trained[0])
    assert keys.tolist() == want_keys.tolist(), f"rank {rank}: keys {keys} != {want_keys}"
    close("one-process file: rows of the spread table", values, want_values)
    keys = rows_by_key(loaded[1])[0].astype(np.int64)
    target = loaded[1].target_gpu  # the file's placement, as the layer's config gives it
    owners = np.mod(keys, world) if target < 0 else np.full(keys.shape, target)
    assert (owners == rank).all(), f"rank {rank}: {loaded[1].name} holds keys {keys}"
    done("keras one-process file: every rank keeps the rows it owns")


if __name__ == "__main__":
    main_guard(main)
