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
    for extra in (["--impls", "sok,tf"], ["--check", "2"], ["--harness", "x"]):
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


def _two_cpu_ranks(*args, timeout=600):
    """run.py --horovod ARGS under horovodrun -np 2 (Gloo, no GPU): the completed process."""
    cmd = [HOROVODRUN, "-np", "2", "-H", "localhost:2", "--gloo", sys.executable, RUN,
           "--horovod", *args]
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)


def _horovod_lines(r):
    """The HOROVOD lines' key=value pairs, after horovodrun's "[0]<stdout>:" prefixes."""
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    lines = [line.split("HOROVOD ", 1)[1] for line in r.stdout.splitlines() if "HOROVOD " in line]
    return [dict(w.split("=", 1) for w in line.split()) for line in lines]


@pytest.mark.skipif(not os.path.exists(HOROVODRUN), reason="no horovodrun next to the interpreter")
def test_horovod_mode_on_two_cpu_ranks():
    """--horovod under horovodrun -np 2 (Gloo, CPU): SOK's tables sharded over the two ranks, each
    rank its own ids; rank 0 prints one HOROVOD line per mode."""
    r = _two_cpu_ranks(*TINY, "--device", "cpu", "--mode", "both", "--dists", "uniform",
                       "--rounds", "1", "--steps", "2", "--warmup", "1")
    lines = _horovod_lines(r)
    assert len(lines) == 2, r.stdout
    for mode, kv in zip(("graph", "function"), lines):
        assert kv["mode"] == mode and kv["dist"] == "uniform", kv
        assert kv["ranks"] == "2" and kv["batch_per_rank"] == "64", kv
        assert float(kv["step_ms"]) > 0 and float(kv["samples_per_s"]) > 0, kv
        assert float(kv["sent_MB_per_rank"]) > 0 and len(kv["rank_step_ms"].split(",")) == 2


@pytest.mark.skipif(not os.path.exists(HOROVODRUN), reason="no horovodrun next to the interpreter")
def test_horovod_profile_prints_every_ranks_table():
    """--horovod --profile: both ranks trace the same steps (their collectives pair up) and each
    prints its traced step's op table, the exchange's all-to-alls in it."""
    r = _two_cpu_ranks(*TINY, "--device", "cpu", "--mode", "both", "--dists", "uniform",
                       "--warmup", "1", "--profile", "40")
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    for rank in (0, 1):
        lines = [ln for ln in r.stdout.splitlines() if ln.startswith(f"[{rank}]<stdout>:")]
        traced = [ln for ln in lines if "traced step" in ln]
        assert len(traced) == 2 * 2, "\n".join(lines)  # two traced steps per mode
        assert any("SokExchangePlan" in ln for ln in lines), "\n".join(lines)


def check_losses(out):
    """{(mode, impl): [losses]} of --check's CHECK lines."""
    losses = {}
    for line in out.splitlines():
        if line.startswith("CHECK"):
            kv = dict(w.split("=", 1) for w in line.split() if "=" in w)
            words = line.split("losses=", 1)[1].split()
            losses[(kv["mode"], kv["impl"])] = [float(x) for x in words[:3]]
    return losses


def test_mlp_keeps_sok_and_tf_equal():
    """--mlp 8,8: the same MLP for sok and tf (deterministic weights, the same Adagrad), so --check
    still finds equal losses; and the MLP is really in the step: the losses differ from the
    stand-in's and fall as the MLP and the tables train."""
    common = ["--check", "3", "--mode", "both", "--impls", "sok,tf", "--dists", "uniform"]
    out = run(*common, "--mlp", "8,8", timeout=120)
    lines = [line for line in out.splitlines() if line.startswith("CHECK")]
    assert len(lines) == 2 * 2 and all(line.endswith("OK") for line in lines), out
    assert "check passed" in out
    with_mlp = check_losses(out)
    plain = check_losses(run(*common, timeout=120))
    for key, losses in with_mlp.items():
        np.testing.assert_allclose(losses, with_mlp[("graph", "sok")], rtol=1e-5, err_msg=key)
        assert losses != plain[key], (key, losses, plain[key])
        assert losses[-1] < losses[0], (key, losses)


def test_mlp_runs_in_the_timing_table():
    out = run("--mlp", "8,8", "--impls", "sok,tf", "--mode", "both", "--rounds", "1", "--steps",
              "1", "--warmup", "1", "--dists", "uniform", timeout=120)
    assert "mlp=8,8" in out, out
    rows = {tuple(line.split()[:3]) for line in out.splitlines()
            if line.startswith(("graph ", "function "))}
    assert {("graph", "uniform", "wall"), ("function", "uniform", "wall")} <= rows, out
    assert "tf/sok" in out


def test_batch_flags_refuse_mixing_and_bad_values(capsys):
    bench = load_bench()
    for extra in (["--horovod"], []):
        with pytest.raises(SystemExit):
            bench.parse_args([*extra, "--batch", "8", "--global-batch", "16"])
        err = capsys.readouterr().err
        assert "--global-batch" in err and "exclude each other" in err, err
    for bad in ("8,x", "0", ""):
        with pytest.raises(SystemExit):
            bench.parse_args(["--mlp", bad])
        assert "--mlp wants a comma list" in capsys.readouterr().err
    # Without --horovod the global batch is the one process's batch; with it, per rank later.
    assert bench.parse_args(["--global-batch", "16"]).batch == 16
    args = bench.parse_args(["--horovod", "--global-batch", "16", "--mlp", "4,2"])
    assert args.batch is None and args.mlp == [4, 2]
    bench.resolve_batch(args, 4)
    assert args.batch == 4
    args = bench.parse_args(["--horovod", "--global-batch", "10"])
    with pytest.raises(SystemExit) as e:
        bench.resolve_batch(args, 4)
    assert "--global-batch 10 does not divide among 4 ranks" in str(e.value)
    # Per rank (--batch) stays weak scaling: resolve_batch leaves it.
    args = bench.parse_args(["--horovod", "--batch", "10"])
    bench.resolve_batch(args, 4)
    assert args.batch == 10 and args.global_batch is None


@pytest.mark.skipif(not os.path.exists(HOROVODRUN), reason="no horovodrun next to the interpreter")
def test_horovod_strong_scaling_with_mlp_on_two_cpu_ranks():
    """--global-batch 8 --mlp 8,8 under horovodrun -np 2: each rank 4 samples, the MLP's gradients
    averaged over the ranks, so both ranks end with the same weights (mlp_in_sync=yes)."""
    r = _two_cpu_ranks(*[a for a in TINY if a not in ("--batch", "64")], "--global-batch", "8",
                       "--mlp", "8,8", "--device", "cpu", "--mode", "both", "--dists", "uniform",
                       "--rounds", "1", "--steps", "2", "--warmup", "1", timeout=120)
    lines = _horovod_lines(r)
    assert len(lines) == 2, r.stdout
    for mode, kv in zip(("graph", "function"), lines):
        assert kv["mode"] == mode and kv["ranks"] == "2" and kv["scaling"] == "strong", kv
        assert kv["global_batch"] == "8" and kv["batch_per_rank"] == "4", kv
        assert kv["mlp"] == "8,8" and kv["mlp_in_sync"] == "yes", kv
        # 3 fields x dim 16 -> 8 -> 8 -> 1: weights and biases, float32.
        assert float(kv["allreduce_MB"]) == round(4 * (48 * 8 + 8 + 8 * 8 + 8 + 8 + 1) / 1e6, 3)


@pytest.mark.skipif(not os.path.exists(HOROVODRUN), reason="no horovodrun next to the interpreter")
def test_horovod_global_batch_must_divide_among_ranks():
    r = _two_cpu_ranks("--fields", "3", "--vocab", "500", "--global-batch", "7", "--device",
                       "cpu", "--dists", "uniform", timeout=120)
    assert r.returncode != 0, r.stdout[-4000:]
    assert "--global-batch 7 does not divide among 2 ranks" in r.stdout + r.stderr, \
        r.stdout[-4000:] + r.stderr[-4000:]
