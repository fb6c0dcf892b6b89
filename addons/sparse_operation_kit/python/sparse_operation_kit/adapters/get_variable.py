"""DeepRec's tf.get_embedding_variable on stock TensorFlow: an Embedding Variable, or with a
partitioner a partitioned one, reused through variable scopes."""

import tensorflow as tf

from sparse_operation_kit.parallel import partitioned
from sparse_operation_kit.tables.embedding_variable import SOK_VARIABLES, EmbeddingVariable


def get_embedding_variable(
    name,
    embedding_dim,
    key_dtype=tf.int64,
    value_dtype=tf.float32,
    initializer=None,
    regularizer=None,
    trainable=True,
    collections=None,
    caching_device=None,
    partitioner=None,
    validate_shape=True,
    custom_getter=None,
    constraint=None,
    steps_to_live=None,
    init_data_source=None,
    ev_option=None,
):
    """DeepRec's tf.get_embedding_variable on stock TensorFlow.

    `partitioner` (or the variable scope's): a sok.PartitionedEmbeddingVariable of n parts
    "name/part_i" acting as one table; key k lives in part (k mod 1000) mod n, DeepRec's rule
    (see sparse_operation_kit.parallel.partitioned). Placement over Horovod workers is
    `var.target_gpu` (-1 spreads rows over all ranks, k puts the table on rank k). The variable is
    reused when a variable scope with reuse asks for the same name again. Without an initializer
    (here or in ev_option's InitializerOption) rows start truncated normal with stddev 1, as in
    DeepRec.
    """
    scope = tf.compat.v1.get_variable_scope()
    full_name = f"{scope.name}/{name}" if scope.name else name
    option_init = ev_option.init_option.initializer if ev_option and ev_option.init_option else None
    if initializer is None and option_init is None:
        initializer = tf.compat.v1.truncated_normal_initializer()  # DeepRec's: stddev 1
    partitioner = partitioner if partitioner is not None else scope.partitioner

    def make_table(table_name, table_collections):
        return EmbeddingVariable(
            table_name,
            embedding_dim,
            key_dtype=key_dtype,
            value_dtype=value_dtype,
            initializer=initializer,
            trainable=trainable,
            ev_option=ev_option,
            steps_to_live=steps_to_live,
            collections=table_collections,
        )

    if not tf.executing_eagerly():
        existing = _existing(full_name, is_partitioned=partitioner is not None)
        if existing is not None:
            return _reuse(existing, full_name, embedding_dim, scope)
    if partitioner is not None:
        return partitioned.create(
            full_name, embedding_dim, partitioner, make_table, trainable, collections
        )
    return make_table(full_name, collections)


def _existing(full_name, is_partitioned):
    """The table of this graph named `full_name` (partitioned or not), or None."""
    graph = tf.compat.v1.get_default_graph()
    if is_partitioned:
        return partitioned.find(graph, full_name)
    for v in graph.get_collection(SOK_VARIABLES):
        if isinstance(v, EmbeddingVariable) and v.name == full_name:
            return v
    return None


def _reuse(existing, full_name, embedding_dim, scope):
    if not scope.reuse:
        raise ValueError(
            f"Embedding Variable '{full_name}' already exists; use a variable_scope "
            "with reuse=True (or tf.AUTO_REUSE) to share it"
        )
    if existing.embedding_dim != int(embedding_dim):
        raise ValueError(
            f"Embedding Variable '{full_name}' has dimension {existing.embedding_dim}, "
            f"not {embedding_dim}"
        )
    return existing
