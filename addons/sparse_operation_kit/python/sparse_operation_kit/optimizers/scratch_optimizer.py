"""The optimizer that runs the generic path's update on the scratch variables of SOK tables.

sok.OptimizerWrapper(opt) leaves `opt` the program's own: NVIDIA SOK 2.x programs also apply it
directly to their tf.Variables. So the scratch variables never reach a Keras `opt` (one built
with them refuses the program's variables afterwards; a legacy one would read its step after the
wrapper's staging instead of when the call starts):

  * tf.compat.v1 optimizers keep no step and make slots for any variable on demand: they update
    the scratch themselves, in one call with the dense variables (AdagradDA reads the program's
    global_step, as on its own).
  * Keras 3, tf_keras and tf_keras legacy optimizers: a private copy of `opt` (same class and
    configuration) updates the scratch. Before each update the copy takes `opt`'s learning rate
    (the same variable or schedule: later changes apply) and the wrapper's step (wrapper_step);
    GenericSparseUpdater then advances the wrapper's step once for the call.

Other state a Keras optimizer keeps beside its step and slots (Nadam's momentum-schedule product)
is per object: the copy's follows the wrapper's calls, `opt`'s the direct ones.
"""
import tensorflow as tf

from sparse_operation_kit.runtime import compat


def _static_hyper(value):
    """A legacy hyperparameter for get_config without running a graph: a variable's constant
    initial value (the copy shares the variable itself, see _share_hyperparameters)."""
    if isinstance(value, tf.Variable):
        value = value.initial_value
    if isinstance(value, tf.Tensor):
        static = tf.get_static_value(value)
        return 1.0 if static is None else float(static)
    return value


def _config(optimizer, flavor):
    if flavor != "keras_legacy" or tf.executing_eagerly():
        return optimizer.get_config()
    saved = optimizer._hyper  # get_config would read hyperparameter variables in a session
    optimizer._hyper = {name: _static_hyper(v) for name, v in saved.items()}
    try:
        return optimizer.get_config()
    finally:
        optimizer._hyper = saved


def _assign(var, value):
    if isinstance(var, tf.Variable):
        return var.assign(value, read_value=False)
    return var.assign(value)  # a Keras 3 variable


class ScratchOptimizer:
    """Updates scratch variables for one wrapped optimizer (`program`); `optimizer` is the one
    holding the scratch variables' slots."""

    def __init__(self, program, flavor):
        self.program = program
        self.flavor = flavor
        self.optimizer = program if flavor == "v1" else None
        self._scratch = []

    def _new_copy(self):
        with tf.init_scope():
            copy = type(self.program).from_config(_config(self.program, self.flavor))
            if self.flavor == "keras_legacy":
                _ = copy.iterations  # made now, not inside a tf.function's later trace
        return copy

    def prepare(self, scratch):
        """Creates the slots of the new scratch variables `scratch`. A Keras 3 / tf_keras
        optimizer learns its variables once, so a fresh copy is built for all of them (the
        scratch slots hold nothing between steps: the slot stores do)."""
        self._scratch.extend(scratch)
        if self.flavor == "v1":
            compat.v1_create_slots(self.program, scratch)
        elif self.flavor == "keras_legacy":
            if self.optimizer is None:
                self.optimizer = self._new_copy()
            self._share_hyperparameters()
            compat.keras_legacy_create_slots(self.optimizer, scratch)
        else:
            copy = self._new_copy()
            with tf.init_scope():
                copy.build(list(self._scratch))
            self.optimizer = copy

    def replace(self, old, new):
        """Scratch variables `old` were rebuilt as `new` (larger): slots for the new ones."""
        gone = {id(v) for v in old}
        self._scratch = [v for v in self._scratch if id(v) not in gone]
        self.prepare(new)

    def own_variables(self):
        """The copy's variables beside the scratch slots (its step): kept out of TF1 Savers."""
        if self.flavor != "keras_legacy":
            return []
        return [self.optimizer.iterations]

    def _share_hyperparameters(self):
        copy = self.optimizer
        if self.flavor == "keras_legacy":
            with tf.init_scope():
                self.program._create_hypers()  # as its first apply_gradients would
            copy._hyper = dict(self.program._hyper)
            copy._hypers_created = True
        elif copy._learning_rate is not self.program._learning_rate:
            # Past Keras's attribute tracking: the variable stays the program optimizer's.
            object.__setattr__(copy, "_learning_rate", self.program._learning_rate)

    def apply(self, pairs, step):
        """Updates the (gradient, scratch) `pairs` at optimizer step `step` (an int64 tensor);
        the op in TF1 graphs, else None."""
        self._share_hyperparameters()
        copy = self.optimizer
        set_step = _assign(copy.iterations, step)
        graph = not tf.executing_eagerly()
        with tf.control_dependencies([set_step] if graph else []):
            if self.flavor == "keras3":
                copy.apply([g for g, _ in pairs], [v for _, v in pairs])
                return None
            result = copy.apply_gradients(pairs)
        return result if graph and isinstance(result, (tf.Operation, tf.Tensor)) else None
