"""Model parallelism under Horovod: tables are sharded over ranks, inputs are data-parallel.

Placement (NVIDIA SOK 2.x's convention): a table with target_gpu = -1 keeps key k on rank
k mod N (row k // N of a static table's local shard); target_gpu = k keeps the whole table on
rank k. One lookup_sparse call makes exactly two all-to-alls, whatever the number of tables:

  1. each rank sends every owner only the distinct keys that owner holds ([key, table, count]);
  2. owners read (training: insert) their rows and send them back, flattened (dims may differ).

TensorFlow differentiates through both exchanges (Horovod registers the all-to-all gradient), so
the backward pass sends per-key gradients to the owners, where the gather's gradient becomes a
tf.IndexedSlices of the owner's keys for the fused optimizer update.
"""
import zlib

import tensorflow as tf

from sparse_operation_kit import exchange
from sparse_operation_kit.context import context
from sparse_operation_kit.embedding_variable import EmbeddingVariable


def target_of(param):
    return int(getattr(param, "target_gpu", -1))


def global_rows(param):
    """Rows of a static table over all ranks."""
    rows = getattr(param, "sok_global_rows", None)
    return rows if rows is not None else param.shape[0]


def _owner(keys, target, world):
    if target < 0:
        return tf.math.floormod(keys, tf.constant(world, keys.dtype))
    return tf.fill(tf.shape(keys), tf.constant(target, keys.dtype))


def _local_keys(param, keys, world):
    """Owner-side row index of a key: EVs keep the key; a spread static table row k // N."""
    if isinstance(param, EmbeddingVariable):
        return tf.cast(keys, param.key_dtype)
    if target_of(param) < 0:
        return tf.math.floordiv(keys, tf.constant(world, keys.dtype))
    return keys


def _signature(params):
    """The same on every rank exactly when the ranks pass the same tables in the same order."""
    parts = []
    for p in params:
        dim = p.embedding_dim if isinstance(p, EmbeddingVariable) else int(p.shape[-1])
        kind = "ev" if isinstance(p, EmbeddingVariable) else "static"
        parts.append(f"{kind}:{dim}:{target_of(p)}")
    return zlib.crc32("|".join(parts).encode()) & 0x7FFFFFFF


def _check_same_tables(hvd, params, names):
    sig = _signature(params)
    seen = hvd.allgather(tf.constant([sig], tf.int64))
    return tf.debugging.assert_equal(
        seen, tf.constant(sig, tf.int64),
        message=f"lookup_sparse: ranks passed different tables (this rank: {', '.join(names)} with "
                "these dims and target_gpu values); every rank must call lookup_sparse with the same "
                "table list in the same order")


def fetch_rows(params, keys, counts, training, names):
    hvd = context.hvd
    world = context.world_size
    n = len(params)
    dims = []
    for p, nm in zip(params, names):
        t = target_of(p)
        if t >= world or t < -1:
            raise ValueError(f"table '{nm}': target_gpu={t} but there are {world} ranks")
        dims.append(p.embedding_dim if isinstance(p, EmbeddingVariable) else int(p.shape[-1]))
    checks = [_check_same_tables(hvd, params, names)]
    with tf.name_scope("sok_exchange"):
        wide = [tf.cast(k, tf.int64) for k in keys]
        for i, p in enumerate(params):  # static ids are checked against the global table here
            if not isinstance(p, EmbeddingVariable):
                checks.append(tf.debugging.assert_non_negative(
                    wide[i], message=f"lookup of static table '{names[i]}': negative id"))
                checks.append(tf.debugging.assert_less(
                    wide[i], tf.constant(global_rows(p), tf.int64),
                    message=f"lookup of static table '{names[i]}': id out of range [0, {global_rows(p)})"))
        all_keys = tf.concat(wide, 0)
        table_ids = tf.concat([tf.fill(tf.shape(k), tf.constant(i, tf.int64)) for i, k in enumerate(wide)], 0)
        positions = tf.concat([tf.range(tf.shape(k, out_type=tf.int64)[0]) for k in wide], 0)
        all_counts = tf.concat([tf.cast(c, tf.int64) for c in counts], 0)
        owners = tf.concat([_owner(k, target_of(p), world) for k, p in zip(wide, params)], 0)

        # 1. keys to their owners, grouped by owner rank.
        order = tf.argsort(owners, stable=True)
        sorted_tables = tf.gather(table_ids, order)
        request = tf.stack([tf.gather(all_keys, order), sorted_tables, tf.gather(all_counts, order)], axis=1)
        splits = tf.math.bincount(tf.cast(owners, tf.int32), minlength=world, maxlength=world)
        with tf.control_dependencies(checks):
            request = tf.identity(request)
        received, received_splits = hvd.alltoall(request, splits=splits)

        # 2. owners read their rows; results are flattened in received order (dims may differ).
        r_keys, r_tables, r_counts = received[:, 0], received[:, 1], received[:, 2]
        dim_of = tf.constant(dims, tf.int64)
        r_dims = tf.gather(dim_of, r_tables)
        r_offsets = tf.cumsum(r_dims, exclusive=True)
        picks = [tf.reshape(tf.where(tf.equal(r_tables, i)), [-1]) for i in range(n)]
        local_keys = [_local_keys(p, tf.gather(r_keys, picks[i]), world) for i, p in enumerate(params)]
        local_counts = [tf.gather(r_counts, picks[i]) for i in range(n)]
        rows = exchange.local_rows(params, local_keys, local_counts, training, names)
        flat_index = [tf.reshape(tf.gather(r_offsets, picks[i])[:, None] + tf.range(dims[i], dtype=tf.int64)[None, :],
                                 [-1]) for i in range(n)]
        flat_rows = tf.dynamic_stitch([tf.cast(f, tf.int32) for f in flat_index],
                                      [tf.reshape(r, [-1]) for r in rows])
        source = tf.repeat(tf.range(world), received_splits)
        float_splits = tf.math.unsorted_segment_sum(r_dims, source, world)
        back, _ = hvd.alltoall(flat_rows, splits=tf.cast(float_splits, tf.int32))

        # 3. back on the requester: rows of each table in its distinct-key order.
        s_dims = tf.gather(dim_of, sorted_tables)
        s_offsets = tf.cumsum(s_dims, exclusive=True)
        sorted_positions = tf.gather(positions, order)
        out = []
        for i in range(n):
            q = tf.reshape(tf.where(tf.equal(sorted_tables, i)), [-1])
            index = tf.gather(s_offsets, q)[:, None] + tf.range(dims[i], dtype=tf.int64)[None, :]
            rows_sorted = tf.gather(back, index)
            # Keys of one table keep their relative order inside each owner's group only, so undo
            # the owner grouping: row of distinct key j is at the place where position j landed.
            inverse = tf.math.invert_permutation(tf.cast(tf.gather(sorted_positions, q), tf.int32))
            out.append(tf.gather(rows_sorted, inverse))
    return out


def static_variable(args, kwargs, target):
    """sok.Variable under Horovod: this rank's shard of a static table.

    The initial value is the whole table (identical on every rank); target -1 keeps rows
    r, r+N, r+2N, ... on rank r, target k keeps every row on rank k and none elsewhere.
    """
    args = list(args)
    init = args.pop(0) if args else kwargs.pop("initial_value")
    value = init() if callable(init) else init
    value = tf.convert_to_tensor(value, dtype=kwargs.get("dtype"))
    rows = int(value.shape[0])
    rank, world = context.rank, context.world_size
    if target < 0:
        local = value[rank::world]
    elif target == rank:
        local = value
    else:
        local = value[:0]
    var = tf.Variable(local, *args, **kwargs)
    var.target_gpu = target
    var.sok_global_rows = rows
    return var


def all2all_dense_embedding(param, indices):
    """NVIDIA SOK 2.x's all2all_dense_embedding: rows of `indices` (any shape) from a table
    sharded over ranks, differentiable, returned in the shape of `indices` + [dim]."""
    from sparse_operation_kit._ops import ops
    indices = tf.convert_to_tensor(indices)
    flat = tf.reshape(indices, [-1])
    unique, inverse, counts = ops.sok_unique_keys([flat], N=1)
    name = getattr(param, "name", "table")
    rows = exchange.fetch_rows([param], [unique[0]], [counts[0]], True, [name])[0]
    out = tf.gather(rows, inverse[0])
    dim = tf.shape(rows)[1:]
    return tf.reshape(out, tf.concat([tf.shape(indices), dim], 0))
