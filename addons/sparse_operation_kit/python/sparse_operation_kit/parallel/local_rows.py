"""Rows of keys from the tables this process holds: the one read that the one-process path
(exchange.py) and the owners' side of the distributed path (distributed.py) share."""
import tensorflow as tf

from sparse_operation_kit.runtime import compat
from sparse_operation_kit.runtime._ops import ops
from sparse_operation_kit.tables.embedding_variable import EmbeddingVariable
from sparse_operation_kit.tables.tables import StaticTable, checked_rows


def static_rows(var, keys, name):
    """Rows of a dense table, its ids checked against its rows (an error naming the table)."""
    checked = checked_rows(var, keys, "lookup", name)
    if isinstance(var, StaticTable):  # its own sparse_read would check them a second time
        return compat.ResourceVariable.sparse_read(var, checked)
    return tf.gather(var, checked)


def local_rows(params, keys, counts, training, names, valid=None):
    """Rows of `keys[i]` from local tables `params[i]`: one fused op for all Embedding Variables.
    valid ([len(params)], only when every table is an Embedding Variable): table i reads only its
    first valid[i] keys, the exchange's padded owner keys."""
    rows = [None] * len(params)
    ev_idx = [i for i, p in enumerate(params) if isinstance(p, EmbeddingVariable)]
    if valid is not None and len(ev_idx) != len(params):
        raise ValueError("local_rows: valid counts are for Embedding Variables only")
    if ev_idx:
        for i in ev_idx:
            compat.variable_accessed(params[i])
        fetched = ops.sok_embedding_variable_gather(
            [params[i].handle for i in ev_idx], [keys[i] for i in ev_idx],
            [counts[i] if training else tf.zeros([0], tf.int64) for i in ev_idx],
            tf.zeros([0], tf.int64) if valid is None else valid,
            dims=[params[i].embedding_dim for i in ev_idx], training=bool(training))
        for i, r in zip(ev_idx, fetched, strict=True):
            rows[i] = r
    for i, p in enumerate(params):
        if rows[i] is None:
            rows[i] = static_rows(p, keys[i], names[i])
    return rows
