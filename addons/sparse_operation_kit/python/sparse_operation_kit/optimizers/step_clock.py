"""The wall-clock time of each optimizer step, for sok.incremental_model_dump(since=datetime).

Rows record the step of their last optimizer update (`versions`); each optimizer's StepClock
records the time at which its steps read their step number (SokWallClock: tf.timestamp is
refused under op determinism), so a time maps to the first step that ran at or after it. A host
hash table, not a variable: checkpoints and TF1 initializers are unchanged. Per step: one insert
and one remove on the host, of the step value the update already reads (no extra device-to-host
copy), nothing per row.
"""
import numpy as np
import tensorflow as tf

from sparse_operation_kit.runtime._ops import ops
from sparse_operation_kit.runtime.devices import on_host

# Steps whose time a clock keeps: a `since` older than the last CLOCK_STEPS steps of this
# process is refused (the step form has no such limit).
CLOCK_STEPS = 1 << 17
MIXED = object()  # a table updated by optimizers with different step counters
SCOPE = "sok_step_clock"  # the per-step host ops' names (tests tell them from a step's own)


class StepClock:
    """An optimizer's step -> wall-clock time (seconds since the epoch) of its last CLOCK_STEPS
    steps."""

    def __init__(self):
        self._table = None
        self._export = None

    def _lookup(self):
        if self._table is None:
            with tf.init_scope(), on_host():
                self._table = tf.lookup.experimental.MutableHashTable(
                    tf.int64, tf.float64, default_value=-1.0, name="sok_step_clock",
                    checkpoint=False,  # not in TF1 Savers or meta graphs: per process
                )
                if not tf.executing_eagerly():  # made now: the graph may be finalized by then
                    self._export = self._table.export()
        return self._table

    def record(self, step, variables):
        """Stamps `step` (the number the update of `variables` records) with the time now: the op
        in graphs, None when eager (it ran)."""
        for var in variables:
            known = getattr(var, "_sok_step_clock", None)
            var._sok_step_clock = self if known in (None, self) else MIXED
        table = self._lookup()
        with on_host(), tf.name_scope(SCOPE):
            step = tf.reshape(tf.cast(step, tf.int64), [1])  # remove's keys have rank >= 1
            insert = table.insert(step, tf.reshape(ops.sok_wall_clock(), [1]))
            with tf.control_dependencies([insert] if insert is not None else []):
                forget = table.remove(step - CLOCK_STEPS)
        return None if tf.executing_eagerly() else tf.group(insert, forget)

    def entries(self, sess=None):
        """(steps, times) as numpy arrays, ordered by step."""
        if self._table is None:
            return np.zeros([0], np.int64), np.zeros([0], np.float64)
        if self._export is not None:
            steps, times = sess.run(self._export)
        else:
            steps, times = (t.numpy() for t in self._table.export())
        order = np.argsort(steps)
        return steps[order], times[order]


def clock_of(var):
    """The StepClock of the optimizer that updates `var`, None, or MIXED."""
    return getattr(var, "_sok_step_clock", None)
