"""Smoke and agreement tests of run.py on a tiny shape (CPU, or the GPU where TensorFlow sees one):
    .venv/bin/python -m pytest -q tests/benchmarks/test_embedding_run.py
Each run is a subprocess (graph mode switches eager execution off for the whole process)."""
import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RUN = os.path.join(ROOT, "benchmarks", "embedding", "run.py")
HARNESS = os.path.join(ROOT, "benchmarks", "gpu", "build", "fields", "bench_fields")
TINY = [
    "--fields",
    "3",
    "--vocab",
    "500",
    "--batch",
    "64",
    "--ids-per-field",
    "6",
    "--min-ids-per-field",
    "1",
]


def run(*args, timeout=600):
    r = subprocess.run(
        [sys.executable, RUN, *TINY, *args], capture_output=True, text=True, timeout=timeout
    )
    assert r.returncode == 0, r.stdout + r.stderr[-4000:]
    return r.stdout


@pytest.mark.parametrize("inputs", ["batched", "resident"])
def test_all_implementations_agree_in_both_modes(inputs):
    out = run("--check", "3", "--mode", "both", "--inputs", inputs)
    lines = [line for line in out.splitlines() if line.startswith("CHECK")]
    assert len(lines) == 2 * 2 * 3, out  # dists x modes x implementations
    assert all(line.endswith("OK") for line in lines), out
    assert "check passed" in out


@pytest.mark.parametrize("extra", [[], ["--ids-per-field", "4", "--min-ids-per-field", "4"]])
def test_timing_table_in_both_modes(extra):
    out = run(
        "--mode",
        "both",
        "--rounds",
        "1",
        "--steps",
        "1",
        "--warmup",
        "1",
        "--dists",
        "uniform",
        *extra,
    )
    rows = {
        tuple(line.split()[:3])
        for line in out.splitlines()
        if line.startswith(("graph ", "function "))
    }
    for mode in ("graph", "function"):
        for kind in ("wall", "cpu", "ran"):
            assert (mode, "uniform", kind) in rows, out
    assert "tf/sok" in out and "hash/sok" in out and "SOK kernels run in the timed steps" in out


def test_dumped_ids_are_the_benchmark_batches(tmp_path):
    run("--dump-ids", str(tmp_path), "--num-batches", "2")
    header = dict(line.split(" ", 1) for line in (tmp_path / "header.txt").read_text().splitlines()
                  if not line.startswith("#"))
    assert header["format"] == "sok_ids_v1" and header["fields"] == "3" and header["batch"] == "64"
    assert header["dists"] == "uniform powerlaw" and header["num_batches"] == "2"
    # Loaded under its own name: tests/benchmarks/test_criteo.py imports the Criteo job's run.py.
    spec = importlib.util.spec_from_file_location("embedding_bench_run", RUN)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    args = bench.parse_args([*TINY, "--num-batches", "2"])
    for dist in ("uniform", "powerlaw"):
        batches = bench.make_batches(args, dist)
        for b in range(2):
            for f in range(3):
                ids = np.fromfile(tmp_path / f"{dist}_b{b}_f{f}_ids.bin", "<i8")
                splits = np.fromfile(tmp_path / f"{dist}_b{b}_f{f}_splits.bin", "<i8")
                np.testing.assert_array_equal(ids, batches[b][f][0])
                np.testing.assert_array_equal(splits, batches[b][f][1])
                lengths = np.diff(splits)
                assert lengths.min() >= 1 and lengths.max() <= 6 and splits[-1] == len(ids)
    if os.path.exists(HARNESS):  # benchmarks/gpu/build_harness.sh; --parse-only needs no GPU
        r = subprocess.run(
            [HARNESS, str(tmp_path), "--parse-only"], capture_output=True, text=True, timeout=60
        )
        assert r.returncode == 0, r.stderr
        assert r.stdout.count("HARNESS_INPUT") == 2 and r.stdout.count(" ok") == 2, r.stdout


@pytest.mark.parametrize("extra", [[], ["--ids-per-field", "4", "--min-ids-per-field", "4"]])
def test_batched_inputs_give_each_field_its_ids(extra):
    """--inputs batched (one variable, split per step) and resident (variables per batch and
    field, or tensors for a tf.function) hand every implementation the same SparseTensors as the
    per-field variables, for every batch."""
    import tensorflow as tf

    spec = importlib.util.spec_from_file_location("embedding_bench_run", RUN)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    args = bench.parse_args([*TINY, "--num-batches", "3", *extra])
    batches = bench.make_batches(args, "powerlaw")
    batched, per_field = bench.BatchedIdInputs(args, batches), bench.IdInputs(args, batches)
    resident = bench.ResidentIdInputs(args, batches)
    captured = bench.ResidentIdInputs(args, batches, eager=True)  # function mode's: tensors
    for b, (got, want) in enumerate(
        [(batched.sparse(tf.constant(b, tf.int32)), per_field.sparse(tf.constant(b, tf.int32)))
         for b in range(3)]
        + [(resident.sparse(b), per_field.sparse(tf.constant(b, tf.int32))) for b in range(3)]
        + [(captured.sparse(b), per_field.sparse(tf.constant(b, tf.int32))) for b in range(3)]
    ):
        b %= 3
        assert len(got) == len(want) == 3
        for f, (g, w) in enumerate(zip(got, want)):
            ids, splits = batches[b][f]
            np.testing.assert_array_equal(g.values.numpy(), ids, err_msg=f"batch {b} field {f}")
            np.testing.assert_array_equal(g.values.numpy(), w.values.numpy())
            np.testing.assert_array_equal(g.indices.numpy(), w.indices.numpy())
            np.testing.assert_array_equal(g.dense_shape.numpy(), w.dense_shape.numpy())
            np.testing.assert_array_equal(
                np.bincount(g.indices.numpy()[:, 0], minlength=64), np.diff(splits))


@pytest.mark.parametrize("mode", ["graph", "function"])
def test_profile_names_each_implementations_ops(mode, tmp_path):
    """--profile in either mode: per implementation a traced step and its op table (SOK's fused
    ops by name), the records written to --trace-out; function mode adds when the runtime started
    the function."""
    trace = tmp_path / "trace.jsonl"
    out = run("--mode", mode, "--profile", "30", "--warmup", "1", "--dists", "uniform",
              "--inputs", "resident", "--trace-out", str(trace))
    for impl in ("sok", "tf", "hash"):
        assert f"[{impl}] traced step" in out, out
    assert "SokUniqueKeys" in out and "SokEmbeddingVariableSparseApply" in out, out
    assert ("runtime starts the function at" in out) == (mode == "function"), out
    records = [json.loads(line) for line in trace.read_text().splitlines()]
    assert {r["impl"] for r in records} == {"sok", "tf", "hash"}
    sok_ops = {rec[2] for r in records if r["impl"] == "sok" for rec in r["records"]}
    assert {"SokUniqueKeys", "SokPooledCombine", "SokEmbeddingVariableGather"} <= sok_ops, sok_ops


HOROVODRUN = os.path.join(os.path.dirname(sys.executable), "horovodrun")


def load_bench():
    spec = importlib.util.spec_from_file_location("embedding_bench_run", RUN)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


def test_horovod_flags_refuse_single_process_parts():
    bench = load_bench()
    assert bench.parse_args(["--horovod"]).impls == "sok"
    assert bench.parse_args([]).impls == "sok,tf,hash"
    for extra in (["--impls", "sok,tf"], ["--check", "2"], ["--profile", "5"]):
        with pytest.raises(SystemExit):
            bench.parse_args(["--horovod", *extra])


def test_horovod_exchange_bytes_count_keys_rows_and_gradients():
    """Two ranks, dim 2: rank 0 asks rank 1 for ids 1, 3 (distinct per field: 3 twice in one field
    is one key), rank 1 asks rank 0 for id 2 and keeps id 5."""
    bench = load_bench()
    splits = np.array([0, 3], np.int64)
    counts = np.stack([
        bench.keys_per_owner([[(np.array([1, 3, 3]), splits)]], 2),
        bench.keys_per_owner([[(np.array([2, 5, 5]), splits)]], 2),
    ])
    np.testing.assert_array_equal(counts[:, 0], [[0, 2], [1, 1]])
    sent = bench.exchange_bytes(counts, 2, 1)[:, 0]
    row, sizes = 8, (1 + 2) * 8  # one table: its count, signature, bad-id flag
    # Rank 0: 2 keys + their gradients out, 1 row back to rank 1; rank 1: 1 key + gradient, 2 rows.
    assert list(sent) == [2 * (16 + row) + row + sizes, (16 + row) + 2 * row + sizes]


@pytest.mark.skipif(not os.path.exists(HOROVODRUN), reason="no horovodrun next to the interpreter")
def test_horovod_mode_on_two_cpu_ranks():
    """--horovod under horovodrun -np 2 (Gloo, CPU): SOK's tables sharded over the two ranks, each
    rank its own ids; rank 0 prints one HOROVOD line per mode."""
    cmd = [HOROVODRUN, "-np", "2", "-H", "localhost:2", "--gloo", sys.executable, RUN,
           "--horovod", *TINY, "--device", "cpu", "--mode", "both", "--dists", "uniform",
           "--rounds", "1", "--steps", "2", "--warmup", "1"]
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    # horovodrun prefixes each rank's lines ("[0]<stdout>:"): the summary starts after that.
    lines = [line.split("HOROVOD ", 1)[1] for line in r.stdout.splitlines() if "HOROVOD " in line]
    assert len(lines) == 2, r.stdout
    for mode, line in zip(("graph", "function"), lines):
        kv = dict(w.split("=", 1) for w in line.split())
        assert kv["mode"] == mode and kv["dist"] == "uniform", line
        assert kv["ranks"] == "2" and kv["batch_per_rank"] == "64", line
        assert float(kv["step_ms"]) > 0 and float(kv["samples_per_s"]) > 0, line
        assert float(kv["sent_MB_per_rank"]) > 0 and len(kv["rank_step_ms"].split(",")) == 2
