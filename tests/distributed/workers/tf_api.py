"""TensorFlow's own lookups under horovodrun against one process: what a DeepRec program calls
(tf.nn.embedding_lookup, embedding_lookup_sparse, safe_embedding_lookup_sparse) and Keras's
sok.Embedding without a combiner fetch each row from its owner, on Embedding Variables and on
sok.Variable tables (a rank holds a shard), so the ranks train one table. Every rank looks up its
slice of the global batch and takes SGD steps through sok.OptimizerWrapper; it checks each
step's embeddings and, at the end, every row it owns (and that it holds no other key; a static
table's shard) against plain TensorFlow on the whole global batch. Eagerly, then in a
tf.function.

    python tf_api.py      (under horovodrun -np N; one process is the world of one)
"""
import numpy as np
import tensorflow as tf
from mp_common import (
    GLOBAL_BATCH,
    HYPER,
    check_ev_rows,
    check_static_rows,
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
    static_init,
)

import sparse_operation_kit as sok

STEPS = 4
K = 3  # ids per sample


def positions(step, spec, salt):
    rng = np.random.default_rng(100 * step + 10 * salt + spec.rows)
    return rng.integers(0, spec.rows, [GLOBAL_BATCH, K])


def as_sparse(values, pos):
    """[batch, K] as a SparseTensor, an entry per id; entries of position -1 (the safe lookup's
    invalid ids) keep -1."""
    idx = np.stack(np.meshgrid(np.arange(pos.shape[0]), np.arange(K), indexing="ij"), -1)
    return tf.SparseTensor(idx.reshape(-1, 2), tf.constant(values.reshape(-1)), pos.shape)


def run(graph_function):
    _, rank, world = setup()
    tag = "function" if graph_function else "eager"
    spread, local, st_spread, st_local = specs(world, prefix=f"tfapi_{tag}_")
    all_specs = [spread, local, st_spread, st_local]
    tables = [make_sok_table(s) for s in all_specs]
    ref = [tf.Variable(t.sparse_read(tf.constant(s.vocab, s.key_dtype), training=False)
                       if s.kind == "ev" else static_init(s)) for s, t in zip(all_specs, tables)]
    layer = sok.Embedding(embedding_variable=tables[0])
    w = tf.constant(dense_init(3 * spread.dim + local.dim + st_spread.dim + st_local.dim))
    opt = sok.OptimizerWrapper(make_keras_optimizer("sgd"))
    sl = rank_slice(rank, world)
    touched = [np.zeros(spread.rows, bool), np.zeros(local.rows, bool)]

    def keys(spec, pos):
        return np.where(pos >= 0, spec.vocab[np.maximum(pos, 0)], -1).astype(
            spec.key_dtype.as_numpy_dtype)

    def train(dense0, dense_keras, sparse1, safe0, dense2, sparse3, y):
        with tf.GradientTape() as tape:
            embs = [tf.reduce_sum(tf.nn.embedding_lookup(tables[0], dense0), axis=1),
                    tf.reduce_sum(layer(dense_keras), axis=1),
                    tf.nn.embedding_lookup_sparse(tables[1], sparse1, None, combiner="mean"),
                    tf.nn.safe_embedding_lookup_sparse(tables[0], safe0, combiner="sum"),
                    tf.reduce_sum(tf.nn.embedding_lookup(tables[2], dense2), axis=1),
                    tf.nn.embedding_lookup_sparse(tables[3], sparse3, None, combiner="sqrtn")]
            loss = loss_fn(embs, w, y)
        opt.apply_gradients(zip(tape.gradient(loss, tables), tables))
        return embs

    step_fn = tf.function(train) if graph_function else train
    for step in range(STEPS):
        pos = [positions(step, spread, 0), positions(step, spread, 1), positions(step, local, 2),
               positions(step, spread, 3), positions(step, st_spread, 4),
               positions(step, st_local, 5)]
        pos[3][::2, 1] = -1  # invalid ids, dropped by the safe lookup: so are negative keys
        pos[3][spread.vocab[pos[3]] < 0] = -1
        y = labels(3, step)
        embs = step_fn(tf.constant(keys(spread, pos[0][sl])),
                       tf.constant(keys(spread, pos[1][sl])),
                       as_sparse(keys(local, pos[2][sl]), pos[2][sl]),
                       as_sparse(keys(spread, pos[3][sl]), pos[3][sl]),
                       tf.constant(keys(st_spread, pos[4][sl])),
                       as_sparse(keys(st_local, pos[5][sl]), pos[5][sl]), tf.constant(y[sl]))
        with tf.GradientTape() as tape:
            rembs = [tf.reduce_sum(tf.gather(ref[0], pos[0]), axis=1),
                     tf.reduce_sum(tf.gather(ref[0], pos[1]), axis=1),
                     tf.reduce_mean(tf.gather(ref[1], pos[2]), axis=1),
                     tf.nn.safe_embedding_lookup_sparse(ref[0], as_sparse(pos[3], pos[3]),
                                                        combiner="sum"),
                     tf.reduce_sum(tf.gather(ref[2], pos[4]), axis=1),
                     tf.reduce_sum(tf.gather(ref[3], pos[5]), axis=1) / np.sqrt(K)]
            rloss = loss_fn(rembs, w, y)
        for i, what in enumerate(["embedding_lookup", "Embedding layer",
                                  "embedding_lookup_sparse", "safe_embedding_lookup_sparse",
                                  "embedding_lookup of a sok.Variable",
                                  "embedding_lookup_sparse of a sok.Variable"]):
            close(f"{tag} step {step}: {what}", embs[i].numpy(), rembs[i].numpy()[sl])
        for r, g in zip(ref, tape.gradient(rloss, ref)):
            r.assign_sub(HYPER["sgd"]["lr"] * tf.convert_to_tensor(g))
        for p in pos[:2] + pos[3:4]:
            touched[0][p[p >= 0]] = True
        touched[1][pos[2].reshape(-1)] = True
    for i, (s, t) in enumerate(zip([spread, local], tables)):
        check_ev_rows(f"{tag}: {s.name} after {STEPS} steps", s, [x.numpy() for x in t.export()[:3]],
                      ref[i].numpy(), [], "sgd", touched[i], rank, world)
    for i in (2, 3):
        check_static_rows(f"{tag}: {all_specs[i].name} after {STEPS} steps", all_specs[i],
                          tables[i].numpy(), ref[i].numpy(), rank, world)
    done(f"tf api {tag}: TensorFlow's lookups and Keras's Embedding on {world} ranks equal the "
         f"reference (global batch {GLOBAL_BATCH})")


def main():
    run(graph_function=False)
    run(graph_function=True)


if __name__ == "__main__":
    main_guard(main)
