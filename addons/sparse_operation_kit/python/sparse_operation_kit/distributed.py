"""Model parallelism under Horovod: tables are sharded over ranks, inputs are data-parallel.

Placement follows tables.py (target_gpu -1: key k on rank k mod N; k: the whole table on rank k).
One lookup_sparse call makes one exchange per direction, whatever the number of tables:

  1. each rank sends every owner only the distinct keys that owner holds ([key, count] rows, by
     owner then table); a [world, n + 2] matrix travels first: the keys per (owner, table) and
     [table-list signature, bad-id flag], so that every rank learns every size on the host at
     once and checks that all ranks passed the same tables and valid ids before going on;
  2. owners read (training: insert) their rows and send them back, flattened (dims may differ),
     sized from that matrix: no wait on the host.

The backward pass sends each row's gradient back the same way (a custom gradient), where the
gather's gradient becomes a tf.IndexedSlices of the owner's keys for the fused optimizer update.
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


def _mismatch(params, names, sig):
    return (
        "lookup_sparse: the ranks passed different tables to this lookup_sparse call. Rank "
        f"{context.rank} passed [{_describe(params, names)}] (signature {sig}); every rank must "
        "pass the same tables (names, dimensions, target_gpu) in the same order."
    )


def _checks(received_headers, params, names, sig):
    """Asserts, on every rank alike, that all ranks passed these tables and valid static ids.

    Each rank sends every rank [signature, bad-id flag] with its sizes (the first exchange), so
    every rank sees what every other rank passed: a mismatch fails on every rank at once, before
    the second exchange, instead of hanging in it.
    """
    world = context.world_size
    sigs, bad = tf.unstack(received_headers, num=2, axis=1)
    same = tf.debugging.Assert(
        tf.reduce_all(tf.equal(sigs, tf.constant(sig, tf.int64))),
        [_mismatch(params, names, sig) + f" Table-list signatures of ranks 0..{world - 1}:", sigs],
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


def _reorder(x, sizes, world, n, to_table_major):
    """x holds one block per (rank, table), sizes[i] elements each (host), rank-major (block
    q * n + t) when to_table_major, else table-major (block t * world + q); returns the blocks
    concatenated in the other order."""
    pieces = tf.split(x, sizes, num=world * n)
    if to_table_major:
        order = [q * n + t for t in range(n) for q in range(world)]
    else:
        order = [t * world + q for q in range(world) for t in range(n)]
    return tf.concat([pieces[i] for i in order], 0)


def _on_host():
    """Arithmetic on sizes the exchange left in host memory stays there (no copies, no waits)."""
    return tf.device("/CPU:0")


def _stack_on_host(sizes):
    """tf.size's results (host memory on a GPU too: the size ops stay by their tensors) as one
    host vector."""
    with _on_host():
        return tf.stack(sizes)


def fetch_rows(params, keys, counts, training, names):
    """Rows of the distinct `keys[i]` of every table, fetched from their owners (one exchange per
    direction). The index work is vectorized over the tables: eager execution pays per op."""
    world = context.world_size
    device = getattr(params[0], "device", "")
    for p, nm in zip(params, names):
        tables.check_target(target_of(p), world, "lookup_sparse", nm)
    with tf.name_scope("sok_exchange"), _not_xla_compiled():
        chain = collectives.TRAIN if training else collectives.LOOKUP
        sent = _send_keys(params, keys, counts, names, device, chain)
        owned = _owned_keys(params, sent)
        rows = local_rows(params, owned.keys, owned.counts, training, names)
        return _return_rows(rows, owned, sent, [_dim(p) for p in params], device, chain)


def _send_keys(params, keys, counts, names, device, chain):
    """1. Keys to their owners, grouped by (owner, table), behind the size matrix."""
    n, world = len(params), context.world_size
    sig = _signature(params, names)
    sizes = _stack_on_host([tf.size(k, out_type=tf.int64) for k in keys])
    all_keys = tf.concat([tf.cast(k, tf.int64) for k in keys], 0)
    all_counts = tf.concat([tf.cast(c, tf.int64) for c in counts], 0)
    total = tf.size(all_keys, out_type=tf.int64)
    table_ids = _segment_ids(sizes, total)
    key_target = tf.gather(tf.constant([target_of(p) for p in params], tf.int64), table_ids)
    block = tables.owner(all_keys, key_target, world) * n + table_ids  # (owner, table)
    order = tf.argsort(block, stable=True)
    request = tf.gather(tf.stack([all_keys, all_counts], axis=1), order)
    header = tf.stack([tf.constant(sig, tf.int64), _bad_static_ids(params, all_keys, table_ids)])
    matrix = tf.concat([tf.reshape(_count(block, world * n), [world, n]),
                        tf.tile(header[None], [world, 1])], 1)
    ex = collectives.exchange(request, matrix, device, row_columns=n,
                              width_mismatch=_mismatch(params, names, sig), chain=chain)
    with _on_host():
        checks = _checks(ex.received[:, n:], params, names, sig)
        sent = ex.sent[:, :n]  # keys per (owner q, table t)
        block_start = tf.cumsum(tf.reshape(sent, [-1]), exclusive=True)
        in_table = tf.reshape(tf.transpose(tf.cumsum(tf.transpose(sent), axis=1, exclusive=True)),
                              [-1])
        shift = block_start - in_table
    # Where each key's row lands among its table's rows as they come back (blocks of owners).
    position = tf.scatter_nd(order[:, None], tf.range(total), [total])
    back_at = tf.split(position - tf.gather(shift, block), sizes, num=n)
    return types.SimpleNamespace(ex=ex, checks=checks, sizes=sizes, sent=sent, back_at=back_at)


def _owned_keys(params, sent):
    """2. On the owner: the received keys and counts of each table."""
    n, world = len(params), context.world_size
    with tf.control_dependencies(sent.checks):  # nothing goes on before every rank's check
        received = tf.identity(sent.ex.rows)
    with _on_host():
        recv = sent.ex.received[:, :n]  # keys per (requester q, table t)
        per_table = tf.reduce_sum(recv, axis=0)
        blocks = tf.reshape(recv, [-1])
    by_table = _reorder(received, blocks, world, n, to_table_major=True)
    local_keys, local_counts = (tf.split(c, per_table, num=n)
                                for c in tf.unstack(by_table, num=2, axis=1))
    local_keys = [_local_keys(p, k, world) for p, k in zip(params, local_keys, strict=True)]
    # A key asked for by several ranks arrives once per rank. Static shards read each row once
    # so that their gradient (the wrapped optimizer's input) holds each row once, summed over
    # the ranks, as one process's would (Keras 3's Adagrad, e.g., squares the values of a
    # tf.IndexedSlices before it sums duplicates). Embedding Variables sum duplicates themselves.
    repeat = [None] * n
    for i, p in enumerate(params):
        if not isinstance(p, EmbeddingVariable):
            local_keys[i], repeat[i] = tf.unique(local_keys[i], out_idx=tf.int64)
    return types.SimpleNamespace(keys=local_keys, counts=list(local_counts), repeat=repeat,
                                 recv=recv)


def _return_rows(rows, owned, sent, dims, device, chain):
    """3. Owners send the rows back flattened, blocks by (requester, table); the requester puts
    them in table order (each table's distinct keys in their order).

    A custom gradient sends each row's gradient back the same way, reversed, built outside XLA:
    TensorFlow's own gradients of these ops would be clustered by XLA's auto-jit (which fails on
    a table with no keys on a rank) and recompiled for every step's new sizes."""
    n, world = len(dims), context.world_size
    with _on_host():
        dim = tf.constant(dims, tf.int64)
        owed = owned.recv * dim  # floats per (requester, table)
        due = sent.sent * dim  # floats per (owner, table)
        owed_by_table, owed_by_rank = tf.reshape(tf.transpose(owed), [-1]), tf.reshape(owed, [-1])
        due_by_table, due_by_rank = tf.reshape(tf.transpose(due), [-1]), tf.reshape(due, [-1])
        owed_to, due_from = tf.reduce_sum(owed, axis=1), tf.reduce_sum(due, axis=1)
        table_floats = sent.sizes * dim
        each = tf.unstack(sent.sizes, num=n)

    # The gradient's ops make no host arithmetic of their own: optimizers may colocate a
    # gradient with its op, and one on the GPU cannot share a group with host ops.
    @tf.custom_gradient
    def move(*rows):
        reps = [r if rep is None else tf.gather(r, rep) for r, rep in zip(rows, owned.repeat)]
        rep_sizes = _stack_on_host([tf.size(r, out_type=tf.int64) for r in reps])
        flat = tf.concat([tf.reshape(r, [-1]) for r in reps], 0)
        out = _reorder(flat, owed_by_table, world, n, to_table_major=False)
        back = collectives.all_to_all_sized(out, owed_to, due_from, device, chain)
        parts = tf.split(_reorder(back, due_by_rank, world, n, to_table_major=True),
                         table_floats, num=n)
        outs = [tf.gather(tf.reshape(part, [-1, d]), at)
                for part, d, at in zip(parts, dims, sent.back_at)]

        def grad(*d_outs):
            with _not_xla_compiled():
                d_parts = [tf.reshape(tf.math.unsorted_segment_sum(
                    tf.zeros_like(o) if g is None else g, at, size), [-1])
                    for g, o, at, size in zip(d_outs, outs, sent.back_at, each)]
                d_back = _reorder(tf.concat(d_parts, 0), due_by_table, world, n,
                                  to_table_major=False)
                d_out = collectives.all_to_all_sized(d_back, due_from, owed_to, device)
                d_flat = _reorder(d_out, owed_by_rank, world, n, to_table_major=True)
                d_reps = tf.split(d_flat, rep_sizes, num=n)
                d_rows = []
                for r, rep, g, d in zip(rows, owned.repeat, d_reps, dims):
                    g = tf.reshape(g, [-1, d])
                    if rep is not None:  # rows read once, sent once per asking rank
                        g = tf.math.unsorted_segment_sum(g, rep, tf.shape(r, out_type=tf.int64)[0])
                    d_rows.append(g)
                return d_rows

        return outs, grad

    return move(*rows)
