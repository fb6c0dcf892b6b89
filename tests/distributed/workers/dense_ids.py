"""Dense ids ([batch, k] tensors) under horovodrun against one process: the lookups whose dedup
and exchange plan skip the requester's wait (padded keys, parallel/distributed.py). Every rank
looks up its slice of the global batch in both Embedding Variables of mp_common (one spread over
the ranks, one whole on the last rank), in one lookup_sparse call, eagerly and in a tf.function,
and trains them with Adam through sok.OptimizerWrapper; it checks each step's embeddings and, at
the end, every row and slot it owns against plain TensorFlow on the whole global batch.

    python dense_ids.py      (under horovodrun -np N; one process is the world of one)
"""
import numpy as np
import tensorflow as tf
from mp_common import (
    GLOBAL_BATCH,
    check_ev_rows,
    close,
    dense_init,
    done,
    epsilon,
    labels,
    loss_fn,
    main_guard,
    make_keras_optimizer,
    make_sok_table,
    num_slots,
    rank_slice,
    reference_ev_update,
    setup,
    slot_initial,
    specs,
)

import sparse_operation_kit as sok

STEPS = 6
IDS_PER_SAMPLE = 3
KIND = "adam"
COMBINERS = ["sum", "mean"]


def positions(step, spec):
    """[GLOBAL_BATCH, IDS_PER_SAMPLE] vocab positions: repeats inside a rank's slice and across
    ranks (a few rows only), so requesters and owners both dedup."""
    rng = np.random.default_rng(1000 * step + spec.rows)
    return rng.integers(0, min(spec.rows, 5), [GLOBAL_BATCH, IDS_PER_SAMPLE])


def reference_embedding(table, pos, combiner):
    rows = tf.gather(table, pos)  # [batch, k, dim]; the gradient sums repeated rows
    out = tf.reduce_sum(rows, axis=1)
    return out / IDS_PER_SAMPLE if combiner == "mean" else out


def run(graph_function):
    _, rank, world = setup()
    tag = "function" if graph_function else "eager"
    evs = [s for s in specs(world, prefix=f"dense_{tag}_") if s.kind == "ev"]
    tables = [make_sok_table(s) for s in evs]
    ref = [tf.Variable(t.sparse_read(tf.constant(s.vocab, s.key_dtype), training=False))
           for s, t in zip(evs, tables)]
    ref_slots = [[tf.Variable(tf.fill(tf.shape(r), slot_initial(KIND)))
                  for _ in range(num_slots(KIND))] for r in ref]
    w = tf.constant(dense_init(sum(s.dim for s in evs)))
    opt = sok.OptimizerWrapper(make_keras_optimizer(KIND))
    sl = rank_slice(rank, world)
    touched = [np.zeros(s.rows, bool) for s in evs]

    def train(ids, y):
        with tf.GradientTape() as tape:
            embs = sok.lookup_sparse(tables, ids, combiners=COMBINERS)
            loss = loss_fn(embs, w, y)
        opt.apply_gradients(zip(tape.gradient(loss, tables), tables))
        return embs

    step_fn = tf.function(train) if graph_function else train
    for step in range(STEPS):
        pos = [positions(step, s) for s in evs]
        y = labels(4, step)
        ids = [tf.constant(s.vocab[p[sl]], s.key_dtype) for s, p in zip(evs, pos)]
        embs = step_fn(ids, tf.constant(y[sl]))
        with tf.GradientTape() as tape:
            rembs = [reference_embedding(r, p, c) for r, p, c in zip(ref, pos, COMBINERS)]
            rloss = loss_fn(rembs, w, y)
        rgrads = tape.gradient(rloss, ref)
        for i in range(len(evs)):
            close(f"{tag} step {step}: embeddings of {evs[i].name}", embs[i].numpy(),
                  rembs[i].numpy()[sl])
            reference_ev_update(KIND, ref[i], ref_slots[i], rgrads[i], step + 1,
                                epsilon(KIND, keras_api=True))
            touched[i][pos[i].reshape(-1)] = True
    if graph_function:  # the padded path is the one that ran
        graph = step_fn.get_concrete_function(ids, tf.constant(y[sl])).graph
        padded = {op.type for op in graph.get_operations()
                  if op.type in ("SokUniqueKeys", "SokExchangeOwnerKeys") and op.get_attr("padded")}
        assert padded == {"SokUniqueKeys", "SokExchangeOwnerKeys"} or world == 1, padded
    # An evaluation lookup of new and known keys reads without inserting.
    sizes = [int(t.size()) for t in tables]
    pos = [np.random.default_rng(7).integers(0, s.rows, [GLOBAL_BATCH, IDS_PER_SAMPLE])
           for s in evs]
    ids = [tf.constant(s.vocab[p[sl]], s.key_dtype) for s, p in zip(evs, pos)]
    embs = sok.lookup_sparse(tables, ids, combiners=COMBINERS, training=False)
    for i, s in enumerate(evs):
        close(f"{tag}: evaluation lookup of {s.name}", embs[i].numpy(),
              reference_embedding(ref[i], pos[i], COMBINERS[i]).numpy()[sl])
    assert [int(t.size()) for t in tables] == sizes, "an evaluation lookup inserted keys"
    for i, (s, t) in enumerate(zip(evs, tables)):
        check_ev_rows(f"{tag}: {s.name} after {STEPS} steps", s,
                      [x.numpy() for x in t.export()[:3]], ref[i].numpy(),
                      [v.numpy() for v in ref_slots[i]], KIND, touched[i], rank, world)
    done(f"dense ids {tag}: embeddings and {STEPS} {KIND} steps equal the reference "
         f"(global batch {GLOBAL_BATCH}, {IDS_PER_SAMPLE} ids a sample)")


def main():
    run(graph_function=False)
    run(graph_function=True)


if __name__ == "__main__":
    main_guard(main)
