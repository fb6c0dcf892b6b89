"""A table's rows in a Keras weights store (`.keras` files, `save_weights`): entry
"<prefix>_<field>" for each field of schema.EXPORT_FIELDS (keys, values, optimizer slots,
frequencies and last-update steps) and "<prefix>_shard", the [rank, world] that saved them.
sok.Embedding / sok.SparseEmbedding keep their tables this way, sok.OptimizerWrapper the slot
stores of its generic path.

Under Horovod a rank holds its shard of each table, so an entry loads onto the rank of the world
that saved it only; a one-process file loads anywhere, each rank keeping the rows it owns.
"""
import numpy as np

from sparse_operation_kit.runtime.context import context
from sparse_operation_kit.runtime.schema import EXPORT_FIELDS, ROW_FIELDS
from sparse_operation_kit.tables.embedding_variable import host_snapshot, is_embedding_variable
from sparse_operation_kit.tables.tables import owner, target_of


def entry_keys(prefix):
    """The store keys that `save_rows(store, prefix, ...)` writes."""
    return [f"{prefix}_{f}" for f in EXPORT_FIELDS] + [f"{prefix}_shard"]


def mark_shard(store, prefix):
    store[f"{prefix}_shard"] = np.array([context.rank, context.world_size], np.int64)


def save_rows(store, prefix, table):
    """Every row of Embedding Variable `table`."""
    for field, value in table.snapshot().items():
        store[f"{prefix}_{field}"] = np.asarray(value)  # a view, no copy
    mark_shard(store, prefix)


def owned_part(store, keys, prefix, table, fields, where, target=None):
    """This rank's part of the row-aligned arrays `fields` under `prefix` (`keys`: the store's;
    `where`: who loads, for errors; `target`: the placement that decides the owner of a row,
    `table`'s by default)."""
    rank, world = context.rank, context.world_size
    marker = f"{prefix}_shard"  # absent from one-process files of older versions
    saved = np.asarray(store[marker]) if marker in keys else (0, 1)
    saved_rank, saved_world = (int(x) for x in saved)
    if saved_world > 1 and (saved_rank, saved_world) != (rank, world):
        raise ValueError(
            f"{where}: the weights file holds rank {saved_rank}'s shard of table "
            f"'{table.name}' (of {saved_world} ranks) and loads onto that rank of "
            f"{saved_world} only, not rank {rank} of {world}; to move a table between "
            "world sizes save it with sok.dump on every rank and sok.load it"
        )
    arrays = [np.asarray(store[f"{prefix}_{f}"]) for f in fields]
    if saved_world > 1 or world == 1:
        return arrays
    ids = arrays[0] if is_embedding_variable(table) else np.arange(len(arrays[0]))
    mine = owner(ids, target_of(table) if target is None else target, world) == rank
    return [a[mine] for a in arrays]


def load_rows(store, keys, prefix, table, where, target=None):
    """Replaces the rows of Embedding Variable `table` with those `save_rows` wrote under
    `prefix` (this rank's part, see owned_part)."""
    missing = [f for f in EXPORT_FIELDS if f"{prefix}_{f}" not in keys]
    if missing:
        raise ValueError(
            f"{where}: the weights file has no rows of table '{table.name}' (missing {missing})"
        )
    rows = dict(zip(ROW_FIELDS, owned_part(store, keys, prefix, table, ROW_FIELDS, where, target)))
    table.import_snapshot(host_snapshot({
        f: rows[f] if f in rows else np.asarray(store[f"{prefix}_{f}"]) for f in EXPORT_FIELDS}))
