"""The step of sok.OptimizerWrapper, counted apart from the wrapped optimizer's (SOK 2.x).

A wrapper counts its own calls: each `wrapper.apply_gradients` advances the wrapper's counter
once, and `opt.apply_gradients` called directly advances `opt.iterations` once; neither moves the
other. During a wrapper call the wrapped Keras optimizer's `_iterations` *is* the wrapper's
counter, so everything the call runs reads that step: the fused kernels' and the generic path's
table rows (their `versions`, hence eviction, the step clock and incremental dumps), a Keras
learning-rate schedule, and the dense variables given in the same call.

SOK 2.x swaps the counter the same way, so a program that interleaves wrapper calls for tables
with direct calls for tf.Variables sees the same step number on both sides.
tf.compat.v1 optimizers keep no step: SOK's own counter numbers the tables' updates.

The rows' versions (GlobalStepEvict's `var.shrink(global_step)`, incremental dumps) record the
`global_step` given to `apply_gradients` / `minimize`, as DeepRec's do, and the wrapper's step
when none is given.
"""
import contextlib

import tensorflow as tf

from sparse_operation_kit.runtime.devices import on_host


def new_counter(name):
    """An int64 step counter at 0, on the host (the step clock and the row stamps read it there);
    made outside any tf.function or control flow being traced."""
    with tf.init_scope(), on_host():
        return tf.Variable(0, dtype=tf.int64, trainable=False, name=name)


@contextlib.contextmanager
def counting_with(optimizer, counter):
    """Within the block `optimizer.iterations` is `counter`: its updates, schedules and increment
    read and advance the wrapper's step. Set past Keras's and TensorFlow's attribute tracking, so
    `counter` never joins the optimizer's variables or checkpoint."""
    saved = optimizer.__dict__.get("_iterations")
    object.__setattr__(optimizer, "_iterations", counter)
    try:
        yield counter
    finally:
        object.__setattr__(optimizer, "_iterations", saved)


def read_step(step):
    """A step (a variable of any kind, or a tensor) as an int64 tensor on the host."""
    with on_host():
        if isinstance(step, tf.Variable):
            step = step.read_value()
        elif hasattr(step, "value") and not tf.is_tensor(step):  # a Keras 3 variable
            step = tf.convert_to_tensor(step.value)
        return tf.cast(step, tf.int64)


def advance(counter):
    """counter += 1, as an op in graphs."""
    if isinstance(counter, tf.Variable):
        return counter.assign_add(1, read_value=False)
    return counter.assign_add(1)  # a Keras 3 variable
