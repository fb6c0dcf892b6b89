"""Where SOK's kernels run: a placement check for users and tests ("did my lookup run on the GPU?")."""
from typing import Dict

import tensorflow as tf

from sparse_operation_kit import compat
from sparse_operation_kit._ops import ops


def kernel_run_counts() -> Dict[str, int]:
    """How many SOK kernels ran on each device type in this process so far: {"CPU": n, "GPU": m}.

    Compare two readings around a step to see where its SOK ops ran.
    """
    with tf.init_scope(), tf.device("/CPU:0"):
        cpu, gpu = (int(x) for x in ops.sok_kernel_run_counts().numpy())
    return {"CPU": cpu, "GPU": gpu}


def gpu_kernels_built() -> bool:
    """True when this build of the ops library carries GPU kernels (built where nvcc was found)."""
    return "GPU" in compat.registered_kernel_devices("SokUniqueKeys")
