"""What the data path needs to know about a table: its name, its placement over the ranks, and
sok.Variable's static-table type.

Placement (NVIDIA SOK 2.x's convention), written once here: target -1 (mode "distributed") keeps
key k on rank k mod N, at row k // N of a static table's local shard (floor division: negative
keys land on the same rank on every layout, as in core/common.h); target r (mode "localized:r")
keeps the whole table on rank r. In one process every table is whole, whatever its target.
"""
from __future__ import annotations

import contextlib
from typing import Any

import numpy as np
import tensorflow as tf

from sparse_operation_kit.runtime import compat
from sparse_operation_kit.runtime._ops import ops
from sparse_operation_kit.runtime.context import context
from sparse_operation_kit.tables.embedding_variable import EmbeddingVariable

SPREAD = -1  # the target of a table whose rows are spread over all ranks


def table_name(var: Any) -> str:
    """A table's name without TensorFlow's output suffix (":0"): how errors and files name it."""
    name = getattr(var, "name", None) or "table"
    return name[:-2] if name.endswith(":0") else name


def parse_mode(mode: str | None) -> int:
    """mode=None | "distributed" -> target -1 (rows over all ranks); "localized:k" -> k."""
    if mode is None or mode == "distributed":
        return SPREAD
    if isinstance(mode, str) and mode.startswith("localized:"):
        try:
            return int(mode.split(":", 1)[1])
        except ValueError:
            pass
    raise ValueError(f"unknown mode {mode!r}: expected None, 'distributed' or 'localized:<rank>'")


def mode_of(target: int) -> str:
    return "distributed" if target < 0 else f"localized:{target}"


def check_target(target: int, world: int, where: str, name: str) -> None:
    """A target must name -1 or a rank of this world."""
    if target < SPREAD or target >= world:
        raise ValueError(
            f"{where}: table '{name}' has target_gpu={target}, but there are {world} ranks (mode "
            f"'{mode_of(target)}'; valid: -1 / 'distributed' to spread the rows over all ranks, or "
            f"0..{world - 1} / 'localized:0'..'localized:{world - 1}')"
        )


def _np(x):
    return isinstance(x, (np.ndarray, np.generic, int))


def owner(keys, target, world: int):
    """Rank holding each key (numpy or tensor keys; `target` a scalar or one per key)."""
    if _np(keys):
        keys = np.asarray(keys)
        if world == 1:
            return np.zeros(keys.shape, np.int64)
        return np.where(np.asarray(target) < 0, np.mod(keys, world), target).astype(np.int64)
    keys = tf.cast(keys, tf.int64)
    if world == 1:
        return tf.zeros_like(keys)
    target = tf.broadcast_to(tf.cast(target, tf.int64), tf.shape(keys))
    return tf.where(target < 0, tf.math.floormod(keys, tf.constant(world, tf.int64)), target)


def local_row(keys, target: int, world: int):
    """Row of each key in its owner's shard of a static table."""
    if target >= 0 or world == 1:
        return keys
    if _np(keys):
        return np.floor_divide(keys, world)
    return tf.math.floordiv(keys, tf.constant(world, keys.dtype))


def global_key(rows, target: int, world: int, rank: int):
    """The key of local row `rows` of rank `rank`'s shard (the inverse of local_row)."""
    if target >= 0 or world == 1:
        return rows
    return rows * world + rank


class StaticTable(compat.ResourceVariable):
    """sok.Variable: a dense embedding table that is a tf.Variable to users (read, assign,
    checkpoint, differentiate it) and owns its placement.

    In one process it holds the whole table. Under Horovod it holds this rank's shard: target -1
    keeps rows r, r+N, r+2N, ... on rank r, target k every row on rank k and none elsewhere;
    `global_rows` is the whole table's row count.
    """

    def __init__(self, *, target: int = SPREAD, world_size: int = 1, global_rows: int | None = None,
                 **variable_kwargs):
        super().__init__(**variable_kwargs)
        self._target = int(target)
        self._world_size = int(world_size)
        self._global_rows = int(self.shape[0]) if global_rows is None else int(global_rows)

    @property
    def target_gpu(self) -> int:
        return self._target

    @property
    def mode(self) -> str:
        return mode_of(self._target)

    @property
    def world_size(self) -> int:
        return self._world_size

    @property
    def global_rows(self) -> int:
        return self._global_rows

    def sparse_read(self, indices, name=None):
        return super().sparse_read(checked_rows(self, indices, "sparse_read"), name=name)

    def owner(self, keys):
        return owner(keys, self._target, self._world_size)

    def local_row(self, keys):
        return local_row(keys, self._target, self._world_size)

    def global_key(self, rows, rank: int):
        return global_key(rows, self._target, self._world_size, rank)


def checked_rows(var, ids, what: str, name: str | None = None):
    """`ids` once each is a row of the dense table `var` (this rank's shard): SokCheckRowIds, on
    the table's device, raises an InvalidArgumentError naming the table and the first id
    outside its rows; TensorFlow's GPU gather would read zeros for it, its GPU scatter skip it."""
    ids = tf.convert_to_tensor(ids)
    rows = var.shape[0]
    # On the table's device, where its gather or scatter runs (a Keras 3 Variable names none).
    device = getattr(var, "device", "")
    with tf.device(device) if device else contextlib.nullcontext():
        num_rows = (tf.constant(rows, tf.int64) if rows is not None
                    else tf.shape(var, out_type=tf.int64)[0])
        return ops.sok_check_row_ids(ids, num_rows, table_name=name or table_name(var),
                                     what=what)


def target_of(param) -> int:
    """The placement target of any table lookup_sparse takes (a plain tf.Variable: spread)."""
    if isinstance(param, (EmbeddingVariable, StaticTable)):
        return int(param.target_gpu)
    return SPREAD


def global_rows(param) -> int | None:
    """Rows of a static table over all ranks (None for an Embedding Variable)."""
    if isinstance(param, EmbeddingVariable):
        return None
    if isinstance(param, StaticTable):
        return param.global_rows
    return int(param.shape[0])


def dim_of(param) -> int:
    return param.embedding_dim if isinstance(param, EmbeddingVariable) else int(param.shape[-1])


def is_sok_table(v) -> bool:
    """Embedding Variables and sok.Variable tables (model-parallel: never all-reduced)."""
    return isinstance(v, (EmbeddingVariable, StaticTable))


def static_table(args, kwargs, mode: str | None) -> StaticTable:
    """sok.Variable(*args, mode=..., **kwargs): tf.Variable's arguments, the whole table's initial
    value on every rank; this rank keeps its shard."""
    target = parse_mode(mode)
    rank, world = context.rank, context.world_size
    kwargs = _variable_kwargs(args, kwargs)
    if kwargs.get("name") is None:
        kwargs["name"] = default_name("sok_static_Variable")
    if world == 1:
        return StaticTable(target=target, world_size=1, **kwargs)
    check_target(target, world, "sok.Variable", kwargs.get("name") or "Variable")
    init = kwargs.pop("initial_value")
    shape = kwargs.pop("shape", None)  # the whole table's: the shard's own shape differs
    if callable(init):
        try:
            value = init()
        except TypeError:
            if shape is None:
                raise
            value = init(shape=shape, dtype=kwargs.get("dtype") or tf.float32)
    else:
        value = init
    value = tf.convert_to_tensor(value, dtype=kwargs.get("dtype"))
    if shape is not None and not tf.TensorShape(shape).is_compatible_with(value.shape):
        raise ValueError(
            f"sok.Variable: shape {shape} but the initial value has shape {value.shape}"
        )
    rows = int(value.shape[0])
    if target < 0:
        local = value[rank::world]
    elif target == rank:
        local = value
    else:
        local = value[:0]
    return StaticTable(
        target=target, world_size=world, global_rows=rows, initial_value=local, **kwargs
    )


_VARIABLE_ARGS = ("initial_value", "trainable", "validate_shape", "caching_device", "name",
                  "variable_def", "dtype", "import_scope", "constraint", "synchronization",
                  "aggregation", "shape", "experimental_enable_variable_lifting")


_default_names = {}


def default_name(prefix: str) -> str:
    """SOK 2.x's name for an unnamed table: prefix_0, prefix_1, ... in creation order, so each
    table keeps its own files in sok.dump (eager tf.Variables would all be 'Variable') and every
    rank, creating its tables in the same order, names them alike."""
    n = _default_names.get(prefix, 0)
    _default_names[prefix] = n + 1
    return f"{prefix}_{n}"


def _variable_kwargs(args, kwargs):
    """tf.Variable's positional arguments by name (ResourceVariable orders them differently)."""
    if len(args) > len(_VARIABLE_ARGS):
        raise TypeError(f"sok.Variable takes at most {len(_VARIABLE_ARGS)} positional arguments")
    named = dict(zip(_VARIABLE_ARGS, args))
    twice = sorted(set(named) & set(kwargs))
    if twice:
        raise TypeError(f"sok.Variable got multiple values for {twice}")
    return {**named, **kwargs}
