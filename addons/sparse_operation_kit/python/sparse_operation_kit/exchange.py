"""How rows of distinct keys reach the rank that asked for them.

One process: every table is local, so fetching is a direct read. Under Horovod (see
`distributed.py`) keys travel to their owners with one all-to-all and rows come back with
another; this module picks the path.
"""
import tensorflow as tf

from sparse_operation_kit._ops import ops
from sparse_operation_kit.context import context
from sparse_operation_kit.embedding_variable import EmbeddingVariable, compat


def static_rows(var, keys, name):
    """Rows of a dense table with an explicit range check naming the table."""
    num_rows = var.shape[0]
    if num_rows is None:
        num_rows = tf.shape(var, out_type=keys.dtype)[0]
    # No quotes around the name: graph-mode Assert prints its message escaped (\\').
    checks = [
        tf.debugging.assert_non_negative(keys, message=f"lookup of static table {name}: negative id"),
        tf.debugging.assert_less(keys, tf.cast(num_rows, keys.dtype),
                                 message=f"lookup of static table {name}: id out of range "
                                         f"[0, {num_rows})"),
    ]
    with tf.control_dependencies(checks):
        return tf.gather(var, keys)


def local_rows(params, keys, counts, training, names):
    """Rows of `keys[i]` from local tables `params[i]`: one fused op for all Embedding Variables."""
    rows = [None] * len(params)
    ev_idx = [i for i, p in enumerate(params) if isinstance(p, EmbeddingVariable)]
    if ev_idx:
        for i in ev_idx:
            compat.variable_accessed(params[i])
        fetched = ops.sok_embedding_variable_gather(
            [params[i].handle for i in ev_idx], [keys[i] for i in ev_idx],
            [counts[i] if training else tf.zeros([0], tf.int64) for i in ev_idx],
            dims=[params[i].embedding_dim for i in ev_idx], training=bool(training))
        for i, r in zip(ev_idx, fetched):
            rows[i] = r
    for i, p in enumerate(params):
        if rows[i] is None:
            rows[i] = static_rows(p, keys[i], names[i])
    return rows


def fetch_rows(params, keys, counts, training, names):
    if context.world_size > 1:
        from sparse_operation_kit import distributed
        return distributed.fetch_rows(params, keys, counts, training, names)
    return local_rows(params, keys, counts, training, names)
