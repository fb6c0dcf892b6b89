"""Process-wide state: which communication engine is in use, and this process's rank."""


class _Context:
    def __init__(self):
        self.initialized = False
        self.hvd = None  # horovod.tensorflow when running under horovodrun

    @property
    def rank(self):
        return self.hvd.rank() if self.hvd is not None else 0

    @property
    def world_size(self):
        return self.hvd.size() if self.hvd is not None else 1


context = _Context()


def init(use_horovod=None, comm_tool="horovod", use_legacy_optimizer=True, **kwargs):
    """Initialises SOK. Uses Horovod when it is initialised (call hvd.init() first).

    In one process without Horovod it is a no-op apart from bookkeeping, so scripts written for
    several workers also run alone. comm_tool: "horovod" (the only one). use_legacy_optimizer
    (NVIDIA SOK 2.x): with tf_keras as tf.keras (TF_USE_LEGACY_KERAS=1), `tf.keras.optimizers`
    becomes `tf.keras.optimizers.legacy`, whose optimizers take any variables at any step, so one
    optimizer object can update SOK variables (through sok.OptimizerWrapper) and dense
    variables in turn. Keras 3's namespace is left as it is (it has no legacy optimizers).
    """
    if comm_tool != "horovod":
        raise ValueError(f"sok.init: unknown comm_tool {comm_tool!r} (SOK communicates through 'horovod')")
    hvd = None
    if use_horovod is not False:
        try:
            import horovod.tensorflow as hvd_module
            try:
                hvd_module.size()
                hvd = hvd_module
            except ValueError:
                if use_horovod:
                    raise RuntimeError("sok.init(use_horovod=True): call hvd.init() first")
        except ImportError:
            if use_horovod:
                raise
    context.hvd = hvd
    context.initialized = True
    if use_legacy_optimizer:
        _use_legacy_keras_optimizers()
    return context


def _use_legacy_keras_optimizers():
    import tensorflow as tf

    from sparse_operation_kit.keras_support import keras_is_v3
    if keras_is_v3():
        return
    legacy = getattr(tf.keras.optimizers, "legacy", None)
    if legacy is None:  # already switched
        return
    tf.keras.optimizers = legacy
    tf.get_logger().warning("sok.init(use_legacy_optimizer=True): tf.keras.optimizers is now "
                            "tf.keras.optimizers.legacy (pass use_legacy_optimizer=False to keep the new optimizers)")


def rank():
    return context.rank


def num_ranks():
    return context.world_size
