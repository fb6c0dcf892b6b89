"""pytest fixtures and hooks of the tests of the Python package; the shared helpers are in
support.py."""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

import sparse_operation_kit as sok  # noqa: E402
from tests.python.support import TEST_DEVICE  # noqa: E402


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "cpu_placement: the test places SOK ops on the CPU on purpose"
    )
    if TEST_DEVICE == "gpu":
        if not tf.config.list_physical_devices("GPU"):
            raise pytest.UsageError("SOK_TEST_DEVICE=gpu, but TensorFlow sees no GPU")
        if not sok.gpu_kernels_built():
            raise pytest.UsageError("SOK_TEST_DEVICE=gpu, but this ops library has no GPU kernels")


@pytest.fixture(autouse=True)
def _sok_ops_on_test_device(request):
    before = sok.kernel_run_counts(by_op=True)
    yield
    if TEST_DEVICE != "gpu" or request.node.get_closest_marker("cpu_placement"):
        return
    after = sok.kernel_run_counts(by_op=True)
    on_cpu = {op: c["CPU"] - before.get(op, {}).get("CPU", 0) for op, c in after.items()}
    # Grappler's constant folding evaluates SokUniqueKeys on the host when its ids are graph
    # constants (once, while optimising); test_devices checks its placement with fed ids.
    # SokCheckRowIds runs on its static table's device, and tests put static tables on the CPU
    # where TensorFlow's sparse optimizer kernels are CPU-only (test_variables checks its GPU
    # placement).
    on_cpu = {op: n for op, n in on_cpu.items()
              if n and op not in ("SokUniqueKeys", "SokCheckRowIds")}
    assert not on_cpu, f"SOK kernels ran on the CPU under SOK_TEST_DEVICE=gpu: {on_cpu}"
