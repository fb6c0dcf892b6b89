"""N-to-M checkpoints: sok.dump on one world size, sok.load on another (or in one process).

train_and_dump(dir): a few Keras-Adagrad steps on four tables (EV spread, EV on rank 1, static
  distributed, static localized:1), checked against the reference, then sok.dump(dir, tables);
  rank 0 writes the reference rows and Adagrad accumulators beside it (reference.npz).
load_and_continue(dir): fresh tables of the same names, sok.load(dir, tables); every rank checks
  that it holds exactly the rows it owns now, with the reference's values and accumulators, then
  runs more Adagrad steps on the Embedding Variables (whose slots came from the dump) and checks
  them against the reference continued from reference.npz.

Run alone (`python mp_checkpoint.py load=DIR`) it loads into one process, without Horovod.
"""
import os
import sys
import time

import numpy as np
import tensorflow as tf
from mp_common import (
    GLOBAL_BATCH,
    Spec,
    check_ev_rows,
    check_static_rows,
    close,
    done,
    epsilon,
    global_batch,
    ids_value,
    initial_rows,
    lookups_fail,
    main_guard,
    make_keras_optimizer,
    make_sok_table,
    rank_slice,
    reference_combine,
    reference_ev_update,
    setup,
    to_sparse,
)

import sparse_operation_kit as sok

KIND = "adagrad"
EPS = epsilon(KIND, keras_api=True)


def ck_specs():
    """The same names and placements on every world size (target 1 exists for 2 and 3 ranks; one
    process holds every table whole)."""
    return [
        Spec(
            "ck_ev_spread", "ev", 4, [0, 1, 2, 3, 5, 8, 13, -3, -7, 2**40 + 3], tf.int64, "sum", -1
        ),
        Spec("ck_ev_local", "ev", 3, [0, 4, 9, 16, 25, -1, 100003], tf.int32, "mean", 1),
        Spec("ck_st_spread", "static", 4, np.arange(11), tf.int64, "sqrtn", -1),
        Spec("ck_st_local", "static", 2, np.arange(7), tf.int32, "sum", 1),
    ]


def _loss(embs):
    h = tf.concat(embs, 1)
    coef = tf.constant(
        np.linspace(-1, 1, int(h.shape[1]) * GLOBAL_BATCH).reshape(GLOBAL_BATCH, -1), tf.float32
    )
    return h, coef


def _steps(
    seed, first, count, specs, tables, refs, ref_slots, touched, opt, ref_opt, rank, world, what
):
    """`count` Adagrad steps (eager) of SOK tables vs the reference; checks forward every step."""
    sl = rank_slice(rank, world)
    static = [i for i, s in enumerate(specs) if s.kind != "ev"]
    for step in range(first, first + count):
        batch = global_batch(seed, step, specs)
        for i, s in enumerate(specs):
            touched[i][[p for sample in batch[s.name] for p in sample]] = True
        with tf.GradientTape() as tape:
            embs = sok.lookup_sparse(
                tables,
                [to_sparse(ids_value(s, batch[s.name][sl])) for s in specs],
                combiners=[s.combiner for s in specs],
            )
            h, coef = _loss(embs)
            loss = tf.reduce_sum(h * coef[sl]) + 0.5 * tf.reduce_sum(h * h)
        grads = tape.gradient(loss, tables)
        with tf.GradientTape() as tape:
            rembs = [
                reference_combine(
                    r, to_sparse(ids_value(s, batch[s.name], keyed=False)), GLOBAL_BATCH, s.combiner
                )
                for r, s in zip(refs, specs)
            ]
            h, coef = _loss(rembs)
            rloss = tf.reduce_sum(h * coef) + 0.5 * tf.reduce_sum(h * h)
        rgrads = tape.gradient(rloss, refs)
        for i, s in enumerate(specs):
            close(
                f"{what} step {step}: forward of '{s.name}'", embs[i].numpy(), rembs[i].numpy()[sl]
            )
        opt.apply_gradients(zip(grads, tables))
        for i, s in enumerate(specs):
            if s.kind == "ev":
                reference_ev_update(KIND, refs[i], ref_slots[i], rgrads[i], step + 1, EPS)
        if static:
            ref_opt.apply_gradients([(rgrads[i], refs[i]) for i in static])


def _check_rows(what, specs, tables, ref_values, ref_acc, touched, rank, world):
    for i, (s, t) in enumerate(zip(specs, tables)):
        if s.kind == "ev":
            check_ev_rows(
                f"{what}: '{s.name}'",
                s,
                [x.numpy() for x in t.export()[:3]],
                ref_values[i],
                [ref_acc[i]],
                KIND,
                touched[i],
                rank,
                world,
            )
        else:
            check_static_rows(f"{what}: '{s.name}'", s, t.numpy(), ref_values[i], rank, world)


def train_and_dump(path, hvd, rank, world, steps=4):
    specs = ck_specs()
    tables = [make_sok_table(s) for s in specs]
    refs = [tf.Variable(initial_rows(s, t)) for s, t in zip(specs, tables)]
    ref_slots = {
        i: [tf.Variable(tf.fill([s.rows, s.dim], 0.1))]
        for i, s in enumerate(specs)
        if s.kind == "ev"
    }
    touched = [np.zeros(s.rows, bool) for s in specs]
    opt = sok.OptimizerWrapper(make_keras_optimizer(KIND))
    _steps(
        21,
        0,
        steps,
        specs,
        tables,
        refs,
        ref_slots,
        touched,
        opt,
        make_keras_optimizer(KIND),
        rank,
        world,
        f"checkpoint ({world} ranks) training",
    )
    ref_values = [r.numpy() for r in refs]
    ref_acc = {i: v[0].numpy() for i, v in ref_slots.items()}
    _check_rows(
        f"before sok.dump ({world} ranks)", specs, tables, ref_values, ref_acc, touched, rank, world
    )
    sok.dump(path, tables)
    if rank == 0:
        arrays = {}
        for i, s in enumerate(specs):
            arrays[f"{s.name}/values"] = ref_values[i]
            arrays[f"{s.name}/touched"] = touched[i]
            if s.kind == "ev":
                arrays[f"{s.name}/acc"] = ref_acc[i]
        np.savez(os.path.join(path, "reference.npz"), steps=steps, world=world, **arrays)
    if hvd is not None:
        hvd.allreduce(tf.constant(0), name="reference_written")
    for s in specs:
        files = sorted(os.listdir(os.path.join(path, s.name)))
        assert files == [f"rank{r}-of-{world}.npz" for r in range(world)], files
    done(f"checkpoint: sok.dump from {world} ranks")


def load_and_continue(path, hvd, rank, world, steps=3):
    specs = ck_specs()
    ref = np.load(os.path.join(path, "reference.npz"))
    saved_world, done_steps = int(ref["world"]), int(ref["steps"])
    tables = [make_sok_table(s) for s in specs]
    sok.load(path, tables)
    ref_values = [ref[f"{s.name}/values"] for s in specs]
    ref_acc = {i: ref[f"{s.name}/acc"] for i, s in enumerate(specs) if s.kind == "ev"}
    touched = [ref[f"{s.name}/touched"].copy() for s in specs]
    what = f"sok.load of a {saved_world}-rank dump into {world} rank{'s' if world > 1 else ''}"
    _check_rows(what, specs, tables, ref_values, ref_acc, touched, rank, world)
    # Keep training the Embedding Variables: their Adagrad accumulators came from the dump.
    ev_idx = [i for i, s in enumerate(specs) if s.kind == "ev"]
    ev_specs = [specs[i] for i in ev_idx]
    refs = [tf.Variable(ref_values[i]) for i in ev_idx]
    ref_slots = {j: [tf.Variable(ref_acc[i])] for j, i in enumerate(ev_idx)}
    ev_touched = [touched[i] for i in ev_idx]
    opt = sok.OptimizerWrapper(make_keras_optimizer(KIND))
    _steps(
        21,
        done_steps,
        steps,
        ev_specs,
        [tables[i] for i in ev_idx],
        refs,
        ref_slots,
        ev_touched,
        opt,
        None,
        rank,
        world,
        what + ", then Adagrad",
    )
    _check_rows(
        what + f", then {steps} Adagrad steps",
        ev_specs,
        [tables[i] for i in ev_idx],
        [r.numpy() for r in refs],
        {j: v[0].numpy() for j, v in ref_slots.items()},
        ev_touched,
        rank,
        world,
    )
    done(f"checkpoint: {what}: rows, slots and {steps} further Adagrad steps equal the reference")


def leave_early(rank, world):
    """The last rank leaves; the others' next lookup_sparse must fail with Horovod's error (the
    job then ends non-zero), not hang."""
    if rank == world - 1:
        print(f"[rank {rank}] leaves early", flush=True)
        os._exit(0)
    if lookups_fail(rank, "after_leave", 20, time.time()):
        os._exit(2)
    raise AssertionError(f"rank {rank}: lookup_sparse kept working after rank {world - 1} left")


def main():
    use_hvd = "HOROVOD_RANK" in os.environ
    hvd, rank, world = setup(use_horovod=use_hvd)
    for arg in sys.argv[1:]:
        if arg.startswith("dump="):
            train_and_dump(arg[5:], hvd, rank, world)
        elif arg.startswith("load="):
            load_and_continue(arg[5:], hvd, rank, world)
        elif arg == "leave":
            leave_early(rank, world)
        else:
            raise ValueError(f"unknown phase {arg}")


if __name__ == "__main__":
    main_guard(main)
