"""The collectives of model parallelism, picked once per job in sok.init():

- "nccl": every rank has its own GPU. The exchange's all-to-alls and `all_reduce` are SOK's ops
  on TensorFlow's GPU stream over one NCCL communicator per process, bootstrapped through Horovod
  (rank 0's NCCL id is broadcast once). No per-call negotiation; one wait on the host per
  all-to-all, for the per-rank sizes.
- "horovod": Horovod's collectives (Gloo between CPUs), with Horovod's negotiation.

Ranks must run the same collectives in the same order. Eager code and tf.function (automatic
control dependencies of stateful ops) do; in a TF1 graph each SOK collective gets a control
dependency on the one created before it in its chain: "train" (training lookups, their
gradients, sok.all_reduce) or "lookup" (lookups that do not train, e.g. evaluation), so that
running an evaluation never runs a training step's collectives. A training step's chain ends at
its gradients' collectives (and the sok.all_reduce calls after them): a training lookup built
after them starts a new step (another train op: a dependency would make every run of it also
run the earlier step's lookups and gradients).
A Session.run that fetches two steps, or both kinds, at once may order their collectives
differently on different ranks: fetch them in separate runs.
"""
import contextlib
import logging
import os
import socket
import threading
import types
import weakref
import zlib

import tensorflow as tf

from sparse_operation_kit.runtime._ops import ops
from sparse_operation_kit.runtime.devices import gpu_kernels_built

_log = logging.getLogger("sparse_operation_kit")
_ENV = "SOK_COLLECTIVES"  # "horovod" forces Horovod's collectives (e.g. to compare)
# TF1 graph -> {chain: the last SOK collective op of that chain in it}
_last_in_graph = weakref.WeakKeyDictionary()
TRAIN, LOOKUP = "train", "lookup"


class _Job:
    hvd = None  # horovod.tensorflow, with several ranks
    kind = None  # "nccl" or "horovod" with several ranks, else None


_job = _Job()


def kind():
    """The job's collectives: "nccl", "horovod", or None (one process)."""
    return _job.kind


# ------------------------------------------------------------------------------ set-up


def pin_rank_to_gpu(hvd):
    """Gives this rank GPU `local_rank` (what SOK 2.x programs write by hand) unless the program
    chose its GPUs (CUDA_VISIBLE_DEVICES of one GPU, or tf.config.set_visible_devices)."""
    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        return
    local_rank, local_size = hvd.local_rank(), hvd.local_size()
    try:
        visible = tf.config.get_visible_devices("GPU")
    except RuntimeError:
        visible = gpus
    if len(gpus) < local_size:
        _log.warning(
            "sok.init: %d ranks on this host share %d GPU(s): rank %d uses GPU %d with another "
            "rank (one GPU per rank is the fast and supported set-up)",
            local_size, len(gpus), hvd.rank(), local_rank % len(gpus))
    if len(visible) != len(gpus) or len(gpus) == 1:
        return  # the program (or the launcher) chose
    try:
        tf.config.set_visible_devices(gpus[local_rank % len(gpus)], "GPU")
    except RuntimeError as e:  # TensorFlow already initialised its devices
        _log.warning(
            "sok.init: cannot give rank %d GPU %d (%s): call sok.init() before any TensorFlow "
            "op runs, or choose the GPU yourself", hvd.rank(), local_rank, e)


def _nccl_device():
    """The CUDA ordinal of this process's one visible GPU, or None (no GPU, or several)."""
    try:
        visible = tf.config.get_visible_devices("GPU")
    except RuntimeError:
        return None
    if len(visible) != 1:
        return None
    return int(visible[0].name.rsplit(":", 1)[1])


def _local_nccl_reason():
    """Why this rank cannot use NCCL (None: it can)."""
    if os.environ.get(_ENV, "").lower() == "horovod":
        return f"{_ENV}=horovod"
    if not gpu_kernels_built():
        return "this build of SOK has no GPU kernels"
    if _nccl_device() is None:
        return "the rank does not see exactly one GPU"
    return None


def _gpu_identity(device):
    """This rank's GPU as a number equal on two ranks exactly when they share a GPU of one host
    (CUDA_VISIBLE_DEVICES maps TensorFlow's ordinal to the host's GPU)."""
    visible = [v for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    gpu = visible[device].strip() if device < len(visible) else str(device)
    return zlib.crc32(f"{socket.gethostname()}|{gpu}".encode()) & 0x7FFFFFFF


def _shared_gpu_reason(hvd, reason):
    """Why NCCL cannot be used by the job because ranks share a GPU (None: no two do). Every
    rank gets the same answer (an allgather), so all fall back together."""
    ident = -1 - hvd.rank() if reason is not None else _gpu_identity(_nccl_device() or 0)
    with tf.Graph().as_default():
        gathered = hvd.allgather(tf.constant([ident], tf.int64), name="sok_gpu_ids")
        with _cpu_session() as sess:
            ids = list(sess.run(gathered))
    shared = sorted({i for i in ids if i >= 0 and ids.count(i) > 1})
    if not shared:
        return None
    ranks = [r for r, i in enumerate(ids) if i == shared[0]]
    return (f"ranks {ranks} share one GPU (NCCL needs a GPU per rank: run at most one rank per "
            "GPU)")


def setup(hvd, timeout_s):
    """Chooses the job's collectives (the same on every rank) and, for NCCL, joins the
    communicator. Runs in a throwaway graph and session on the CPU, so it works in eager and TF1
    programs alike and allocates no GPU memory through TensorFlow."""
    _job.hvd, _job.kind = hvd, "horovod"
    reason = _local_nccl_reason()
    shared = _shared_gpu_reason(hvd, reason)  # a collective: every rank calls it
    reason = reason or shared
    uid = b"\0" * 128
    if reason is None and hvd.rank() == 0:
        try:
            uid = _run(lambda: ops.sok_nccl_unique_id())
        except tf.errors.OpError as e:
            reason = e.message
    with tf.Graph().as_default():
        ok = hvd.allreduce(tf.constant(1 if reason is None else 0, tf.int32), op=hvd.Min,
                           name="sok_nccl_ok")
        uid_t = hvd.broadcast(tf.io.decode_raw(tf.constant(uid), tf.uint8), root_rank=0,
                              name="sok_nccl_id")
        with _cpu_session() as sess:
            all_ok, uid_bytes = sess.run([ok, uid_t])
    if not all_ok:
        if reason is not None and tf.config.list_physical_devices("GPU"):
            _log.warning("sok: rank %d exchanges through Horovod, not NCCL: %s", hvd.rank(), reason)
        return
    device = _nccl_device()
    init = lambda: ops.sok_nccl_init(  # noqa: E731
        tf.constant(bytes(uid_bytes)), rank=hvd.rank(), world=hvd.size(), device=device,
        timeout_seconds=float(timeout_s))
    _run_bounded(init, timeout_s, f"joining the NCCL communicator (rank {hvd.rank()}, GPU {device})")
    _job.kind = "nccl"


def reset():
    """One process again (sok.init without Horovod)."""
    _job.hvd, _job.kind = None, None


def _cpu_session():
    return tf.compat.v1.Session(config=tf.compat.v1.ConfigProto(device_count={"GPU": 0}))


def _run(make):
    with tf.Graph().as_default(), tf.device("/CPU:0"):
        out = make()
        with _cpu_session() as sess:
            return sess.run(out)


def _run_bounded(make, timeout_s, what):
    """_run in a thread that may take at most timeout_s (NCCL's bootstrap waits for every rank)."""
    result = {}

    def target():
        try:
            _run(make)
        except BaseException as e:  # noqa: BLE001  re-raised below, in the caller's thread
            result["error"] = e

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(timeout_s)
    if t.is_alive():
        raise RuntimeError(f"sok.init: {what} did not complete within {timeout_s:g} s: a rank is "
                           "missing or stalled")
    if "error" in result:
        raise result["error"]


# ------------------------------------------------------------------------------ collectives


def not_xla_compiled():
    """Keeps XLA's auto-clustering (--xla, tf.config.optimizer.set_jit) off SOK's collectives and
    the ops around them: their shapes change from call to call and the collectives run outside
    XLA; gradients inherit it."""
    if tf.executing_eagerly():
        return contextlib.nullcontext()
    return tf.xla.experimental.jit_scope(compile_ops=False)


def uses_nccl(device=""):
    """True when a collective placed on `device` runs on NCCL."""
    return _job.kind == "nccl" and "CPU" not in (device or "").upper()


def all_to_all(x, counts, device="", chain=TRAIN):
    """Rows of `x`, grouped by destination, counts[p] (int64) to rank p; returns the received rows
    (in rank order) and how many came from each rank (int64, in host memory on GPUs)."""
    ex = exchange(x, counts, device, chain=chain)
    return ex.rows, ex.received


def exchange(x, counts, device="", row_columns=-1, width_mismatch=None, chain=TRAIN,
             opens_lookup=False):
    """The all-to-all with sizes in a matrix: counts [world, k] (int64), row p for rank p, whose
    first `row_columns` columns (-1: all) add up to the rows of `x` for rank p (rows of `x` past
    them are not sent); the other columns
    travel along (values every rank must see). Returns .rows (received, in rank order),
    .received (the [world, k] values rank p sent here, row p) and .sent (`counts`), both in host
    memory on GPUs: the wait for sizes on the host happens here. Ranks whose k differ all fail
    with `width_mismatch` (a message) and every rank's k. `opens_lookup`: the first collective of
    a lookup (TF1 chains, module doc)."""
    counts = tf.cast(counts, tf.int64)
    message = width_mismatch or "the ranks sent count matrices of different widths"
    with _after_previous(chain, opens_lookup):
        if uses_nccl(device):
            rows, _, sent, received = ops.sok_all_to_all(
                x, counts, row_columns=row_columns, width_mismatch=message)
        else:
            rows, received, sent = _horovod_exchange(x, counts, row_columns, message)
    _remember(rows, chain)
    return types.SimpleNamespace(rows=rows, received=received, sent=sent)


def _horovod_exchange(x, counts, row_columns, message):
    hvd = _job.hvd
    if counts.shape.rank == 1:
        rows, received = hvd.alltoall(x, splits=tf.cast(counts, tf.int32))
        return rows, tf.cast(received, tf.int64), counts
    ones = tf.ones([hvd.size()], tf.int32)
    width = tf.shape(counts, tf.int64)[1]
    widths, _ = hvd.alltoall(tf.fill([hvd.size()], width), splits=ones)
    same = tf.debugging.Assert(tf.reduce_all(tf.equal(widths, width)),
                               [message + " Count columns per rank:", widths],
                               summarize=hvd.size())
    with tf.control_dependencies([same]):
        rows_to = tf.reduce_sum(counts if row_columns < 0 else counts[:, :row_columns], axis=1)
    # Rows past the counts (a padded request's tail) are not sent.
    rows, _ = hvd.alltoall(x[:tf.reduce_sum(rows_to)], splits=tf.cast(rows_to, tf.int32))
    received, _ = hvd.alltoall(counts, splits=ones)
    return rows, received, counts


def all_to_all_sized(x, send_rows, recv_rows, device="", chain=TRAIN, ends_step=False):
    """The all-to-all when both sides know the sizes: send_rows[p] rows of `x` to rank p,
    recv_rows[p] rows from rank p (int64 [world], host values from `exchange`). On GPUs no
    sizes are exchanged and nothing waits on the host."""
    with _after_previous(chain):
        if uses_nccl(device):
            out = ops.sok_all_to_all_sized(x, send_rows, recv_rows)
        else:
            out, _ = _job.hvd.alltoall(x, splits=tf.cast(send_rows, tf.int32))
    _remember(out, chain, ends_step)
    return out


def all_reduce(tensors, op="mean"):
    """The sum or mean over ranks of each dense tensor in `tensors` (a list): on GPUs one NCCL
    launch for all of them; else Horovod's allreduce of each. One process: the tensors."""
    if op not in ("mean", "sum"):
        raise ValueError(f"sok.all_reduce: op must be 'mean' or 'sum', got {op!r}")
    tensors = [tf.convert_to_tensor(t) for t in tensors]
    for t in tensors:
        if op == "mean" and not t.dtype.is_floating:
            raise ValueError(f"sok.all_reduce: the mean of a {t.dtype.name} tensor is not "
                             "defined: use op='sum'")
    hvd = _job.hvd
    if hvd is None or hvd.size() == 1 or not tensors:
        return tensors
    if not uses_nccl():
        hvd_op = hvd.Average if op == "mean" else hvd.Sum
        return [hvd.allreduce(t, op=hvd_op) for t in tensors]
    out = [None] * len(tensors)
    by_dtype = {}
    for i, t in enumerate(tensors):
        by_dtype.setdefault(tf.as_dtype(t.dtype), []).append(i)
    for idx in by_dtype.values():
        with _after_previous():
            reduced = ops.sok_all_reduce([tensors[i] for i in idx], reduction=op)
        _remember(reduced[0], ends_step=None)  # after the gradients (dense ones) or not
        for i, r in zip(idx, reduced, strict=True):
            out[i] = r
    return out


def all_gather(tensors, training=False):
    """Every rank's tensors concatenated along axis 0 in rank order, for each tensor of
    `tensors` (a list; its first dimension may differ between ranks, the others may not). In a
    TF1 graph each gather follows the lookups before it in SOK's chain of collectives: those of
    an evaluation (training=False) or of a training step (training=True), so that every rank
    runs SOK's collectives in one order; another library's gather left free to run before or
    after SOK's exchange can leave each rank waiting for the other. On GPUs SOK's all-to-all;
    else Horovod's allgather. One process: the tensors."""
    tensors = [tf.convert_to_tensor(t) for t in tensors]
    for i, t in enumerate(tensors):
        if t.shape.rank == 0:
            raise ValueError(f"sok.all_gather: tensor {i} is a scalar: give it a first dimension "
                             "(the one the ranks' tensors are concatenated along)")
    hvd = _job.hvd
    if hvd is None or hvd.size() == 1:
        return tensors
    chain = TRAIN if training else LOOKUP
    out = []
    for i, t in enumerate(tensors):
        with _after_previous(chain), not_xla_compiled():
            gathered = _gather(t, i, hvd.size()) if uses_nccl() else hvd.allgather(t)
        _remember(gathered, chain, ends_step=None)
        out.append(gathered)
    return out


def _gather(t, i, world):
    """all_gather of one tensor through SOK's all-to-all. It moves bytes (rows of one byte), so
    ranks whose rows differ in size cannot disagree on what NCCL moves; each rank sends its bytes
    per row and dtype beside the counts, and every rank fails at once on a mismatch."""
    dtype = t.dtype
    if dtype == tf.bool:
        t = tf.cast(t, tf.uint8)
    elif not (dtype.is_integer or dtype.is_floating or dtype.is_complex):
        raise ValueError(f"sok.all_gather: tensor {i} is of dtype {dtype.name}: numbers or bools "
                         "only")
    size = t.dtype.size
    row_shape = tf.shape(t, out_type=tf.int64)[1:]
    row_bytes = tf.reduce_prod(row_shape) * size
    data = tf.reshape(t if t.dtype == tf.uint8 else tf.bitcast(t, tf.uint8), [-1])
    kind = tf.constant(dtype.as_datatype_enum, tf.int64)
    counts = tf.stack([tf.fill([world], tf.size(data, out_type=tf.int64)),
                       tf.fill([world], row_bytes), tf.fill([world], kind)], axis=1)
    received_bytes, _, _, received = ops.sok_all_to_all(
        tf.tile(data, [world]), counts, row_columns=1,
        width_mismatch=f"sok.all_gather: tensor {i}: the ranks sent count matrices of "
                       "different widths")
    with tf.device("/CPU:0"):
        same = [tf.debugging.Assert(
            tf.reduce_all(tf.equal(received[:, 1], row_bytes)),
            [f"sok.all_gather: tensor {i} has rows of different sizes on different ranks "
             "(bytes per row, by rank):", received[:, 1]], summarize=world),
            tf.debugging.Assert(
            tf.reduce_all(tf.equal(received[:, 2], kind)),
            [f"sok.all_gather: tensor {i} has different dtypes on different ranks (TensorFlow's "
             "DataType numbers, by rank):", received[:, 2]], summarize=world)]
    with tf.control_dependencies(same):
        # A type of one byte keeps its shape through bitcast; a wider one gains a dim of bytes.
        shape = tf.concat([tf.constant([-1], tf.int64), row_shape]
                          + ([tf.constant([size], tf.int64)] if size > 1 else []), 0)
        rows = tf.reshape(received_bytes, shape)
        out = rows if t.dtype == tf.uint8 else tf.bitcast(rows, t.dtype)
    return tf.cast(out, tf.bool) if dtype == tf.bool else out


class _after_previous:
    """In a TF1 graph: the next collective of `chain` depends on its previous one, unless it opens
    a lookup and the previous one ended a training step (module doc)."""

    def __init__(self, chain=TRAIN, opens_lookup=False):
        self._chain, self._opens_lookup = chain, opens_lookup

    def __enter__(self):
        self._ctx = None
        if not tf.executing_eagerly():
            g = tf.compat.v1.get_default_graph()
            prev = _last_in_graph.get(g, {}).get(self._chain)
            if prev is not None and not (self._opens_lookup and prev.ends_step):
                self._ctx = tf.control_dependencies([prev.op])
                self._ctx.__enter__()
        return self

    def __exit__(self, *exc):
        if self._ctx is not None:
            self._ctx.__exit__(*exc)
        return False


def _remember(tensor, chain=TRAIN, ends_step=False):
    """`ends_step`: a gradient's collective (the end of a training step's lookups); None: as the
    previous one of the chain (sok.all_reduce: of dense gradients after them, or in a forward
    pass before a lookup, which must stay ordered with it)."""
    if not tf.executing_eagerly():
        chains = _last_in_graph.setdefault(tensor.graph, {})
        if ends_step is None:
            prev = chains.get(chain)
            ends_step = prev is not None and prev.ends_step
        chains[chain] = types.SimpleNamespace(op=tensor.op, ends_step=ends_step)


@tf.RegisterGradient("SokAllToAll")
def _all_to_all_grad(op, grad, *_):
    """Each row's gradient goes back to the rank that sent the row."""
    with _after_previous():
        out = ops.sok_all_to_all_sized(tf.convert_to_tensor(grad), _rows(op, 3), _rows(op, 2))
    _remember(out, ends_step=True)
    return [out, None]


def _rows(op, i):
    """Rows per rank of SokAllToAll's host counts output i (its row columns added up)."""
    counts = op.outputs[i]
    if counts.shape.rank == 1:
        return counts
    columns = op.get_attr("row_columns")
    with tf.device("/CPU:0"):
        return tf.reduce_sum(counts if columns < 0 else counts[:, :columns], axis=1)


@tf.RegisterGradient("SokAllToAllSized")
def _all_to_all_sized_grad(op, grad):
    with _after_previous():
        out = ops.sok_all_to_all_sized(tf.convert_to_tensor(grad), op.inputs[2], op.inputs[1])
    _remember(out, ends_step=True)
    return [out, None, None]


tf.no_gradient("SokAllReduce")
