"""benchmarks/collectives: run.py under `horovodrun -np 2 --gloo` on the CPU (its own correctness
check of the exchanged rows passes, and it prints positive bandwidths), the shared helpers, and
torch_nccl.py compiles (PyTorch with NCCL and GPUs is on the GPU machines only):
    .venv/bin/python -m pytest -q tests/benchmarks/test_collectives_bench.py"""
import importlib.util
import os
import py_compile
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCH = os.path.join(ROOT, "benchmarks", "collectives")
HOROVODRUN = os.path.join(os.path.dirname(sys.executable), "horovodrun")
JOB_TIMEOUT = 420  # seconds: a hung job fails the test instead of stalling the suite


def load(name):
    spec = importlib.util.spec_from_file_location(f"collectives_bench_{name}",
                                                  os.path.join(BENCH, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# A result line, after horovodrun's "[rank]<stdout>:" prefix if any.
COLL_LINE = re.compile(r"^(?:\[\d+\]<stdout>:)?(COLL .*)$", re.M)
CHECK_LINE = re.compile(r"^(?:\[\d+\]<stdout>:)?(CHECK impl=.*)$", re.M)


def coll_fields(out):
    """The key=value fields of every `COLL ` line."""
    return [dict(f.split("=", 1) for f in line.split()[1:]) for line in COLL_LINE.findall(out)]


def sok_pythonpath():
    """The directory of the sparse_operation_kit this interpreter imports (source tree on
    PYTHONPATH or installed wheel), found without importing TensorFlow."""
    spec = importlib.util.find_spec("sparse_operation_kit")
    if spec is None or not spec.origin:
        pytest.skip("sparse_operation_kit is not importable")
    return os.path.dirname(os.path.dirname(spec.origin))


def test_sizes_and_bus_bandwidth_factors():
    common = load("coll_common")
    assert common.parse_sizes("64KiB, 1MiB,2GiB,1MB,4096") == [65536, 2**20, 2**31, 10**6, 4096]
    assert common.size_label(64 * 2**20) == "64MiB" and common.size_label(1000) == "1000B"
    assert common.rows_per_rank(2**20, 8) == 2**20 // (8 * 256)
    assert common.bus_factor("all_to_all", 8) == 7 / 8
    assert common.bus_factor("all_reduce", 4) == 1.5
    # The slowest rank of each repetition, then the median over repetitions.
    assert common.slowest_rank_median([[1.0, 5.0, 2.0], [3.0, 1.0, 1.0]]) == (3.0, 2.0, 5.0)
    line = common.coll_line("sok", "all_to_all", "nccl", "GPU", 8, 2**20, 1e-3, 1e-3, 1e-3, 20, 5)
    fields = coll_fields(line)[0]
    assert fields["algbw_GBps"] == "1.049" and fields["busbw_GBps"] == "0.918"
    with pytest.raises(ValueError):
        common.parse_size("12 parsecs")


def test_torch_script_compiles():
    py_compile.compile(os.path.join(BENCH, "torch_nccl.py"), doraise=True)


def test_torch_script_flags():
    if importlib.util.find_spec("torch") is None:
        pytest.skip("no PyTorch here: torch_nccl.py runs on the GPU machines (torchrun)")
    args = load("torch_nccl").parse_args(["--sizes", "64KiB,1MiB", "--iters", "2"])
    assert args.sizes == [65536, 2**20] and args.iters == 2 and args.ops == ["all_to_all",
                                                                             "all_reduce"]


def horovodrun_job(script, *args):
    """`horovodrun -np 2 --gloo -H localhost:2 python script args` on the CPU; the finished
    process (output in .stdout). A job over JOB_TIMEOUT fails the test."""
    if not os.path.exists(HOROVODRUN):
        pytest.skip(f"horovodrun not found next to {sys.executable} (bash tools/install_horovod.sh)")
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", TF_CPP_MIN_LOG_LEVEL="2",
               HOROVOD_GLOO_TIMEOUT_SECONDS="60", SOK_COLLECTIVE_TIMEOUT_SECONDS="120")
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env["PYTHONPATH"] = os.pathsep.join([sok_pythonpath()] + [p for p in [env.get("PYTHONPATH")] if p])
    cmd = [HOROVODRUN, "-np", "2", "--gloo", "-H", "localhost:2", sys.executable, str(script),
           *args]
    try:
        return subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, timeout=JOB_TIMEOUT)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{' '.join(cmd)} hung for more than {JOB_TIMEOUT} s:\n{e.stdout}")


def test_run_under_horovod_on_cpu():
    proc = horovodrun_job(os.path.join(BENCH, "run.py"), "--sizes", "64KiB,256KiB", "--iters",
                          "2", "--warmup", "1", "--reps", "2", "--impls", "sok,sok_sized,horovod")
    out = proc.stdout
    assert proc.returncode == 0, out[-6000:]
    assert "CHECK FAILED" not in out, out[-6000:]
    # run.py's check before timing: rows rank*1000 + destination, all_reduce of rank+1.
    checked = CHECK_LINE.findall(out)
    assert len(checked) == 3 * 2 and all(ln.endswith(" ok") for ln in checked), out[-6000:]
    lines = coll_fields(out)
    got = {(f["impl"], f["op"], f["size"]) for f in lines}
    want = {(impl, op, size) for impl in ("sok", "sok_sized", "horovod")
            for op in ("all_to_all", "all_reduce") for size in ("64KiB", "256KiB")}
    assert got == want and len(lines) == len(want), out[-6000:]  # printed once, by rank 0
    for f in lines:
        assert f["ranks"] == "2" and f["device"] == "CPU", f
        assert float(f["ms"]) > 0 and float(f["algbw_GBps"]) > 0 and float(f["busbw_GBps"]) > 0, f
        assert int(f["bytes"]) == {"64KiB": 65536, "256KiB": 262144}[f["size"]], f
    # No GPU: SOK's collectives are Horovod's (Gloo), and Horovod's own run on Gloo.
    assert {f["backend"] for f in lines if f["impl"].startswith("sok")} == {"horovod"}, out[-6000:]
    assert {f["backend"] for f in lines if f["impl"] == "horovod"} == {"horovod-gloo"}


# run.py with SOK's all-to-all adding 1 to what rank 1 receives.
CORRUPTING_RUN = """import importlib.util, sys
import horovod.tensorflow as hvd
spec = importlib.util.spec_from_file_location("collectives_bench_run", sys.argv[1])
run = importlib.util.module_from_spec(spec)
spec.loader.exec_module(run)
exchange = run.SokImpl.all_to_all


def off_by_one_on_rank_1(self, x, counts):
    out, received = exchange(self, x, counts)
    return (out + 1.0 if hvd.rank() == 1 else out), received


run.SokImpl.all_to_all = off_by_one_on_rank_1
run.main(sys.argv[2:])
"""


def test_check_stops_every_rank_on_wrong_rows(tmp_path):
    """A rank that receives wrong rows fails the check, and the whole job ends (no hang)."""
    script = tmp_path / "corrupting_run.py"
    script.write_text(CORRUPTING_RUN)
    proc = horovodrun_job(script, os.path.join(BENCH, "run.py"), "--sizes", "64KiB", "--impls",
                          "sok", "--iters", "1", "--reps", "1")
    assert proc.returncode != 0, proc.stdout[-6000:]
    assert "CHECK FAILED rank=1 impl=sok all_to_all rows differ" in proc.stdout, proc.stdout[-6000:]
    assert not COLL_LINE.findall(proc.stdout), proc.stdout[-6000:]
