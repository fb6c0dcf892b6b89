"""DeepRec's `tf.nn.group_embedding_lookup_sparse`: many pooled lookups in one fused call, mapped
onto sok.lookup_sparse (same arguments, same order as DeepRec's)."""

import sys

import tensorflow as tf

from sparse_operation_kit.lookup.lookup import lookup_sparse

_COMBINERS = ("mean", "sum", "sqrtn")


def _as_list(x):
    if x is None:
        return None
    if isinstance(x, tuple):
        return list(x)
    return list(x) if isinstance(x, list) else [x]


def _sequence_rows(param, ids, weights):
    """[batch, max_len, dim]: the row of every id at its (sample, position), zeros elsewhere."""
    if isinstance(ids, tf.RaggedTensor):
        ids = ids.to_sparse()
    if isinstance(weights, tf.RaggedTensor):
        weights = weights.to_sparse()
    rows = tf.nn.embedding_lookup(param, ids.values)
    if weights is not None:
        rows = rows * tf.expand_dims(weights.values, -1)
    shape = tf.concat(
        [
            ids.dense_shape[:2],
            [
                param.embedding_dim
                if hasattr(param, "embedding_dim")
                else tf.shape(param, out_type=tf.int64)[1]
            ],
        ],
        0,
    )
    return tf.scatter_nd(ids.indices[:, :2], rows, shape)


def group_embedding_lookup_sparse(
    params,
    sp_ids,
    combiners,
    sp_weights=None,
    partition_strategy="mod",
    is_sequence=False,
    params_num_per_group=sys.maxsize,
    name=None,
):
    """Pooled embeddings of every (table, ids) pair, as DeepRec's group_embedding_lookup_sparse.

    params: tables (Embedding Variables, partitioned ones, tf.Variable); sp_ids: a SparseTensor or
    RaggedTensor per table; combiners: "mean" or "sum" per table (None: "mean"; "sqrtn" is
    accepted too); sp_weights: None or per table None / weights shaped like the ids.
    is_sequence=True returns [batch, max_len, dim] per table (each id's row at its position,
    weighted, zeros where a sample has fewer ids) instead of pooling. partition_strategy: "mod"
    (DeepRec supports no other). params_num_per_group is a scheduling hint: every table is looked
    up in one fused op here. Returns a list of tensors, one per table.
    """
    params = _as_list(params)
    if not params:
        raise ValueError("group_embedding_lookup_sparse: params must be one or more tables")
    sp_ids = _as_list(sp_ids)
    combiners = ["mean"] * len(params) if combiners is None else _as_list(combiners)
    for c in combiners:
        if c not in _COMBINERS:
            raise ValueError(
                f"group_embedding_lookup_sparse: combiners must be 'mean' or 'sum' (or 'sqrtn'), got {c!r}"
            )
    if len(combiners) != len(sp_ids) or len(combiners) != len(params):
        raise ValueError(
            f"group_embedding_lookup_sparse: {len(params)} params, {len(sp_ids)} sp_ids and "
            f"{len(combiners)} combiners: give one of each per table"
        )
    weights = _as_list(sp_weights)
    if weights is not None and len(weights) != len(params):
        raise ValueError(
            f"group_embedding_lookup_sparse: {len(params)} params but {len(weights)} sp_weights"
        )
    if partition_strategy != "mod":
        raise ValueError(
            f"group_embedding_lookup_sparse: partition_strategy must be 'mod', got {partition_strategy!r}"
        )
    with tf.name_scope(name or "group_embedding_lookup_sparse"):
        if is_sequence:
            weights = weights or [None] * len(params)
            return [_sequence_rows(p, i, w) for p, i, w in zip(params, sp_ids, weights)]
        return lookup_sparse(params, sp_ids, sp_weights=weights, combiners=combiners)
