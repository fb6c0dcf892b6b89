"""Static tables on a GPU under optimizers whose sparse update TensorFlow runs on the CPU only.

tf.compat.v1's Momentum, RMSProp, AdagradDA and ProximalGradientDescent (and tf_keras' legacy
RMSprop) update a tf.IndexedSlices gradient with ops that have no GPU kernel
(ResourceSparseApplyMomentum, ...): on a GPU shard of a sok.Variable the step cannot run. Such a
step goes through a scratch variable on the CPU, as the generic path does for Embedding
Variables: the touched rows of the shard and of the optimizer's slots of it are gathered into the
first n rows of the scratch and of its slots, the optimizer updates them there (its own sparse
kernel, lazily, as on the shard), and they are written back. The optimizer's slots of the shard
exist (sok.dump and get_slot read them) and hold what they would on the CPU.
"""
import itertools

import tensorflow as tf

from sparse_operation_kit.optimizers import scratch_rows
from sparse_operation_kit.runtime import compat
from sparse_operation_kit.tables.tables import StaticTable

# Optimizer class -> its sparse update op.
_SPARSE_OPS = {
    ("v1", "MomentumOptimizer"): "ResourceSparseApplyMomentum",
    ("v1", "RMSPropOptimizer"): "ResourceSparseApplyRMSProp",
    ("v1", "AdagradDAOptimizer"): "ResourceSparseApplyAdagradDA",
    ("v1", "ProximalGradientDescentOptimizer"): "ResourceSparseApplyProximalGradientDescent",
    ("keras_legacy", "RMSprop"): "ResourceSparseApplyRMSProp",
}
_uid = itertools.count()


def cpu_only_update(optimizer, flavor) -> bool:
    """True when `optimizer` updates sparse gradients with an op that has no GPU kernel."""
    op = _SPARSE_OPS.get((flavor, type(optimizer).__name__))
    return op is not None and "GPU" not in compat.registered_kernel_devices(op)


class StaticStager:
    """The CPU scratch of each staged static table, for one wrapped optimizer."""

    def __init__(self, optimizer, flavor, capacity, always=False):
        self.optimizer, self.flavor, self.capacity = optimizer, flavor, capacity
        self.always = always  # tests: stage on any device
        self._scratch = {}  # id(var) -> (scratch, {slot name: (slot of var, slot of scratch)})

    def wants(self, grad, var) -> bool:
        if not isinstance(var, StaticTable) or not isinstance(grad, tf.IndexedSlices):
            return False
        if self.always:
            return True
        on_gpu = "GPU" in (var.device or "").upper()
        return on_gpu and cpu_only_update(self.optimizer, self.flavor)

    def _create_slots(self, variables):
        if self.flavor == "v1":
            compat.v1_create_slots(self.optimizer, variables)
        else:
            compat.keras_legacy_create_slots(self.optimizer, variables)

    def _state(self, var):
        state = self._scratch.get(id(var))
        if state is None:
            dim = int(var.shape[-1])
            with tf.init_scope(), tf.device("/CPU:0"):
                scratch = tf.Variable(tf.zeros([self.capacity, dim]), trainable=False,
                                      name=f"sok_static_scratch_{next(_uid)}")
            self._create_slots([var, scratch])
            names = self.optimizer.get_slot_names()
            slots = {nm: (self.optimizer.get_slot(var, nm), self.optimizer.get_slot(scratch, nm))
                     for nm in names}
            state = (scratch, {nm: s for nm, s in slots.items() if s[0] is not None})
            self._scratch[id(var)] = state
        return state

    def stage(self, grad, var):
        """((gradient, scratch) for the wrapped optimizer, dependencies, write_back())."""
        scratch, slots = self._state(var)
        cap, dim = self.capacity, int(var.shape[-1])
        touched = scratch_rows.TouchedRows(
            tf.cast(grad.indices, tf.int64), grad.values, dim, cap, var.name,
            f"CPU scratch of the {type(self.optimizer).__name__} update")
        unique, n, summed, padding = touched.unique, touched.n, touched.summed, touched.padding
        with tf.control_dependencies([touched.check]):
            deps = [scratch.assign(tf.pad(tf.gather(var, unique), padding))]
            for of_var, of_scratch in slots.values():
                deps.append(of_scratch.assign(tf.pad(tf.gather(of_var, unique), padding)))
        gradient = tf.IndexedSlices(summed, tf.range(n), dense_shape=tf.constant([cap, dim]))

        def write_back():
            writes = [var.scatter_update(tf.IndexedSlices(scratch[:n], unique))]
            for of_var, of_scratch in slots.values():
                writes.append(of_var.scatter_update(tf.IndexedSlices(of_scratch[:n], unique)))
            return writes

        return (gradient, scratch), deps, write_back
