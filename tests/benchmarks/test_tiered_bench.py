"""run.py --storage dram_ssd on a tiny shape (CPU): sok_tier (sok's tables in DRAM_SSDHASH storage,
DRAM a tenth of each table) trains like sok, and the timing table gives both step times and their
ratio, with the tier's files and file traffic. Each run is a subprocess (graph mode switches eager
execution off for the whole process). --storage hbm_dram and hbm_dram_ssd need a GPU: here only
their refusal and the per-table budgets, in-process."""
import importlib
import importlib.util
import os
import re
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RUN = os.path.join(ROOT, "benchmarks", "embedding", "run.py")
TINY = ["--fields", "2", "--vocab", "1000", "--batch", "64", "--ids-per-field", "6",
        "--min-ids-per-field", "1", "--device", "cpu", "--storage", "dram_ssd"]


def run(tmp_path, *args):
    r = subprocess.run([sys.executable, RUN, *TINY, "--storage-path", str(tmp_path), *args],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr[-4000:]
    return r.stdout


def tier_files(line):
    files, size = re.search(r"files: (\d+), (\d+) bytes", line).groups()
    return int(files), int(size)


@pytest.mark.parametrize("strategy", ["lfu", "lru"])
def test_tiered_tables_train_like_dram_ones(tmp_path, strategy):
    out = run(tmp_path, "--check", "6", "--mode", "both", "--impls", "sok",
              "--cache-strategy", strategy)
    checks = [ln for ln in out.splitlines() if ln.startswith("CHECK")]
    assert len(checks) == 2 * 2 * 2, out  # dists x modes x (sok, sok_tier)
    tiered = [ln for ln in checks if "impl=sok_tier " in ln]
    assert len(tiered) == 4 and all(ln.endswith("vs sok: OK") for ln in tiered), out
    assert "check passed" in out
    # Most rows were on file: 2 tables, DRAM for a tenth of each.
    tiers = [ln for ln in out.splitlines() if ln.startswith("TIER")]
    assert len(tiers) == 4, out
    for line in tiers:
        rows, on_file = map(int, re.search(r"(\d+) rows in all tables.*>= (\d+) rows on file",
                                           line).groups())
        assert on_file >= 0.85 * rows, line
        files, size = tier_files(line)
        assert files == 2 and size >= 160 * on_file, line
    assert os.listdir(tmp_path) == []  # removed afterwards


def test_timing_table_has_both_step_times_and_their_ratio(tmp_path):
    out = run(tmp_path, "--rounds", "2", "--steps", "1", "--warmup", "4", "--dists", "powerlaw")
    assert "sok ms" in out and "sok_tier ms" in out and "sok_tier/sok" in out, out
    wall = next(ln for ln in out.splitlines() if ln.startswith("graph     powerlaw  wall"))
    sok, tier, ratio = wall.split()[4:7]
    assert abs(float(tier) / float(sok) - float(ratio.rstrip("x"))) < 0.02 * float(ratio[:-1]), wall
    detail = next(ln for ln in out.splitlines() if "sok_tier tables:" in ln)
    written = re.search(r"\(demotions, compactions\): ([\d.]+) MB", detail).group(1)
    assert float(written) > 0 and tier_files(detail)[1] > 0, detail


@pytest.fixture(scope="module")
def bench():
    # Its own module name: tests/benchmarks/test_criteo.py imports the Criteo job's run.py.
    spec = importlib.util.spec_from_file_location("embedding_bench_run", RUN)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # also puts benchmarks/embedding on sys.path (impls)
    return module


@pytest.mark.parametrize("storage", ["hbm_dram", "hbm_dram_ssd"])
def test_hbm_tiers_are_refused_on_the_cpu(bench, capsys, storage):
    with pytest.raises(SystemExit) as e:
        bench.parse_args([*TINY, "--storage", storage])
    assert e.value.code == 2
    assert f"--storage {storage}: HBM tiers need a GPU (--device cpu)" in capsys.readouterr().err


def test_hbm_dram_is_refused_without_a_gpu(bench, capsys):
    import tensorflow as tf

    if tf.config.list_physical_devices("GPU"):
        pytest.skip("TensorFlow sees a GPU")
    with pytest.raises(SystemExit):
        bench.parse_args([*TINY, "--storage", "hbm_dram", "--device", "auto"])
    assert "HBM tiers need a GPU (TensorFlow sees no GPU)" in capsys.readouterr().err


def test_hbm_dram_budget_is_the_cache_fraction_of_each_table(bench, tmp_path):
    """Parsed as dram_ssd (hbm_dram is refused here), then switched: the budgets take
    --cache-fraction, not --dram-fraction, and the tables get no folder."""
    import sparse_operation_kit as sok
    from sparse_operation_kit.tables.storage import ROW_META_BYTES

    impls = importlib.import_module("impls")
    args = bench.parse_args([*TINY, "--dim", "8", "--cache-fraction", "0.25",
                             "--dram-fraction", "0.5", "--cache-strategy", "lru"])
    args.storage = "hbm_dram"
    batches = bench.make_batches(args, "powerlaw")
    tier = impls.Tier(args, batches)
    row = 4 * 8 * 2 + ROW_META_BYTES  # values + Adagrad's accumulator + metadata
    assert tier.dir is None and tier.row_bytes == row
    for f in range(args.fields):
        rows = len(np.unique(np.concatenate([b[f][0] for b in batches])))
        assert tier.final_rows[f] == rows
        budget = tier.option(f).storage_option
        assert budget.storage_type == sok.StorageType.HBM_DRAM
        assert budget.storage_path is None and budget.cache_strategy == sok.CacheStrategy.LRU
        assert budget.storage_size == [max(1, int(0.25 * rows)) * row]
        assert 0.25 * rows * row - row < budget.storage_size[0] <= 0.25 * rows * row
    text = tier.describe({"steps": 3, "wchar": 0})
    assert "HBM budget" in text and "rows (0.25)" in text and f"({row} B a row)" in text
    assert "host memory" in text
    tier.close()
    # The same arguments as dram_ssd: --dram-fraction and a folder below --storage-path.
    args.storage, args.storage_path = "dram_ssd", str(tmp_path)
    ssd = impls.Tier(args, batches)
    option = ssd.option(0).storage_option
    assert option.storage_type == sok.StorageType.DRAM_SSDHASH
    assert option.storage_size == [max(1, int(0.5 * ssd.final_rows[0])) * row]
    assert os.path.dirname(option.storage_path) == str(tmp_path)
    ssd.close()
    # hbm_dram_ssd: an HBM budget (--cache-fraction) over a DRAM one (--dram-fraction), files.
    args.storage = "hbm_dram_ssd"
    three = impls.Tier(args, batches)
    for f in range(args.fields):
        option = three.option(f).storage_option
        rows = three.final_rows[f]
        assert option.storage_type == sok.StorageType.HBM_DRAM_SSDHASH
        assert option.storage_size == [max(1, int(0.25 * rows)) * row,
                                       max(1, int(0.5 * rows)) * row]
        assert os.path.dirname(option.storage_path) == str(tmp_path)
    text = three.describe({})
    assert "HBM budget" in text and "DRAM budget" in text and "rows on file" in text, text
    three.close()
    assert os.listdir(tmp_path) == []
