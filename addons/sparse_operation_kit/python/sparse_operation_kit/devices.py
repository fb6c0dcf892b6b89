"""Where SOK's kernels run: a placement check for users and tests ("did my lookup run on the GPU?")."""
from typing import Dict

import tensorflow as tf

from sparse_operation_kit import compat
from sparse_operation_kit._ops import ops


def kernel_run_counts() -> Dict[str, int]:
    """How many SOK kernels ran on each device type in this process so far: {"CPU": n, "GPU": m}.

    Compare two readings around a step to see where its SOK ops ran.
    """
    with tf.init_scope():
        if tf.executing_eagerly():
            with tf.device("/CPU:0"):
                counts = ops.sok_kernel_run_counts().numpy()
        else:  # eager execution disabled (TF1 programs): a throwaway graph and session
            with tf.Graph().as_default() as g, tf.device("/CPU:0"):
                counts = tf.compat.v1.Session(graph=g).run(ops.sok_kernel_run_counts())
    return {"CPU": int(counts[0]), "GPU": int(counts[1])}


def gpu_kernels_built() -> bool:
    """True when this build of the ops library carries GPU kernels (built where nvcc was found)."""
    return "GPU" in compat.registered_kernel_devices("SokUniqueKeys")
