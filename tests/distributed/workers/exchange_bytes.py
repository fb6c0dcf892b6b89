"""Bytes that lookup_sparse's exchange moves between ranks per training step, for a Criteo-like
batch, against an all-gather of all keys (every rank receiving every other rank's keys and rows).

The model follows the wire format of sparse_operation_kit/parallel/distributed.py: per
lookup_sparse call and rank, one header row [signature, n, bad-id flag] (3 x int64) to every other
rank, then for each distinct key of each table that another rank owns: the request [key, table,
count] (3 x int64) and the row back (dim x float32); the backward pass sends that row's gradient
(dim x float32) to the owner. Traffic of a rank with itself is not counted.

The all-gather design it is compared with: every rank sends its distinct keys (int64) to every
other rank, receives every other rank's rows (dim x float32 each) and, backward, every other
rank's gradients (dim x float32 each).

    python exchange_bytes.py            prints the table for 2, 4 and 8 ranks
"""
import os
import sys

import numpy as np

KEY, FLOAT = 8, 4


def _owner(keys, target, world):
    return np.mod(keys, world) if target < 0 else np.full(keys.shape, target)


def exchange_bytes(keys, dims, targets=None):
    """keys[r][t]: ids of table t looked up on rank r (repeats allowed). Returns a dict of the
    bytes per step over all ranks: alltoall (forward keys, forward rows, backward gradients,
    headers, total) and allgather (keys, rows, gradients, total)."""
    world = len(keys)
    targets = targets or [-1] * len(dims)
    # The size matrix: per destination, a count per table plus [signature, bad-id flag].
    out = dict(requests=0, rows=0, grads=0,
               headers=(len(dims) + 2) * KEY * world * (world - 1),
               ag_keys=0, ag_rows=0, ag_grads=0)
    for r in range(world):
        for t, dim in enumerate(dims):
            distinct = np.unique(np.asarray(keys[r][t], np.int64))
            remote = int(np.sum(_owner(distinct, targets[t], world) != r))
            out["requests"] += remote * 2 * KEY  # [key, count]
            out["rows"] += remote * dim * FLOAT
            out["grads"] += remote * dim * FLOAT
            out["ag_keys"] += (world - 1) * distinct.size * KEY
            out["ag_rows"] += (world - 1) * distinct.size * dim * FLOAT
            out["ag_grads"] += (world - 1) * distinct.size * dim * FLOAT
    out["alltoall"] = out["requests"] + out["rows"] + out["grads"] + out["headers"]
    out["allgather"] = out["ag_keys"] + out["ag_rows"] + out["ag_grads"]
    return out


def criteo_keys(world, global_batch, seed=0):
    """keys[r][field] of a synthetic Criteo global batch split evenly over `world` ranks."""
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, os.path.join(here, "..", "..", "..", "benchmarks", "criteo"))
    try:
        import data
    finally:
        sys.path.pop(0)
    ids = data.SyntheticCriteo(seed).batch(0, 0, global_batch).ids
    per = global_batch // world
    return [[ids[r * per:(r + 1) * per, f] for f in range(ids.shape[1])] for r in range(world)]


def table(worlds=(2, 4, 8), global_batch=8192, dim=16):
    lines = [
        f"Criteo-like global batch of {global_batch} (26 tables, dim {dim}, rows spread over "
        "ranks), "
        "bytes per training step over all ranks:",
        f"{'ranks':>5} {'all-to-all':>12} {'all-gather':>12} {'ratio':>6}",
    ]
    results = {}
    for world in worlds:
        b = exchange_bytes(criteo_keys(world, global_batch), [dim] * 26)
        results[world] = b
        lines.append(
            f"{world:>5} {b['alltoall']:>12,} {b['allgather']:>12,} "
            f"{b['alltoall'] / b['allgather']:>6.2f}"
        )
    return "\n".join(lines), results


if __name__ == "__main__":
    print(table()[0])
