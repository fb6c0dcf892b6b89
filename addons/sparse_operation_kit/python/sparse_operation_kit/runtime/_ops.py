"""Loads the compiled ops (tf/_sparse_operation_kit_ops.so) once. The library sits at the
package root (sparse_operation_kit/), one level above this module, as the wheel and
tools/stage_gpu_package.sh place it."""
import os

import tensorflow as tf

_LIB_NAME = "_sparse_operation_kit_ops.so"


def _find_library():
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the package root
    candidates = [os.environ.get("SOK_OPS_LIBRARY", ""), os.path.join(here, _LIB_NAME)]
    for path in candidates:
        if path and os.path.exists(path):
            return path
    raise ImportError(
        f"sparse_operation_kit: {_LIB_NAME} not found in the package ({here}); "
        "build the wheel with `bazel build //tools/pip_package:build_sok` or set SOK_OPS_LIBRARY")


def _check_tf_version():
    try:
        from sparse_operation_kit._build_info import BUILT_FOR_TF
    except ImportError:  # a source checkout (tools/dev_build.sh)
        return
    if BUILT_FOR_TF.split(".")[:2] != tf.__version__.split(".")[:2]:
        raise ImportError(
            f"sparse_operation_kit was built for TensorFlow {BUILT_FOR_TF} but runs on "
            f"{tf.__version__}: rebuild the wheel against this TensorFlow"
        )


_check_tf_version()
ops = tf.load_op_library(_find_library())
