"""sok.LossScaleOptimizer: Keras 3's mixed-precision loss scaling around a sok.OptimizerWrapper.

Under the "mixed_float16" policy Keras wraps a compiled optimizer in its LossScaleOptimizer, which
checks every gradient for infs and NaNs by densifying a tf.IndexedSlices to its dense shape. A SOK
table's gradient is a tf.IndexedSlices keyed by id (ids lie anywhere in int64: it has no dense
shape), so that check cannot run on it, and Keras leaves the gradient of a table's carrier
(keras_support) scaled. This subclass checks such a gradient's values instead, which is the same
test, and sok.OptimizerWrapper unscales the tables' gradients by its scale; everything else (the
dynamic scale, skipping a step whose gradients are not finite, serialization) is Keras's own.
`model.compile(optimizer=sok.LossScaleOptimizer(sok.OptimizerWrapper(keras.optimizers.Adam())))`:
Keras then does not wrap it again.
"""
import functools
import weakref

import tensorflow as tf

from sparse_operation_kit.runtime.keras_version import keras_is_v3, keras_module


@functools.cache
def _loss_scale_class():
    """The registered subclass of keras.optimizers.LossScaleOptimizer (made once)."""
    keras = keras_module()

    @keras.saving.register_keras_serializable(package="sok", name="LossScaleOptimizer")
    class LossScaleOptimizer(keras.optimizers.LossScaleOptimizer):
        """Keras's LossScaleOptimizer; a table's gradient checked by its values."""

        def __init__(self, inner_optimizer, **kwargs):
            super().__init__(inner_optimizer, **kwargs)
            # Keras leaves the tables' gradients scaled (their carriers are marked
            # overwrite_with_gradient): sok.OptimizerWrapper divides them by this one's scale.
            inner_optimizer._sok_loss_scaler = weakref.ref(self)

        def check_finite(self, grads):
            return super().check_finite(
                [g.values if isinstance(g, tf.IndexedSlices) else g for g in grads])

    return LossScaleOptimizer


def LossScaleOptimizer(inner_optimizer, **kwargs):  # noqa: N802  a class to its callers
    """keras.optimizers.LossScaleOptimizer(inner_optimizer, **kwargs) that also checks SOK tables'
    gradients (see the module doc); `inner_optimizer` a sok.OptimizerWrapper of a Keras 3
    optimizer (or any Keras 3 optimizer)."""
    if not keras_is_v3():
        raise TypeError("sok.LossScaleOptimizer is for Keras 3; with tf_keras use "
                        "tf_keras.mixed_precision.LossScaleOptimizer")
    return _loss_scale_class()(inner_optimizer, **kwargs)


if keras_is_v3():  # registered at import: keras.models.load_model needs no custom_objects
    _loss_scale_class()
