"""sok.dump / sok.load (NVIDIA SOK 2.x): tables written per rank, read back on any layout.

Each rank writes its own shard of every variable (keys, values and, for Embedding Variables, the
co-located optimizer slots, frequencies and versions) to `path/<variable>/rank<r>-of-<N>.npz`.
Loading reads every shard of a variable and keeps the keys this rank owns under the current
world size, so a dump from N ranks loads onto M ranks (and into one process).
"""
import glob
import os
import re

import numpy as np
import tensorflow as tf

from sparse_operation_kit.context import context
from sparse_operation_kit.embedding_variable import EmbeddingVariable


def _dir_name(var):
    name = getattr(var, "name", "table")
    name = name[:-2] if name.endswith(":0") else name
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)


def _owned(keys, target):
    world, rank = context.world_size, context.rank
    if target < 0:
        return np.mod(keys, world) == rank
    return np.full(keys.shape, target == rank)


def _require_eager(what):
    if not tf.executing_eagerly():
        raise RuntimeError(f"sok.{what} runs eagerly (TF2); in TF1 graphs use tf.compat.v1.train.Saver")


def dump(path, variables, optimizer=None):
    """Writes this rank's shard of each variable under `path` (EV slots are always included)."""
    _require_eager("dump")
    rank, world = context.rank, context.world_size
    for var in variables:
        d = os.path.join(path, _dir_name(var))
        os.makedirs(d, exist_ok=True)
        target = int(getattr(var, "target_gpu", -1))
        if isinstance(var, EmbeddingVariable):
            keys, values, slots, freqs, versions, slot_kind, slot_init = [t.numpy() for t in var.export()]
            arrays = dict(keys=keys.astype(np.int64), values=values, slots=slots, freqs=freqs,
                          versions=versions, slot_kind=slot_kind, slot_init=slot_init)
        else:
            values = var.numpy()
            local = np.arange(values.shape[0], dtype=np.int64)
            keys = local * world + rank if (target < 0 and world > 1) else local
            if world > 1 and target >= 0 and target != rank:
                keys = keys[:0]
            arrays = dict(keys=keys, values=values)
        arrays["dim"] = np.int64(values.shape[1] if values.ndim == 2 else 0)
        np.savez(os.path.join(d, f"rank{rank}-of-{world}.npz"), **arrays)
    if context.hvd is not None:
        context.hvd.allreduce(tf.constant(0), name="sok_dump_barrier")


def load(path, variables, optimizer=None):
    """Reads every shard of each variable and keeps the keys this rank owns now."""
    _require_eager("load")
    for var in variables:
        d = os.path.join(path, _dir_name(var))
        files = sorted(glob.glob(os.path.join(d, "rank*-of-*.npz")))
        if not files:
            raise FileNotFoundError(f"sok.load: no dump of '{_dir_name(var)}' under {path}")
        shards = [np.load(f) for f in files]
        dim = var.embedding_dim if isinstance(var, EmbeddingVariable) else int(var.shape[-1])
        for f, s in zip(files, shards):
            if int(s["dim"]) != dim:
                raise ValueError(f"sok.load: '{_dir_name(var)}' has dimension {dim} but {f} holds "
                                 f"dimension {int(s['dim'])}")
        keys = np.concatenate([s["keys"] for s in shards])
        values = np.concatenate([s["values"].reshape(-1, dim) for s in shards])
        target = int(getattr(var, "target_gpu", -1))
        mine = _owned(keys, target)
        if isinstance(var, EmbeddingVariable):
            slots = np.concatenate([s["slots"] for s in shards])
            num_slots = slots.shape[1] if slots.ndim == 3 else 0
            slot_kind = max(int(s["slot_kind"]) for s in shards)
            slot_init = next((s["slot_init"] for s in shards if s["slot_init"].size), np.zeros([0], np.float32))
            var._restore_from_tensors({
                "keys": tf.constant(keys[mine]), "values": tf.constant(values[mine]),
                "slots": tf.constant(slots[mine].reshape(-1, num_slots, dim)),
                "freqs": tf.constant(np.concatenate([s["freqs"] for s in shards])[mine]),
                "versions": tf.constant(np.concatenate([s["versions"] for s in shards])[mine]),
                "slot_kind": tf.constant(slot_kind, tf.int32), "slot_init": tf.constant(slot_init, tf.float32)})
        else:
            world = context.world_size
            local = keys[mine] // world if (target < 0 and world > 1) else keys[mine]
            current = var.numpy()
            if local.size and local.max() >= current.shape[0]:
                raise ValueError(f"sok.load: '{_dir_name(var)}' holds row {int(local.max())} but the local "
                                 f"shard has {current.shape[0]} rows")
            current[local] = values[mine]
            var.assign(current)
