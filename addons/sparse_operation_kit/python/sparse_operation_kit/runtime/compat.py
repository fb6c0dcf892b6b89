"""Every use of TensorFlow internals lives here, each where no public API does the job.

If a TensorFlow release moves one of these, this is the only file to change.
"""
import tensorflow as tf
from tensorflow.python.eager import record as _record  # no public "a tape is recording" query
from tensorflow.python.eager import tape as _tape  # no public "variable was read" hook
from tensorflow.python.framework import kernels as _kernels  # no public list of registered kernels
from tensorflow.python.framework import ops as _framework_ops
from tensorflow.python.ops import resource_variable_ops as _resource_variable_ops
from tensorflow.python.saved_model import (
    save_context as _save_context,
)  # no public "exporting" flag
from tensorflow.python.training.saving import saveable_object as _saveable_object
from tensorflow.python.util import dispatch as _dispatch  # no public "dispatch on this class" hook

from sparse_operation_kit.runtime.schema import Optimizer

TF_VERSION = tf.__version__

# A checkpoint-trackable base for optimizer wrappers: tf.Module would also do, but its `name` and
# `variables` attributes would shadow those of the wrapped optimizer.
AutoTrackable = tf.__internal__.tracking.AutoTrackable

# tf.Variable's concrete class: tf.Variable itself cannot be subclassed into a working variable,
# so sok.Variable's StaticTable (and tf_keras's gradient carriers) subclass this one.
ResourceVariable = _resource_variable_ops.ResourceVariable


class TableRef:
    """What tf.Variable.ref() gives: a hashable reference to a table, by identity (TensorFlow's
    own code, e.g. tf.custom_gradient in graph mode, calls .ref() on every global variable)."""

    def __init__(self, table):
        self._table = table

    def deref(self):
        return self._table

    def __hash__(self):
        return id(self._table)

    def __eq__(self, other):
        return isinstance(other, TableRef) and other._table is self._table


class _CheckpointHooks:
    """The public hooks (checkpoint_tensors(), restore_checkpoint_tensors(tensors), name) mapped
    onto TensorFlow's private checkpoint protocols, for TableResource and TensorsTrackable."""

    def ref(self):
        return TableRef(self)

    def _serialize_to_tensors(self):
        return self.checkpoint_tensors()

    def _restore_from_tensors(self, restored_tensors):
        return self.restore_checkpoint_tensors(restored_tensors)

    def _gather_saveables_for_checkpoint(self):
        # tf.compat.v1.train.Saver names tensors by variable ("<name>/keys", ...); the key
        # "VARIABLE_VALUE" makes a Saver({"key": var}) use "key/keys", as for variables.
        return {"VARIABLE_VALUE": lambda name=self.name: _NamedTensorsSaveable(self, name)}


class TableResource(_CheckpointHooks, tf.saved_model.experimental.TrackableResource):
    """A TrackableResource that reads like a resource variable and checkpoints named tensors.

    Subclasses implement public hooks; this class maps them onto TensorFlow's private protocols:
      checkpoint_tensors() -> {field: tensor}: what tf.train.Checkpoint, SavedModel and
        tf.compat.v1.train.Saver ("<name>/<field>") store;
      restore_checkpoint_tensors({field: tensor}) -> the restoring op;
      name: the key of the table in Saver checkpoints.
    """

    @property
    def _should_act_as_resource_variable(self):
        # Having this attribute makes tf.gradients / GradientTape / embedding_lookup treat the
        # table as a resource variable (they differentiate with respect to `.handle`). A
        # SavedModel export must see the resource it is: as a "variable" it would be written
        # as a dense one.
        if in_saved_model_export():
            raise AttributeError("_should_act_as_resource_variable")
        return True


class TensorsTrackable(_CheckpointHooks, tf.__internal__.tracking.Trackable):
    """A checkpointable object (no resource of its own, e.g. a partitioned table whose parts are
    resources) with TableResource's public hooks: checkpoint_tensors(),
    restore_checkpoint_tensors(tensors) and name."""


class _NamedTensorsSaveable(_saveable_object.SaveableObject):
    def __init__(self, table, name):
        self._table = table
        tensors = table.checkpoint_tensors()
        specs = [_saveable_object.SaveSpec(t, "", f"{name}/{f}") for f, t in tensors.items()]
        self._fields = list(tensors)
        super().__init__(table, specs, name)

    def restore(self, restored_tensors, restored_shapes):
        return self._table.restore_checkpoint_tensors(
            dict(zip(self._fields, restored_tensors, strict=True))
        )


def variable_accessed(variable):
    """Tells active GradientTapes that `variable` was read, as tf.Variable reads do."""
    if variable.trainable:
        _tape.variable_accessed(variable)


def gradient_tape_recording():
    """True while a GradientTape (or forward accumulator) records the ops run here, eagerly or
    while a tf.function traces them (stop_recording() pauses it)."""
    return bool(_record.could_possibly_record())


def is_tf1_initializer(init):
    """True for the classes of tf.compat.v1's *_initializer functions (no public base class)."""
    return type(init).__module__ == "tensorflow.python.ops.init_ops"


def in_saved_model_export():
    """True while tf.saved_model.save builds the SavedModel (tracing and writing objects)."""
    return _save_context.in_save_context()


def register_gradient(op_type):
    return _framework_ops.RegisterGradient(op_type)


def register_dispatchable_type(cls):
    """Lets tf.experimental.dispatch_for_api dispatch on `cls`, which is no CompositeTensor."""
    return _dispatch.register_dispatchable_type(cls)


def v1_optimizer_hyperparameters(opt):
    """Hyperparameters of a tf.compat.v1.train optimizer (kept in private attributes)."""
    name = type(opt).__name__
    if name == "GradientDescentOptimizer":
        return Optimizer.SGD, {"learning_rate": opt._learning_rate}
    if name == "AdagradOptimizer":
        return Optimizer.ADAGRAD, {"learning_rate": opt._learning_rate,
                           "initial_accumulator": opt._initial_accumulator_value, "epsilon": 0.0}
    if name == "AdamOptimizer":
        return Optimizer.ADAM, {"learning_rate": opt._lr, "beta1": opt._beta1, "beta2": opt._beta2,
                        "epsilon": opt._epsilon}
    if name == "FtrlOptimizer":
        if opt._l2_shrinkage_regularization_strength:
            return None, None  # no fused kernel: the generic path runs TensorFlow's own update
        return Optimizer.FTRL, {"learning_rate": opt._learning_rate,
                        "initial_accumulator": opt._initial_accumulator_value,
                        "lr_power": opt._learning_rate_power,
                        "l1": opt._l1_regularization_strength,
                        "l2": opt._l2_regularization_strength, "beta": opt._beta}
    return None, None


def v1_create_slots(opt, var_list):
    """Has a tf.compat.v1.train optimizer create its slots for `var_list` now (apply_gradients
    would, too late for the generic path, which fills them before the update)."""
    with tf.init_scope():
        opt._create_slots(var_list)


def keras_legacy_create_slots(opt, var_list):
    """The same for a tf_keras.optimizers.legacy optimizer."""
    with tf.init_scope():
        opt._create_all_weights(var_list)


def registered_kernel_devices(op_type):
    """Device types with a registered kernel for `op_type` (no public API lists them)."""
    return {k.device_type for k in _kernels.get_registered_kernels_for_op(op_type).kernel}


def python_function_of(fn):
    """The Python callable a tf.function wraps (bound to its object for a method), so it can be
    traced afresh; anything else as it is. No public API exposes a method's object."""
    if not isinstance(fn, tf.types.experimental.PolymorphicFunction):
        return fn
    func = fn.python_function
    for bound in (func, getattr(fn, "__wrapped__", None)):
        holder = getattr(bound, "__self__", None)
        target = getattr(holder, "target", None)  # TfMethodTarget: the object of a decorated method
        if target is not None:
            plain = getattr(bound, "__func__", bound)
            return lambda *args, **kwargs: plain(target, *args, **kwargs)
    return func


def register_collection_proto(collection, proto_type, to_proto, from_proto):
    """Lets export_meta_graph / import_meta_graph carry `collection`'s Python objects as protos
    (no public API registers them)."""
    _framework_ops.register_proto_function(collection, proto_type=proto_type, to_proto=to_proto,
                                           from_proto=from_proto)


def fetch_as(cls, fetch_value):
    """`Session.run(x)` of an instance of `cls` (also inside lists and dicts, through
    Session.make_callable, and in tf.control_dependencies([x])) runs `fetch_value(x)`, as a
    tf.Variable fetch runs its read: Graph.as_graph_element asks the object itself through a
    private protocol. The tensor is made once per table, in the table's graph."""

    def _as_graph_element(self):
        element = getattr(self, "_sok_fetch_element", None)
        if element is not None:
            return element
        try:
            graph = self.graph
        except AttributeError:  # an eager table's handle has no graph
            graph = None
        if graph is None:
            raise TypeError(f"table '{self.name}' was created eagerly: a Session cannot fetch it")
        if graph.finalized:
            raise TypeError(
                f"table '{self.name}': fetch it once before the graph is finalized (the fetch adds "
                "an op), or fetch sok.export(var) made before then"
            )
        with graph.as_default(), tf.name_scope(f"{self.name.replace(':', '_')}_fetch"):
            element = fetch_value(self)
        self._sok_fetch_element = element
        return element

    cls._as_graph_element = _as_graph_element
