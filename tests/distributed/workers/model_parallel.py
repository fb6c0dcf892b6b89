"""Worker run under `horovodrun -np N`: model-parallel SOK against a single-process reference.

Every rank checks, at every step, that its forward values, the gradients of the rows it owns (the
sum over ranks of their contributions), and after 20 optimizer steps its rows and slots equal a
plain-TensorFlow reference that holds the whole tables and the whole global batch. Phases:

  tf2       Keras 3 SGD / Adagrad / Adam through sok.OptimizerWrapper, eager
  tf1       tf.compat.v1.train optimizers through sok.OptimizerWrapper, tf.compat.v1.Session
  sok2x     SOK 2.x-style code unchanged: sok.Variable / DynamicVariable, filter_variables,
            all2all_dense_embedding, the local shard read with tf.nn.embedding_lookup
  errors    mismatched tables / dims, bad ids on one rank, target_gpu >= world size
  dump=DIR  train a little, then sok.dump into DIR (with the reference for a later load)
  sok2program=DIR  a representative SOK 2.x program (workers/sok2_program.py), dumping into DIR
  load=DIR  sok.load a dump made by another world size, check it and keep training

    python model_parallel.py tf2 tf1 sok2x errors dump=/tmp/x load=/tmp/y
"""
import sys
import time

import mp_checkpoint
import mp_common
import numpy as np
import sok2_program
import tensorflow as tf
from mp_common import (
    GLOBAL_BATCH,
    check_ev_grad,
    check_ev_rows,
    check_static_rows,
    close,
    cpu_step_ops,
    dense_init,
    done,
    epsilon,
    global_batch,
    ids_value,
    initial_rows,
    labels,
    log,
    loss_fn,
    main_guard,
    make_keras_optimizer,
    make_sok_table,
    make_v1_optimizer,
    num_slots,
    rank_slice,
    reference_combine,
    reference_ev_update,
    setup,
    shard_rows,
    slot_initial,
    specs,
    to_sparse,
)

import sparse_operation_kit as sok

STEPS = 20
# Which tables share one lookup_sparse call: all four mixed (-1 and k, EVs and static), or
# one call of the spread tables and one of the tables placed on one rank.
GROUPS = {"sgd": [[0, 1, 2, 3]], "adagrad": [[0, 2], [1, 3]], "adam": [[3, 0, 1, 2]]}
SEED = {"sgd": 1, "adagrad": 2, "adam": 3}


def dense_grad(g, rows, dim):
    """A gradient (tf.IndexedSlices value or array) as a dense [rows, dim] array."""
    if hasattr(g, "indices"):
        out = np.zeros([rows, dim], np.float32)
        np.add.at(out, np.asarray(g.indices), np.asarray(g.values).reshape(-1, dim))
        return out
    return np.asarray(g)


class Case:
    """Tables and reference of one optimizer run (shared by the TF2 and TF1 phases)."""

    def __init__(self, kind, mode, rank, world):
        self.kind, self.mode, self.rank, self.world = kind, mode, rank, world
        self.tiers = " on two tiers" if mp_common.STORAGE is not None else ""
        self.specs = specs(world, prefix=f"{mode}_{kind}_" + ("tier_" if self.tiers else ""))
        self.groups = GROUPS[kind]
        self.sl = rank_slice(rank, world)
        self.eps = epsilon(kind, keras_api=(mode == "tf2"))
        self.total_dim = sum(s.dim for s in self.specs)

    def batch(self, step):
        b = global_batch(SEED[self.kind], step, self.specs)
        return b, labels(SEED[self.kind], step)

    def ref_slots(self):
        """{table index: the reference's slot Variables} of the EV tables, as the optimizer
        starts them (its first slot at slot_initial, any other at 0)."""
        return {
            i: [
                tf.Variable(tf.fill([s.rows, s.dim], slot_initial(self.kind) if k == 0 else 0.0))
                for k in range(num_slots(self.kind))
            ]
            for i, s in enumerate(self.specs)
            if s.kind == "ev"
        }

    def sok_forward(self, tables, local_ids):
        embs = [None] * len(tables)
        for g in self.groups:
            outs = sok.lookup_sparse([tables[i] for i in g], [local_ids[i] for i in g],
                                     combiners=[self.specs[i].combiner for i in g])
            for i, o in zip(g, outs):
                embs[i] = o
        return embs

    def ref_forward(self, ref_tables, global_ids):
        return [reference_combine(t, ids, GLOBAL_BATCH, s.combiner)
                for t, ids, s in zip(ref_tables, global_ids, self.specs)]

    def check_step(self, step, embs, rembs, grads, rgrads, w_grad, rw_grad):
        for i, s in enumerate(self.specs):
            close(
                f"{self.mode}/{self.kind} step {step}: forward of '{s.name}'",
                embs[i],
                rembs[i][self.sl],
            )
        close(
            f"{self.mode}/{self.kind} step {step}: dense gradient (hvd.allreduce Sum)",
            w_grad,
            rw_grad,
        )
        for i, s in enumerate(self.specs):
            what = f"{self.mode}/{self.kind} step {step}: gradient of '{s.name}'"
            if s.kind == "ev":
                check_ev_grad(
                    what,
                    s,
                    grads[i].indices,
                    grads[i].values,
                    rgrads[i].indices,
                    rgrads[i].values,
                    self.rank,
                    self.world,
                )
            else:
                rows = shard_rows(s, self.rank, self.world)
                got = dense_grad(grads[i], len(rows), s.dim)
                close(what, got, dense_grad(rgrads[i], s.rows, s.dim)[rows])

    def check_final(self, exported, shards, ref_tables, ref_slots, touched, w, rw):
        for i, s in enumerate(self.specs):
            what = f"{self.mode}/{self.kind} after {STEPS} steps: rows of '{s.name}'"
            if s.kind == "ev":
                check_ev_rows(
                    what,
                    s,
                    exported[i],
                    ref_tables[i],
                    ref_slots[i],
                    self.kind,
                    touched[i],
                    self.rank,
                    self.world,
                )
            else:
                check_static_rows(what, s, shards[i], ref_tables[i], self.rank, self.world)
        close(f"{self.mode}/{self.kind} after {STEPS} steps: dense weights", w, rw)


# ---------------------------------------------------------------------------------------------
# TF2 eager, Keras 3 optimizers
# ---------------------------------------------------------------------------------------------
def run_tf2(kind, hvd, rank, world):
    c = Case(kind, "tf2", rank, world)
    tables = [make_sok_table(s) for s in c.specs]
    ref_tables = [tf.Variable(initial_rows(s, t)) for s, t in zip(c.specs, tables)]
    ref_slots = c.ref_slots()
    w = tf.Variable(dense_init(c.total_dim), name="tf2_dense")
    rw = tf.Variable(dense_init(c.total_dim))
    emb_vars, dense_vars = sok.filter_variables(tables + [w])
    assert [v.name for v in emb_vars] == [t.name for t in tables] and dense_vars == [w], (
        emb_vars,
        dense_vars,
    )
    opt = sok.OptimizerWrapper(make_keras_optimizer(kind))
    ref_opt = make_keras_optimizer(kind)  # static tables and the dense layer, as plain tf.Variables
    ref_dense = [ref_tables[i] for i, s in enumerate(c.specs) if s.kind != "ev"] + [rw]
    touched = [np.zeros(s.rows, bool) for s in c.specs]
    for step in range(STEPS):
        batch, y = c.batch(step)
        local_ids = [to_sparse(ids_value(s, batch[s.name][c.sl])) for s in c.specs]
        global_ids = [to_sparse(ids_value(s, batch[s.name], keyed=False)) for s in c.specs]
        for i, s in enumerate(c.specs):
            touched[i][[p for sample in batch[s.name] for p in sample]] = True
        with tf.GradientTape() as tape:
            embs = c.sok_forward(tables, local_ids)
            loss = loss_fn(embs, w, y[c.sl])
        grads = tape.gradient(loss, emb_vars + dense_vars)
        w_grad = hvd.allreduce(grads[-1], op=hvd.Sum)
        with tf.GradientTape() as rtape:
            rembs = c.ref_forward(ref_tables, global_ids)
            rloss = loss_fn(rembs, rw, y)
        rgrads = rtape.gradient(rloss, ref_tables + [rw])
        c.check_step(
            step,
            [e.numpy() for e in embs],
            [e.numpy() for e in rembs],
            grads[:-1],
            rgrads[:-1],
            w_grad.numpy(),
            rgrads[-1].numpy(),
        )
        opt.apply_gradients(zip(grads[:-1] + [w_grad], emb_vars + dense_vars))
        for i, s in enumerate(c.specs):
            if s.kind == "ev":
                reference_ev_update(kind, ref_tables[i], ref_slots[i], rgrads[i], step + 1, c.eps)
        ref_opt.apply_gradients(
            zip(
                [rgrads[i] for i, s in enumerate(c.specs) if s.kind != "ev"] + [rgrads[-1]],
                ref_dense,
            )
        )
    exported = [
        [x.numpy() for x in t.export()[:3]] if s.kind == "ev" else None
        for s, t in zip(c.specs, tables)
    ]
    shards = [t.numpy() if s.kind != "ev" else None for s, t in zip(c.specs, tables)]
    c.check_final(
        exported,
        shards,
        [t.numpy() for t in ref_tables],
        {i: [x.numpy() for x in v] for i, v in ref_slots.items()},
        touched,
        w.numpy(),
        rw.numpy(),
    )
    done(
        f"tf2 {kind}{c.tiers}: forward, gradients and {STEPS} steps equal the reference "
        f"(groups {c.groups})"
    )


# ---------------------------------------------------------------------------------------------
# TF1 graph mode (tf.compat.v1.Session), tf.compat.v1.train optimizers
# ---------------------------------------------------------------------------------------------
def run_tf1(kind, hvd, rank, world):
    c = Case(kind, "tf1", rank, world)
    graph = tf.Graph()
    with graph.as_default(), tf.compat.v1.Session(graph=graph) as sess:
        tables = [make_sok_table(s) for s in c.specs]
        ref_tables = [tf.Variable(tf.zeros([s.rows, s.dim])) for s in c.specs]
        ref_init_ph = [tf.compat.v1.placeholder(tf.float32, [s.rows, s.dim]) for s in c.specs]
        ref_init = [r.assign(p) for r, p in zip(ref_tables, ref_init_ph)]
        ref_slots = c.ref_slots()
        w = tf.Variable(dense_init(c.total_dim), name="tf1_dense")
        rw = tf.Variable(dense_init(c.total_dim))
        local_ph = [tf.compat.v1.sparse_placeholder(s.key_dtype) for s in c.specs]
        global_ph = [tf.compat.v1.sparse_placeholder(tf.int64) for s in c.specs]
        y_ph = tf.compat.v1.placeholder(tf.float32, [GLOBAL_BATCH])
        t_ph = tf.compat.v1.placeholder(tf.int64, [])

        embs = c.sok_forward(tables, local_ph)
        loss = loss_fn(embs, w, y_ph[c.sl])
        opt = sok.OptimizerWrapper(make_v1_optimizer(kind))
        emb_vars, dense_vars = sok.filter_variables(tables + [w])
        assert dense_vars == [w]
        gvs = opt.compute_gradients(loss, var_list=emb_vars + dense_vars)
        grads = [g for g, _ in gvs]
        w_grad = hvd.allreduce(grads[-1], op=hvd.Sum)
        train = opt.apply_gradients(list(zip(grads[:-1] + [w_grad], emb_vars + dense_vars)))

        rembs = c.ref_forward(ref_tables, global_ph)
        rloss = loss_fn(rembs, rw, y_ph)
        rgrads = tf.gradients(rloss, ref_tables + [rw])
        ref_ops = []
        for i, s in enumerate(c.specs):
            if s.kind == "ev":
                ref_ops += reference_ev_update(
                    kind, ref_tables[i], ref_slots[i], rgrads[i], t_ph, c.eps
                )
        ref_opt = make_v1_optimizer(kind)
        ref_ops.append(
            ref_opt.apply_gradients(
                [(rgrads[i], ref_tables[i]) for i, s in enumerate(c.specs) if s.kind != "ev"]
                + [(rgrads[-1], rw)]
            )
        )
        ref_train = tf.group(*ref_ops)
        exports = [
            t.export()[:3] if s.kind == "ev" else t.read_value() for s, t in zip(c.specs, tables)
        ]

        sess.run(tf.compat.v1.global_variables_initializer())
        init_rows = [initial_rows(s, t, sess) for s, t in zip(c.specs, tables)]
        sess.run(ref_init, dict(zip(ref_init_ph, init_rows)))
        touched = [np.zeros(s.rows, bool) for s in c.specs]
        for step in range(STEPS):
            batch, y = c.batch(step)
            feed = {y_ph: y, t_ph: step + 1}
            for i, s in enumerate(c.specs):
                feed[local_ph[i]] = ids_value(s, batch[s.name][c.sl])
                feed[global_ph[i]] = ids_value(s, batch[s.name], keyed=False)
                touched[i][[p for sample in batch[s.name] for p in sample]] = True
            got = sess.run(
                dict(
                    embs=embs,
                    grads=grads[:-1],
                    w_grad=w_grad,
                    rembs=rembs,
                    rgrads=rgrads,
                    train=train,
                    ref_train=ref_train,
                ),
                feed,
            )
            c.check_step(
                step,
                got["embs"],
                got["rembs"],
                got["grads"],
                got["rgrads"][:-1],
                got["w_grad"],
                got["rgrads"][-1],
            )
        final = sess.run(dict(exports=exports, ref=ref_tables, slots=ref_slots, w=w, rw=rw))
        exported = [final["exports"][i] if s.kind == "ev" else None for i, s in enumerate(c.specs)]
        shards = [final["exports"][i] if s.kind != "ev" else None for i, s in enumerate(c.specs)]
        c.check_final(
            exported, shards, final["ref"], final["slots"], touched, final["w"], final["rw"]
        )
    done(
        f"tf1 {kind}{c.tiers}: forward, gradients and {STEPS} steps equal the reference "
        f"(groups {c.groups})"
    )


# ---------------------------------------------------------------------------------------------
# SOK 2.x-style code, unchanged
# ---------------------------------------------------------------------------------------------
def run_sok2x(hvd, rank, world):
    import keras

    from sparse_operation_kit import experiment as sok2  # SOK 2.x's import path

    sok2.init()  # again, as SOK 2.x scripts do after hvd.init()
    rows, dim = 9, 3
    init = np.random.default_rng(3).uniform(-1, 1, [rows, dim]).astype(np.float32)
    v_dist = sok2.Variable(init, dtype=tf.float32, mode="distributed", name="sok2_dist")
    v_loc = sok2.Variable(init, dtype=tf.float32, mode="localized:0", name="sok2_loc")
    dyn = sok2.DynamicVariable(
        dimension=dim, var_type="hybrid", initializer="random", name="sok2_dyn", mode="distributed"
    )
    dense = tf.Variable(tf.ones([3 * dim, 1]), name="sok2_dense")

    # Local shard of a distributed table: global row k is local row k // N on rank k mod N.
    owned = np.arange(rank, rows, world)
    assert v_dist.shape[0] == len(owned), (v_dist.shape, owned)
    close("sok2x: local shard via tf.nn.embedding_lookup",
          tf.nn.embedding_lookup(v_dist, tf.constant(owned // world)).numpy(), init[owned])
    assert v_loc.shape[0] == (rows if rank == 0 else 0), v_loc.shape

    rng = np.random.default_rng(17)
    dyn_keys = np.array([3, -8, 2**41 + 1, 12, 7, 0], np.int64)
    dyn_init = dyn.sparse_read(tf.constant(dyn_keys), training=False).numpy()
    ids = rng.integers(0, rows, [GLOBAL_BATCH, 2])
    dids = rng.integers(0, len(dyn_keys), [GLOBAL_BATCH, 3])
    sl = rank_slice(rank, world)

    # all2all_dense_embedding: any index shape, differentiable; compared with tf.gather.
    coef = rng.uniform(-1, 1, [GLOBAL_BATCH, 2, dim]).astype(np.float32)
    for name, var in (("distributed", v_dist), ("localized:0", v_loc)):
        with tf.GradientTape() as tape:
            out = sok2.all2all_dense_embedding(var, tf.constant(ids[sl]))
            loss = tf.reduce_sum(out * coef[sl])
        close(f"sok2x: all2all_dense_embedding ({name})", out.numpy(), init[ids[sl]])
        want = np.zeros_like(init)
        np.add.at(want, ids.reshape(-1), coef.reshape(-1, dim))
        local = shard_rows_of(name, rows, rank, world)
        close(f"sok2x: all2all_dense_embedding gradient ({name})",
              dense_grad(tape.gradient(loss, var), len(local), dim), want[local])
    out = sok2.all2all_dense_embedding(dyn, tf.constant(dyn_keys[dids[sl]]))
    close("sok2x: all2all_dense_embedding (DynamicVariable)", out.numpy(), dyn_init[dids[sl]])

    # One SOK 2.x training step: lookup_sparse, filter_variables, allreduce of the dense gradients.
    ref = [tf.Variable(init), tf.Variable(init), tf.Variable(dyn_init)]
    rdense = tf.Variable(tf.ones([3 * dim, 1]))
    y = rng.uniform(-1, 1, GLOBAL_BATCH).astype(np.float32)
    params = [v_dist, v_loc, dyn]
    sok_vars, other = sok2.filter_variables(params + [dense])
    assert other == [dense] and len(sok_vars) == 3
    optimizer = sok2.OptimizerWrapper(keras.optimizers.SGD(learning_rate=0.1))
    def ragged(a):
        return tf.RaggedTensor.from_tensor(tf.constant(a))
    with tf.GradientTape() as tape:
        embs = sok2.lookup_sparse(
            params,
            [ragged(ids[sl]), ragged(ids[sl]), ragged(dyn_keys[dids[sl]])],
            combiners=["sum", "mean", "sum"],
        )
        loss = loss_fn(embs, dense, y[sl])
    grads = tape.gradient(loss, sok_vars + other)
    grads = grads[:len(sok_vars)] + [hvd.allreduce(g, op=hvd.Sum) for g in grads[len(sok_vars):]]
    optimizer.apply_gradients(zip(grads, sok_vars + other))
    with tf.GradientTape() as tape:
        rembs = [reference_combine(ref[0], to_sparse(ids_value_dense(ids)), GLOBAL_BATCH, "sum"),
                 reference_combine(ref[1], to_sparse(ids_value_dense(ids)), GLOBAL_BATCH, "mean"),
                 reference_combine(ref[2], to_sparse(ids_value_dense(dids)), GLOBAL_BATCH, "sum")]
        rloss = loss_fn(rembs, rdense, y)
    rgrads = tape.gradient(rloss, ref + [rdense])
    keras.optimizers.SGD(learning_rate=0.1).apply_gradients(zip(rgrads, ref + [rdense]))
    for i, e in enumerate(embs):
        close(f"sok2x: lookup_sparse output {i}", e.numpy(), rembs[i].numpy()[sl])
    close(
        "sok2x: distributed shard after one step",
        tf.nn.embedding_lookup(v_dist, owned // world).numpy(),
        ref[0].numpy()[owned],
    )
    close(
        "sok2x: localized shard after one step",
        v_loc.numpy(),
        ref[1].numpy() if rank == 0 else init[:0],
    )
    keys, values = sok2.export(dyn)
    pos = {int(k): i for i, k in enumerate(dyn_keys)}
    want_keys = sorted(
        int(dyn_keys[p]) for p in set(dids.reshape(-1)) if int(dyn_keys[p]) % world == rank
    )
    assert sorted(int(k) for k in keys.numpy()) == want_keys, (keys.numpy(), want_keys)
    close("sok2x: DynamicVariable rows after one step", values.numpy(),
          ref[2].numpy()[[pos[int(k)] for k in keys.numpy()]])
    close("sok2x: dense layer after one step", dense.numpy(), rdense.numpy())

    # Evaluation (training=False) reads unseen keys' initial rows and inserts nothing on the owners.
    unseen = tf.constant([[1000 + rank, 2000, 1000 + rank]], tf.int64)  # 2000: on every rank
    out = sok2.lookup_sparse([dyn], [tf.RaggedTensor.from_tensor(unseen)], training=False)[0]
    close(
        "sok2x: evaluation lookup of unseen keys",
        out.numpy(),
        dyn.sparse_read(unseen, training=False).numpy().sum(axis=1),
    )
    assert sorted(int(k) for k in sok2.export(dyn)[0].numpy()) == want_keys, (
        "evaluation inserted keys"
    )
    done(
        "sok2x: SOK 2.x-style code (Variable/DynamicVariable modes, filter_variables, "
        "lookup_sparse, "
        "all2all_dense_embedding, local shard via tf.nn.embedding_lookup) runs unchanged"
    )


def shard_rows_of(mode, rows, rank, world):
    if mode == "distributed":
        return np.arange(rank, rows, world)
    return np.arange(rows) if rank == 0 else np.arange(0)


def ids_value_dense(a):
    a = np.asarray(a)
    indices = np.array([[b, j] for b in range(a.shape[0]) for j in range(a.shape[1])], np.int64)
    return tf.compat.v1.SparseTensorValue(
        indices, a.reshape(-1).astype(np.int64), np.array(a.shape, np.int64)
    )


# ---------------------------------------------------------------------------------------------
# Errors: the same clear error on every rank, and no rank left inside a collective
# ---------------------------------------------------------------------------------------------
def expect_error(what, fn, exc, *needles):
    try:
        fn()
    except exc as e:
        text = str(e)
        missing = [n for n in needles if n not in text]
        if missing:
            raise AssertionError(f"{what}: the error lacks {missing}: {text}") from e
        log(f"{what}: raised {type(e).__name__}: {text.splitlines()[0][:300]}")
        return text
    raise AssertionError(f"{what}: no error was raised")


def _fed_ragged(values, row_splits):
    """TF1 ragged ids from placeholders with defaults: as a program feeds them, and out of reach
    of Grappler's constant folding (which would run the index ops once on the CPU, where the GPU
    device check counts them)."""
    def fed(x):
        return tf.compat.v1.placeholder_with_default(tf.constant(x, tf.int64), [None])

    return tf.RaggedTensor.from_row_splits(fed(values), fed(row_splits))


def run_errors(hvd, rank, world):
    def ev(name, dim):
        return sok.get_embedding_variable(name, dim, initializer=tf.ones_initializer())
    a, b, c3 = ev("err_a", 4), ev("err_b", 4), ev("err_c", 3)
    ids = tf.ragged.constant([[1, 2], [rank + 5]], dtype=tf.int64)
    mismatch = (tf.errors.InvalidArgumentError,)
    expect_error("tables in another order on rank 0", lambda: sok.lookup_sparse(
        [a, b] if rank == 0 else [b, a], [ids, ids]), mismatch, "ranks passed different tables",
        f"Rank {rank} passed", "same order")
    expect_error("another dimension on the last rank", lambda: sok.lookup_sparse(
        [c3] if rank == world - 1 else [a], [ids]), mismatch, "ranks passed different tables",
        "dim 3" if rank == world - 1 else "dim 4")
    expect_error("another number of tables on rank 0", lambda: sok.lookup_sparse(
        [a, b] if rank == 0 else [a], [ids, ids] if rank == 0 else [ids]), mismatch,
        "ranks passed different tables")
    st = sok.Variable(np.zeros([5, 2], np.float32), mode="distributed", name="err_static")
    bad = tf.ragged.constant([[1, 7 if rank == 0 else 2]], dtype=tf.int64)
    expect_error(
        "an out-of-range id on rank 0 only",
        lambda: sok.lookup_sparse([st], [bad]),
        mismatch,
        "outside the rows of a static table",
        "'err_static' [0, 5)",
    )
    # A SparseTensor index beyond its dense shape on rank 0 only: the dedup does not wait for
    # its checks, the exchange's header carries them, and every rank names the rank and table.
    beyond = tf.SparseTensor(tf.constant([[0, 0], [1, 4 if rank == 0 else 1]], tf.int64),
                             tf.constant([1, 2], tf.int64), tf.constant([2, 3], tf.int64))
    expect_error(
        "an index beyond dense_shape on rank 0 only",
        lambda: sok.lookup_sparse([b, a], [ids, beyond]),
        mismatch,
        "ids of table 'err_a' on rank 0",
        "beyond dense_shape",
    )
    d = ev("err_d", 4)
    d.target_gpu = world
    expect_error(
        "target_gpu == world size",
        lambda: sok.lookup_sparse([d], [ids]),
        ValueError,
        f"target_gpu={world}, but there are {world} ranks",
    )
    expect_error(
        "sok.Variable localized beyond the world",
        lambda: sok.Variable(np.zeros([3, 2], np.float32), mode=f"localized:{world}"),
        ValueError,
        f"there are {world} ranks",
    )
    # Nobody was left inside a collective: a normal call still works on every rank.
    out = sok.lookup_sparse([a, b], [ids, ids])
    close("errors: a lookup after the errors", out[0].numpy(), np.array([[2.0] * 4, [1.0] * 4]))

    # TF1 graph: the same check, raised by Session.run on every rank.
    graph = tf.Graph()
    with graph.as_default(), tf.compat.v1.Session(graph=graph) as sess:
        g_a, g_b = ev("gerr_a", 4), ev("gerr_b", 4)
        g_ids = _fed_ragged([1, 2], [0, 2])
        out = sok.lookup_sparse([g_a, g_b] if rank == 0 else [g_b, g_a], [g_ids, g_ids])
        sess.run(tf.compat.v1.global_variables_initializer())
        expect_error(
            "TF1: tables in another order on rank 0",
            lambda: sess.run(out),
            mismatch,
            "ranks passed different tables",
        )
    done(
        "errors: mismatched tables/dims/ids give the same clear error on every rank; target_gpu "
        ">= world "
        "raises; no rank hangs"
    )


# ---------------------------------------------------------------------------------------------
# Bytes on the wire: the exchange_bytes model checked against what the all-to-alls really send
# ---------------------------------------------------------------------------------------------
def run_collectives(hvd, rank, world):
    """sok.all_reduce (sum and mean; float and int64; an empty tensor) in eager and TF1 code equals
    the reduction of every rank's values, computed locally."""
    base = np.arange(6, dtype=np.float32).reshape(2, 3)
    ranks = np.arange(1, world + 1)

    def inputs():
        return [tf.constant(base * (rank + 1)), tf.constant([rank + 1, 3], tf.int64),
                tf.zeros([0, 4], tf.float32)]

    want_sum = [base * ranks.sum(), np.array([ranks.sum(), 3 * world]), np.zeros([0, 4])]
    got = [t.numpy() for t in sok.all_reduce(inputs(), op="sum")]
    for what, g, w in zip(["float", "int64", "empty"], got, want_sum, strict=True):
        close(f"eager all_reduce sum ({what})", g, w)
    mean = sok.all_reduce(inputs()[::2], op="mean")
    close("eager all_reduce mean", mean[0].numpy(), base * ranks.mean())
    with tf.Graph().as_default():
        outs = sok.all_reduce(inputs(), op="sum") + sok.all_reduce(inputs()[:1], op="mean")
        with tf.compat.v1.Session() as sess:
            for _ in range(3):
                res = sess.run(outs)
                close("TF1 all_reduce sum", res[0], want_sum[0])
                close("TF1 all_reduce sum (int64)", res[1], want_sum[1])
                close("TF1 all_reduce mean", res[3], base * ranks.mean())
    try:
        sok.all_reduce([tf.constant([1, 2], tf.int64)], op="mean")
        raise AssertionError("all_reduce mean of int64 did not fail")
    except ValueError as e:
        assert "mean" in str(e) and "int64" in str(e), e
    run_all_gather(rank, world)
    done("collectives: sok.all_reduce sum/mean, sok.all_gather, eager and TF1")


def run_all_gather(rank, world):
    """sok.all_gather: rank r's r + 1 rows (float [., 2, 3]), rank-dependent int64 and bool rows
    (none on rank 0), every rank gets them all in rank order, eager and TF1; rows of different
    sizes or dtypes fail on every rank."""
    def parts(r):
        return [np.full([r + 1, 2, 3], r + 0.5, np.float32), np.arange(r, dtype=np.int64) + 10 * r,
                np.array([r % 2 == 1] * r, dtype=bool)]

    want = [np.concatenate([parts(r)[i] for r in range(world)]) for i in range(3)]
    for got, w in zip(sok.all_gather([tf.constant(p) for p in parts(rank)]), want, strict=True):
        assert got.dtype == tf.as_dtype(w.dtype), (got.dtype, w.dtype)
        close("eager all_gather", got.numpy(), w)
    with tf.Graph().as_default():
        feeds = [tf.compat.v1.placeholder(tf.as_dtype(p.dtype), [None] + list(p.shape[1:]))
                 for p in parts(rank)]
        outs = sok.all_gather(feeds, training=False)
        gathers = [op for op in tf.compat.v1.get_default_graph().get_operations()
                   if op.type in ("SokAllToAll", "HorovodAllgather")]
        assert len(gathers) == 3 and all(op.get_attr("_XlaCompile") is False for op in gathers), \
            "the gathers are open to XLA's auto-clustering"
        with tf.compat.v1.Session() as sess:
            for _ in range(2):
                res = sess.run(outs, dict(zip(feeds, parts(rank), strict=True)))
                for got, w in zip(res, want, strict=True):
                    close("TF1 all_gather", got, w)
    try:
        sok.all_gather([tf.zeros([1, 2 + rank])])[0].numpy()
        raise AssertionError("an all_gather of rows of different sizes did not fail")
    except tf.errors.OpError as e:
        assert "different sizes" in str(e) or "ismatched" in str(e), e
    try:  # of one size, so only the dtype tells them apart
        sok.all_gather([tf.zeros([1], tf.float32 if rank == 0 else tf.int32)])[0].numpy()
        raise AssertionError("an all_gather of different dtypes did not fail")
    except tf.errors.OpError as e:
        assert "different dtypes" in str(e) or "ismatched data types" in str(e), e


def _ancestors(tensors):
    seen, todo = set(), [getattr(t, "op", t) for t in tensors]  # tensors or ops
    while todo:
        op = todo.pop()
        if op not in seen:
            seen.add(op)
            todo.extend([t.op for t in op.inputs] + list(op.control_inputs))
    return seen


def _collectives(graph):
    return {op for op in graph.get_operations() if "lltoall" in op.type or "AllToAll" in op.type}


def run_chains(hvd, rank, world):
    """TF1: SOK orders its collectives with control dependencies, training ones apart from
    lookups that do not train, so an evaluation run never runs a training step's collectives
    (nor inserts keys). Two lookups of one step are ordered; a second train op (a step built
    after the first one's gradients) runs none of the first step's collectives."""
    with tf.Graph().as_default() as g:
        ev = sok.get_embedding_variable("chains_ev", 4)
        other = sok.get_embedding_variable("chains_other", 4)
        ids = _fed_ragged([1, 2, 3 + rank], [0, 2, 3])
        opt = sok.OptimizerWrapper(tf.compat.v1.train.AdagradOptimizer(0.1))
        first = sok.lookup_sparse([ev], [ids], training=True)[0]
        first_ops = _collectives(g)
        second = sok.lookup_sparse([other], [ids], training=True)[0]
        assert first_ops <= _ancestors([second]), "two lookups of one step are not ordered"
        loss = tf.reduce_sum(first) + tf.reduce_sum(second)
        train = opt.apply_gradients(opt.compute_gradients(loss, [ev, other]))
        training_ops = _collectives(g)
        ids2 = _fed_ragged([4, 5 + rank], [0, 1, 2])
        loss2 = tf.reduce_sum(sok.lookup_sparse([ev], [ids2], training=True)[0])
        train2 = opt.apply_gradients(opt.compute_gradients(loss2, [ev]))
        pulled = training_ops & _ancestors([train2])
        assert not pulled, f"a second train op runs the first's {sorted(o.name for o in pulled)}"
        probe = _fed_ragged([7, 8 + rank], [0, 2])
        lookup_ops = _collectives(g)
        evaluation = sok.lookup_sparse([ev], [probe], training=False)[0]
        pulled = training_ops & _ancestors([evaluation])
        assert not pulled, f"evaluation depends on training collectives {sorted(o.name for o in pulled)}"
        eval_ops = _collectives(g) - lookup_ops
        labels = tf.constant([[1.0 * rank]])
        gathered = sok.all_gather([evaluation, labels], training=False)
        for t in gathered:  # after the eval lookup's exchange, apart from training
            assert eval_ops <= _ancestors([t]), f"{t.name} may run before the eval lookup's"
            pulled = training_ops & _ancestors([t])
            assert not pulled, f"an eval gather runs training collectives {sorted(o.name for o in pulled)}"
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(train)
            size = sess.run(ev.size())
            sess.run(evaluation)
            assert sess.run(ev.size()) == size, "an evaluation lookup inserted keys"
            for step in (train2, train, train2):  # separate runs, so in the same order everywhere
                sess.run(step)
    done("chains: evaluation lookups run none of the training collectives; steps apart")


def run_bytes(hvd, rank, world, per_rank=64, dim=16):
    import exchange_bytes

    from sparse_operation_kit.runtime import collectives

    keys = exchange_bytes.criteo_keys(
        world, per_rank * world
    )  # every rank's keys, computed locally
    tables = [sok.get_embedding_variable(f"bytes_C{f + 1}", dim) for f in range(len(keys[rank]))]
    sent = []
    exchange, sized = collectives.exchange, collectives.all_to_all_sized

    def count(tensor, rows_to):
        """Bytes this rank sends to other ranks."""
        c = np.asarray(rows_to)
        per_row = int(np.prod(tensor.shape[1:])) * tensor.dtype.size
        sent.append(int(c.sum() - c[rank]) * per_row)

    def recorded_exchange(tensor, counts, device="", row_columns=-1, **kw):
        c = counts.numpy()
        count(tensor, c[:, :row_columns].sum(axis=1) if c.ndim == 2 else c)
        sent[-1] += (c.size - c.shape[-1] if c.ndim == 2 else 0) * 8  # the size matrix
        return exchange(tensor, counts, device, row_columns, **kw)

    def recorded_sized(tensor, send_rows, recv_rows, *args, **kw):
        count(tensor, tf.convert_to_tensor(send_rows).numpy())
        return sized(tensor, send_rows, recv_rows, *args, **kw)

    ids = [tf.RaggedTensor.from_tensor(tf.constant(k[:, None])) for k in keys[rank]]
    collectives.exchange, collectives.all_to_all_sized = recorded_exchange, recorded_sized
    try:
        with tf.GradientTape() as tape:
            loss = tf.add_n([tf.reduce_sum(e) for e in sok.lookup_sparse(tables, ids)])
        tape.gradient(loss, tables)
    finally:
        collectives.exchange, collectives.all_to_all_sized = exchange, sized
    assert len(sent) == 3, (
        f"one lookup_sparse call of {len(tables)} tables and its gradient made {len(sent)} "
        "all-to-alls (want keys, rows, row gradients)"
    )
    measured = hvd.allreduce(tf.constant(sent, tf.int64), op=hvd.Sum).numpy()
    model = exchange_bytes.exchange_bytes(keys, [dim] * len(tables))
    assert measured[0] == model["requests"] + model["headers"], (measured, model)
    assert measured[1] == model["rows"], (measured, model)
    assert measured[2] == model["rows"], (measured, model)  # the rows' gradients
    done(
        f"bytes: {len(tables)} tables, {per_rank} samples per rank: keys {measured[0]:,} B + rows "
        f"{measured[1]:,} B "
        f"forward (as modelled), step total with gradients {model['alltoall']:,} B vs all-gather "
        f"{model['allgather']:,} B"
    )


def main():
    hvd, rank, world = setup()
    assert world == hvd.size() > 1, "run under horovodrun -np N (N > 1)"
    for arg in sys.argv[1:]:
        start, on_cpu = time.time(), cpu_step_ops()
        if arg.split(":")[0] in ("tf2", "tf1"):  # tf2 (every optimizer) or tf2:adam
            mode, _, only = arg.partition(":")
            for kind in [only] if only else ["sgd", "adagrad", "adam"]:
                (run_tf2 if mode == "tf2" else run_tf1)(kind, hvd, rank, world)
        elif arg.startswith("tiered="):  # the Embedding Variables of later phases: two tiers
            mp_common.STORAGE = mp_common.tiered_storage(arg[len("tiered="):], rank)
        elif arg == "sok2x":
            run_sok2x(hvd, rank, world)
        elif arg == "bytes":
            run_bytes(hvd, rank, world)
        elif arg == "collectives":
            run_collectives(hvd, rank, world)
        elif arg == "chains":
            run_chains(hvd, rank, world)
        elif arg == "errors":
            run_errors(hvd, rank, world)
        elif arg.startswith("dump="):
            mp_checkpoint.train_and_dump(arg[5:], hvd, rank, world)
        elif arg.startswith("sok2program="):
            sok2_program.run(arg[len("sok2program="):], hvd, rank, world)
        elif arg.startswith("load="):
            mp_checkpoint.load_and_continue(arg[5:], hvd, rank, world)
        else:
            raise ValueError(f"unknown phase {arg}")
        log(f"phase {arg.split('=')[0]} took {time.time() - start:.1f} s")
        if cpu_step_ops() != on_cpu:  # SOK_TEST_DEVICE=gpu fails at exit; this says where
            log(f"phase {arg.split('=')[0]} ran SOK step kernels on the CPU: {cpu_step_ops()}")


if __name__ == "__main__":
    main_guard(main)
