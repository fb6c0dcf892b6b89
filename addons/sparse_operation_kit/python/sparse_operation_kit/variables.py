"""NVIDIA SOK 2.x's variables: sok.Variable (static table) and sok.DynamicVariable (hash table)."""
from __future__ import annotations

import tensorflow as tf

from sparse_operation_kit.embedding_variable import (
    EmbeddingVariable,
    EmbeddingVariableOption,
    InitializerOption,
)
from sparse_operation_kit.partitioned import PartitionedEmbeddingVariable
from sparse_operation_kit.slots import RowSlot
from sparse_operation_kit.tables import StaticTable, parse_mode, static_table


def Variable(*args, mode: str | None = None, **kwargs) -> StaticTable:  # SOK 2.x's API name
    """A static (dense) embedding table taking tf.Variable's arguments: a sok.StaticTable, which is
    a tf.Variable holding the whole table (one process) or this rank's shard (Horovod).

    mode: None or "distributed" (target_gpu -1: key k on rank k mod N), or "localized:k" (the
    whole table on rank k).
    """
    return static_table(args, kwargs, mode)


class DynamicVariable(EmbeddingVariable):
    """A hash-table embedding whose rows appear as keys arrive (NVIDIA SOK 2.x API).

    initializer: "random" (uniform in [-0.05, 0.05]), "zeros", "ones", a number as a string, or a
    TensorFlow initializer; every key gets its own deterministic initial row. var_type names a
    storage kind ("hbm", "hybrid", ...) and is accepted: rows live in this process's memory here.
    """

    def __init__(
        self,
        dimension: int,
        initializer=None,
        var_type: str | None = None,
        name: str | None = None,
        constraint=None,
        trainable: bool = True,
        key_type=None,
        dtype=None,
        mode: str | None = None,
        **kwargs,
    ):
        if name is None:
            name = "DynamicVariable"
            if not tf.executing_eagerly():
                name = tf.compat.v1.get_default_graph().unique_name(name, mark_as_used=False)
        self.var_type = var_type
        self.mode = mode
        super().__init__(
            name,
            dimension,
            key_dtype=key_type or tf.int64,
            value_dtype=dtype or tf.float32,
            trainable=trainable,
            ev_option=EmbeddingVariableOption(
                init_option=InitializerOption(
                    initializer if initializer is not None else "random", default_value_dim=0
                )
            ),
        )
        self.target_gpu = parse_mode(mode)

    @property
    def dimension(self):
        return self.embedding_dim

    @property
    def size(self):
        """[number of keys, dimension] as an int64 tensor (SOK 2.x's `v.size` is this shape)."""
        return tf.stack([super().size(), tf.constant(self.embedding_dim, tf.int64)])

    def sparse_read(self, indices, name=None, training=True):
        # SOK 2.x casts int32 ids (e.g. a Python list given to tf.nn.embedding_lookup) to int64
        # keys.
        indices = tf.convert_to_tensor(indices)
        if indices.dtype == tf.int32 and self.key_dtype == tf.int64:
            indices = tf.cast(indices, tf.int64)
        return super().sparse_read(indices, name=name, training=training)

    @property
    def key_type(self):
        return self.key_dtype


def export(var) -> tuple[tf.Tensor, tf.Tensor]:
    """(keys, values) of every row of a SOK variable (a dense table: its ids and rows)."""
    if isinstance(var, (EmbeddingVariable, PartitionedEmbeddingVariable)):
        keys, values = var.export()[:2]
        return keys, values
    if isinstance(var, RowSlot):  # a slot stored in a table's rows
        return var.export()
    value = tf.convert_to_tensor(var)
    return tf.range(tf.shape(value, out_type=tf.int64)[0]), value


def assign(var, indices, values) -> tf.Operation | tf.Tensor | tf.Variable | None:
    """Writes rows: var[indices[i]] = values[i] (inserting keys of dynamic tables)."""
    if isinstance(var, (EmbeddingVariable, PartitionedEmbeddingVariable)):
        return var.assign(indices, values)
    return var.scatter_update(tf.IndexedSlices(tf.convert_to_tensor(values, var.dtype),
                                               tf.convert_to_tensor(indices)))
