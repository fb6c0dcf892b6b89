"""A table larger than its upper tier trains, evicts, checkpoints and restores, and its rows equal
those of a small one-tier table trained on the same ids of a sample of keys: on the CPU a
DRAM_SSDHASH table ten times its DRAM budget (always), on a GPU an HBM_DRAM table whose rows and
slots exceed the GPU's memory (10% of the GPU as the row cache, the rest in pinned host memory).

The GPU case is opt-in by size: SOK_TEST_LARGE_TABLE_GB=<GB of rows and slots>, larger than the
GPU (the test checks it), with SOK_TEST_DEVICE=gpu. It needs about 4.6x that in host memory
(the host tier's slots, and the snapshots of sok.dump and sok.load beside the table; each phase
logs its peak), 1.1x on disk under SOK_TEST_LARGE_TABLE_DIR (default: pytest's tmp_path), and
minutes:

    SOK_TEST_DEVICE=gpu SOK_TEST_LARGE_TABLE_GB=100 python3 -m pytest -s \
        tests/python/tables/test_storage_larger_than_tier.py -k gpu

Where host memory is smaller than the GPU's, SOK_TEST_GPU_MEMORY_GB=<GB> caps the GPU memory
TensorFlow (and so every SOK table) may use, and the table must exceed that cap instead:

    SOK_TEST_DEVICE=gpu SOK_TEST_GPU_MEMORY_GB=8 SOK_TEST_LARGE_TABLE_GB=20 python3 -m pytest -s \
        tests/python/tables/test_storage_larger_than_tier.py -k gpu
"""
import gc
import os
import resource
import subprocess
import time
import types

import numpy as np
import pytest
import tensorflow as tf

import sparse_operation_kit as sok
from sparse_operation_kit.tables import storage
from tests.python.support import TEST_DEVICE, unique_name

GB = float(os.environ.get("SOK_TEST_LARGE_TABLE_GB", "0") or 0)
GPU_CAP_GB = float(os.environ.get("SOK_TEST_GPU_MEMORY_GB", "0") or 0)


def cap_gpu_memory():
    """With SOK_TEST_GPU_MEMORY_GB, TensorFlow's GPU:0 gets that much memory (its allocator holds
    every SOK table's GPU arrays). Set at import, before anything initialises the GPU."""
    gpus = tf.config.list_physical_devices("GPU")
    if GPU_CAP_GB <= 0 or TEST_DEVICE != "gpu" or not gpus:
        return
    tf.config.set_logical_device_configuration(
        gpus[0], [tf.config.LogicalDeviceConfiguration(memory_limit=int(GPU_CAP_GB * 1024))])


cap_gpu_memory()


def gpu_bytes():
    """The GPU memory this process may use: SOK_TEST_GPU_MEMORY_GB's cap, else the total of the
    GPU it uses (the first visible one)."""
    if GPU_CAP_GB > 0:
        config = tf.config.get_logical_device_configuration(tf.config.list_physical_devices("GPU")[0])
        assert config and config[0].memory_limit == int(GPU_CAP_GB * 1024), (
            "SOK_TEST_GPU_MEMORY_GB did not take: TensorFlow initialised the GPU before this "
            "module (run the file alone)")
        return int(GPU_CAP_GB * 1024) << 20
    first = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0] or "0"
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,"
                          "nounits", "-i", first], check=True, capture_output=True, text=True)
    return int(out.stdout.strip().splitlines()[0]) * (1 << 20)


class Trainer:
    """Adagrad steps on one table, loss sum(rows * w): a key's update depends only on how
    often the step holds it, so a table holding only the sample keys gets the same rows."""

    def __init__(self, name, dim, option, steps_to_live):
        self.ev = sok.EmbeddingVariable(
            name, dim, initializer=tf.random_uniform_initializer(-1, 1, seed=3),
            ev_option=sok.EmbeddingVariableOption(
                storage_option=option, evict_option=sok.GlobalStepEvict(steps_to_live)))
        self.opt = sok.OptimizerWrapper(tf.compat.v1.train.AdagradOptimizer(0.1))
        w = tf.range(1.0, dim + 1.0) / dim

        @tf.function(reduce_retracing=True)
        def step(ids):
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(self.ev.sparse_read(ids) * w)
            self.opt.apply_gradients([(tape.gradient(loss, self.ev), self.ev)])

        self.step = step

    def run(self, ids):
        self.step(tf.constant(ids, tf.int64))

    def read(self, keys):
        return self.ev.sparse_read(tf.constant(keys, tf.int64), training=False).numpy()


def log(what, t0):
    peak_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux
    print(f"[larger than its tier] {what}: {time.time() - t0:.1f} s (peak host memory "
          f"{peak_gb:.1f} GB)", flush=True)


def larger_than_its_tier(c, dump_dir):
    """c: dim, keys, batch, option (the tiered storage), limit (bytes the table's rows and
    slots must exceed: the upper tier's memory), device."""
    row_bytes = 4 * c.dim * 2  # the value and Adagrad's accumulator
    keep_from = c.keys // 20  # the second pass touches keys [keep_from, keys): the rest is evicted
    # What eviction keeps must still exceed the tier, or the dump and load would not test it.
    assert (c.keys - keep_from) * row_bytes > c.limit, (
        f"{c.keys} keys hold {c.keys * row_bytes / 1e6:.1f} MB of rows and slots, "
        f"{(c.keys - keep_from) * row_bytes / 1e6:.1f} MB after eviction: not more than the "
        f"{c.limit / 1e6:.1f} MB the table must exceed (ask for more GB)")
    sample = np.unique(np.linspace(0, c.keys - 1, 4096).astype(np.int64))
    name = unique_name("larger_than_its_tier")
    first = -(-c.keys // c.batch)  # steps of the first pass: every key once
    second = -(-(c.keys - keep_from) // c.batch)
    # A step of only the sample keys sits between the passes, so every second-pass update is
    # more than `second` steps after every first-pass one: eviction keeps exactly those keys.
    big = Trainer(name, c.dim, c.option, steps_to_live=second)
    small = Trainer(name, c.dim, None, steps_to_live=second)

    def both(ids):
        big.run(ids)
        small.run(ids[np.isin(ids, sample)])

    t0 = time.time()
    for s in range(first):
        both(np.concatenate([np.arange(s * c.batch, min(c.keys, (s + 1) * c.batch)), sample]))
    assert int(big.ev.size()) == c.keys
    log(f"{c.keys} keys ({c.keys * row_bytes / 1e6:.1f} MB of rows and slots, the tier above "
        f"{c.limit / 1e6:.1f} MB) inserted in {first} steps", t0)
    np.testing.assert_array_equal(big.read(sample), small.read(sample))

    t0 = time.time()
    both(sample)
    rng = np.random.default_rng(0)
    for s in range(second):
        lo = keep_from + s * c.batch
        ids = np.arange(lo, min(c.keys, lo + c.batch))
        hot = keep_from + rng.zipf(1.15, c.batch // 4) % (c.keys - keep_from)  # repeats
        both(np.concatenate([ids, hot.astype(np.int64), sample]))
    log(f"second pass, {second} steps", t0)
    np.testing.assert_array_equal(big.read(sample), small.read(sample))

    t0 = time.time()
    removed = int(big.ev.shrink(first + 1 + second))
    kept = c.keys - keep_from + int(np.sum(sample < keep_from))
    assert (removed, int(big.ev.size())) == (c.keys - kept, kept)
    assert kept * row_bytes > c.limit
    log(f"evicted {removed} keys, {kept} left", t0)

    t0 = time.time()
    sok.dump(dump_dir, [big.ev])
    log("sok.dump", t0)
    probe = np.unique(np.concatenate([sample, rng.integers(keep_from, c.keys, 100000)]))
    want = big.read(probe)
    big = None  # frees the table before its copy is loaded (its step function holds it)
    gc.collect()

    t0 = time.time()
    restored = Trainer(name, c.dim, c.option, steps_to_live=second)
    sok.load(dump_dir, [restored.ev])
    log("sok.load", t0)
    assert int(restored.ev.size()) == kept
    np.testing.assert_array_equal(restored.read(probe), want)
    # The slots came back too: two more steps on both tables keep the sample's rows equal.
    for _ in range(2):
        restored.run(sample)
        small.run(sample)
    np.testing.assert_array_equal(restored.read(sample), small.read(sample))


@pytest.mark.cpu_placement
def test_dram_ssdhash_table_ten_times_its_dram_budget(tmp_path):
    dim, keys = 8, 30000
    budget = keys * (4 * dim * 2 + storage.ROW_META_BYTES) // 10
    (tmp_path / "ssd").mkdir()
    option = sok.StorageOption(sok.StorageType.DRAM_SSDHASH, str(tmp_path / "ssd"), [budget])
    with tf.device("/CPU:0"):
        larger_than_its_tier(types.SimpleNamespace(dim=dim, keys=keys, batch=4096, option=option,
                                                   limit=budget), str(tmp_path / "dump"))


@pytest.mark.skipif(
    TEST_DEVICE != "gpu" or GB <= 0,
    reason="opt-in by size: SOK_TEST_DEVICE=gpu SOK_TEST_LARGE_TABLE_GB=<GB, more than the GPU>")
def test_hbm_dram_table_larger_than_the_gpu(tmp_path):
    dim, gpu = 128, gpu_bytes()
    option = sok.StorageOption(sok.StorageType.HBM_DRAM, storage_size=[gpu // 10],
                               cache_strategy=sok.CacheStrategy.LFU)
    larger_than_its_tier(
        types.SimpleNamespace(dim=dim, keys=int(GB * 1e9) // (8 * dim), batch=1 << 21,
                              option=option, limit=gpu),
        os.environ.get("SOK_TEST_LARGE_TABLE_DIR") or str(tmp_path))
