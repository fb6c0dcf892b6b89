"""Model parallelism under Horovod: tables are sharded over ranks, inputs are data-parallel.

Placement follows tables.py (target_gpu -1: key k on rank k mod N; k: the whole table on rank k);
the exchange's index work is a few fused ops over all tables (core/exchange.h).
One lookup_sparse call makes one exchange per direction, whatever the number of tables:

  1. each rank sends every owner only the distinct keys that owner holds ([key, count] rows, by
     owner then table); a [world, n + 2] matrix travels first: the keys per (owner, table) and
     [table-list signature, bad-id flag], so that every rank learns every size on the host at
     once and checks that all ranks passed the same tables and valid ids before going on;
  2. owners dedup what every rank sent, all tables at once, read (training: insert) each row
     once and send it to every rank that asked, flattened (dims may differ), sized from that
     matrix. lookup_sparse pools those flat rows where they arrived (fetch_returned_rows and
     SokPooledCombineFlat, whose gradient comes back in the same layout); fetch_rows takes each
     key's row out for the other callers.

Dense ids (lookup.py's _exchanged) skip both dedups' waits for their distinct counts: the
requester's dedup and the owner's keep every entry (padding after the distinct keys) and give
the counts on the device, where the plan, the gather and the update take them
(core/exchange.h); the size matrix is then the lookup's one wait. SparseTensor and RaggedTensor
ids keep both waits: padded, their plan, rows and gradients would be sized by the ids instead of
the distinct keys; with the owner's keys padded alone fields100 and the 26-field step on 4 GPUs
ran slower, and the 26-field step on 2 GPUs no faster once the GPU table's growth bound stopped
making padded owners wait (benchmarks/gpu/SCALING.md). Ids outside their dense shape travel as the
header's bad flag (the requester's valid -1), so every rank fails at the size matrix. Static
tables need exact owner keys (TensorFlow's optimizers apply a repeated index twice).

The backward pass sends each row's gradient back the same way (a custom gradient); an owner sums
a row's gradients in rank order, and the gather's gradient becomes a tf.IndexedSlices of distinct
keys for the fused optimizer update.
"""
import types
import zlib

import tensorflow as tf

from sparse_operation_kit.parallel.local_rows import local_rows
from sparse_operation_kit.runtime import collectives
from sparse_operation_kit.runtime._ops import ops
from sparse_operation_kit.runtime.context import context
from sparse_operation_kit.tables import tables, uniqueness
from sparse_operation_kit.tables.embedding_variable import EmbeddingVariable
from sparse_operation_kit.tables.tables import dim_of as _dim
from sparse_operation_kit.tables.tables import global_rows, target_of


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


def _mismatch(params, names, sig):
    return (
        "lookup_sparse: the ranks passed different tables to this lookup_sparse call. Rank "
        f"{context.rank} passed [{_describe(params, names)}] (signature {sig}); every rank must "
        "pass the same tables (names, dimensions, target_gpu) in the same order."
    )


def _bad_ids(params, names):
    world = context.world_size
    bounds = ", ".join(
        f"{i + 1}: '{nm}' [0, {global_rows(p)})"
        for i, (p, nm) in enumerate(zip(params, names))
        if not isinstance(p, EmbeddingVariable)
    )
    return (
        f"lookup_sparse: an id outside the rows of a static table (tables of this call: {bounds})."
        f" Per rank 0..{world - 1}, the table number it passed an out-of-range id for (0: none):"
    )


def _specs(params):
    """The exchange ops' per-table attributes (core/exchange.h's TableSpec)."""
    rows = [-1 if isinstance(p, EmbeddingVariable) else global_rows(p) for p in params]
    return dict(targets=[target_of(p) for p in params], rows=rows)


def fetch_rows(params, keys, counts, training, names, valid=None, padded=False):
    """Rows of the distinct `keys[i]` of every table, fetched from their owners (one exchange per
    direction). The index work is vectorized over the tables: eager execution pays per op.
    valid: [n] on the device, table i's keys are its first valid[i]; -1: its ids' positions were
    outside their dense shape (the plan's header makes every rank fail). padded: the keys carry
    padding past valid (the requester's dedup did not wait for its counts): it is not sent, its
    rows are zeros, and the owner's keys are padded too."""
    with tf.name_scope("sok_exchange"), collectives.not_xla_compiled():
        rows, owned, sent, device, chain = _rows_of_owners(params, keys, counts, training, names,
                                                           valid, padded)
        return _return_rows(rows, owned, sent, [_dim(p) for p in params], device, chain)


def fetch_returned_rows(params, keys, counts, training, names, valid=None, padded=False):
    """fetch_rows' rows as they come back, not split per table: .flat (floats; differentiable),
    .row_at (where the row of key i of table t starts in it, -1: none; key i of table t is entry
    sum(.sizes[:t]) + i), .sizes ([n], host) and .dims. SokPooledCombineFlat reads them in place,
    which saves copying every row (and its gradient) once more."""
    dims = [_dim(p) for p in params]
    with tf.name_scope("sok_exchange"), collectives.not_xla_compiled():
        rows, owned, sent, device, chain = _rows_of_owners(params, keys, counts, training, names,
                                                           valid, padded)
        flat = _returned_flat(rows, owned, sent, dims, device, chain)
    return types.SimpleNamespace(flat=flat, row_at=sent.row_at, sizes=sent.sizes, dims=dims)


def _rows_of_owners(params, keys, counts, training, names, valid, padded):
    """Steps 1 and 2: the keys sent to their owners, and the owners' rows of them."""
    world = context.world_size
    device = getattr(params[0], "device", "")
    for p, nm in zip(params, names):
        tables.check_target(target_of(p), world, "lookup_sparse", nm)
    chain = collectives.TRAIN if training else collectives.LOOKUP
    sent = _send_keys(params, keys, counts, names, device, chain, valid)
    owned = _owned_keys(params, sent, training, padded=padded)
    rows = local_rows(params, owned.keys, owned.counts, training, names, owned.valid)
    return rows, owned, sent, device, chain


def _send_keys(params, keys, counts, names, device, chain, valid):
    """1. Keys to their owners, grouped by (owner, table), behind the size matrix (one op plans
    it: core/exchange.h)."""
    n = len(params)
    sig = _signature(params, names)
    request, matrix, row_at, sizes = ops.sok_exchange_plan(
        [tf.cast(k, tf.int64) for k in keys], [tf.cast(c, tf.int64) for c in counts],
        tf.zeros([0], tf.int64) if valid is None else valid,
        world=context.world_size, dims=[_dim(p) for p in params], signature=sig,
        **_specs(params))
    ex = collectives.exchange(request, matrix, device, row_columns=n,
                              width_mismatch=_mismatch(params, names, sig), chain=chain,
                              opens_lookup=True)
    # Each rank sent every rank [signature, bad-id flag] with its sizes, so every rank sees what
    # every other rank passed: a mismatch fails on every rank at once, before the second
    # exchange, instead of hanging in it. The same op sizes the rows' exchange. On a GPU its
    # kernel keeps every tensor in host memory, beside the all-to-alls (no cross-device sends).
    owed_to, due_from = ops.sok_exchange_sizes(
        ex.received, ex.sent, dims=[_dim(p) for p in params], signature=sig,
        mismatch=_mismatch(params, names, sig), bad_ids=_bad_ids(params, names),
        table_names=names)
    return types.SimpleNamespace(ex=ex, sizes=sizes, row_at=row_at, owed_to=owed_to,
                                 due_from=due_from)


def _owned_keys(params, sent, training, padded):
    """2. On the owner: each table's distinct keys (static shards: local rows) with their counts
    summed, and where their rows go back. A key several ranks ask for is read once and its
    gradient summed over them in rank order (one process's IndexedSlices hold each key once too:
    Keras 3's Adagrad, e.g., squares the values before it sums duplicates)."""
    n = len(params)
    padded = padded and all(isinstance(p, EmbeddingVariable) for p in params)
    with tf.control_dependencies([sent.owed_to]):  # nothing goes on before every rank's check
        keys, counts, row_pos, distinct, valid = ops.sok_exchange_owner_keys(
            sent.ex.rows, sent.ex.received, N=n, dims=[_dim(p) for p in params], padded=padded,
            **_specs(params))
    keys = [tf.cast(k, p.key_dtype) if isinstance(p, EmbeddingVariable) else k
            for k, p in zip(keys, params)]
    # The update may skip its dedup (of the padded keys: given `valid`); a training Gather of
    # them inserts them.
    if padded:
        uniqueness.declare_padded(keys, valid, inserted=bool(training))
    else:
        uniqueness.declare_distinct(keys, inserted=bool(training))
    return types.SimpleNamespace(keys=keys, counts=list(counts), row_pos=row_pos,
                                 distinct=distinct, valid=valid if padded else None)


def _return_rows(rows, owned, sent, dims, device, chain):
    """3. Owners send the rows back flattened, blocks by (requester, table); each requester
    takes its keys' rows out of what comes back (row_at).

    A custom gradient sends each row's gradient back the same way, reversed, built outside XLA:
    XLA's auto-jit would recompile for every step's new sizes."""
    n = len(dims)

    @tf.custom_gradient
    def move(*rows):
        back = _rows_to_requesters(rows, owned, sent, dims, device, chain)
        outs = ops.sok_exchange_gather_rows(back, sent.row_at, sent.sizes, N=n, dims=dims)

        def grad(*d_outs):
            with collectives.not_xla_compiled():
                d_outs = [tf.zeros_like(o) if g is None else tf.convert_to_tensor(g)
                          for g, o in zip(d_outs, outs)]
                d_back = ops.sok_exchange_scatter_rows(d_outs, sent.row_at, sent.sizes,
                                                       sent.due_from, dims=dims)
                return _grads_to_owners(d_back, owned, sent, dims, device)

        return list(outs), grad

    return move(*rows)


def _returned_flat(rows, owned, sent, dims, device, chain):
    """3. as _return_rows, without taking each key's row out: the flat rows as they came back
    (their gradient comes in the same layout)."""

    @tf.custom_gradient
    def move(*rows):
        back = _rows_to_requesters(rows, owned, sent, dims, device, chain)

        def grad(d_back):
            with collectives.not_xla_compiled():
                return _grads_to_owners(tf.convert_to_tensor(d_back), owned, sent, dims, device)

        return back, grad

    return move(*rows)


def _rows_to_requesters(rows, owned, sent, dims, device, chain):
    """Every distinct row to the requesters that asked, flat blocks by (requester, table)."""
    flat = ops.sok_exchange_rows_to_blocks(rows, owned.row_pos, sent.ex.received, dims=dims)
    return collectives.all_to_all_sized(flat, sent.owed_to, sent.due_from, device, chain)


def _grads_to_owners(d_back, owned, sent, dims, device):
    """The returned rows' gradient back to the owners, summed per distinct row in rank order.
    Its ops make no host arithmetic of their own: optimizers may colocate a gradient with its
    op, and one on the GPU cannot share a group with host ops."""
    d_flat = collectives.all_to_all_sized(d_back, sent.due_from, sent.owed_to, device,
                                          ends_step=True)
    return list(ops.sok_exchange_rows_from_blocks(d_flat, owned.row_pos, owned.distinct,
                                                  N=len(dims), dims=dims))
