"""Process-wide state: which communication engine is in use, and this process's rank."""
import logging
import os

import tensorflow as tf

from sparse_operation_kit.runtime import collectives
from sparse_operation_kit.runtime.keras_version import keras_is_v3

# Collectives that wait longer than this end every rank with an error (ranks that diverged: a
# skipped or different collective, a dead or stalled rank), instead of hanging the job.
DEFAULT_COLLECTIVE_TIMEOUT_S = 300.0
_STALL_SHUTDOWN = "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"
_STALL_CHECK = "HOROVOD_STALL_CHECK_TIME_SECONDS"


class _Context:
    def __init__(self):
        self.initialized = False
        self.hvd = None  # horovod.tensorflow when running under horovodrun
        self.collective_timeout_s = None  # None: Horovod waits forever (it was set up without one)

    @property
    def rank(self):
        return self.hvd.rank() if self.hvd is not None else 0

    @property
    def world_size(self):
        return self.hvd.size() if self.hvd is not None else 1


context = _Context()


def init(use_horovod=None, comm_tool="horovod", use_legacy_optimizer=True,
         collective_timeout_s=None, pin_gpu=True):
    """Initialises SOK, and Horovod under horovodrun if the program has not (NVIDIA SOK 2.x's
    sok.init() does the same); with Horovod already initialised (hvd.init() first) it uses it.

    collective_timeout_s (default: $SOK_COLLECTIVE_TIMEOUT_SECONDS or 300): when ranks diverge, a
    collective that waits this long shuts Horovod down and every rank's pending call fails with an
    error instead of hanging. Horovod reads it at hvd.init(): if the program initialised Horovod
    itself, set HOROVOD_STALL_SHUTDOWN_TIME_SECONDS in the environment instead.
    Under Horovod with several ranks on a GPU machine, each rank gets GPU `local_rank` (pin_gpu;
    not if the program chose its GPUs) and the exchange between ranks runs on NCCL (see
    collectives.py; $SOK_COLLECTIVES=horovod keeps Horovod's). Call it before any TensorFlow op runs.
    In one process without Horovod it is a no-op apart from bookkeeping, so scripts written for
    several workers also run alone. comm_tool: "horovod" (the only one). use_legacy_optimizer
    (NVIDIA SOK 2.x): with tf_keras as tf.keras (TF_USE_LEGACY_KERAS=1), `tf.keras.optimizers`
    becomes `tf.keras.optimizers.legacy`, whose optimizers take any variables at any step, so one
    optimizer object can update SOK variables (through sok.OptimizerWrapper) and dense
    variables in turn. Keras 3's namespace is left as it is (it has no legacy optimizers).
    """
    if comm_tool != "horovod":
        raise ValueError(f"sok.init: unknown comm_tool {comm_tool!r} (SOK communicates through 'horovod')")
    timeout = collective_timeout_s
    if timeout is None:
        timeout = float(os.environ.get("SOK_COLLECTIVE_TIMEOUT_SECONDS", DEFAULT_COLLECTIVE_TIMEOUT_S))
    if not timeout > 0:
        raise ValueError(f"sok.init: collective_timeout_s must be > 0 seconds, got {timeout}")
    hvd = None
    if use_horovod is not False:
        try:
            import horovod.tensorflow as hvd_module
        except ImportError:
            if use_horovod:
                raise
            hvd_module = None
        if hvd_module is not None:
            if not hvd_module.is_initialized() and (use_horovod or "HOROVOD_RANK" in os.environ):
                _set_stall_timeout(timeout)
                hvd_module.init()
            if hvd_module.is_initialized():
                hvd = hvd_module
            elif use_horovod:
                raise RuntimeError("sok.init(use_horovod=True): Horovod is not initialised and this "
                                   "process was not started by horovodrun")
    context.hvd = hvd
    context.collective_timeout_s = _configured_timeout() if hvd is not None else None
    collectives.reset()
    if hvd is not None and hvd.size() > 1:
        if pin_gpu:
            collectives.pin_rank_to_gpu(hvd)
        collectives.setup(hvd, context.collective_timeout_s or timeout)
    if hvd is not None and context.collective_timeout_s is None:
        logging.getLogger("sparse_operation_kit").warning(
            "Horovod was initialised before sok.init() without %s: collectives wait forever when "
            "ranks diverge. Set it (e.g. %s=300) in the environment, or let sok.init() initialise "
            "Horovod.", _STALL_SHUTDOWN, _STALL_SHUTDOWN)
    context.initialized = True
    if use_legacy_optimizer:
        _use_legacy_keras_optimizers()
    return context


def _set_stall_timeout(timeout):
    """Horovod's stall inspector shuts Horovod down after `timeout` s of a collective that not
    every rank joined; the user's own settings win."""
    os.environ.setdefault(_STALL_SHUTDOWN, str(int(max(1, round(timeout)))))
    os.environ.setdefault(_STALL_CHECK, str(int(max(1, min(60, round(timeout / 2))))))


def _configured_timeout():
    value = float(os.environ.get(_STALL_SHUTDOWN, "0") or 0)
    return value if value > 0 else None


def _use_legacy_keras_optimizers():
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
