"""Which key tensors hold distinct keys, declared by the code that made them distinct.

lookup_sparse dedups its ids once (SokUniqueKeys); in one process the gradient of each Embedding
Variable is keyed by exactly those keys, so the fused optimizer update may skip its own dedup.
A training lookup that hands those keys straight to the table's Gather has also inserted them: the
update then reserves no room for them again (the GPU tables' growth bound would otherwise count
every key twice a step and synchronise far more often). The declarations are kept per graph
(TF1 graphs, tf.function) and go away with the graph; eager updates always dedup (cheap next to
an eager step).

Under Horovod an owner's keys may be padded (parallel/distributed.py): key tensor i of a call is
distinct in its first valid[i] entries, the rest repeat its first key with a zero gradient. Such
a tensor is not distinct; the update that is given `valid` skips the padding, any other sums the
zeros into a row that has a gradient anyway.
"""
import weakref

import tensorflow as tf

_distinct = weakref.WeakKeyDictionary()  # graph -> {tensor name}
_inserted = weakref.WeakKeyDictionary()  # graph -> {tensor name}
_padded = weakref.WeakKeyDictionary()  # graph -> {tensor name: (valid tensor, index)}


def _graph_tensor(t):
    return tf.is_symbolic_tensor(t)


def declare_distinct(tensors, inserted=False):
    """Records that each graph tensor of `tensors` holds distinct keys, and with `inserted` that
    the step's training lookup inserted every one of them into its table."""
    for t in tensors:
        if _graph_tensor(t):
            _distinct.setdefault(t.graph, set()).add(t.name)
            if inserted:
                _inserted.setdefault(t.graph, set()).add(t.name)


def declare_padded(tensors, valid, inserted=False):
    """Records that graph tensor i of `tensors` is distinct in its first valid[i] entries (valid:
    an int64 [len(tensors)] tensor) and padded with copies of its first key after them."""
    for i, t in enumerate(tensors):
        if _graph_tensor(t):
            _padded.setdefault(t.graph, {})[t.name] = (valid, i)
            if inserted:
                _inserted.setdefault(t.graph, set()).add(t.name)


def valid_count(t):
    """(valid, i) when `t` was declared padded (its first valid[i] entries count), else None."""
    return _padded.get(t.graph, {}).get(t.name) if _graph_tensor(t) else None


def is_distinct(t) -> bool:
    """True when `t` was declared to hold distinct keys (a cast or concat of it was not)."""
    return _graph_tensor(t) and t.name in _distinct.get(t.graph, ())


def is_inserted(t) -> bool:
    """True when `t` was declared inserted by a training lookup of the same step."""
    return _graph_tensor(t) and t.name in _inserted.get(t.graph, ())
