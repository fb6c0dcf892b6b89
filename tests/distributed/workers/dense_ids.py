"""Dense ids ([batch, k] tensors) under horovodrun against one process: the lookups whose dedup
and exchange plan skip the requester's wait (padded keys, parallel/distributed.py). Every rank
looks up its slice of the global batch in one lookup_sparse call and trains with Adam through
sok.OptimizerWrapper; it checks each step's embeddings and, at the end, every row and slot it
owns against plain TensorFlow on the whole global batch. Phases: mp_common's two Embedding
Variables (one spread over the ranks, one whole on the last rank), eagerly and in a tf.function
(the owner's keys padded too); then with its two static tables as well (the owner's keys exact:
a static table's optimizer needs them distinct).

    python dense_ids.py      (under horovodrun -np N; one process is the world of one)
"""
import numpy as np
import tensorflow as tf
from mp_common import (
    GLOBAL_BATCH,
    check_ev_rows,
    check_static_rows,
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
    static_init,
)

import sparse_operation_kit as sok

STEPS = 6
IDS_PER_SAMPLE = 3
KIND = "adam"


def positions(step, spec):
    """[GLOBAL_BATCH, IDS_PER_SAMPLE] vocab positions: repeats inside a rank's slice and across
    ranks (a few rows only), so requesters and owners both dedup."""
    rng = np.random.default_rng(1000 * step + spec.rows)
    return rng.integers(0, min(spec.rows, 5), [GLOBAL_BATCH, IDS_PER_SAMPLE])


def reference_embedding(table, pos, combiner):
    """Each distinct row read once (as lookup_sparse does): the table's gradient then holds each
    row once, which TensorFlow's and Keras' optimizers expect of a tf.Variable's slices."""
    unique, index = tf.unique(tf.reshape(pos, [-1]))
    rows = tf.reshape(tf.gather(tf.gather(table, unique), index), [*pos.shape, -1])
    out = tf.reduce_sum(rows, axis=1)
    if combiner == "mean":
        return out / IDS_PER_SAMPLE
    return out / np.sqrt(IDS_PER_SAMPLE) if combiner == "sqrtn" else out


def run(graph_function, with_static=False):
    _, rank, world = setup()
    tag = ("function" if graph_function else "eager") + (" with static tables" if with_static else "")
    prefix = f"dense_{'fn' if graph_function else 'eager'}{'_st' if with_static else ''}_"
    all_specs = [s for s in specs(world, prefix=prefix) if with_static or s.kind == "ev"]
    tables = [make_sok_table(s) for s in all_specs]
    ref = [tf.Variable(t.sparse_read(tf.constant(s.vocab, s.key_dtype), training=False)
                       if s.kind == "ev" else static_init(s)) for s, t in zip(all_specs, tables)]
    ref_slots = [[tf.Variable(tf.fill(tf.shape(r), slot_initial(KIND)))
                  for _ in range(num_slots(KIND))] for r in ref]
    ref_opt = make_keras_optimizer(KIND)  # the static tables' reference: plain tf.Variables
    static = [i for i, s in enumerate(all_specs) if s.kind != "ev"]
    combiners = [s.combiner for s in all_specs]
    w = tf.constant(dense_init(sum(s.dim for s in all_specs)))
    opt = sok.OptimizerWrapper(make_keras_optimizer(KIND))
    sl = rank_slice(rank, world)
    touched = [np.zeros(s.rows, bool) for s in all_specs]

    def train(ids, y):
        with tf.GradientTape() as tape:
            embs = sok.lookup_sparse(tables, ids, combiners=combiners)
            loss = loss_fn(embs, w, y)
        opt.apply_gradients(zip(tape.gradient(loss, tables), tables))
        return embs

    step_fn = tf.function(train) if graph_function else train
    for step in range(STEPS):
        pos = [positions(step, s) for s in all_specs]
        y = labels(4, step)
        ids = [tf.constant(s.vocab[p[sl]], s.key_dtype) for s, p in zip(all_specs, pos)]
        embs = step_fn(ids, tf.constant(y[sl]))
        with tf.GradientTape() as tape:
            rembs = [reference_embedding(r, p, c) for r, p, c in zip(ref, pos, combiners)]
            rloss = loss_fn(rembs, w, y)
        rgrads = tape.gradient(rloss, ref)
        for i, s in enumerate(all_specs):
            close(f"{tag} step {step}: embeddings of {s.name}", embs[i].numpy(),
                  rembs[i].numpy()[sl])
            touched[i][pos[i].reshape(-1)] = True
            if s.kind == "ev":
                reference_ev_update(KIND, ref[i], ref_slots[i], rgrads[i], step + 1,
                                    epsilon(KIND, keras_api=True))
        if static:
            ref_opt.apply_gradients([(rgrads[i], ref[i]) for i in static])
    if graph_function:  # the padded path is the one that ran
        graph = step_fn.get_concrete_function(ids, tf.constant(y[sl])).graph
        padded = {op.type for op in graph.get_operations()
                  if op.type in ("SokUniqueKeys", "SokExchangeOwnerKeys") and op.get_attr("padded")}
        assert padded == {"SokUniqueKeys", "SokExchangeOwnerKeys"} or world == 1, padded
    # An evaluation lookup of new and known keys reads without inserting.
    sizes = [int(t.size()) for t, s in zip(tables, all_specs) if s.kind == "ev"]
    pos = [np.random.default_rng(7).integers(0, s.rows, [GLOBAL_BATCH, IDS_PER_SAMPLE])
           for s in all_specs]
    ids = [tf.constant(s.vocab[p[sl]], s.key_dtype) for s, p in zip(all_specs, pos)]
    embs = sok.lookup_sparse(tables, ids, combiners=combiners, training=False)
    for i, s in enumerate(all_specs):
        close(f"{tag}: evaluation lookup of {s.name}", embs[i].numpy(),
              reference_embedding(ref[i], pos[i], combiners[i]).numpy()[sl])
    after = [int(t.size()) for t, s in zip(tables, all_specs) if s.kind == "ev"]
    assert after == sizes, "an evaluation lookup inserted keys"
    for i, (s, t) in enumerate(zip(all_specs, tables)):
        what = f"{tag}: {s.name} after {STEPS} steps"
        if s.kind == "ev":
            check_ev_rows(what, s, [x.numpy() for x in t.export()[:3]], ref[i].numpy(),
                          [v.numpy() for v in ref_slots[i]], KIND, touched[i], rank, world)
        else:
            check_static_rows(what, s, t.numpy(), ref[i].numpy(), rank, world)
    done(f"dense ids {tag}: embeddings and {STEPS} {KIND} steps equal the reference "
         f"(global batch {GLOBAL_BATCH}, {IDS_PER_SAMPLE} ids a sample)")


def main():
    run(graph_function=False)
    run(graph_function=True)
    run(graph_function=False, with_static=True)


if __name__ == "__main__":
    main_guard(main)
