"""NVIDIA SOK 2.x's incremental dump: the rows of Embedding Variables (sok.DynamicVariable)
updated since a point of training, and loading such increments onto a table.

The clock is the optimizer step. Every optimizer update of a row records in the row's `versions`
field the step it ran at: the step of the sok.OptimizerWrapper (or sok.SGD) before the call, its
own counter of its calls (0, 1, 2, ...; optimizers/wrapper_step.py), apart from the wrapped
optimizer's `iterations`.
`sok.update_step(optimizer)` is the number the next update will record, so

    since = sok.update_step(optimizer)      # or datetime.now(pytz.utc), as in SOK 2.x
    ... train ...
    keys, values = sok.incremental_model_dump(tables, since)

gives exactly the rows those steps updated. Rows that were only read (inserted) or written with
sok.assign / scatter_* keep the step of their last optimizer update (0 for never-updated rows),
so `since=0` gives every row.

SOK 2.x's form, `since` a datetime, maps the time to a step: every optimizer keeps a StepClock
(optimizers/step_clock.py), the wall-clock time at which each of its last CLOCK_STEPS steps read
its step number, and the dump takes the first step that ran at or after `since`. A naive
datetime is local time, as Python's datetime.timestamp() takes it.
"""
import datetime
import os
from collections.abc import Iterable

import numpy as np
import tensorflow as tf

from sparse_operation_kit.checkpoint.dump import (  # one shard format: sok.dump's
    _barrier,
    _dir_name,
    _ev_slots,
    _owned,
    _read_shard,
    _require_eager,
    _shard_files,
)
from sparse_operation_kit.optimizers.step_clock import CLOCK_STEPS, MIXED, clock_of
from sparse_operation_kit.runtime.context import context
from sparse_operation_kit.runtime.schema import EXPORT_FIELDS, ROW_FIELDS
from sparse_operation_kit.tables import tables, validation
from sparse_operation_kit.tables.embedding_variable import EmbeddingVariable, host_snapshot


def update_step(optimizer):
    """The step number the next update by `optimizer` (a sok.OptimizerWrapper, its Keras form,
    or sok.SGD) records in the rows it updates: an int (eager) or an int64 tensor (graphs)."""
    # The wrapper's own counter (optimizers/wrapper_step.py), never the wrapped optimizer's.
    step = getattr(optimizer, "sok_optimizer_step", None)  # fused path, sok.SGD
    if step is None:  # generic path
        step = getattr(getattr(optimizer, "sok_slots", None), "step", None)
    if step is None and hasattr(optimizer, "_sok_updater"):
        step = optimizer.iterations  # the Keras form of the wrapper: its own `iterations`
    if step is None:  # no update yet: the first one records step 0
        return 0 if tf.executing_eagerly() else tf.constant(0, tf.int64)
    value = tf.cast(tf.convert_to_tensor(step), tf.int64)
    return int(value.numpy()) if tf.executing_eagerly() else value


def _since_seconds(since):
    """`since` as POSIX seconds (a datetime), or None (an optimizer step); refuses other types."""
    if isinstance(since, datetime.datetime):
        return since.timestamp()  # naive: local time, as Python takes it
    if isinstance(since, (bool, np.bool_)) or not isinstance(since, (int, np.integer)):
        raise TypeError(
            "sok.incremental_model_dump: `since` is an optimizer step (an int, e.g. "
            "sok.update_step(optimizer) read before the steps) or a datetime (e.g. "
            f"datetime.now(pytz.utc)), got {type(since).__name__} {since!r}"
        )
    return None


def _first_step_since(steps, times, seconds, name):
    """The first step of a clock's (steps, times) that ran at or after `seconds`; None for an
    empty clock."""
    later = times >= seconds
    if not later.any():
        return int(steps[-1]) + 1 if steps.size else None
    first = int(steps[later].min())
    if first > 0 and not (~later).any():  # steps before `first` ran, but when is unknown
        raise ValueError(
            f"sok.incremental_model_dump: `since` predates the wall-clock history of the updates "
            f"of '{name}', which starts at step {first} (the clock keeps the last {CLOCK_STEPS} "
            "steps of this process and is not checkpointed); pass the step form (an int)"
        )
    return first


def _step_at(var, seconds, sess):
    """The first step of `var`'s optimizer that ran at or after `seconds` (read after the table:
    a step the snapshot saw is on the clock)."""
    name = tables.table_name(var)
    clock = clock_of(var)
    if clock is MIXED:
        raise ValueError(
            f"sok.incremental_model_dump: '{name}' was updated by optimizers with different step "
            "counters, so a time maps to no one step; pass the step form (an int)"
        )
    first = None if clock is None else _first_step_since(*clock.entries(sess), seconds, name)
    if first is None:
        raise ValueError(
            f"sok.incremental_model_dump: no optimizer update of '{name}' ran in this process, so "
            "no step maps to a time; pass the step form (an int)"
        )
    return first


def _tables(variables, what):
    variables = list(variables) if isinstance(variables, Iterable) else [variables]
    for var in variables:
        if not isinstance(var, EmbeddingVariable):
            raise TypeError(
                f"sok.{what}: '{getattr(var, 'name', var)}' is a {type(var).__name__}, which records "
                "no update steps; increments hold sok.DynamicVariable / Embedding Variable rows "
                "(save static tables with sok.dump)"
            )
    return variables


def _gather_ranks(arrays):
    """Every rank's arrays concatenated in rank order (one process: as they are)."""
    if context.hvd is None or context.world_size == 1:
        return arrays
    if not tf.executing_eagerly():
        raise RuntimeError("sok.incremental_model_dump under Horovod runs eagerly (TF2)")
    return np.concatenate(context.hvd.allgather_object(arrays), axis=0)


def incremental_model_dump(variables, since, sess=None, path=None):
    """(keys, values): for each variable, numpy arrays of the keys whose rows an optimizer update
    changed at step `since` or later (an int), or at or after the time `since` (a datetime, SOK
    2.x's form; naive: local time), and those rows (under Horovod: of every rank).

    sess: the tf.compat.v1.Session to read the tables in (TF1 graphs). path: also write this
    rank's part of the increment (rows with their optimizer slots, frequencies and steps) under
    `path`, in sok.dump's layout; sok.incremental_model_load applies it onto a table.
    """
    seconds = _since_seconds(since)
    variables = _tables(variables, "incremental_model_dump")
    if tf.executing_eagerly():
        snapshots = [{f: np.asarray(t) for f, t in v.snapshot().items()} for v in variables]
    elif sess is None:
        raise ValueError("sok.incremental_model_dump in a TF1 graph: pass the session (sess=...)")
    else:
        snapshots = sess.run([v.snapshot() for v in variables])
    if seconds is None:
        firsts = [int(since)] * len(variables)
    else:
        firsts = [_step_at(v, seconds, sess) for v in variables]
    increments = []
    for snap, first in zip(snapshots, firsts):
        changed = snap["versions"] >= first
        increments.append({f: snap[f][changed] if f in ROW_FIELDS else snap[f] for f in EXPORT_FIELDS})
    if path is not None:
        _write(path, variables, increments, firsts)
    keys = [_gather_ranks(inc["keys"].astype(np.int64)) for inc in increments]
    values = [_gather_ranks(inc["values"]) for inc in increments]
    return keys, values


def _write(path, variables, increments, firsts):
    names = [_dir_name(tables.table_name(v)) for v in variables]
    _require_eager("incremental_model_dump(path=...)", names)
    rank, world = context.rank, context.world_size
    _barrier("sok_incremental_dump_start")
    for var, name, inc, since in zip(variables, names, increments, firsts):
        d = os.path.join(path, name)
        os.makedirs(d, exist_ok=True)
        arrays = dict(inc, keys=inc["keys"].astype(np.int64), dim=np.int64(var.embedding_dim),
                      since_step=np.int64(since))
        np.savez(os.path.join(d, f"rank{rank}-of-{world}.npz"), **arrays)
    _barrier("sok_incremental_dump_end")


def incremental_model_load(path, variables):
    """Applies the increment (or full sok.dump) under `path` onto each variable: its rows replace
    the rows of the same keys, with their slots, frequencies and steps; other rows stay. Under
    Horovod every rank keeps the keys it owns. Runs eagerly (TF2)."""
    variables = _tables(variables, "incremental_model_load")
    names = [_dir_name(tables.table_name(v)) for v in variables]
    _require_eager("incremental_model_load", names)
    for var, name in zip(variables, names):
        files = _shard_files(path, name)
        shards = [_read_shard(f, name, "sok.incremental_model_load") for f in files]
        for f, s in zip(files, shards):
            if int(s["dim"]) != var.embedding_dim:
                raise ValueError(
                    f"sok.incremental_model_load: '{name}' has dimension {var.embedding_dim} but "
                    f"{f} holds dimension {int(s['dim'])}"
                )
        current = {f: np.asarray(t) for f, t in var.snapshot().items()}
        current["keys"] = current["keys"].astype(np.int64)
        mine = [_owned(s["keys"], var.target_gpu, name) for s in shards]
        shards = [{f: s[f][m] if f in ROW_FIELDS else s[f] for f in EXPORT_FIELDS}
                  for s, m in zip(shards, mine)]
        validation.check_key_dtype_fits(
            np.concatenate([s["keys"] for s in shards]), var.key_dtype, name,
            f"sok.incremental_model_load from {path}")
        var.import_snapshot(_upsert(current, shards, var.embedding_dim, name))


def _upsert(current, shards, dim, name):
    """The table's rows with the increment's rows in place of those of the same keys (a later
    shard's row wins)."""
    parts = [current] + shards
    slots, slot_kind, slot_init = _ev_slots(parts, dim, name)
    keys = np.concatenate([p["keys"] for p in parts])
    # The last row of each key: unique over the reversed order finds last occurrences.
    _, last_reversed = np.unique(keys[::-1], return_index=True)
    pick = np.sort(keys.size - 1 - last_reversed)
    merged = {
        "keys": keys[pick],
        "values": np.concatenate([p["values"].reshape(-1, dim) for p in parts])[pick],
        "slots": slots[pick],
        "freqs": np.concatenate([p["freqs"] for p in parts])[pick],
        "versions": np.concatenate([p["versions"] for p in parts])[pick],
        "slot_kind": np.int32(slot_kind),
        "slot_init": np.asarray(slot_init, np.float32),
    }
    return host_snapshot(merged)
