"""How rows of distinct keys reach the rank that asked for them.

One process: every table is local, so fetching is a direct read (local_rows.py). Under Horovod
(distributed.py) keys travel to their owners with one all-to-all and rows come back with another;
this module picks the path.
"""
from sparse_operation_kit.parallel import distributed
from sparse_operation_kit.parallel.local_rows import local_rows
from sparse_operation_kit.runtime.context import context


def fetch_rows(params, keys, counts, training, names, valid=None, padded=False):
    """Rows of the distinct `keys[i]` of every table `params[i]` (training inserts new keys).
    valid, padded (under Horovod only): the dedup's device counts (-1: bad positions) and
    whether the keys carry padding past them (distributed.fetch_rows)."""
    if context.world_size > 1:
        return distributed.fetch_rows(params, keys, counts, training, names, valid, padded)
    if valid is not None:
        raise ValueError("fetch_rows: the dedup's valid counts in one process")
    return local_rows(params, keys, counts, training, names)
