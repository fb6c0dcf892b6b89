"""Where SOK's kernels run: a placement check for users and tests
("did my lookup run on the GPU?")."""

import contextlib

import tensorflow as tf

from sparse_operation_kit.runtime import compat
from sparse_operation_kit.runtime._ops import ops


@contextlib.contextmanager
def on_host():
    """Ops made here run on the CPU, whatever device or colocation encloses them: for small
    host-memory inputs (a learning rate, a step). Made on a GPU, a constant or variable lives in
    device memory and costs a copy to the host, waited for, in every step."""
    with tf.compat.v1.colocate_with(None, ignore_existing=True), tf.device("/CPU:0"):
        yield


def kernel_run_counts(by_op: bool = False) -> dict:
    """How many SOK kernels ran on each device type in this process so far: {"CPU": n, "GPU": m},
    or with by_op=True {op type: {"CPU": n, "GPU": m}}.

    Compare two readings around a step to see where its SOK ops ran.
    """
    with tf.init_scope():
        if tf.executing_eagerly():
            with tf.device("/CPU:0"):
                types, counts = (t.numpy() for t in ops.sok_kernel_run_counts())
        else:  # eager execution disabled (TF1 programs): a throwaway graph and session
            with tf.Graph().as_default() as g, tf.device("/CPU:0"):
                types, counts = tf.compat.v1.Session(graph=g).run(ops.sok_kernel_run_counts())
    per_op = {t.decode(): {"CPU": int(c[0]), "GPU": int(c[1])} for t, c in zip(types, counts)}
    if by_op:
        return per_op
    return {d: sum(c[d] for c in per_op.values()) for d in ("CPU", "GPU")}


def gpu_kernels_built() -> bool:
    """True when this build of the ops library carries GPU kernels (built where nvcc was found)."""
    return "GPU" in compat.registered_kernel_devices("SokUniqueKeys")
