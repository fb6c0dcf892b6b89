"""Launching a horovodrun job from a test: `horovodrun -np N --gloo -H localhost:N python ...`
with this interpreter and the sparse_operation_kit it imports, a job timeout (a hang fails the
test instead of stalling CI), and the job's output without TensorFlow's start-up noise."""
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
WORKERS = os.path.join(HERE, "workers")
BIN = os.path.dirname(sys.executable)
# The launcher beside this interpreter (a venv), else the one on PATH.
HOROVODRUN = next((p for p in (os.path.join(BIN, "horovodrun"), shutil.which("horovodrun") or "")
                   if p and os.path.exists(p)), os.path.join(BIN, "horovodrun"))
# SOK_TEST_DEVICE=gpu (a machine with a GPU per rank): the ranks exchange over NCCL and each
# asserts that its SOK kernels and all-to-alls ran on its GPU (workers/mp_common.py).
TEST_DEVICE = os.environ.get("SOK_TEST_DEVICE", "cpu").lower()

def gpu_count():
    """GPUs on this machine (nvidia-smi; 0 without one)."""
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(line.startswith("GPU ") for line in out.stdout.splitlines())


# Ranks of the jobs that are not about a rank count (programs, failures; default 2):
# SOK_TEST_RANKS=4 runs them on 4 GPUs of one machine.
RANKS = int(os.environ.get("SOK_TEST_RANKS", "2"))
JOB_TIMEOUT = 420  # seconds for one horovodrun job: a hang fails the test, it does not stall CI


def _sok_pythonpath():
    """The directory holding the sparse_operation_kit package this interpreter imports (source
    tree or installed wheel), found without importing TensorFlow."""
    spec = importlib.util.find_spec("sparse_operation_kit")
    assert spec is not None and spec.origin, "sparse_operation_kit is not importable"
    return os.path.dirname(os.path.dirname(spec.origin))


def _env(gloo_timeout=60):
    env = dict(os.environ)
    env["PATH"] = BIN + os.pathsep + env.get("PATH", "")
    env["PYTHONPATH"] = os.pathsep.join(
        [_sok_pythonpath()] + [p for p in [env.get("PYTHONPATH")] if p]
    )
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    env["HOROVOD_GLOO_TIMEOUT_SECONDS"] = str(gloo_timeout)
    if TEST_DEVICE == "gpu":  # every rank on its own GPU (sok.init pins it), NCCL between them
        env.setdefault("NCCL_NVLS_ENABLE", "0")
    else:
        env.setdefault("CUDA_VISIBLE_DEVICES", "")
    return env


def horovodrun(np_, script, *args, gloo_timeout=60, timeout=JOB_TIMEOUT, env=None):
    """Runs `horovodrun -np N --gloo -H localhost:N python workers/script args`; returns
    (exit code, output, seconds). A job over `timeout` is killed and reported as a hang."""
    if not os.path.exists(HOROVODRUN):
        pytest.skip(
            f"horovodrun not found next to {sys.executable} (bash tools/install_horovod.sh)"
        )
    cmd = [
        HOROVODRUN,
        "-np",
        str(np_),
        "--gloo",
        "-H",
        f"localhost:{np_}",
        sys.executable,
        os.path.join(WORKERS, script),  # a worker's name, or an absolute path
        *args,
    ]
    start = time.time()
    try:
        proc = subprocess.run(cmd, cwd=WORKERS, env={**_env(gloo_timeout), **(env or {})}, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        out = e.stdout if isinstance(e.stdout, str) else (e.stdout or b"").decode(errors="replace")
        pytest.fail(
            f"horovodrun -np {np_} {script} {' '.join(args)} hung for more than {timeout} s:\n"
            f"{_tail(out)}"
        )
    return proc.returncode, proc.stdout, time.time() - start


_NOISE = re.compile(r"(W0000|I0000|E0000|WARNING: All log messages|To enable the following|"
                    r"cuda_platform|cudart_stub|^\[\d+\]<stderr>:$)")


def _tail(out, lines=80):
    kept = [ln for ln in out.splitlines() if not _NOISE.search(ln)]
    return "\n".join(kept[-lines:])
