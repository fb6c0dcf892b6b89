"""sok.dump / sok.load (NVIDIA SOK 2.x): tables written per rank, read back on any layout.

Each rank writes its own shard of every variable (keys, values and, for Embedding Variables, the
co-located optimizer slots, frequencies and versions) to `path/<variable>/rank<r>-of-<N>.npz`.
Loading reads every shard of a variable and keeps the keys this rank owns under the current
world size, so a dump from N ranks loads onto M ranks (and into one process).
"""
import glob
import os
import re
from collections.abc import Iterable

import numpy as np
import tensorflow as tf

from sparse_operation_kit.checkpoint.shard_file import ShardFile
from sparse_operation_kit.optimizers import generic_optimizer
from sparse_operation_kit.runtime import compat, schema
from sparse_operation_kit.runtime.context import context
from sparse_operation_kit.tables import tables, validation
from sparse_operation_kit.tables.embedding_variable import EmbeddingVariable, host_snapshot


def _dir_name(name):
    """The directory of a table (or slot) under a dump's path."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)


def _owned(keys, target, name):
    """Which of `keys` this rank holds under the current world size."""
    world, rank = context.world_size, context.rank
    if world > 1:
        tables.check_target(target, world, "sok.load", name)
    return tables.owner(keys, target, world) == rank


# A table can be larger than half the host's memory: a load keeps one copy of each array where it
# can (one shard is not concatenated, rows all owned are not indexed).
def _joined(parts):
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


def _picked(array, mine):
    return array if mine is None else array[mine]


_SHARD = re.compile(r"rank(\d+)-of-(\d+)\.npz$")


def _shard_files(path, name):
    """The shard files of one complete dump of the variable `name` (all ranks of one world size)."""
    d = os.path.join(path, name)
    found = {}
    for f in glob.glob(os.path.join(d, "rank*-of-*.npz")):
        m = _SHARD.search(os.path.basename(f))
        if m:
            found.setdefault(int(m.group(2)), {})[int(m.group(1))] = f
    if not found:
        raise FileNotFoundError(f"sok.load: no dump of '{name}' under {path}")
    if len(found) > 1:
        raise ValueError(f"sok.load: {d} holds dumps from several world sizes ({sorted(found)}); "
                         "keep the files of one dump only")
    world, files = next(iter(found.items()))
    missing = sorted(set(range(world)) - set(files))
    if missing:
        raise FileNotFoundError(
            f"sok.load: the dump of '{name}' under {path} was written by {world} ranks "
            f"but the files of ranks {missing} are missing"
        )
    return [files[r] for r in range(world)]


_REQUIRED = ("keys", "values", "dim")

# The rows and slots one import takes when sok.load restores a table a chunk at a time: what a
# load holds in memory beside the table.
LOAD_CHUNK_BYTES = 64 << 20


def _open_shard(f, name, what="sok.load"):
    """One shard's file, its fields read on demand; a truncated or corrupt file, or one that is
    not a sok.dump shard, is an error naming it."""
    shard = ShardFile(f, name, what)
    missing = [k for k in _REQUIRED if k not in shard.fields()]
    if missing:
        raise ValueError(
            f"{what}: the shard {f} of '{name}' lacks {missing} (not a sok.dump shard, or "
            "corrupt)"
        )
    return shard


def _read_shard(f, name, what="sok.load"):
    """One shard's arrays, whole."""
    shard = _open_shard(f, name, what)
    return {k: shard.read(k) for k in shard.fields()}


def _slot_layout(metas, name):
    """(slot_kind, slot_init, num_slots) of a table's shards from each shard's (slots shape,
    slot_kind, slot_init): shards of ranks that never applied an update have no slots."""
    kinds = {int(kind) for shape, kind, _ in metas if len(shape) == 3 and shape[1]}
    if len(kinds) > 1:
        names = sorted(schema.optimizer_of_slot_kind(k) for k in kinds)
        raise ValueError(
            f"sok.load: the shards of '{name}' hold slots of different optimizers {names}"
        )
    slot_kind = kinds.pop() if kinds else schema.NO_SLOTS
    slot_init = next(
        (np.asarray(init) for _, kind, init in metas
         if np.asarray(init).size and int(kind) == slot_kind),
        np.zeros([0], np.float32),
    ).astype(np.float32)
    return slot_kind, slot_init, slot_init.size if slot_kind >= 0 else 0


def _has_slots(shape, rows, layout):
    """Whether a shard of `rows` rows holds slots of the table's layout (else its rows get the
    slots' initial values)."""
    return len(shape) == 3 and shape[0] == rows and shape[1] == layout[2]


def _initial_slots(rows, layout, dim):
    return np.broadcast_to(layout[1][None, :, None], (rows, layout[2], dim))


def _ev_slots(shards, dim, name):
    """Slots of every shard (dicts of arrays) as one [rows, num_slots, dim] array."""
    layout = _slot_layout([(s["slots"].shape, s["slot_kind"], s["slot_init"]) for s in shards], name)
    parts = []
    for s in shards:
        rows, raw = s["keys"].shape[0], s["slots"]
        own = _has_slots(raw.shape, rows, layout)
        parts.append(raw.astype(np.float32, copy=False) if own else _initial_slots(rows, layout, dim))
    return _joined(parts), layout[0], layout[1]


def _require_eager(what, names):
    if not tf.executing_eagerly():
        raise RuntimeError(
            f"sok.{what} runs eagerly (TF2); in TF1 graphs use tf.compat.v1.train.Saver"
        )
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(
            f"sok.{what}: several variables are named {twice}; each variable is stored under "
            "its name, so give them distinct names (name=...)"
        )


def _plain_slots(variables, optimizer, create):
    """[(slot, primary, slot name)] of the program's own optimizer (not a sok.OptimizerWrapper) for
    static tables and other tf.Variables: SOK 2.x programs train those with a plain optimizer."""
    flavor = generic_optimizer.optimizer_flavor(optimizer)
    if flavor is None:
        raise TypeError(
            "sok.dump/load: optimizer must be a tf.compat.v1.train, Keras or tf_keras (legacy) "
            f"optimizer or a sok.OptimizerWrapper, got {type(optimizer).__name__}"
        )
    dynamic = [tables.table_name(v) for v in variables if isinstance(v, EmbeddingVariable)]
    if dynamic:
        # Only the wrapper knows a dynamic table's slots (the optimizer never sees its rows).
        raise TypeError(
            f"sok.dump/load: the dynamic tables {dynamic} are trained through sok.OptimizerWrapper; "
            f"pass that wrapper, not the {type(optimizer).__name__} it wraps, to dump or load "
            "their optimizer slots"
        )
    if create and flavor in ("v1", "keras_legacy"):
        (compat.v1_create_slots if flavor == "v1" else compat.keras_legacy_create_slots)(
            optimizer, variables
        )
    elif create and variables and not generic_optimizer.optimizer_built(optimizer):
        # A Keras optimizer creates every slot in build; slots loaded before would be lost.
        raise ValueError(
            f"sok.load: the {type(optimizer).__name__} is not built yet, so its slots do not "
            "exist; call optimizer.build(<every variable it trains>) before loading its slots"
        )
    out = []
    for var in variables:
        try:
            found = generic_optimizer.optimizer_slots(optimizer, flavor, var)
        except KeyError:  # a legacy optimizer's get_slot of a variable it never updated
            found = {}
        # tf_keras names a slot built inside apply_gradients "<optimizer>/<slot>" and one built
        # by build() "<slot>": the dump keeps the slot's own name so either loads the other.
        out.extend((slot, var, name.rsplit("/", 1)[-1]) for name, slot in sorted(found.items()))
    return out


def _with_slots(variables, optimizer, create):
    """[(variable, target, directory name)]: the variables, then the optimizer's slots of them
    ("<variable>/<slot>", placed like their variable). Slots stored in an Embedding Variable's
    rows are part of its shard anyway."""
    entries = [(v, tables.target_of(v), _dir_name(tables.table_name(v))) for v in variables]
    if optimizer is None:
        return entries
    if hasattr(optimizer, "sok_slot_variables"):
        found = optimizer.sok_slot_variables(variables, create=create)
    else:
        found = _plain_slots(variables, optimizer, create)
    for slot, var, slot_name in found:
        name = _dir_name(f"{tables.table_name(var)}/{slot_name}")
        entries.append((slot, tables.target_of(var), name))
    return entries


def _slot_names(variables, optimizer):
    """The slot names a dump of `variables` by `optimizer` can hold."""
    if hasattr(optimizer, "sok_slot_names"):
        return set(optimizer.sok_slot_names())
    return {n.rsplit("/", 1)[-1] for _, _, n in _plain_slots(variables, optimizer, False)}


def _optimizer_name(optimizer):
    if hasattr(optimizer, "sok_slot_variables"):  # a wrapper: the optimizer that owns the slots
        return type(optimizer.optimizer).__name__
    return type(optimizer).__name__


def _check_no_slot_left(path, variables, optimizer, entries):
    """An optimizer (or wrapper) loads the slots it has; a dumped slot it lacks for a variable (a
    Keras optimizer built without that variable) is an error, not skipped: the variable would
    resume with the slots it has now."""
    loaded = {n for _, _, n in entries}
    names = _slot_names(variables, optimizer)
    for var in variables:
        table = tables.table_name(var)
        for slot in sorted(names):
            d = _dir_name(f"{table}/{slot}")
            if d not in loaded and os.path.isdir(os.path.join(path, d)):
                raise ValueError(
                    f"sok.load: {path} holds the '{slot}' slot of '{table}' but the "
                    f"{_optimizer_name(optimizer)} has none for it: build the optimizer with that "
                    "variable before loading"
                )


def dump(path: str, variables: Iterable, optimizer=None) -> None:
    """Writes this rank's shard of each variable under `path`; with `optimizer` also the
    optimizer's slots of them (each under its own name, e.g. "<table>/<slot>", sharded as its
    table). `optimizer` is a sok.OptimizerWrapper or, for static tables (sok.Variable) and other
    tf.Variables, the program's own optimizer (tf.compat.v1.train, Keras 3, tf_keras or its
    legacy optimizers), as in SOK 2.x. Slots stored in an Embedding Variable's rows are always
    included."""
    _require_eager("dump", [])
    entries = _with_slots(list(variables), optimizer, create=False)
    _require_eager("dump", [n for _, _, n in entries])
    rank, world = context.rank, context.world_size
    _barrier("sok_dump_start")  # no rank may still be reading a dump that rank 0 now replaces
    for var, target, name in entries:
        d = os.path.join(path, name)
        os.makedirs(d, exist_ok=True)
        if rank == 0:  # shards of an earlier dump with another world size would mix in at load
            for f in glob.glob(os.path.join(d, "rank*-of-*.npz")):
                m = _SHARD.search(os.path.basename(f))
                if m and int(m.group(2)) != world:
                    os.remove(f)
        if isinstance(var, EmbeddingVariable):
            # np.asarray views the snapshot's host tensors; .numpy() would copy each.
            arrays = {f: np.asarray(t) for f, t in var.snapshot().items()}
            arrays["keys"] = arrays["keys"].astype(np.int64, copy=False)
            values = arrays["values"]
        else:
            values = var.numpy()
            keys = tables.global_key(
                np.arange(values.shape[0], dtype=np.int64), target, world, rank
            )
            if world > 1 and target >= 0 and target != rank:
                keys = keys[:0]
            arrays = dict(keys=keys, values=values)
        arrays["dim"] = np.int64(values.shape[1] if values.ndim == 2 else 0)
        np.savez(os.path.join(d, f"rank{rank}-of-{world}.npz"), **arrays)
    _barrier("sok_dump_end")  # every shard is written when dump returns on any rank


def _barrier(name):
    if context.hvd is not None and context.world_size > 1:
        context.hvd.allreduce(tf.constant(0), name=name)


def load(path: str, variables: Iterable, optimizer=None) -> None:
    """Reads every shard of each variable and keeps the keys this rank owns now; with `optimizer`
    also its slots of them (created first where they do not exist yet)."""
    _require_eager("load", [])
    variables = list(variables)
    entries = _with_slots(variables, optimizer, create=True)
    _require_eager("load", [n for _, _, n in entries])
    if optimizer is not None:
        _check_no_slot_left(path, variables, optimizer, entries)
    for var, target, name in entries:
        files = _shard_files(path, name)
        shards = [_open_shard(f, name) for f in files]
        dim = var.embedding_dim if isinstance(var, EmbeddingVariable) else int(var.shape[-1])
        for f, s in zip(files, shards):
            if int(s.read("dim")) != dim:
                raise ValueError(f"sok.load: '{name}' has dimension {dim} but {f} holds "
                                 f"dimension {int(s.read('dim'))}")
        keys = _joined([s.read("keys") for s in shards])
        mine = _owned(keys, target, name)
        if isinstance(var, EmbeddingVariable):
            _load_ev(var, shards, keys, None if mine.all() else mine, dim, name, path)
        else:
            values = _joined([s.read("values").reshape(-1, dim) for s in shards])
            local = tables.local_row(keys[mine], target, context.world_size)
            current = var.numpy()
            if local.size and local.max() >= current.shape[0]:
                raise ValueError(
                    f"sok.load: '{name}' holds row {int(local.max())} but the local "
                    f"shard has {current.shape[0]} rows"
                )
            current[local] = values[mine]
            var.assign(current)


def _check_rows(shards, keys, name):
    """Every row field of each shard has a row per key, and no key repeats: checked before the
    first chunk replaces the table, so a bad dump leaves the table as it was."""
    for s in shards:
        n = s.shape("keys")[0]
        for field in ("values", "freqs", "versions"):
            if not s.shape(field) or s.shape(field)[0] != n:
                raise ValueError(f"sok.load: the shard {s.path} of '{name}' has {n} keys but "
                                 f"{field} of shape {s.shape(field)}")
    ordered = np.sort(keys)
    repeated = ordered[1:][ordered[1:] == ordered[:-1]]
    if repeated.size:
        raise ValueError(f"sok.load: key {int(repeated[0])} appears twice in the dump of '{name}'")


def _load_ev(var, shards, keys, mine, dim, name, path):
    """Imports the rows `mine` (None: all) of an Embedding Variable's shards a chunk of
    LOAD_CHUNK_BYTES at a time, so a load holds little more than the table."""
    # int64 keys of the dump must fit an int32 table (a cast would fold keys onto others).
    picked = _picked(keys, mine)
    validation.check_key_dtype_fits(picked, var.key_dtype, name, f"sok.load from {path}")
    _check_rows(shards, picked, name)
    total = int(picked.size)
    del picked
    layout = _slot_layout(
        [(s.shape("slots"), s.read("slot_kind"), s.read("slot_init")) for s in shards], name
    )
    for i, chunk in enumerate(_chunks(shards, keys, mine, dim, layout)):
        chunk["slot_kind"] = np.int32(layout[0])
        chunk["slot_init"] = np.asarray(layout[1], np.float32)
        var.import_snapshot(host_snapshot(chunk), append=i > 0, reserve_rows=0 if i else total)


def _chunks(shards, keys, mine, dim, layout):
    """The picked rows of every shard as {field: array} chunks of LOAD_CHUNK_BYTES; at least
    one, so that an import of no rows still replaces the table's."""
    step = max(1, LOAD_CHUNK_BYTES // (4 * dim * (1 + layout[2])))
    start, given = 0, False
    for s in shards:
        n = s.shape("keys")[0]
        own = _has_slots(s.shape("slots"), n, layout)
        for a in range(0, n, step):
            b = min(n, a + step)
            m = None if mine is None else mine[start + a:start + b]
            if m is not None and not m.any() and given:
                continue
            slots = s.rows("slots", a, b) if own else _initial_slots(b - a, layout, dim)
            given = True
            yield {
                "keys": _picked(keys[start + a:start + b], m),
                "values": _picked(s.rows("values", a, b).reshape(-1, dim), m),
                "slots": _picked(slots, m),
                "freqs": _picked(s.rows("freqs", a, b), m),
                "versions": _picked(s.rows("versions", a, b), m),
            }
        start += n
    if not given:
        yield {
            "keys": keys[:0],
            "values": np.zeros([0, dim], np.float32),
            "slots": np.zeros([0, layout[2], dim], np.float32),
            "freqs": np.zeros([0], np.int64),
            "versions": np.zeros([0], np.int64),
        }
