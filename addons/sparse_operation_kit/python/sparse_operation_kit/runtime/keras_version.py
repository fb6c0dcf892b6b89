"""Which Keras `tf.keras` is, and which Keras an optimizer belongs to (imports nothing of SOK, so
that sok.init, the Keras integration and the optimizer paths can all ask)."""

import tensorflow as tf


def keras_is_v3():
    """True when `tf.keras` is Keras 3 (TF 2.16+ without TF_USE_LEGACY_KERAS=1)."""
    return not tf.keras.layers.Layer.__module__.startswith("tf_keras")


def keras_module():
    """The Keras that `tf.keras` is: Keras 3's `keras` package, or `tf_keras`."""
    if keras_is_v3():
        import keras

        return keras
    import tf_keras

    return tf_keras


def keras_optimizer_kind(optimizer):
    """ "keras3", "tf_keras" or None: which Keras's (new-style) optimizer `optimizer` is."""
    try:
        import keras

        if isinstance(optimizer, keras.optimizers.Optimizer):
            return "keras3"
    except ImportError:
        pass
    try:
        import tf_keras

        if isinstance(optimizer, tf_keras.optimizers.Optimizer):
            return "tf_keras"
    except ImportError:
        pass
    return None
