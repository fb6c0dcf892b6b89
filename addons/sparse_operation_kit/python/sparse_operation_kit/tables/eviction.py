"""NVIDIA SOK 2.x's `sok.sparse_read_and_evict(var, indices)`: a training read that keeps a
DynamicVariable within its `max_capacity` rows and hands back the rows it removed.

Which rows go: those updated longest ago (the smallest `versions`, the step of a row's last
update), rows of equal step in the order they were inserted. The rows of `indices` always stay,
so a batch with more distinct ids than max_capacity leaves the table above it. A table without
max_capacity never evicts. Every call that evicts rewrites the table (a snapshot without the
evicted rows): its cost grows with the table, not with the batch.
"""
import tensorflow as tf

from sparse_operation_kit.runtime.schema import EXPORT_FIELDS, ROW_FIELDS
from sparse_operation_kit.tables.embedding_variable import EmbeddingVariable


def sparse_read_and_evict(var, indices, name=None):
    """(rows of `indices`, evicted keys, evicted rows).

    indices: a Tensor (rows come back in its shape plus the dimension), a RaggedTensor (a
    RaggedTensor of rows) or a SparseTensor (one row per value). The read is a training read: new
    keys are inserted, and the rows are differentiable like var.sparse_read's.
    """
    if not isinstance(var, EmbeddingVariable):
        raise TypeError(
            "sok.sparse_read_and_evict takes a sok.DynamicVariable (or Embedding Variable), got "
            f"{type(var).__name__}"
        )
    if isinstance(indices, tf.RaggedTensor):
        ids = indices.flat_values
    elif isinstance(indices, tf.SparseTensor):
        ids = indices.values
    else:
        ids = tf.convert_to_tensor(indices)
    rows = var.sparse_read(ids, name=name)
    capacity = getattr(var, "max_capacity", None)
    if capacity is None:
        keys = tf.zeros([0], var.key_dtype)
        evicted = (keys, tf.zeros([0, var.embedding_dim], tf.float32))
    else:
        with tf.control_dependencies([rows]):
            evicted = _evict_over_capacity(var, tf.reshape(var.key_map(ids), [-1]), capacity)
        # The eviction rewrites the table: whatever uses the rows (the loss, then the optimizer's
        # update of these keys) must come after it, or the rewrite would undo the update (graphs
        # order nothing else between them; the GPU ran them the other way round).
        with tf.control_dependencies(list(evicted)):
            rows = tf.identity(rows)
    if isinstance(indices, tf.RaggedTensor):
        rows = indices.with_flat_values(rows)
    return rows, evicted[0], evicted[1]


def _evict_over_capacity(var, keep_keys, capacity):
    snapshot = var.snapshot()
    keys, versions = snapshot["keys"], snapshot["versions"]
    kept = _member(keys, tf.cast(keep_keys, keys.dtype))
    excess = tf.maximum(tf.size(keys) - capacity, 0)
    excess = tf.minimum(excess, tf.size(keys) - tf.reduce_sum(tf.cast(kept, tf.int32)))

    def evict():
        # Oldest update first; a stable sort keeps insertion order among equal steps.
        age = tf.where(kept, tf.constant(float("inf"), tf.float64), tf.cast(versions, tf.float64))
        order = tf.argsort(age, stable=True)
        victims, remain = order[:excess], tf.sort(order[excess:])
        rest = {f: tf.gather(snapshot[f], remain) if f in ROW_FIELDS else snapshot[f]
                for f in EXPORT_FIELDS}
        with tf.control_dependencies([var.import_snapshot(rest)]):
            return (tf.identity(tf.gather(keys, victims)),
                    tf.identity(tf.gather(snapshot["values"], victims)))

    def nothing():
        return tf.zeros([0], keys.dtype), tf.zeros([0, var.embedding_dim], tf.float32)

    return tf.cond(excess > 0, evict, nothing)


def _member(keys, candidates):
    """keys[i] in candidates, for every i."""
    table = tf.sort(tf.unique(candidates).y)
    pos = tf.searchsorted(table, keys)
    padded = tf.concat([table, tf.zeros([1], table.dtype)], 0)  # pos may be len(table)
    return tf.logical_and(pos < tf.size(table, out_type=pos.dtype),
                          tf.equal(tf.gather(padded, pos), keys))
