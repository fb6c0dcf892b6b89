"""Shared pieces of the horovodrun workers: set-up, the test tables, deterministic batches and the
single-process reference written in plain TensorFlow.

The reference needs no collective: every rank builds the whole global batch itself and holds the
whole tables in tf.Variables. An Embedding Variable's initial rows are deterministic per key, so
`ev.sparse_read(keys, training=False)` gives any key's initial row on any rank before training.
"""
import os
import sys
import time
import zlib

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import sparse_operation_kit as sok  # noqa: E402
from sparse_operation_kit.tables import storage  # noqa: E402

RTOL, ATOL = 1e-5, 1e-5
GLOBAL_BATCH = 12  # split evenly over 1, 2, 3 and 4 ranks


def setup(use_horovod=True):
    """hvd.init() then sok.init() (SOK 2.x order); returns (hvd or None, rank, world)."""
    hvd = None
    if use_horovod:
        import horovod.tensorflow as hvd
        hvd.init()
    sok.init()
    if use_horovod and os.environ.get("SOK_TEST_DEVICE", "cpu").lower() == "gpu":
        import atexit

        from sparse_operation_kit.runtime import collectives

        # A one-rank job (a reference run under horovodrun) makes no communicator.
        several = sok.num_ranks() > 1
        assert collectives.kind() == ("nccl" if several else None), \
            f"rank {sok.rank()}: collectives {collectives.kind()}"
        atexit.register(_check_ran_on_gpu, several)
    return hvd, sok.rank(), sok.num_ranks()


STEP_OPS = ("SokUniqueKeys", "SokEmbeddingVariableGather", "SokPooledCombine",
            "SokPooledCombineGrad", "SokEmbeddingVariableSparseApply", "SokAllToAll",
            "SokAllReduce", "SokExchangePlan", "SokExchangeOwnerKeys",
            "SokExchangeRowsToBlocks", "SokExchangeGatherRows", "SokExchangeScatterRows",
            "SokExchangeRowsFromBlocks", "SokPooledCombineFlat", "SokPooledCombineFlatGrad")


def cpu_step_ops():
    """{op: runs on the CPU} of the step's SOK kernels so far."""
    counts = sok.kernel_run_counts(by_op=True)
    return {op: c["CPU"] for op, c in counts.items() if c["CPU"] and op in STEP_OPS}


def _check_ran_on_gpu(several):
    """SOK_TEST_DEVICE=gpu: the kernels of a training step ran on the GPU only, the all-to-alls
    among them when there are several ranks."""
    on_cpu = cpu_step_ops()
    ran = sok.kernel_run_counts(by_op=True).get("SokAllToAll", {}).get("GPU", 0)
    if on_cpu or (several and not ran):
        print(f"[rank {sok.rank()}] FAILED device check: on the CPU {on_cpu}; "
              f"SokAllToAll on the GPU {ran} times", flush=True)
        os._exit(3)
    log(f"OK device: SOK kernels on the GPU, {ran} NCCL all-to-alls")


def log(msg):
    print(f"[rank {sok.rank()}/{sok.num_ranks()}] {msg}", flush=True)


def close(what, got, want, rtol=RTOL, atol=ATOL):
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape:
        raise AssertionError(
            f"rank {sok.rank()}: {what}: shape {got.shape} != reference {want.shape}"
        )
    np.testing.assert_allclose(
        got,
        want,
        rtol=rtol,
        atol=atol,
        err_msg=f"rank {sok.rank()}: {what} differs from the single-process reference",
    )


# ---------------------------------------------------------------------------------------------
# The tables: two Embedding Variables and two static sok.Variable tables
# ---------------------------------------------------------------------------------------------
class Spec:
    def __init__(self, name, kind, dim, vocab, key_dtype, combiner, target):
        self.name, self.kind, self.dim, self.key_dtype, self.combiner = (
            name,
            kind,
            dim,
            key_dtype,
            combiner,
        )
        self.vocab = np.asarray(vocab)  # EV: its keys; static: its row ids 0..rows-1
        self.target = target  # -1 spread over all ranks, k on rank k

    @property
    def rows(self):
        return len(self.vocab)


def specs(world, prefix=""):
    """Keys far apart, negative and beyond 32 bits; odd row counts; one table per placement kind."""
    last = world - 1
    return [
        Spec(
            prefix + "ev_spread",
            "ev",
            4,
            [0, 1, 2, 3, 5, 8, 13, -3, -7, 2**40 + 3],
            tf.int64,
            "sum",
            -1,
        ),
        Spec(prefix + "ev_local", "ev", 3, [0, 4, 9, 16, 25, -1, 100003], tf.int32, "mean", last),
        Spec(prefix + "st_spread", "static", 4, np.arange(11), tf.int64, "sqrtn", -1),
        Spec(
            prefix + "st_local", "static", 2, np.arange(7), tf.int32, "sum", 1 if world > 1 else 0
        ),
    ]


def static_init(spec):
    rng = np.random.default_rng(zlib.crc32(spec.name.encode()))
    return rng.uniform(-1.0, 1.0, [spec.rows, spec.dim]).astype(np.float32)


# A StorageOption factory for the Embedding Variables of the phases that follow (the `tiered=`
# phase sets it): each rank's shard then lives in two tiers, and must train as the one-tier
# reference does.
STORAGE = None


def tiered_storage(root, rank):
    """A factory of multi-tier options with room for two rows in the upper tier: DRAM_SSDHASH
    under root/rank_<r> on CPUs, HBM_DRAM on GPUs (each is refused on the other device)."""
    two_rows = 2 * (4 * 4 * 3 + storage.ROW_META_BYTES)  # dim <= 4 with Adam's two slots
    if os.environ.get("SOK_TEST_DEVICE", "cpu").lower() == "gpu":
        return lambda: sok.StorageOption(sok.StorageType.HBM_DRAM, storage_size=[two_rows])
    path = os.path.join(root, f"rank_{rank}")
    os.makedirs(path, exist_ok=True)
    return lambda: sok.StorageOption(sok.StorageType.DRAM_SSDHASH, path, [two_rows])


def make_sok_table(spec):
    if spec.kind == "ev":
        option = STORAGE() if STORAGE is not None else None
        ev = sok.get_embedding_variable(
            spec.name,
            spec.dim,
            key_dtype=spec.key_dtype,
            initializer=tf.random_uniform_initializer(-1.0, 1.0, seed=11),
            ev_option=sok.EmbeddingVariableOption(storage_option=option) if option else None,
        )
        ev.target_gpu = spec.target
        return ev
    mode = "distributed" if spec.target < 0 else f"localized:{spec.target}"
    return sok.Variable(static_init(spec), mode=mode, name=spec.name)


def initial_rows(spec, table, sess=None):
    """The whole table's initial rows (EV: of its vocab, read without inserting)."""
    if spec.kind != "ev":
        return static_init(spec)
    t = table.sparse_read(tf.constant(spec.vocab, spec.key_dtype), training=False)
    return sess.run(t) if sess is not None else t.numpy()


def owner(spec, keys, world):
    keys = np.asarray(keys, np.int64)
    if world == 1:
        return np.zeros(keys.shape, np.int64)
    return np.mod(keys, world) if spec.target < 0 else np.full(keys.shape, spec.target)


def shard_rows(spec, rank, world):
    """Global row ids of a static table held by `rank` (row k // N of the shard is k)."""
    if world == 1:
        return np.arange(spec.rows)
    if spec.target < 0:
        return np.arange(rank, spec.rows, world)
    return np.arange(spec.rows) if spec.target == rank else np.arange(0)


# ---------------------------------------------------------------------------------------------
# Batches: positions into each table's vocab, per global sample
# ---------------------------------------------------------------------------------------------
def global_batch(seed, step, tables):
    """{table name: list (per global sample) of vocab positions}. Repeated ids inside samples and
    across ranks (position 0 is in every rank's first sample); some samples are empty; at step 3
    the first rank-slice of the last table has no ids; at step 5 the last two tables have no ids
    at all (an exchange where nothing moves)."""
    rng = np.random.default_rng(seed * 1000 + step)
    out = {}
    for t, spec in enumerate(tables):
        samples = []
        for b in range(GLOBAL_BATCH):
            n = int(rng.integers(0, 5))
            ids = [int(x) for x in rng.integers(0, spec.rows, n)]
            if b % 2 == 0 or b % 3 == 0:  # the first sample of each slice for 1 to 4 ranks
                ids = ids + [0, 0]
            samples.append(ids)
        if step == 3 and t == len(tables) - 1:
            for b in range(GLOBAL_BATCH // 3):
                samples[b] = []
        if step == 5 and t >= len(tables) - 2:
            samples = [[] for _ in range(GLOBAL_BATCH)]
        out[spec.name] = samples
    return out


def rank_slice(rank, world):
    per = GLOBAL_BATCH // world
    return slice(rank * per, (rank + 1) * per)


def ids_value(spec, samples, keyed=True):
    """tf.compat.v1.SparseTensorValue of the samples: keys (keyed) or vocab positions."""
    indices = [[b, j] for b, s in enumerate(samples) for j in range(len(s))]
    vals = [spec.vocab[p] if keyed else p for s in samples for p in s]
    width = max([len(s) for s in samples] + [1])
    dtype = spec.key_dtype.as_numpy_dtype if keyed else np.int64
    return tf.compat.v1.SparseTensorValue(
        np.array(indices, np.int64).reshape(-1, 2),
        np.array(vals, dtype),
        np.array([len(samples), width], np.int64),
    )


def to_sparse(value):
    return tf.SparseTensor(
        tf.constant(value.indices), tf.constant(value.values), tf.constant(value.dense_shape)
    )


def reference_combine(table, sp_positions, batch, combiner):
    """Pooled rows of a whole-table tf.Variable (segment sums; empty samples read zeros). Like
    tf.nn.embedding_lookup_sparse it reads each distinct id once, so the table's gradient holds
    each row once (what optimizers expect)."""
    unique, index = tf.unique(sp_positions.values)
    rows = tf.gather(tf.gather(table, unique), index)
    seg = sp_positions.indices[:, 0]
    sums = tf.math.unsorted_segment_sum(rows, seg, batch)
    count = tf.math.unsorted_segment_sum(tf.ones_like(seg, tf.float32), seg, batch)[:, None]
    if combiner == "mean":
        return sums / tf.maximum(count, 1.0)
    if combiner == "sqrtn":
        return sums / tf.sqrt(tf.maximum(count, 1.0))
    return sums


def loss_fn(embs, w, labels):
    """A SUM over samples: per-rank losses add up to the global batch's loss."""
    h = tf.concat(embs, axis=1)
    pred = tf.matmul(h, w)[:, 0]
    return tf.reduce_sum(0.5 * tf.square(pred - labels)) + 0.5 * tf.reduce_sum(tf.square(h))


def labels(seed, step):
    return np.random.default_rng(seed * 7 + step).uniform(-1, 1, GLOBAL_BATCH).astype(np.float32)


def dense_init(total_dim):
    return np.random.default_rng(5).uniform(-0.5, 0.5, [total_dim, 1]).astype(np.float32)


# ---------------------------------------------------------------------------------------------
# Reference updates of Embedding Variable tables (lazy: only rows with a gradient move)
# ---------------------------------------------------------------------------------------------
HYPER = {
    "sgd": dict(lr=0.01),
    "adagrad": dict(lr=0.1, init_acc=0.1),
    "adam": dict(lr=0.05, beta1=0.9, beta2=0.999),
}


def num_slots(kind):
    return {"sgd": 0, "adagrad": 1, "adam": 2}[kind]


def make_keras_optimizer(kind):
    import keras
    h = HYPER[kind]
    if kind == "sgd":
        return keras.optimizers.SGD(h["lr"])
    if kind == "adagrad":
        return keras.optimizers.Adagrad(h["lr"], initial_accumulator_value=h["init_acc"])
    return keras.optimizers.Adam(h["lr"], beta_1=h["beta1"], beta_2=h["beta2"])


def make_v1_optimizer(kind):
    h = HYPER[kind]
    if kind == "sgd":
        return tf.compat.v1.train.GradientDescentOptimizer(h["lr"])
    if kind == "adagrad":
        return tf.compat.v1.train.AdagradOptimizer(h["lr"], initial_accumulator_value=h["init_acc"])
    return tf.compat.v1.train.AdamOptimizer(h["lr"], beta1=h["beta1"], beta2=h["beta2"])


def epsilon(kind, keras_api):
    if kind == "adagrad":
        return 1e-7 if keras_api else 0.0
    if kind == "adam":
        return 1e-7 if keras_api else 1e-8
    return 0.0


def slot_initial(kind):
    return HYPER["adagrad"]["init_acc"] if kind == "adagrad" else 0.0


def reference_ev_update(kind, table, slots, grad, t, eps):
    """Lazy sparse update of a whole-table reference (tf.Variables): `grad` is a tf.IndexedSlices
    of vocab positions (duplicates summed); `t` the 1-based step. Returns the update op(s)."""
    h = HYPER[kind]
    dense = tf.math.unsorted_segment_sum(grad.values, grad.indices, tf.shape(table)[0])
    touched = tf.math.unsorted_segment_sum(tf.ones_like(grad.indices, tf.float32), grad.indices,
                                           tf.shape(table)[0])[:, None] > 0
    if kind == "sgd":
        return [table.assign_sub(h["lr"] * dense)]
    if kind == "adagrad":
        acc = tf.where(touched, slots[0] + dense * dense, slots[0])
        step = tf.where(touched, h["lr"] * dense / (tf.sqrt(acc) + eps), 0.0)
        with tf.control_dependencies([step]):
            return [slots[0].assign(acc), table.assign_sub(step)]
    # beta and 1 - beta in float32, as the fused update (and tf.compat.v1's Adam) computes them;
    # Keras 3 forms 1 - beta in float64 (0.001 vs 1 - 0.999f = 0.00099998713).
    b1, b2 = tf.constant(h["beta1"], tf.float32), tf.constant(h["beta2"], tf.float32)
    t = tf.cast(t, tf.float64)
    alpha = tf.cast(h["lr"] * tf.sqrt(1 - tf.pow(tf.cast(b2, tf.float64), t))
                    / (1 - tf.pow(tf.cast(b1, tf.float64), t)), tf.float32)
    m = tf.where(touched, b1 * slots[0] + (1 - b1) * dense, slots[0])
    v = tf.where(touched, b2 * slots[1] + (1 - b2) * dense * dense, slots[1])
    step = tf.where(touched, alpha * m / (tf.sqrt(v) + eps), 0.0)
    with tf.control_dependencies([step]):
        return [slots[0].assign(m), slots[1].assign(v), table.assign_sub(step)]


# ---------------------------------------------------------------------------------------------
# Comparisons of what a rank owns with the reference
# ---------------------------------------------------------------------------------------------
def dense_by_key(indices, values, dim):
    out = {}
    for k, v in zip(np.asarray(indices).reshape(-1), np.asarray(values).reshape(-1, dim)):
        out[int(k)] = out.get(int(k), 0) + v
    return out


def check_ev_grad(what, spec, grad_indices, grad_values, ref_indices, ref_values, rank, world):
    """The owner's gradient (summed per key over the ranks' contributions) equals the
    reference's."""
    got = dense_by_key(grad_indices, grad_values, spec.dim)
    ref = dense_by_key(ref_indices, ref_values, spec.dim)  # by vocab position
    want = {int(spec.vocab[p]): g for p, g in ref.items()
            if int(owner(spec, [spec.vocab[p]], world)[0]) == rank}
    if set(got) != set(want):
        raise AssertionError(
            f"rank {rank}: {what}: gradient keys {sorted(got)} != owned looked-up keys "
            f"{sorted(want)}"
        )
    for k in want:
        close(f"{what} key {k}", got[k], want[k])


def check_ev_rows(what, spec, exported, ref_table, ref_slots, kind, touched, rank, world):
    """Exported rows (keys, values, slots) of an EV equal the reference rows of its owned keys."""
    keys, values, slots = exported[0], exported[1], exported[2]
    pos = {int(k): i for i, k in enumerate(spec.vocab)}
    want_keys = sorted(int(spec.vocab[p]) for p in np.flatnonzero(touched)
                       if int(owner(spec, [spec.vocab[p]], world)[0]) == rank)
    if sorted(int(k) for k in keys) != want_keys:
        raise AssertionError(
            f"rank {rank}: {what}: holds keys {sorted(int(k) for k in keys)}, expected the "
            f"owned looked-up keys {want_keys}"
        )
    idx = [pos[int(k)] for k in keys]
    close(f"{what} values", values, ref_table[idx])
    ns = num_slots(kind)
    if ns and len(keys):
        for s in range(ns):
            close(f"{what} slot {s}", np.asarray(slots)[:, s, :], ref_slots[s][idx])


def check_static_rows(what, spec, shard, ref_table, rank, world):
    close(what, shard, ref_table[shard_rows(spec, rank, world)])


def done(name):
    log(f"OK {name}")


def main_guard(fn):
    """Runs fn(); on any failure prints it with the rank and exits non-zero (horovodrun then
    stops the other ranks)."""
    try:
        fn()
    except BaseException:
        import traceback
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
    log("WORKER-DONE")
    sys.stdout.flush()


def report_failure(who, start, error, chars=500):
    """Prints `<who> failed after <s> s: <type>: <message>`, the message on one line and cut at
    `chars`: the line the failure tests look for."""
    print(f"{who} failed after {time.time() - start:.1f} s: {type(error).__name__}: "
          f"{' '.join(str(error).split())[:chars]}", flush=True)


def lookups_fail(rank, table_name, calls, start):
    """`calls` lookup_sparse calls on a new table, 0.5 s apart, after a rank has left: True once
    one failed (its error reported), False when all of them ran."""
    ev = sok.get_embedding_variable(table_name, 4)
    ids = tf.ragged.constant([[1, 2, 3]], dtype=tf.int64)
    try:
        for _ in range(calls):
            sok.lookup_sparse([ev], [ids])
            time.sleep(0.5)
    except Exception as e:  # any failure is reported with its rank
        report_failure(f"[rank {rank}] lookup_sparse", start, e)
        return True
    return False
