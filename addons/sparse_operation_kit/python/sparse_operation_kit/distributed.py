"""Model parallelism under Horovod: tables are sharded over ranks, inputs are data-parallel.

Placement follows tables.py (target_gpu -1: key k on rank k mod N; k: the whole table on rank k).
One lookup_sparse call makes exactly two all-to-alls, whatever the number of tables:

  1. each rank sends every owner only the distinct keys that owner holds ([key, table, count]),
     behind one header row per destination ([table-list signature, n, bad-id flag]) that lets
     every rank check, before going on, that all ranks passed the same tables and valid ids;
  2. owners read (training: insert) their rows and send them back, flattened (dims may differ).

TensorFlow differentiates through both exchanges (Horovod registers the all-to-all gradient), so
the backward pass sends per-key gradients to the owners, where the gather's gradient becomes a
tf.IndexedSlices of the owner's keys for the fused optimizer update.
"""
import contextlib
import types
import zlib

import tensorflow as tf

from sparse_operation_kit import collectives, tables
from sparse_operation_kit.context import context
from sparse_operation_kit.embedding_variable import EmbeddingVariable
from sparse_operation_kit.local_rows import local_rows
from sparse_operation_kit.tables import dim_of as _dim
from sparse_operation_kit.tables import global_rows, target_of


def _local_keys(param, keys, world):
    """Owner-side row of a key: an Embedding Variable keeps the key, a static shard its row."""
    if isinstance(param, EmbeddingVariable):
        return tf.cast(keys, param.key_dtype)
    return tables.local_row(keys, target_of(param), world)


def _describe(params, names):
    return ", ".join(
        f"'{nm}' ({'ev' if isinstance(p, EmbeddingVariable) else 'static'}, dim {_dim(p)}, "
        f"target_gpu {target_of(p)})"
        for p, nm in zip(params, names)
    )


def _signature(params, names):
    """The same on every rank exactly when the ranks pass the same tables in the same order."""
    parts = [
        f"{nm}:{'ev' if isinstance(p, EmbeddingVariable) else 'static'}:{_dim(p)}:{target_of(p)}"
        for p, nm in zip(params, names)
    ]
    return zlib.crc32("|".join(parts).encode()) & 0x7FFFFFFF


def _bad_static_ids(params, all_keys, table_ids):
    """1 + index of a static table given an id outside [0, global rows) on this rank, else 0."""
    if all(isinstance(p, EmbeddingVariable) for p in params):
        return tf.constant(0, tf.int64)
    rows = tf.gather(
        tf.constant(
            [-1 if isinstance(p, EmbeddingVariable) else global_rows(p) for p in params], tf.int64
        ),
        table_ids,
    )
    bad = tf.logical_and(rows >= 0, tf.logical_or(all_keys < 0, all_keys >= rows))
    return tf.reduce_max(tf.concat([[0], tf.where(bad, table_ids + 1, 0)], 0))


def _checks(received_headers, params, names, sig):
    """Asserts, on every rank alike, that all ranks passed these tables and valid static ids.

    Each rank sends every rank a header row in front of its keys (the first all-to-all), so every
    rank sees what every other rank passed: a mismatch fails on every rank at once, before the
    second all-to-all, instead of hanging in it.
    """
    rank, world = context.rank, context.world_size
    sigs, _, bad = tf.unstack(received_headers, num=3, axis=1)
    same = tf.debugging.Assert(
        tf.reduce_all(tf.equal(sigs, tf.constant(sig, tf.int64))),
        [
            "lookup_sparse: the ranks passed different tables to this lookup_sparse call. Rank "
            f"{rank} passed "
            f"[{_describe(params, names)}] (signature {sig}); every rank must pass the same "
            "tables (names, "
            "dimensions, target_gpu) in the same order. Table-list signatures of ranks "
            f"0..{world - 1}:",
            sigs,
        ],
        summarize=world,
    )
    bounds = ", ".join(
        f"{i + 1}: '{nm}' [0, {global_rows(p)})"
        for i, (p, nm) in enumerate(zip(params, names))
        if not isinstance(p, EmbeddingVariable)
    )
    valid = tf.debugging.Assert(
        tf.reduce_all(tf.equal(bad, 0)),
        [
            "lookup_sparse: an id outside the rows of a static table (tables of this call: "
            f"{bounds}). "
            f"Per rank 0..{world - 1}, the table number it passed an out-of-range id for (0: "
            "none):",
            bad,
        ],
        summarize=world,
    )
    return [same, valid]


def _not_xla_compiled():
    """Keeps XLA's auto-clustering (--xla, tf.config.optimizer.set_jit) off the exchange: its
    shapes change every step and its collectives run outside XLA; the gradients inherit it."""
    if tf.executing_eagerly():
        return contextlib.nullcontext()
    return tf.xla.experimental.jit_scope(compile_ops=False)


# Index helpers, each a handful of ops (eager execution pays per op; tf.repeat and
# tf.searchsorted are a dozen each).
def _count(ids, num):
    """How often each of 0..num-1 occurs in `ids` (int64)."""
    return tf.math.unsorted_segment_sum(tf.ones_like(ids), ids, num)


def _segment_ids(lengths, total):
    """[0] * lengths[0] + [1] * lengths[1] + ... (int64, `total` = sum of lengths)."""
    ends = tf.cumsum(lengths)
    marks = _count(tf.where(ends < total, ends, -1), total)  # negative ids are dropped
    return tf.cumsum(marks)


def _spans(starts, lengths):
    """Concatenation of range(starts[j], starts[j] + lengths[j]) over j (int64)."""
    total = tf.reduce_sum(lengths)
    shift = starts - tf.cumsum(lengths, exclusive=True)
    return tf.range(total) + tf.gather(shift, _segment_ids(lengths, total))


def fetch_rows(params, keys, counts, training, names):
    """Rows of the distinct `keys[i]` of every table, fetched from their owners (two all-to-alls).

    The index work is vectorized over the tables (a fixed number of ops, whatever the number of
    tables): eager execution pays per op.
    """
    world = context.world_size
    device = getattr(params[0], "device", "")
    for p, nm in zip(params, names):
        tables.check_target(target_of(p), world, "lookup_sparse", nm)
    with tf.name_scope("sok_exchange"), _not_xla_compiled():
        sent = _send_keys(params, keys, counts, names, device)
        owned = _owned_keys(params, sent.received)
        rows = local_rows(params, owned.keys, owned.counts, training, names)
        return _return_rows(rows, owned, sent, [_dim(p) for p in params], device)


def _send_keys(params, keys, counts, names, device):
    """1. Keys to their owners: [key, table, count] rows grouped by owner rank, each group behind
    a header row [table-list signature, n, bad-id flag] that every rank checks on arrival."""
    n, world = len(params), context.world_size
    sig = _signature(params, names)
    sizes = tf.stack([tf.size(k, out_type=tf.int64) for k in keys])
    all_keys = tf.concat([tf.cast(k, tf.int64) for k in keys], 0)
    all_counts = tf.concat([tf.cast(c, tf.int64) for c in counts], 0)
    table_ids = _segment_ids(sizes, tf.size(all_keys, out_type=tf.int64))
    key_target = tf.gather(tf.constant([target_of(p) for p in params], tf.int64), table_ids)
    owners = tables.owner(all_keys, key_target, world)
    header = tf.stack([tf.constant(sig, tf.int64), tf.constant(n, tf.int64),
                       _bad_static_ids(params, all_keys, table_ids)])
    rows_out = tf.concat([tf.reshape(tf.tile(header, [world]), [world, 3]),
                          tf.stack([all_keys, table_ids, all_counts], axis=1)], 0)
    dest = tf.concat([tf.range(world, dtype=tf.int64), owners], 0)
    order = tf.argsort(dest, stable=True)
    received, received_splits = collectives.all_to_all(
        tf.gather(rows_out, order), _count(dest, world), device)
    # Every rank checks the headers of all ranks before anything depends on the keys.
    starts = tf.cumsum(received_splits, exclusive=True)
    with tf.control_dependencies(_checks(tf.gather(received, starts), params, names, sig)):
        received = tf.identity(received)
    return types.SimpleNamespace(sizes=sizes, table_ids=table_ids, order=order,
                                 received=received, received_splits=received_splits,
                                 starts=starts)


def _owned_keys(params, received):
    """2. On the owner: the received keys and counts of each table (headers are table n)."""
    n, world = len(params), context.world_size
    r_keys, r_tables, r_counts = tf.unstack(received, num=3, axis=1)
    by_table = tf.argsort(r_tables, stable=True)
    table_sizes = _count(r_tables, n + 1)
    local_keys = tf.split(tf.gather(r_keys, by_table), table_sizes, num=n + 1)[:n]
    local_counts = tf.split(tf.gather(r_counts, by_table), table_sizes, num=n + 1)[:n]
    local_keys = [_local_keys(p, k, world) for p, k in zip(params, local_keys, strict=True)]
    # A key asked for by several ranks arrives once per rank. Static shards read each row once
    # so that their gradient (the wrapped optimizer's input) holds each row once, summed over
    # the ranks, as one process's would (Keras 3's Adagrad, e.g., squares the values of a
    # tf.IndexedSlices before it sums duplicates). Embedding Variables sum duplicates themselves.
    repeat = [None] * n
    for i, p in enumerate(params):
        if not isinstance(p, EmbeddingVariable):
            local_keys[i], repeat[i] = tf.unique(local_keys[i], out_idx=tf.int64)
    return types.SimpleNamespace(keys=local_keys, counts=local_counts, repeat=repeat,
                                 tables=r_tables, by_table=by_table)


def _return_rows(rows, owned, sent, dims, device):
    """3. Owners send the rows back flattened in received order (dims may differ); the requester
    puts them in table order (each table's distinct keys in their order).

    A custom gradient sends each row's gradient back the same way, reversed: TensorFlow's own
    gradients of these gathers would be clustered by XLA's auto-jit (which fails on a table
    with no keys on a rank) and recompiled for every step's new sizes."""
    n, world = len(dims), context.world_size
    dim_of = tf.constant(dims + [0], tf.int64)  # table n: the headers, no row travels back
    r_dims = tf.gather(dim_of, owned.tables)
    grouped_offsets = tf.cumsum(tf.gather(r_dims, owned.by_table), exclusive=True)
    pack = _spans(tf.gather(grouped_offsets, tf.math.invert_permutation(owned.by_table)), r_dims)
    float_ends = tf.concat([[0], tf.cumsum(r_dims)], 0)  # floats before each received row
    float_splits = (tf.gather(float_ends, sent.starts + sent.received_splits)
                    - tf.gather(float_ends, sent.starts))
    sent_tables = tf.gather(tf.concat([tf.fill([world], tf.constant(n, tf.int64)),
                                       sent.table_ids], 0), sent.order)
    sent_offsets = tf.cumsum(tf.gather(dim_of, sent_tables), exclusive=True)
    mine = tf.gather(sent_offsets, tf.math.invert_permutation(sent.order))[world:]
    unpack = _spans(mine, tf.gather(dim_of, sent.table_ids))
    part_sizes = sent.sizes * tf.constant(dims, tf.int64)

    @tf.custom_gradient
    def move(*rows):
        reps = [r if rep is None else tf.gather(r, rep) for r, rep in zip(rows, owned.repeat)]
        grouped = tf.concat([tf.reshape(r, [-1]) for r in reps], 0)
        back, back_counts = collectives.all_to_all(tf.gather(grouped, pack), float_splits, device)
        parts = tf.split(tf.gather(back, unpack), part_sizes, num=n)
        outs = [tf.reshape(part, [-1, d]) for part, d in zip(parts, dims)]

        def grad(*d_outs):
            with _not_xla_compiled():
                d_flat = tf.concat([tf.reshape(tf.zeros_like(o) if d is None else d, [-1])
                                    for d, o in zip(d_outs, outs)], 0)
                d_back = tf.math.unsorted_segment_sum(d_flat, unpack,
                                                      tf.size(back, out_type=tf.int64))
                d_sent, _ = collectives.all_to_all(d_back, back_counts, device)
                d_grouped = tf.math.unsorted_segment_sum(d_sent, pack,
                                                         tf.size(grouped, out_type=tf.int64))
                d_reps = tf.split(d_grouped, [tf.size(r, out_type=tf.int64) for r in reps],
                                  num=n)
                d_rows = []
                for r, rep, d in zip(rows, owned.repeat, d_reps):
                    d = tf.reshape(d, [-1, r.shape[-1] if r.shape[-1] is not None
                                       else tf.shape(r)[-1]])
                    if rep is not None:  # rows read once, sent once per asking rank
                        d = tf.math.unsorted_segment_sum(d, rep, tf.shape(r, out_type=tf.int64)[0])
                    d_rows.append(d)
                return d_rows

        return outs, grad

    return move(*rows)
