"""A representative NVIDIA SOK 2.x training program under horovodrun, checked on every rank
against tf.Variables trained by the same optimizers on the whole global batch in one process.

Tables: two sok.DynamicVariable ("0.5" and "uniform" initializers) and two sok.Variable (one
localized on the last rank, one distributed), looked up in one sok.lookup_sparse call. Adagrad
(fused on the Embedding Variables) trains the first two, Momentum (the generic path) the other
two, both tf.compat.v1.train optimizers in sok.OptimizerWrapper. One step checks
sok.incremental_model_dump against the reference (the rows of that step, from every rank);
then sok.dump / sok.load (with the optimizers' slots) into fresh tables and optimizers, and the
loaded model trains on exactly like the reference.
"""
import os

import numpy as np
import tensorflow as tf
from mp_common import GLOBAL_BATCH, close, done, rank_slice

import sparse_operation_kit as sok

VOCAB, DIM, HOTNESS = 24, 4, 3
STEPS, MORE_STEPS, INCREMENT_STEP = 4, 2, 2
COMBINERS = ["sum", "mean", "sqrtn", "sum"]
NAMES = ["sok2p_dyn_adagrad", "sok2p_var_adagrad", "sok2p_dyn_momentum", "sok2p_var_momentum"]


def _batch(step, table):
    """Ragged ids of the global batch: 1..HOTNESS ids per sample, repeats included."""
    rng = np.random.default_rng(1000 * step + table)
    lengths = rng.integers(1, HOTNESS + 1, GLOBAL_BATCH)
    return [rng.integers(0, VOCAB, n) for n in lengths]


def _ragged(samples):
    return tf.RaggedTensor.from_row_lengths(
        tf.constant(np.concatenate(samples), tf.int64), [len(s) for s in samples])


def _target(step):
    return np.random.default_rng(77 + step).normal(size=[GLOBAL_BATCH, DIM]).astype(np.float32)


def _model(world, suffix=""):
    rng = np.random.default_rng(5)
    static = [rng.normal(size=[VOCAB, DIM]).astype(np.float32) for _ in range(2)]
    tables = [
        sok.DynamicVariable(dimension=DIM, initializer="0.5", name=NAMES[0] + suffix),
        sok.Variable(static[0], mode=f"localized:{world - 1}", name=NAMES[1] + suffix),
        sok.DynamicVariable(dimension=DIM, initializer="uniform", name=NAMES[2] + suffix),
        sok.Variable(static[1], name=NAMES[3] + suffix),
    ]
    optimizers = [
        sok.OptimizerWrapper(tf.compat.v1.train.AdagradOptimizer(0.1)),
        sok.OptimizerWrapper(tf.compat.v1.train.MomentumOptimizer(0.05, momentum=0.9)),
    ]
    return tables, optimizers, static


def _sok_step(tables, optimizers, step, sl):
    ids = [_ragged(_batch(step, i)[sl]) for i in range(4)]
    with tf.GradientTape() as tape:
        embs = sok.lookup_sparse(tables, ids, combiners=COMBINERS)
        loss = tf.add_n([tf.reduce_sum((e - _target(step)[sl]) ** 2) for e in embs])
    grads = tape.gradient(loss, tables)
    optimizers[0].apply_gradients(zip(grads[:2], tables[:2]))
    optimizers[1].apply_gradients(zip(grads[2:], tables[2:]))


def _reference_step(ref, ref_optimizers, step):
    ids = [_ragged(_batch(step, i)).to_sparse() for i in range(4)]
    with tf.GradientTape() as tape:
        embs = [tf.nn.embedding_lookup_sparse(t, i, None, combiner=c)
                for t, i, c in zip(ref, ids, COMBINERS)]
        loss = tf.add_n([tf.reduce_sum((e - _target(step)) ** 2) for e in embs])
    grads = tape.gradient(loss, ref)
    ref_optimizers[0].apply_gradients(zip(grads[:2], ref[:2]))
    ref_optimizers[1].apply_gradients(zip(grads[2:], ref[2:]))


def _check_tables(what, tables, ref, rank, world, touched):
    for i, t in enumerate(tables):
        if isinstance(t, sok.DynamicVariable):
            keys, values = (x.numpy() for x in sok.export(t))
            mine = np.array(sorted(k for k in touched[i] if k % world == rank))
            order = np.argsort(keys)
            np.testing.assert_array_equal(keys[order], mine, err_msg=f"{what}: keys of {t.name}")
            close(f"{what}: rows of {t.name}", values[order], ref[i].numpy()[mine])
        else:
            rows = np.arange(rank, VOCAB, world) if t.target_gpu < 0 else (
                np.arange(VOCAB) if t.target_gpu == rank else np.arange(0))
            close(f"{what}: shard of {t.name}", t.numpy(), ref[i].numpy()[rows])


def run(path, hvd, rank, world):
    sl = rank_slice(rank, world)
    tables, optimizers, static = _model(world)
    uniform_rows = tables[2].sparse_read(np.arange(VOCAB), training=False)  # no insert
    # The reference lives on the CPU: TensorFlow has no GPU kernel for a sparse Momentum update.
    with tf.device("/CPU:0"):
        ref = [tf.Variable(tf.fill([VOCAB, DIM], 0.5)), tf.Variable(static[0]),
               tf.Variable(uniform_rows), tf.Variable(static[1])]
    ref_optimizers = [tf.compat.v1.train.AdagradOptimizer(0.1),
                      tf.compat.v1.train.MomentumOptimizer(0.05, momentum=0.9)]
    touched = [set() for _ in range(4)]
    for step in range(STEPS):
        since = sok.update_step(optimizers[0])
        _sok_step(tables, optimizers, step, sl)
        _reference_step(ref, ref_optimizers, step)
        for i in range(4):
            touched[i] |= {int(k) for s in _batch(step, i) for k in s}
        if step == INCREMENT_STEP:
            keys, values = sok.incremental_model_dump([tables[0]], since)
            order = np.argsort(keys[0])
            step_keys = np.unique(np.concatenate(_batch(step, 0)))
            np.testing.assert_array_equal(keys[0][order], step_keys,
                                          err_msg="incremental_model_dump: keys of the step")
            close("incremental_model_dump: rows of the step", values[0][order],
                  ref[0].numpy()[step_keys])
    _check_tables(f"after {STEPS} steps", tables, ref, rank, world, touched)

    sok.dump(os.path.join(path, "adagrad"), tables[:2], optimizers[0])
    sok.dump(os.path.join(path, "momentum"), tables[2:], optimizers[1])
    loaded, loaded_optimizers, _ = _model(world)
    sok.load(os.path.join(path, "adagrad"), loaded[:2], loaded_optimizers[0])
    sok.load(os.path.join(path, "momentum"), loaded[2:], loaded_optimizers[1])
    _check_tables("after sok.load", loaded, ref, rank, world, touched)
    for step in range(STEPS, STEPS + MORE_STEPS):
        _sok_step(loaded, loaded_optimizers, step, sl)
        _reference_step(ref, ref_optimizers, step)
        for i in range(4):
            touched[i] |= {int(k) for s in _batch(step, i) for k in s}
    _check_tables(f"{MORE_STEPS} steps after sok.load", loaded, ref, rank, world, touched)
    done("sok2 program: DynamicVariable + sok.Variable, Adagrad (fused) + Momentum (generic), "
         "incremental_model_dump, sok.dump/load with slots")
    run_families(rank, world)


# Every optimizer family on SOK tables sharded over the ranks, against one process's tf.Variables
# trained by the same optimizer on the global batch. Each step's ids are a permutation of the
# vocabulary (every row touched once), so Keras's dense updates of a tf.Variable and SOK's updates
# of touched rows agree exactly.
FAMILIES = {
    "v1 GradientDescent (fused)": lambda: tf.compat.v1.train.GradientDescentOptimizer(0.1),
    "v1 Adam (fused)": lambda: tf.compat.v1.train.AdamOptimizer(0.01),
    "v1 FTRL (fused)": lambda: tf.compat.v1.train.FtrlOptimizer(0.1),
    "v1 RMSProp centered": lambda: tf.compat.v1.train.RMSPropOptimizer(0.01, momentum=0.5,
                                                                        centered=True),
    "v1 Adadelta": lambda: tf.compat.v1.train.AdadeltaOptimizer(1.0),
    "v1 ProximalAdagrad": lambda: tf.compat.v1.train.ProximalAdagradOptimizer(
        0.1, l1_regularization_strength=0.01),
    "Keras SGD nesterov": lambda: tf.keras.optimizers.SGD(0.05, momentum=0.9, nesterov=True),
    "Keras Adam amsgrad": lambda: tf.keras.optimizers.Adam(0.01, amsgrad=True),
    "Keras RMSprop": lambda: tf.keras.optimizers.RMSprop(0.01),
    "Keras Nadam": lambda: tf.keras.optimizers.Nadam(0.01),
    "Keras AdamW": lambda: tf.keras.optimizers.AdamW(0.01),
}
FAMILY_STEPS = 3


def _permuted_batch(step):
    ids = np.random.default_rng(500 + step).permutation(VOCAB)
    return np.split(ids, GLOBAL_BATCH)  # GLOBAL_BATCH samples of VOCAB / GLOBAL_BATCH ids


def run_families(rank, world):
    sl = rank_slice(rank, world)
    static = np.random.default_rng(6).normal(size=[VOCAB, DIM]).astype(np.float32)
    for n, (family, make) in enumerate(FAMILIES.items()):
        tables = [sok.DynamicVariable(dimension=DIM, initializer="0.5", name=f"sok2f_dyn_{n}"),
                  sok.Variable(static, name=f"sok2f_var_{n}")]
        with tf.device("/CPU:0"):  # no GPU kernels for some sparse v1 updates (as above)
            ref = [tf.Variable(tf.fill([VOCAB, DIM], 0.5)), tf.Variable(static)]
        opt, ref_opt = sok.OptimizerWrapper(make()), make()
        for step in range(FAMILY_STEPS):
            samples = _permuted_batch(step)
            target = _target(step)
            with tf.GradientTape() as tape:
                embs = sok.lookup_sparse(tables, [_ragged(samples[sl])] * 2,
                                         combiners=["mean", "sum"])
                loss = tf.add_n([tf.reduce_sum((e - target[sl]) ** 2) for e in embs])
            opt.apply_gradients(zip(tape.gradient(loss, tables), tables))
            sp = _ragged(samples).to_sparse()
            with tf.GradientTape() as tape:
                embs = [tf.nn.embedding_lookup_sparse(t, sp, None, combiner=c)
                        for t, c in zip(ref, ["mean", "sum"])]
                loss = tf.add_n([tf.reduce_sum((e - target) ** 2) for e in embs])
            ref_opt.apply_gradients(zip(tape.gradient(loss, ref), ref))
        _check_tables(f"{family}, {FAMILY_STEPS} steps", tables, ref, rank, world,
                      [set(range(VOCAB))] * 2)
    done(f"optimizer families on sharded tables: {', '.join(FAMILIES)}")
