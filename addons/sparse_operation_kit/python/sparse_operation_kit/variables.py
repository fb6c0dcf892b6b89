"""NVIDIA SOK 2.x's variables: sok.Variable (static table) and sok.DynamicVariable (hash table)."""
import tensorflow as tf

from sparse_operation_kit.embedding_variable import EmbeddingVariable, InitializerOption, EmbeddingVariableOption


def parse_mode(mode):
    """mode=None | "distributed" -> target_gpu -1 (rows over all ranks); "localized:k" -> k."""
    if mode is None or mode == "distributed":
        return -1
    if isinstance(mode, str) and mode.startswith("localized:"):
        try:
            return int(mode.split(":", 1)[1])
        except ValueError:
            pass
    raise ValueError(f"unknown mode {mode!r}: expected None, 'distributed' or 'localized:<rank>'")


def Variable(*args, mode=None, **kwargs):
    """A static (dense) embedding table taking tf.Variable's arguments.

    In one process it is a plain tf.Variable holding the whole table; `target_gpu` records its
    placement (-1 for mode "distributed", k for "localized:k") for multi-rank runs.
    """
    target = parse_mode(mode)
    from sparse_operation_kit.context import context
    if context.world_size > 1:
        from sparse_operation_kit import distributed
        return distributed.static_variable(args, kwargs, target)
    var = tf.Variable(*args, **kwargs)
    var.target_gpu = target
    var.sok_mode = mode
    return var


class DynamicVariable(EmbeddingVariable):
    """A hash-table embedding whose rows appear as keys arrive (NVIDIA SOK 2.x API).

    initializer: "random" (uniform in [-0.05, 0.05]), "zeros", "ones", a number as a string, or a
    TensorFlow initializer; every key gets its own deterministic initial row. var_type names a
    storage kind ("hbm", "hybrid", ...) and is accepted: rows live in this process's memory here.
    """

    def __init__(self, dimension, initializer=None, var_type=None, name=None, constraint=None,
                 trainable=True, key_type=None, dtype=None, mode=None, **kwargs):
        if name is None:
            name = "DynamicVariable"
            if not tf.executing_eagerly():
                name = tf.compat.v1.get_default_graph().unique_name(name, mark_as_used=False)
        self.var_type = var_type
        self.mode = mode
        super().__init__(name, dimension, key_dtype=key_type or tf.int64, value_dtype=dtype or tf.float32,
                         trainable=trainable,
                         ev_option=EmbeddingVariableOption(init_option=InitializerOption(
                             initializer if initializer is not None else "random", default_value_dim=0)))
        self.target_gpu = parse_mode(mode)

    @property
    def dimension(self):
        return self.embedding_dim

    @property
    def size(self):
        """[number of keys, dimension] as an int64 tensor (SOK 2.x's `v.size` is this shape)."""
        return tf.stack([super().size(), tf.constant(self.embedding_dim, tf.int64)])

    def sparse_read(self, indices, name=None, training=True):
        # SOK 2.x casts int32 ids (e.g. a Python list given to tf.nn.embedding_lookup) to int64 keys.
        indices = tf.convert_to_tensor(indices)
        if indices.dtype == tf.int32 and self.key_dtype == tf.int64:
            indices = tf.cast(indices, tf.int64)
        return super().sparse_read(indices, name=name, training=training)

    @property
    def key_type(self):
        return self.key_dtype


def export(var):
    """(keys, values) of every row of a SOK variable (a dense table: its ids and rows)."""
    if isinstance(var, EmbeddingVariable):
        keys, values = var.export()[:2]
        return keys, values
    from sparse_operation_kit.slots import RowSlot
    if isinstance(var, RowSlot):  # a slot stored in a table's rows
        return var.export()
    value = tf.convert_to_tensor(var)
    return tf.range(tf.shape(value, out_type=tf.int64)[0]), value


def assign(var, indices, values):
    """Writes rows: var[indices[i]] = values[i] (inserting keys of dynamic tables)."""
    if isinstance(var, EmbeddingVariable):
        return var.assign(indices, values)
    return var.scatter_update(tf.IndexedSlices(tf.convert_to_tensor(values, var.dtype),
                                               tf.convert_to_tensor(indices)))
