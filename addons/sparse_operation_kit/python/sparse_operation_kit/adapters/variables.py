"""NVIDIA SOK 2.x's variables: sok.Variable (static table) and sok.DynamicVariable (hash table)."""
from __future__ import annotations

import tensorflow as tf

from sparse_operation_kit.optimizers.slots import RowSlot
from sparse_operation_kit.parallel.partitioned import PartitionedEmbeddingVariable
from sparse_operation_kit.runtime.context import context
from sparse_operation_kit.tables.embedding_variable import (
    EmbeddingVariable,
    EmbeddingVariableOption,
    InitializerOption,
)
from sparse_operation_kit.tables.tables import (
    StaticTable,
    checked_rows,
    default_name,
    parse_mode,
    static_table,
)


def Variable(*args, mode: str | None = None, **kwargs) -> StaticTable:  # SOK 2.x's API name
    """A static (dense) embedding table taking tf.Variable's arguments: a sok.StaticTable, which is
    a tf.Variable holding the whole table (one process) or this rank's shard (Horovod).

    mode: None or "distributed" (target_gpu -1: key k on rank k mod N), or "localized:k" (the
    whole table on rank k).
    """
    return static_table(args, kwargs, mode)


class _PlacementType(type):
    """isinstance(x, sok.DistributedVariable / sok.LocalizedVariable) holds for the sok.Variable
    tables of that mode (SOK 2.x's two classes are one StaticTable type here)."""

    def __instancecheck__(cls, obj):
        return isinstance(obj, StaticTable) and cls.holds(obj.target_gpu)


class DistributedVariable(metaclass=_PlacementType):
    """SOK 2.x's class of sok.Variable(..., mode="distributed"): key k on rank k mod N. Calling
    it creates that table."""

    @staticmethod
    def holds(target: int) -> bool:
        return target < 0

    def __new__(cls, *args, **kwargs):
        return static_table(args, kwargs, "distributed")


class LocalizedVariable(metaclass=_PlacementType):
    """SOK 2.x's class of sok.Variable(..., mode="localized:k"): the whole table on rank k.
    Calling it creates that table (target_gpu=k, default 0)."""

    @staticmethod
    def holds(target: int) -> bool:
        return target >= 0

    def __new__(cls, *args, target_gpu: int = 0, **kwargs):
        return static_table(args, kwargs, f"localized:{int(target_gpu)}")


class DynamicVariable(EmbeddingVariable):
    """A hash-table embedding whose rows appear as keys arrive (NVIDIA SOK 2.x API).

    initializer: "random" or "uniform" (uniform in [-0.05, 0.05]), "normal" (normal, stddev
    0.05), "zeros", "ones", a number as a string, or a TensorFlow initializer; every key gets its
    own deterministic initial row. var_type names a storage backend ("hbm", "hybrid") and is
    accepted: rows live in this process's memory here. Backend options (SOK's HKV init_capacity,
    max_capacity, max_hbm_for_vectors, ...) are kept in `config_dict`; `max_capacity` bounds the
    rows that sok.sparse_read_and_evict keeps.

    It has no dense value: `tf.convert_to_tensor(var)` is an error that says to read rows with
    `var.sparse_read(ids)` or all of them with `sok.export(var)` (SOK 2.x raises
    NotImplementedError). `sess.run(var)` fetches every row of this rank (`sok.export(var)[1]`,
    see embedding_variable.fetch_rows).
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
            name = default_name("sok_dynamic_Variable")
        self.var_type = var_type or "hbm"
        self.mode = mode
        self.config_dict = dict(kwargs)
        self.max_capacity = _capacity(kwargs.get("max_capacity"), name)
        self._initializer_text = initializer if isinstance(initializer, str) else None
        super().__init__(
            name,
            dimension,
            key_dtype=key_type or tf.int64,
            value_dtype=dtype or tf.float32,
            trainable=trainable,
            ev_option=EmbeddingVariableOption(
                init_option=InitializerOption(
                    _initializer(initializer), default_value_dim=0
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

    @property
    def indices(self):
        """The keys of every row (the first output of sok.export(var))."""
        return self.export()[0]

    def key_map(self, indices):
        """Keys as the table stores them: the ids themselves (SOK 2.x's identity map)."""
        return indices

    @property
    def key_type(self):
        return self.key_dtype

    @property
    def handle_dtype(self):
        return self.dtype

    @property
    def backend_type(self):
        return self.var_type

    @property
    def initializer_str(self):
        return self._initializer_text

    @property
    def num_gpus(self):
        """The number of ranks the table's rows are spread over (SOK 2.x: GPUs)."""
        return context.world_size

    def is_static(self):
        """Always False: the table stays a hash table (to_static is not supported)."""
        return False

    _tf_lookup_reads_shard = True  # SOK 2.x reads across ranks with all2all_dense_embedding

    def _read_keys(self, ids):
        # SOK 2.x casts int32 ids (e.g. a Python list given to tf.nn.embedding_lookup) to int64
        # keys.
        ids = tf.convert_to_tensor(ids)
        if ids.dtype == tf.int32 and self.key_dtype == tf.int64:
            ids = tf.cast(ids, tf.int64)
        return super()._read_keys(ids)

    # --- writes by key (tf.Variable's scatter_* with IndexedSlices, on rows keyed by id) --------
    def _rows_by_key(self, sparse_delta, what):
        if not isinstance(sparse_delta, tf.IndexedSlices):
            raise TypeError(
                f"DynamicVariable '{self.name}'.{what} takes tf.IndexedSlices (values, indices = "
                f"keys), got {type(sparse_delta).__name__}"
            )
        keys = tf.reshape(self._read_keys(sparse_delta.indices), [-1])
        values = tf.convert_to_tensor(sparse_delta.values, tf.float32)
        if values.shape.rank is not None and (
            values.shape.rank == 0 or values.shape[-1] not in (None, self.embedding_dim)
        ):
            raise ValueError(
                f"DynamicVariable '{self.name}'.{what}: the table has dimension "
                f"{self.embedding_dim}, but the values have shape {values.shape}"
            )
        return keys, tf.reshape(values, [-1, self.embedding_dim])

    def scatter_add(self, sparse_delta, use_locking=False, name=None):
        """rows[keys] += values; repeated keys add up, new keys start from their initial row."""
        keys, values = self._rows_by_key(sparse_delta, "scatter_add")
        unique, position = tf.unique(keys)
        summed = tf.math.unsorted_segment_sum(values, position, tf.size(unique))
        return self.assign(unique, self.sparse_read(unique, training=False) + summed)

    def scatter_sub(self, sparse_delta, use_locking=False, name=None):
        """rows[keys] -= values; repeated keys add up, new keys start from their initial row."""
        self._rows_by_key(sparse_delta, "scatter_sub")
        return self.scatter_add(
            tf.IndexedSlices(-tf.convert_to_tensor(sparse_delta.values, tf.float32),
                             sparse_delta.indices, sparse_delta.dense_shape)
        )

    def scatter_update(self, sparse_delta, use_locking=False, name=None):
        """rows[keys] = values (inserting new keys); of repeated keys the last value wins."""
        keys, values = self._rows_by_key(sparse_delta, "scatter_update")
        unique, position = tf.unique(keys)
        last = tf.math.unsorted_segment_max(
            tf.range(tf.size(keys)), position, tf.size(unique)
        )
        return self.assign(unique, tf.gather(values, last))

    def to_static(self, *args, **kwargs):
        raise NotImplementedError(
            f"DynamicVariable '{self.name}': to_static() is not supported; read the rows with "
            "var.sparse_read(ids) into a tf.Variable and write them back with "
            "var.scatter_update(tf.IndexedSlices(rows, ids))"
        )

    to_dynamic = to_static

    # tf.Variable's dense reads and writes: SOK 2.x's DynamicVariable is a tf.Variable, so a
    # program may call them; each is the error that names the table, as tf.convert_to_tensor(var)
    # gives (an AttributeError would name neither the table nor what to call).
    def value(self):
        raise TypeError(_no_dense_value(self))

    def numpy(self):
        raise TypeError(_no_dense_value(self))

    def read_value(self):
        raise TypeError(_no_dense_value(self))

    def assign_add(self, delta, use_locking=False, name=None, read_value=True):
        raise TypeError(_no_dense_write(self, "assign_add", "scatter_add"))

    def assign_sub(self, delta, use_locking=False, name=None, read_value=True):
        raise TypeError(_no_dense_write(self, "assign_sub", "scatter_sub"))

    def __repr__(self):
        return (
            f"<sok.DynamicVariable '{self.name}' shape={self.shape} dtype={self.dtype.name} "
            f"key_type={self.key_dtype.name} mode={self.mode or 'distributed'}>"
        )


def _no_dense_value(var) -> str:
    return (
        f"sok.DynamicVariable '{var.name}' is a hash table without a dense value: read rows "
        f"with var.sparse_read(ids) or tf.nn.embedding_lookup(var, ids), every row with "
        f"sok.export(var) (keys, values), the row count with var.size"
    )


def _no_dense_write(var, method, scatter) -> str:
    return (
        f"sok.DynamicVariable '{var.name}' is a hash table without a dense value: {method} "
        f"cannot apply a dense delta; update rows with var.{scatter}(tf.IndexedSlices(rows, ids))"
    )


def _refuse_conversion(value, dtype=None, name=None, as_ref=False):
    raise TypeError(_no_dense_value(value))


tf.register_tensor_conversion_function(DynamicVariable, _refuse_conversion)

_SOK2_INITIALIZERS = {"uniform": "random", "normal": tf.keras.initializers.RandomNormal(stddev=0.05)}


def _initializer(initializer):
    """SOK 2.x's initializer strings beyond those every table takes ("random", numbers)."""
    if initializer is None:
        return "random"
    if isinstance(initializer, str):
        return _SOK2_INITIALIZERS.get(initializer.strip().lower(), initializer)
    return initializer


def _capacity(value, name):
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(
            f"DynamicVariable '{name}': max_capacity must be a positive integer, got {value!r}"
        )
    return value


def _read_only_slot(slot) -> str:
    return (
        f"sok.assign: the '{slot.name}' slot of table '{slot.table.name}' is a fused optimizer's "
        "slot stored in the table's rows, read-only (sok.export reads it); it is saved and "
        "restored with its table: sok.dump / sok.load(path, tables, optimizer) or "
        "tf.train.Checkpoint"
    )


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
    if isinstance(var, RowSlot):
        raise TypeError(_read_only_slot(var))
    indices = checked_rows(var, indices, "sok.assign")
    return var.scatter_update(tf.IndexedSlices(tf.convert_to_tensor(values, var.dtype), indices))
