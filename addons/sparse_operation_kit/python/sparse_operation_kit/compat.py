"""Every use of TensorFlow internals lives here, each where no public API does the job.

If a TensorFlow release moves one of these, this is the only file to change.
"""
import tensorflow as tf
from tensorflow.python.eager import tape as _tape  # no public "variable was read" hook
from tensorflow.python.framework import ops as _framework_ops
from tensorflow.python.saved_model import save_context as _save_context  # no public "exporting" flag
from tensorflow.python.training.saving import saveable_object as _saveable_object
from tensorflow.python.util import dispatch as _dispatch  # no public "dispatch on this class" hook

TF_VERSION = tf.__version__

SaveableObject = _saveable_object.SaveableObject
SaveSpec = _saveable_object.SaveSpec
# A checkpoint-trackable base for optimizer wrappers: tf.Module would also do, but its `name` and
# `variables` attributes would shadow those of the wrapped optimizer.
AutoTrackable = tf.__internal__.tracking.AutoTrackable


def variable_accessed(variable):
    """Tells active GradientTapes that `variable` was read, as tf.Variable reads do."""
    if variable.trainable:
        _tape.variable_accessed(variable)


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
        return "sgd", {"learning_rate": opt._learning_rate}
    if name == "AdagradOptimizer":
        return "adagrad", {"learning_rate": opt._learning_rate,
                           "initial_accumulator": opt._initial_accumulator_value, "epsilon": 0.0}
    if name == "AdamOptimizer":
        return "adam", {"learning_rate": opt._lr, "beta1": opt._beta1, "beta2": opt._beta2,
                        "epsilon": opt._epsilon}
    if name == "FtrlOptimizer":
        if opt._l2_shrinkage_regularization_strength:
            return None, None  # no fused kernel: the generic path runs TensorFlow's own update
        return "ftrl", {"learning_rate": opt._learning_rate,
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
    from tensorflow.python.framework import kernels
    return {k.device_type for k in kernels.get_registered_kernels_for_op(op_type).kernel}
