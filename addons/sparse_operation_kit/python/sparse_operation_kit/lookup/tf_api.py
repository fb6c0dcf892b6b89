"""TensorFlow's own embedding functions on Embedding Variables, as DeepRec programs call them:
tf.nn.embedding_lookup, embedding_lookup_sparse and safe_embedding_lookup_sparse (v1 and v2)
are dispatched here when their table is an Embedding Variable, a partitioned one, or a list of
one: they convert any other table to a tensor, which an Embedding Variable has not. (A
sok.Variable is a tf.Variable holding this rank's shard: TensorFlow's functions read that shard,
as SOK 2.x programs expect.)

embedding_lookup reads each id's row (lookup.lookup_rows: from its owner under Horovod; the
reads insert unseen keys, as DeepRec's do; a sok.DynamicVariable reads this rank's rows, as in
SOK 2.x, whose programs use all2all_dense_embedding across ranks), the sparse ones are one fused
sok.lookup_sparse.
Results follow TensorFlow's documented semantics, with one difference: the output always has a
row per sample (dense_shape[0]); samples without ids get zeros (TensorFlow's
embedding_lookup_sparse leaves trailing ones out).
"""
from typing import Union

import tensorflow as tf

from sparse_operation_kit.lookup.lookup import lookup_rows, lookup_sparse
from sparse_operation_kit.parallel.partitioned import PartitionedEmbeddingVariable
from sparse_operation_kit.runtime import compat
from sparse_operation_kit.tables.embedding_variable import EmbeddingVariable
from sparse_operation_kit.tables.tables import dim_of

compat.register_dispatchable_type(EmbeddingVariable)
# dispatch_for_api reads typing annotations (typing.Union, not "X | Y").
_TABLE = Union[EmbeddingVariable, PartitionedEmbeddingVariable, list[EmbeddingVariable]]  # noqa: UP007


def _one_table(params, api):
    if isinstance(params, (list, tuple)):
        if len(params) != 1:
            raise ValueError(
                f"{api}: a list of {len(params)} Embedding Variables is not supported; an "
                "Embedding Variable is one table (partitioned: sok.get_embedding_variable(..., "
                "partitioner=...))"
            )
        params = params[0]
    return params


def _embedding_lookup(params, ids, max_norm):
    table = _one_table(params, "tf.nn.embedding_lookup")
    if isinstance(ids, tf.RaggedTensor):
        return tf.ragged.map_flat_values(lambda k: _embedding_lookup(table, k, max_norm), ids)
    if getattr(table, "_tf_lookup_reads_shard", False):
        rows = table.sparse_read(ids)
    else:
        rows = lookup_rows(table, ids)
    if max_norm is not None:
        rows = tf.clip_by_norm(rows, max_norm, axes=[-1])
    return rows


def _as_sparse(x):
    return x.to_sparse() if isinstance(x, tf.RaggedTensor) else x


def _embedding_lookup_sparse(params, sp_ids, sp_weights, combiner, max_norm, api):
    table = _one_table(params, api)
    combiner = combiner or "mean"  # TensorFlow's default
    if max_norm is None:
        return lookup_sparse(table, sp_ids, sp_weights, combiners=combiner)
    # Each distinct id's row is clipped before the combine (TensorFlow's order), then TensorFlow's
    # own combine pools them.
    sp_ids, sp_weights = _as_sparse(sp_ids), _as_sparse(sp_weights)
    distinct, index = tf.unique(sp_ids.values)
    rows = tf.clip_by_norm(lookup_rows(table, distinct), max_norm, axes=[-1])
    positions = tf.SparseTensor(sp_ids.indices, tf.cast(index, tf.int64), sp_ids.dense_shape)
    out = tf.nn.embedding_lookup_sparse(rows, positions, sp_weights, combiner=combiner)
    missing = sp_ids.dense_shape[0] - tf.shape(out, out_type=tf.int64)[0]
    return tf.pad(out, [[0, missing], [0, 0]])


def _safe_embedding_lookup_sparse(params, sparse_ids, sparse_weights, combiner, default_id,
                                  max_norm):
    """TensorFlow's semantics: ids [d0, ..., dn] pool along the last dimension; ids < 0 are
    dropped, and so are ids of weight <= 0 unless combiner is "sum"; a sample left without ids
    gets default_id's row (which a training lookup inserts), or zeros without default_id."""
    api = "tf.nn.safe_embedding_lookup_sparse"
    table = _one_table(params, api)
    ids, weights = _as_sparse(sparse_ids), _as_sparse(sparse_weights)
    shape = ids.dense_shape
    ids = tf.sparse.reshape(ids, tf.stack([tf.reduce_prod(shape[:-1]), shape[-1]]))
    if weights is not None:
        weights = tf.SparseTensor(ids.indices, weights.values, ids.dense_shape)
    keep = ids.values >= 0
    if weights is not None and combiner != "sum":
        keep = tf.logical_and(keep, weights.values > 0)
    ids = tf.sparse.retain(ids, keep)
    weights = None if weights is None else tf.sparse.retain(weights, keep)
    if default_id is not None:
        ids, _ = tf.sparse.fill_empty_rows(ids, tf.cast(default_id, ids.dtype))
        if weights is not None:
            weights, _ = tf.sparse.fill_empty_rows(weights, 1.0)
    out = _embedding_lookup_sparse(table, ids, weights, combiner, max_norm, api)
    return tf.reshape(out, tf.concat([shape[:-1], [dim_of(table)]], 0))


@tf.experimental.dispatch_for_api(tf.nn.embedding_lookup, {"params": _TABLE})
def _embedding_lookup_v2(params, ids, max_norm=None, name=None):
    with tf.name_scope(name or "embedding_lookup"):
        return _embedding_lookup(params, ids, max_norm)


@tf.experimental.dispatch_for_api(tf.compat.v1.nn.embedding_lookup, {"params": _TABLE})
def _embedding_lookup_v1(params, ids, partition_strategy="mod", name=None, validate_indices=True,
                         max_norm=None):
    with tf.name_scope(name or "embedding_lookup"):
        return _embedding_lookup(params, ids, max_norm)


@tf.experimental.dispatch_for_api(tf.nn.embedding_lookup_sparse, {"params": _TABLE})
def _embedding_lookup_sparse_v2(params, sp_ids, sp_weights, combiner=None, max_norm=None,
                                name=None, allow_fast_lookup=False):
    with tf.name_scope(name or "embedding_lookup_sparse"):
        return _embedding_lookup_sparse(params, sp_ids, sp_weights, combiner, max_norm,
                                        "tf.nn.embedding_lookup_sparse")


@tf.experimental.dispatch_for_api(tf.compat.v1.nn.embedding_lookup_sparse, {"params": _TABLE})
def _embedding_lookup_sparse_v1(params, sp_ids, sp_weights, partition_strategy="mod", name=None,
                                combiner=None, max_norm=None, allow_fast_lookup=False):
    with tf.name_scope(name or "embedding_lookup_sparse"):
        return _embedding_lookup_sparse(params, sp_ids, sp_weights, combiner, max_norm,
                                        "tf.nn.embedding_lookup_sparse")


@tf.experimental.dispatch_for_api(tf.nn.safe_embedding_lookup_sparse,
                                  {"embedding_weights": _TABLE})
def _safe_embedding_lookup_sparse_v2(embedding_weights, sparse_ids, sparse_weights=None,
                                     combiner="mean", default_id=None, max_norm=None, name=None,
                                     allow_fast_lookup=False):
    with tf.name_scope(name or "embedding_lookup"):
        return _safe_embedding_lookup_sparse(embedding_weights, sparse_ids, sparse_weights,
                                             combiner, default_id, max_norm)


@tf.experimental.dispatch_for_api(tf.compat.v1.nn.safe_embedding_lookup_sparse,
                                  {"embedding_weights": _TABLE})
def _safe_embedding_lookup_sparse_v1(embedding_weights, sparse_ids, sparse_weights=None,
                                     combiner="mean", default_id=None, name=None,
                                     partition_strategy="div", max_norm=None,
                                     allow_fast_lookup=False):
    with tf.name_scope(name or "embedding_lookup"):
        return _safe_embedding_lookup_sparse(embedding_weights, sparse_ids, sparse_weights,
                                             combiner, default_id, max_norm)
