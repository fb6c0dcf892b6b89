"""lookup_sparse: fused pooled lookups over many tables, one pipeline for one process and N ranks.

    ids of every table -> dedup (one row per distinct key; inverse maps ids back)
                       -> exchange.fetch_rows: rows of the distinct keys (owners look them up;
                          training inserts new keys, evaluation never does); under Horovod the
                          flat rows as they came back (distributed.fetch_returned_rows)
                       -> pooled combine per sample (sum / mean / sqrtn, optional weights), of
                          the flat rows in place (SokPooledCombineFlat)

Gradients flow back the same way: per-sample gradient -> per-distinct-key gradient ->
(exchange) -> tf.IndexedSlices keyed by id on the owning table.
"""
import contextlib
import types
from collections.abc import Sequence
from typing import NamedTuple

import tensorflow as tf

from sparse_operation_kit.parallel import distributed, exchange, partitioned
from sparse_operation_kit.runtime import compat
from sparse_operation_kit.runtime._ops import ops
from sparse_operation_kit.runtime.context import context
from sparse_operation_kit.runtime.devices import on_host
from sparse_operation_kit.serving import serving
from sparse_operation_kit.tables import uniqueness, validation
from sparse_operation_kit.tables.embedding_variable import EmbeddingVariable
from sparse_operation_kit.tables.tables import table_name

COMBINERS = ("sum", "mean", "sqrtn")


def _on_device_of(params):
    """Runs SOK's lookup steps where the tables live. Without it TensorFlow may pin an op with small
    integer inputs (a small batch's ids) to the CPU and send the rows through the host and back."""
    if tf.executing_eagerly():
        devices = {getattr(p, "device", "") for p in params} - {"", None}
        return tf.device(devices.pop()) if len(devices) == 1 else contextlib.nullcontext()
    first = params[0]
    return tf.compat.v1.colocate_with(first.handle if hasattr(first, "handle") else first)


def _ragged_dense_shape(row_splits):
    """[1] int64: the row count of a RaggedTensor (its "dense shape" for SokUniqueKeys, a host
    memory input). tf.shape's GPU kernel leaves the shape in host memory; the subtraction runs on
    the CPU, as on the GPU it would put the count in device memory and cost a copy to the host in
    every step."""
    splits = tf.shape(row_splits, out_type=tf.int64)
    with on_host():
        return splits - 1


@compat.register_gradient("SokPooledCombine")
def _pooled_combine_grad(op, *grads):
    n, m = op.get_attr("N"), op.get_attr("M")
    inverse, segments, weights = (op.inputs[i * n:(i + 1) * n] for i in range(1, 4))
    orders = op.inputs[4 * n:4 * n + m]
    grads = grads[:n]  # the last output, num_rows (the rows' dim 0, in host memory), has none
    num_rows = op.outputs[n]
    with _gradient_device(op, grads):
        row_grads = ops.sok_pooled_combine_grad(
            list(grads),
            list(inverse),
            list(segments),
            list(weights),
            list(orders),
            num_rows,
            combiners=op.get_attr("combiners"),
            table_names=op.get_attr("table_names"),
            segments_checked=op.get_attr("segments_checked"),
        )
    return list(row_grads) + [None] * (3 * n + m) + [None]


def _per_row(grad, rows):
    """`grad` of the Gather's output `rows` as one dense row per key. Rows expanded with
    tf.gather(rows, inverse) (a filtered sparse_read, all2all_dense_embedding) get an
    IndexedSlices by occurrence: summed per key, as the table's gradient must be [keys, dim]."""
    if not isinstance(grad, tf.IndexedSlices):
        return grad
    return tf.math.unsorted_segment_sum(grad.values, grad.indices, tf.shape(rows)[0])


@compat.register_gradient("SokEmbeddingVariableGather")
def _gather_grad(op, *grads):
    n = op.get_attr("N")
    keys = op.inputs[n:2 * n]
    slices = [tf.IndexedSlices(_per_row(g, r), k) for g, k, r in zip(grads, keys, op.outputs)]
    return slices + [None] * (2 * n + 1)


@compat.register_gradient("SokPooledCombineFlat")
def _pooled_combine_flat_grad(op, *grads):
    """The gradient of the returned flat rows (distributed.fetch_returned_rows), in place."""
    n, m = op.get_attr("N"), op.get_attr("M")
    row_at, sizes = op.inputs[1], op.inputs[2]
    inverse, segments, weights = (op.inputs[3 + i * n:3 + (i + 1) * n] for i in range(3))
    orders = op.inputs[3 + 3 * n:3 + 3 * n + m]
    with _gradient_device(op, grads[:n]):
        d_returned = ops.sok_pooled_combine_flat_grad(
            list(grads[:n]), row_at, sizes, list(inverse), list(segments), list(weights),
            list(orders), op.outputs[n], dims=op.get_attr("dims"),
            combiners=op.get_attr("combiners"), table_names=op.get_attr("table_names"),
            segments_checked=op.get_attr("segments_checked"))
    return [d_returned] + [None] * (3 + 3 * n + m)


def _gradient_device(op, grads):
    """Where a pooled combine's gradient runs: beside the forward (see _on_device_of)."""
    if isinstance(op, tf.Operation):  # graphs (TF1, tf.function)
        return tf.compat.v1.colocate_with(op)
    return tf.device(next((g.device for g in grads if g is not None), None))  # eager tape


tf.no_gradient("SokUniqueKeys")
tf.no_gradient("SokPooledCombineGrad")
tf.no_gradient("SokPooledCombineFlatGrad")
tf.no_gradient("SokEmbeddingVariableSparseApply")
tf.no_gradient("SokCheckRowIds")


def _as_list(x):
    return list(x) if isinstance(x, (list, tuple)) else [x]


def _is_dense(ids):
    return isinstance(ids, (tf.Tensor, tf.Variable))


def _flatten_ids(ids, name, dense_shape=None, explicit_segments=False, empty=None):
    """(keys, segment ids, positions, dense shape: dim 0 the batch size) of a
    SparseTensor, a RaggedTensor or a dense tensor of k ids per sample ([batch] for k = 1, or
    [batch, k]; every entry is an id; `dense_shape` is its tf.shape). SokUniqueKeys checks the
    positions [n, rank] lie within the dense shape [rank] (a RaggedTensor's: the sample of each
    id as [n, 1] within [batch]). Dense ids need neither checks nor segment ids: positions [0, 0]
    and empty segment ids (the ops' mark for "k = n / batch ids per sample, in order"), and their
    shape as the dense shape (SokUniqueKeys reads the batch from it); a SparseTensor's segment ids
    are its indices [n, rank] (the ops read column 0). Unless `explicit_segments` (the stock-op
    serving graph) asks for the sample of each id as [n]. `empty`: those marks ([0] segment ids,
    [0, 0] positions), made once per lookup."""
    if _is_dense(ids):
        if ids.shape.rank not in (1, 2):
            raise ValueError(f"lookup_sparse: dense ids of table '{name}' must be [batch] (one id "
                             f"per sample) or [batch, k] (k ids per sample), got shape {ids.shape}")
        keys = tf.reshape(ids, [-1])
        if explicit_segments:
            segments = tf.range(tf.size(keys, out_type=tf.int64), dtype=tf.int64)
            if ids.shape.rank == 2:
                k = ids.shape[1] if ids.shape[1] is not None else tf.maximum(dense_shape[1], 1)
                segments = segments // k if k != 1 else segments
        else:
            segments = empty[0]
        return keys, segments, empty[1], dense_shape
    if isinstance(ids, tf.SparseTensor):
        # The pooled ops read the samples from column 0 of the indices themselves.
        segments = ids.indices[:, 0] if explicit_segments else ids.indices
        return ids.values, segments, ids.indices, ids.dense_shape
    if isinstance(ids, tf.RaggedTensor):
        if ids.ragged_rank != 1:
            ids = ids.merge_dims(1, -1)
        rows = tf.cast(ids.value_rowids(), tf.int64)
        shape = _ragged_dense_shape(ids.row_splits)
        return ids.values, rows, tf.reshape(rows, [-1, 1]), shape
    raise TypeError(
        f"lookup_sparse: ids of table '{name}' must be a tf.SparseTensor, a tf.RaggedTensor or a "
        f"[batch] / [batch, k] tensor, got {type(ids).__name__}"
    )


def _flatten_weights(weights, name):
    if isinstance(weights, (tf.Tensor, tf.Variable)):  # dense ids: weights of their shape
        values = tf.reshape(weights, [-1])
    elif isinstance(weights, tf.SparseTensor):
        values = weights.values
    elif isinstance(weights, tf.RaggedTensor):
        values = weights.flat_values
    else:
        raise TypeError(f"lookup_sparse: weights of table '{name}' must be a tf.SparseTensor or "
                        f"tf.RaggedTensor like its ids, got {type(weights).__name__}")
    if values.dtype != tf.float32:
        raise TypeError(
            f"lookup_sparse: weights of table '{name}' must be float32, got {values.dtype.name}"
        )
    return values


def _key_dtype(param):
    if isinstance(param, (EmbeddingVariable, partitioned.PartitionedEmbeddingVariable)):
        return param.key_dtype
    return None  # static tables take int32 or int64 ids


# How a collective that not every rank joined ends: Horovod's stall shutdown, or SOK's NCCL wait
# that timed out (core/cuda/collectives.cu).
_DIVERGED = {
    "Horovod has been shut down": "Horovod has been shut down",
    "the NCCL communicator is aborted": "the NCCL communicator was aborted",
    "NCCL failed on rank": "NCCL failed",
}


def _diverged(error, call_name, names):
    """The error of an exchange that not every rank completed (ranks diverged), naming the call."""
    why = next((w for k, w in _DIVERGED.items() if k in str(error)), None)
    if why is None:
        return error
    waited = context.collective_timeout_s
    return RuntimeError(
        f"lookup_sparse '{call_name or 'sok_lookup_sparse'}' over tables {names} on rank "
        f"{context.rank}: its exchange did not complete on every rank"
        + (f" within {waited:g} s" if waited else "")
        + f": {why}. The ranks diverged: one skipped this call or made a different "
        "collective, or died or stalled."
    )


def _unique_keys(keys, positions, dense_shapes, names, padded=False, defer_checks=False):
    """SokUniqueKeys with its checks of the ids' positions (all tables at once). Eager inputs
    outside their dense shape raise a ValueError, as the other eager input checks do, unless
    the checks are deferred to the exchange (`valid` -1: every rank fails there at once)."""
    n = len(keys)
    try:
        return ops.sok_unique_keys(keys, positions, dense_shapes, N=n, table_names=names,
                                   padded=padded, defer_position_errors=defer_checks)
    except tf.errors.InvalidArgumentError as e:
        start = e.message.find("lookup_sparse: ids of table")
        if not tf.executing_eagerly() or start < 0:
            raise
        raise ValueError(e.message[start:].split(" [Op:")[0]) from e


def lookup_sparse(params, sp_ids, sp_weights=None, combiners: str | Sequence[str] | None = None,
                  training: bool = True, name: str | None = None) -> tf.Tensor | list[tf.Tensor]:
    """Pooled embeddings of many tables in one call.

    params: a table or a list of tables (sok.EmbeddingVariable / DynamicVariable, a partitioned
      Embedding Variable, sok.Variable, tf.Variable). sp_ids: per table a tf.SparseTensor /
      tf.RaggedTensor of ids ([batch, None]), or a dense [batch] / [batch, k] tensor (k ids per
      sample, every entry an id).
    sp_weights: None, or per table None or weights shaped like the ids. combiners: "sum", "mean"
    or "sqrtn" per table (default "sum"). training: True inserts unseen keys into Embedding
    Variables (and counts frequencies); False reads them without inserting.
    Returns a [batch, dim] tensor per table (a single tensor if `params` was not a list).
    """
    single = not isinstance(params, (list, tuple))
    params, sp_ids, weights_list, combiners, names = _checked_inputs(
        params, sp_ids, sp_weights, combiners
    )
    with tf.name_scope(name or "sok_lookup_sparse"):
        flat = _flat_inputs(params, sp_ids, weights_list, names)
        if serving.active():  # save_stock_saved_model is tracing: stock ops on frozen tables
            outs = serving.pooled_lookup(params, flat.keys, flat.segments,
                                         [shape[0] for shape in flat.dense_shapes], flat.weights,
                                         combiners)
            return outs[0] if single else outs
        tables = partitioned.flat_tables(params)
        dedup = _dedup(tables, flat, names, training, _exchanged(params),
                       _exchanged(params) and all(_is_dense(i) for i in sp_ids))
        rows = _fetch(params, dedup, training, name, names)
        outs = _pool(tables, rows, dedup, flat, combiners, names)
    return outs[0] if single else list(outs)


def _checked_inputs(params, sp_ids, sp_weights, combiners):
    """(params, ids, weights, combiners, table names), one of each per table, checked."""
    params, sp_ids = _as_list(params), _as_list(sp_ids)
    n = len(params)
    if len(sp_ids) != n:
        raise ValueError(f"lookup_sparse: {n} tables but {len(sp_ids)} id tensors")
    if combiners is None:
        combiners = ["sum"] * n
    combiners = _as_list(combiners)
    if len(combiners) != n:
        raise ValueError(f"lookup_sparse: {n} tables but {len(combiners)} combiners")
    weights_list = [None] * n if sp_weights is None else _as_list(sp_weights)
    if len(weights_list) != n:
        raise ValueError(f"lookup_sparse: {n} tables but {len(weights_list)} weight tensors")
    names = [table_name(p) for p in params]
    # SokUniqueKeys checks the ids' indices; the stock-op serving graph has no SokUniqueKeys.
    sp_ids, weights_list = validation.check_lookup_inputs(
        params, sp_ids, weights_list, names, ids_within_dense_shape=serving.active() is not None
    )
    for c, nm in zip(combiners, names):
        if c not in COMBINERS:
            raise ValueError(f"lookup_sparse: unknown combiner '{c}' for table '{nm}' "
                             f"(expected one of {', '.join(COMBINERS)})")
    return params, sp_ids, weights_list, combiners, names


class _FlatInputs(NamedTuple):
    """Per table: its ids as keys [n], segment ids, weights [n] (or [0]), positions and dense
    shape (see _flatten_ids), as the ops take them (int64, float32 weights)."""

    keys: list
    segments: list
    weights: list
    positions: list
    dense_shapes: list


def _flat_inputs(params, sp_ids, weights_list, names):
    """The ids and weights of every table flattened for the ops (_FlatInputs)."""
    # The shapes of every dense id tensor in one op (its GPU kernel leaves them on the host).
    sp_ids = [tf.convert_to_tensor(i) if isinstance(i, tf.Variable) else i for i in sp_ids]
    dense = [i for i in sp_ids if _is_dense(i) and i.shape.rank in (1, 2)]
    dense_shape_of = {}
    for dtype in {i.dtype for i in dense}:  # ShapeN takes one dtype
        same = [i for i in dense if i.dtype == dtype]
        dense_shape_of.update(zip(map(id, same), tf.shape_n(same, out_type=tf.int64)))
    # The ops take a dense table's shape as its "dense shape" (unchecked: positions [0, 0]
    # mark it) and SokUniqueKeys gives every table's dim 0 to SokPooledCombine.
    empty = (tf.zeros([0], tf.int64), tf.zeros([0, 0], tf.int64), tf.zeros([0], tf.float32))
    flat = _FlatInputs([], [], [], [], [])
    for p, ids, w, nm in zip(params, sp_ids, weights_list, names):
        k, s, pos, shape = _flatten_ids(ids, nm, dense_shape_of.get(id(ids)),
                                        explicit_segments=bool(serving.active()),
                                        empty=empty)
        _check_key_dtype(p, k, nm)
        flat.keys.append(k)
        flat.segments.append(tf.cast(s, tf.int64))
        flat.weights.append(empty[2] if w is None else _flatten_weights(w, nm))
        flat.positions.append(tf.cast(pos, tf.int64))
        flat.dense_shapes.append(tf.cast(shape, tf.int64))
    return flat


def _check_key_dtype(param, keys, name):
    if keys.dtype not in (tf.int32, tf.int64):
        raise TypeError(
            f"lookup_sparse: ids of table '{name}' must be int32 or int64, got {keys.dtype.name}"
        )
    want = _key_dtype(param)
    if want is not None and keys.dtype != want:
        raise TypeError(
            f"lookup_sparse: table '{name}' has key dtype {want.name}, but its ids are "
            f"{keys.dtype.name}"
        )


def _exchanged(params):
    """Whether the lookup's keys go through the exchange's plan with the dedup's `valid` (under
    Horovod, no partitioned table: its keys are split by part on the host's shapes). Then bad
    positions travel in the plan's header, so every rank fails at once, and the dedup may be
    padded (SokUniqueKeys' `padded`: nothing waits for the distinct counts). lookup_sparse pads
    only dense ids: padded keys' plan, rows and gradients are sized by the ids, not by the
    distinct keys, which costs more than the wait where ids repeat (SparseTensor fields100 on 4
    GPUs, benchmarks/gpu/SCALING.md)."""
    return context.world_size > 1 and not any(partitioned.is_partitioned(p) for p in params)


def _dedup(tables, flat, names, training, exchanged, padded):
    """SokUniqueKeys over every table: per table the unique keys, inverse, counts, sample order
    and batch size, and (exchanged) `valid` for the plan (the distinct counts, -1 for bad
    positions; padded: unique and counts are padded)."""
    with _on_device_of(tables):
        out = _unique_keys(flat.keys, flat.positions, flat.dense_shapes, names, padded,
                           defer_checks=exchanged)
    if not padded:
        # A training Gather of these keys inserts them (the update's keys when they reach it as
        # they are: one process, unpartitioned tables).
        uniqueness.declare_distinct(out.unique, inserted=bool(training))
    return types.SimpleNamespace(unique=list(out.unique), inverse=list(out.inverse),
                                 counts=list(out.counts), orders=list(out.segment_order),
                                 batch_sizes=out.batch_sizes,
                                 valid=out.valid if exchanged else None, padded=padded)


def _fetch(params, dedup, training, call_name, names):
    """The rows of the distinct keys of every table: one tensor per table, or (through the
    exchange's plan: dedup.valid) the flat rows as the exchange returned them, which the pooling
    reads in place (distributed.fetch_returned_rows)."""
    try:
        if dedup.valid is not None:
            return distributed.fetch_returned_rows(params, dedup.unique, dedup.counts, training,
                                                   names, valid=dedup.valid, padded=dedup.padded)
        return partitioned.fetch_rows(params, dedup.unique, dedup.counts, training=training,
                                      names=names)
    except tf.errors.OpError as e:  # eager: name the call whose exchange never completed
        diverged = _diverged(e, call_name, names)
        if diverged is e:
            raise
        raise diverged from e


def _pool(tables, rows, dedup, flat, combiners, names):
    """SokPooledCombine: each table's rows combined per sample ([batch, dim] per table); of the
    exchange's flat rows, SokPooledCombineFlat."""
    with _on_device_of(tables):
        # SokUniqueKeys checked every position and gives each table's sample order.
        common = dict(segments_checked=True, combiners=combiners, table_names=names)
        if isinstance(rows, list):
            outs, _ = ops.sok_pooled_combine(rows, dedup.inverse, flat.segments, flat.weights,
                                             dedup.orders, dedup.batch_sizes, **common)
        else:
            outs, _ = ops.sok_pooled_combine_flat(
                rows.flat, rows.row_at, rows.sizes, dedup.inverse, flat.segments, flat.weights,
                dedup.orders, dedup.batch_sizes, dims=rows.dims, **common)
    return outs


def lookup_rows(table, ids, training: bool = True) -> tf.Tensor:
    """The row of every id, [*ids.shape, dim], differentiable (tf.nn.embedding_lookup on an
    Embedding Variable, Keras's Embedding without a combiner). Under Horovod a key's row lives on
    its owner: one id per sample of a dense lookup_sparse, through the exchange; one process
    reads its table directly. training: reads insert unseen keys."""
    if context.world_size == 1:
        return table.sparse_read(ids, training=training)
    ids = table._read_keys(ids) if isinstance(table, EmbeddingVariable) else tf.convert_to_tensor(ids)
    rows = lookup_sparse(table, tf.reshape(ids, [-1]), combiners="sum", training=training)
    return tf.reshape(rows, tf.concat([tf.shape(ids), tf.shape(rows)[1:]], 0))


def all2all_dense_embedding(param, indices) -> tf.Tensor:
    """NVIDIA SOK 2.x's all2all_dense_embedding: rows of `indices` (any shape) from a table
    sharded over ranks, differentiable, returned in the shape of `indices` + [dim]."""
    indices = tf.convert_to_tensor(indices)
    flat = tf.reshape(indices, [-1])
    unique, inverse, counts, _, _, _ = ops.sok_unique_keys([flat], [], [], N=1)
    uniqueness.declare_distinct(unique)
    rows = exchange.fetch_rows([param], [unique[0]], [counts[0]], True, [table_name(param)])[0]
    out = tf.gather(rows, inverse[0])
    dim = tf.shape(rows)[1:]
    return tf.reshape(out, tf.concat([tf.shape(indices), dim], 0))
