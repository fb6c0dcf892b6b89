"""TensorFlow's own lookups under horovodrun against one process: what a DeepRec program calls
(tf.nn.embedding_lookup, embedding_lookup_sparse, safe_embedding_lookup_sparse) and Keras's
sok.Embedding without a combiner fetch each row of an Embedding Variable from its owner, so the
ranks train one table. Every rank looks up its slice of the global batch and takes SGD steps
through sok.OptimizerWrapper; it checks each step's embeddings and, at the end, every row it owns
(and that it holds no other key) against plain TensorFlow on the whole global batch: eagerly, in
a tf.function, and in a TF1 graph and Session (tf.compat.v1's SGD wrapped). A SOK 2.x
DynamicVariable's tf.nn.embedding_lookup reads its own rank's rows, as in SOK 2.x.

    python tf_api.py      (under horovodrun -np N; one process is the world of one)
"""
import numpy as np
import tensorflow as tf
from mp_common import (
    GLOBAL_BATCH,
    HYPER,
    check_ev_rows,
    close,
    dense_init,
    done,
    labels,
    loss_fn,
    main_guard,
    make_keras_optimizer,
    make_sok_table,
    rank_slice,
    setup,
    specs,
)

import sparse_operation_kit as sok

STEPS = 4
K = 3  # ids per sample


def positions(step, spec, salt):
    rng = np.random.default_rng(100 * step + 10 * salt + spec.rows)
    return rng.integers(0, spec.rows, [GLOBAL_BATCH, K])


def as_sparse(values, pos, mode="eager"):
    """[batch, K] as a SparseTensor (TF1: its value for a feed), an entry per id; entries of
    position -1 (the safe lookup's invalid ids) keep -1."""
    idx = np.stack(np.meshgrid(np.arange(pos.shape[0]), np.arange(K), indexing="ij"), -1)
    if mode == "tf1":
        return tf.compat.v1.SparseTensorValue(idx.reshape(-1, 2), values.reshape(-1), pos.shape)
    return tf.SparseTensor(idx.reshape(-1, 2), tf.constant(values.reshape(-1)), pos.shape)


WHAT = ["embedding_lookup", "Embedding layer (TF1: v1 embedding_lookup)", "embedding_lookup_sparse",
        "safe_embedding_lookup_sparse"]


def lookups(tables, layer, dense0, dense_keras, sparse1, safe0):
    """The four pooled embeddings a step trains ([batch, dim] each); TF1 (layer None) reads the
    second with the v1 API instead of Keras's layer."""
    second = (layer(dense_keras) if layer is not None
              else tf.compat.v1.nn.embedding_lookup(tables[0], dense_keras))
    return [tf.reduce_sum(tf.nn.embedding_lookup(tables[0], dense0), axis=1),
            tf.reduce_sum(second, axis=1),
            tf.nn.embedding_lookup_sparse(tables[1], sparse1, None, combiner="mean"),
            tf.nn.safe_embedding_lookup_sparse(tables[0], safe0, combiner="sum")]


def tf1_step(all_specs, rank, world):
    """(tables, the step: inputs -> embeddings, the tables' exported rows now, their initial
    rows) in a TF1 graph and Session."""
    spread, local = all_specs
    graph = tf.Graph()
    with graph.as_default():
        tables = [make_sok_table(s) for s in all_specs]
        holders = [tf.compat.v1.placeholder(spread.key_dtype, [None, K]),
                   tf.compat.v1.placeholder(spread.key_dtype, [None, K]),
                   tf.compat.v1.sparse_placeholder(local.key_dtype, [None, K]),
                   tf.compat.v1.sparse_placeholder(spread.key_dtype, [None, K]),
                   tf.compat.v1.placeholder(tf.float32, [None])]
        w = tf.constant(dense_init(3 * spread.dim + local.dim))
        embs = lookups(tables, None, *holders[:-1])
        opt = sok.OptimizerWrapper(tf.compat.v1.train.GradientDescentOptimizer(HYPER["sgd"]["lr"]))
        train_op = opt.minimize(loss_fn(embs, w, holders[-1]), var_list=tables)
        initial = [t.sparse_read(tf.constant(s.vocab, s.key_dtype), training=False)
                   for s, t in zip(all_specs, tables)]
        exports = [t.export()[:3] for t in tables]
        sess = tf.compat.v1.Session(graph=graph)
        sess.run(tf.compat.v1.global_variables_initializer())
        sess.run([t.initializer for t in tables])
    initial = sess.run(initial)

    def step(*inputs):
        return sess.run([embs, train_op], dict(zip(holders, inputs)))[0]

    def rows():
        return sess.run(exports)

    return tables, step, rows, initial


def run(mode):
    _, rank, world = setup()
    tag = mode
    spread, local = all_specs = [s for s in specs(world, prefix=f"tfapi_{tag}_") if s.kind == "ev"]
    w = tf.constant(dense_init(3 * spread.dim + local.dim))
    if mode == "tf1":
        tables, step_fn, rows, initial = tf1_step(all_specs, rank, world)
    else:
        tables = [make_sok_table(s) for s in all_specs]
        initial = [t.sparse_read(tf.constant(s.vocab, s.key_dtype), training=False)
                   for s, t in zip(all_specs, tables)]
        layer = sok.Embedding(embedding_variable=tables[0])
        opt = sok.OptimizerWrapper(make_keras_optimizer("sgd"))

        def train(*inputs):
            with tf.GradientTape() as tape:
                embs = lookups(tables, layer, *inputs[:-1])
                loss = loss_fn(embs, w, inputs[-1])
            opt.apply_gradients(zip(tape.gradient(loss, tables), tables))
            return [e.numpy() for e in embs] if mode == "eager" else embs

        traced = tf.function(train) if mode == "function" else train

        def step_fn(*inputs):
            return [np.asarray(e) for e in traced(*inputs)]

        def rows():
            return [[x.numpy() for x in t.export()[:3]] for t in tables]
    ref = [tf.Variable(r) for r in initial]
    sl = rank_slice(rank, world)
    touched = [np.zeros(spread.rows, bool), np.zeros(local.rows, bool)]

    def keys(spec, pos):
        return np.where(pos >= 0, spec.vocab[np.maximum(pos, 0)], -1).astype(
            spec.key_dtype.as_numpy_dtype)

    for step in range(STEPS):
        pos = [positions(step, spread, 0), positions(step, spread, 1), positions(step, local, 2),
               positions(step, spread, 3)]
        pos[3][::2, 1] = -1  # invalid ids, dropped by the safe lookup: so are negative keys
        pos[3][spread.vocab[pos[3]] < 0] = -1
        y = labels(3, step)
        feed = (keys(spread, pos[0][sl]), keys(spread, pos[1][sl]),
                as_sparse(keys(local, pos[2][sl]), pos[2][sl], mode),
                as_sparse(keys(spread, pos[3][sl]), pos[3][sl], mode), y[sl])
        embs = step_fn(*feed)
        with tf.GradientTape() as tape:
            rembs = [tf.reduce_sum(tf.gather(ref[0], pos[0]), axis=1),
                     tf.reduce_sum(tf.gather(ref[0], pos[1]), axis=1),
                     tf.reduce_mean(tf.gather(ref[1], pos[2]), axis=1),
                     tf.nn.safe_embedding_lookup_sparse(ref[0], as_sparse(pos[3], pos[3]),
                                                        combiner="sum")]
            rloss = loss_fn(rembs, w, y)
        for i, what in enumerate(WHAT):
            close(f"{tag} step {step}: {what}", embs[i], rembs[i].numpy()[sl])
        for r, g in zip(ref, tape.gradient(rloss, ref)):
            r.assign_sub(HYPER["sgd"]["lr"] * tf.convert_to_tensor(g))
        for p in pos[:2] + pos[3:]:
            touched[0][p[p >= 0]] = True
        touched[1][pos[2].reshape(-1)] = True
    for i, (s, exported) in enumerate(zip(all_specs, rows())):
        check_ev_rows(f"{tag}: {s.name} after {STEPS} steps", s, exported, ref[i].numpy(), [],
                      "sgd", touched[i], rank, world)
    if mode == "eager":
        # SOK 2.x's DynamicVariable keeps SOK 2.x's local read: this rank's table, no exchange.
        dyn = sok.DynamicVariable(dimension=2, name="tfapi_dyn", mode="distributed")
        tf.nn.embedding_lookup(dyn, tf.constant([100 * rank + 1, 100 * rank + 2], tf.int64))
        held = int(tf.size(sok.export(dyn)[0]))
        assert held == 2, f"rank {rank}: {held} keys"
    done(f"tf api {tag}: TensorFlow's lookups (TF2: Keras's Embedding too) on {world} ranks equal "
         f"the reference (global batch {GLOBAL_BATCH})")


def main():
    for mode in ("eager", "function", "tf1"):
        run(mode)


if __name__ == "__main__":
    main_guard(main)
