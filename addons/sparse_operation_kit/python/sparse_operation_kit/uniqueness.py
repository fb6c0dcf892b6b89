"""Which key tensors hold distinct keys, declared by the code that made them distinct.

lookup_sparse dedups its ids once (SokUniqueKeys); in one process the gradient of each Embedding
Variable is keyed by exactly those keys, so the fused optimizer update may skip its own dedup.
The declaration is kept per graph (TF1 graphs, tf.function) and goes away with the graph; eager
updates always dedup (cheap next to an eager step).
"""
import weakref

import tensorflow as tf

_distinct = weakref.WeakKeyDictionary()  # graph -> {tensor name}


def _graph_tensor(t):
    return tf.is_symbolic_tensor(t)


def declare_distinct(tensors):
    """Records that each graph tensor of `tensors` holds distinct keys."""
    for t in tensors:
        if _graph_tensor(t):
            _distinct.setdefault(t.graph, set()).add(t.name)


def is_distinct(t) -> bool:
    """True when `t` was declared to hold distinct keys (a cast or concat of it was not)."""
    return _graph_tensor(t) and t.name in _distinct.get(t.graph, ())
