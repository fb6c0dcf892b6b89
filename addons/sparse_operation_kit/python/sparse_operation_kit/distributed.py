"""Model parallelism under Horovod: tables are sharded over ranks, inputs are data-parallel.

Placement (NVIDIA SOK 2.x's convention): a table with target_gpu = -1 keeps key k on rank
k mod N (row k // N of a static table's local shard); target_gpu = k keeps the whole table on
rank k. One lookup_sparse call makes exactly two all-to-alls, whatever the number of tables:

  1. each rank sends every owner only the distinct keys that owner holds ([key, table, count]),
     behind one header row per destination ([table-list signature, bad-id flag, rank]) that lets
     every rank check, before going on, that all ranks passed the same tables and valid ids;
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


def _dim(param):
    return param.embedding_dim if isinstance(param, EmbeddingVariable) else int(param.shape[-1])


def _describe(params, names):
    return ", ".join(f"'{nm}' ({'ev' if isinstance(p, EmbeddingVariable) else 'static'}, dim {_dim(p)}, "
                     f"target_gpu {target_of(p)})" for p, nm in zip(params, names))


def _signature(params, names):
    """The same on every rank exactly when the ranks pass the same tables in the same order."""
    parts = [f"{nm}:{'ev' if isinstance(p, EmbeddingVariable) else 'static'}:{_dim(p)}:{target_of(p)}"
             for p, nm in zip(params, names)]
    return zlib.crc32("|".join(parts).encode()) & 0x7FFFFFFF


def _bad_static_ids(params, keys):
    """1 + index of a static table given an id outside [0, global rows) on this rank, else 0."""
    bad = tf.constant(0, tf.int64)
    for i, p in enumerate(params):
        if isinstance(p, EmbeddingVariable):
            continue
        out = tf.reduce_any(tf.logical_or(keys[i] < 0, keys[i] >= tf.constant(global_rows(p), tf.int64)))
        bad = tf.where(out, tf.constant(i + 1, tf.int64), bad)
    return bad


def _checks(received_headers, params, names, sig):
    """Asserts, on every rank alike, that all ranks passed these tables and valid static ids.

    Each rank sends every rank a header row [signature, bad-id flag, rank] in front of its keys
    (the first all-to-all), so every rank sees what every other rank passed: a mismatch fails on
    every rank at once, before the second all-to-all, instead of hanging in it.
    """
    rank, world = context.rank, context.world_size
    sigs, bad = received_headers[:, 0], received_headers[:, 1]
    same = tf.debugging.Assert(
        tf.reduce_all(tf.equal(sigs, tf.constant(sig, tf.int64))),
        [f"lookup_sparse: the ranks passed different tables to this lookup_sparse call. Rank {rank} passed "
         f"[{_describe(params, names)}] (signature {sig}); every rank must pass the same tables (names, "
         f"dimensions, target_gpu) in the same order. Table-list signatures of ranks 0..{world - 1}:", sigs],
        summarize=world)
    bounds = ", ".join(f"{i + 1}: '{nm}' [0, {global_rows(p)})" for i, (p, nm) in enumerate(zip(params, names))
                       if not isinstance(p, EmbeddingVariable))
    valid = tf.debugging.Assert(
        tf.reduce_all(tf.equal(bad, 0)),
        [f"lookup_sparse: an id outside the rows of a static table (tables of this call: {bounds}). "
         f"Per rank 0..{world - 1}, the table number it passed an out-of-range id for (0: none):", bad],
        summarize=world)
    return [same, valid]


def fetch_rows(params, keys, counts, training, names):
    hvd = context.hvd
    rank, world = context.rank, context.world_size
    n = len(params)
    dims = []
    for p, nm in zip(params, names):
        t = target_of(p)
        if t >= world or t < -1:
            raise ValueError(f"table '{nm}': target_gpu={t}, but there are {world} ranks (valid: -1 to spread "
                             f"the rows over all ranks, or 0..{world - 1})")
        dims.append(_dim(p))
    sig = _signature(params, names)
    with tf.name_scope("sok_exchange"):
        wide = [tf.cast(k, tf.int64) for k in keys]
        all_keys = tf.concat(wide, 0)
        table_ids = tf.concat([tf.fill(tf.shape(k), tf.constant(i, tf.int64)) for i, k in enumerate(wide)], 0)
        positions = tf.concat([tf.range(tf.shape(k, out_type=tf.int64)[0]) for k in wide], 0)
        all_counts = tf.concat([tf.cast(c, tf.int64) for c in counts], 0)
        owners = tf.concat([_owner(k, target_of(p), world) for k, p in zip(wide, params)], 0)

        # 1. keys to their owners, grouped by owner rank, each group behind a header row.
        order = tf.argsort(owners, stable=True)
        sorted_tables = tf.gather(table_ids, order)
        key_rows = tf.stack([tf.gather(all_keys, order), sorted_tables, tf.gather(all_counts, order)], axis=1)
        header = tf.stack([tf.constant(sig, tf.int64), _bad_static_ids(params, wide), tf.constant(rank, tf.int64)])
        headers = tf.tile(header[None, :], [world, 1])
        dest = tf.concat([tf.range(world, dtype=tf.int64), tf.gather(owners, order)], 0)
        request = tf.gather(tf.concat([headers, key_rows], 0), tf.argsort(dest, stable=True))
        splits = tf.math.bincount(tf.cast(dest, tf.int32), minlength=world, maxlength=world)
        received, received_splits = hvd.alltoall(request, splits=splits)

        # Every rank checks the headers of all ranks before anything depends on the keys.
        starts = tf.cumsum(received_splits, exclusive=True)
        checks = _checks(tf.gather(received, starts), params, names, sig)
        is_key = tf.tensor_scatter_nd_update(tf.ones(tf.shape(received)[:1], tf.bool), starts[:, None],
                                             tf.zeros([world], tf.bool))
        with tf.control_dependencies(checks):
            received = tf.boolean_mask(received, is_key)
        received_splits = received_splits - 1

        # 2. owners read their rows; results are flattened in received order (dims may differ).
        r_keys, r_tables, r_counts = received[:, 0], received[:, 1], received[:, 2]
        dim_of = tf.constant(dims, tf.int64)
        r_dims = tf.gather(dim_of, r_tables)
        r_offsets = tf.cumsum(r_dims, exclusive=True)
        picks = [tf.reshape(tf.where(tf.equal(r_tables, i)), [-1]) for i in range(n)]
        local_keys = [_local_keys(p, tf.gather(r_keys, picks[i]), world) for i, p in enumerate(params)]
        local_counts = [tf.gather(r_counts, picks[i]) for i in range(n)]
        # A key asked for by several ranks arrives once per rank. Static shards read each row once
        # so that their gradient (the wrapped optimizer's input) holds each row once, summed over
        # the ranks, as one process's would (Keras 3's Adagrad, e.g., squares the values of a
        # tf.IndexedSlices before it sums duplicates). Embedding Variables sum duplicates themselves.
        repeat = [None] * n
        for i, p in enumerate(params):
            if not isinstance(p, EmbeddingVariable):
                local_keys[i], repeat[i] = tf.unique(local_keys[i], out_idx=tf.int64)
        rows = exchange.local_rows(params, local_keys, local_counts, training, names)
        rows = [r if repeat[i] is None else tf.gather(r, repeat[i]) for i, r in enumerate(rows)]
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
    shape = kwargs.pop("shape", None)  # the whole table's: the shard's own shape differs
    rank, world = context.rank, context.world_size
    if target >= world or target < -1:
        raise ValueError(f"sok.Variable: mode 'localized:{target}' names rank {target}, but there are "
                         f"{world} ranks (valid: 'distributed' or 'localized:0'..'localized:{world - 1}')")
    if callable(init):
        try:
            value = init()
        except TypeError:
            if shape is None:
                raise
            value = init(shape=shape, dtype=kwargs.get("dtype") or tf.float32)
    else:
        value = init
    value = tf.convert_to_tensor(value, dtype=kwargs.get("dtype"))
    if shape is not None and not tf.TensorShape(shape).is_compatible_with(value.shape):
        raise ValueError(f"sok.Variable: shape {shape} but the initial value has shape {value.shape}")
    rows = int(value.shape[0])
    if target < 0:
        local = value[rank::world]
    elif target == rank:
        local = value
    else:
        local = value[:0]
    var = tf.Variable(local, *args, **kwargs)
    var.target_gpu = target
    var.sok_global_rows = rows
    var.sok_mode = "distributed" if target < 0 else f"localized:{target}"
    return var


def all2all_dense_embedding(param, indices):
    """NVIDIA SOK 2.x's all2all_dense_embedding: rows of `indices` (any shape) from a table
    sharded over ranks, differentiable, returned in the shape of `indices` + [dim]."""
    from sparse_operation_kit._ops import ops
    indices = tf.convert_to_tensor(indices)
    flat = tf.reshape(indices, [-1])
    unique, inverse, counts = ops.sok_unique_keys([flat], N=1)
    name = getattr(param, "name", None) or "table"
    name = name[:-2] if name.endswith(":0") else name
    rows = exchange.fetch_rows([param], [unique[0]], [counts[0]], True, [name])[0]
    out = tf.gather(rows, inverse[0])
    dim = tf.shape(rows)[1:]
    return tf.reshape(out, tf.concat([tf.shape(indices), dim], 0))
