"""HBM and HBM_DRAM (GPU memory as a tier): with SOK_TEST_DEVICE=gpu, a table whose GPU cache
holds a few rows trains exactly like a one-tier table, and an HBM table is that one-tier table; on
the CPU both types are refused, naming the table."""
import numpy as np
import pytest
import tensorflow as tf

import sparse_operation_kit as sok
from sparse_operation_kit.tables import storage
from tests.python.support import TEST_DEVICE, sorted_export, unique_name
from tests.python.tables.tier_support import (
    DIM,
    assert_generic_optimizer_matches,
    assert_same_table,
    make,
    train,
)

ADAM_ROW = 4 * DIM * 3 + storage.ROW_META_BYTES  # a row with Adam's two slots
OPTIMIZERS = {
    "sgd": lambda: tf.compat.v1.train.GradientDescentOptimizer(0.1),
    "adagrad": lambda: tf.compat.v1.train.AdagradOptimizer(0.1),
    "adam": lambda: tf.compat.v1.train.AdamOptimizer(0.05),
    "ftrl": lambda: tf.compat.v1.train.FtrlOptimizer(0.05, l1_regularization_strength=0.001),
}
on_gpu = pytest.mark.skipif(TEST_DEVICE != "gpu", reason="HBM_DRAM needs SOK_TEST_DEVICE=gpu")


def hbm_dram(strategy=sok.CacheStrategy.LFU, rows=3):
    return sok.StorageOption(sok.StorageType.HBM_DRAM, storage_size=[rows * ADAM_ROW],
                             cache_strategy=strategy)


def eager_run(ev, opt_name, ids_batches):
    return train(ev, OPTIMIZERS[opt_name], ids_batches)


def test_python_accepts_hbm_dram():
    plan = storage.resolve(hbm_dram(), "t", DIM)
    assert plan.tiered and plan.storage_type == sok.StorageType.HBM_DRAM
    assert plan.path == "" and plan.sizes == [3 * ADAM_ROW]
    with pytest.raises(ValueError, match="storage_path '/x' is given but HBM_DRAM has no SSD"):
        storage.resolve(sok.StorageOption("HBM_DRAM", "/x", [1 << 20]), "t", DIM)
    with pytest.raises(ValueError, match="the HBM budget storage_size\\[0\\] = 8 bytes"):
        storage.resolve(sok.StorageOption("HBM_DRAM", None, [8]), "t", DIM)


def test_python_accepts_hbm_alone():
    plan = storage.resolve(sok.StorageOption(sok.StorageType.HBM), "t", DIM)
    assert not plan.tiered and plan.storage_type == sok.StorageType.HBM and plan.sizes == []
    with pytest.raises(ValueError, match="storage_size has 1 entries, but HBM has 0 cached tier"):
        storage.resolve(sok.StorageOption("HBM", None, [1 << 20]), "t", DIM)


@pytest.mark.cpu_placement
@pytest.mark.parametrize("option, what", [
    (hbm_dram(), "storage HBM_DRAM caches rows in GPU memory"),
    (sok.StorageOption(sok.StorageType.HBM), "storage HBM keeps its rows in GPU memory"),
])
def test_cpu_placement_is_refused_naming_the_table(option, what):
    name = unique_name("hbm_on_cpu")
    with tf.device("/CPU:0"):
        with pytest.raises(tf.errors.InvalidArgumentError,
                           match=what + "; place the table on a GPU") as err:
            ev = make(option, name)
            ev.sparse_read(tf.constant([1, 2], tf.int64)).numpy()
    assert f"table '{name}" in str(err.value)


@on_gpu
def test_hbm_alone_is_the_one_tier_gpu_table():
    name = unique_name("hbm_alone")
    rng = np.random.RandomState(5)
    ids = [rng.randint(-40, 40, size=9).astype(np.int64) for _ in range(6)]
    hbm, one = make(sok.StorageOption(sok.StorageType.HBM), name), make(None, name)
    assert "GPU" in hbm.device
    for g, w in zip(eager_run(hbm, "adam", ids), eager_run(one, "adam", ids), strict=True):
        np.testing.assert_array_equal(g, w)
    ea, eb = sorted_export(hbm), sorted_export(one)
    for field in ea:
        np.testing.assert_array_equal(ea[field], eb[field], err_msg=field)


@on_gpu
@pytest.mark.parametrize("strategy", [sok.CacheStrategy.LFU, sok.CacheStrategy.LRU])
@pytest.mark.parametrize("opt_name", sorted(OPTIMIZERS))
def test_training_equals_the_one_tier_table(opt_name, strategy):
    name = unique_name("hbm")  # one name: both tables start from the same initial values
    rng = np.random.RandomState(7)
    ids = [rng.randint(-40, 40, size=9).astype(np.int64) for _ in range(15)]
    two, one = make(hbm_dram(strategy), name), make(None, name)
    for g, w in zip(eager_run(two, opt_name, ids), eager_run(one, opt_name, ids), strict=True):
        np.testing.assert_array_equal(g, w)
    assert int(two.size()) == int(one.size()) > 3 * 8
    every = tf.constant(np.arange(-50, 50, dtype=np.int64))
    np.testing.assert_array_equal(two.sparse_read(every, training=False).numpy(),
                                  one.sparse_read(every, training=False).numpy())
    assert int(two.size()) == int(one.size())  # the evaluation read inserted nothing
    assert_same_table(two, one)


@on_gpu
@pytest.mark.parametrize("strategy", [sok.CacheStrategy.LFU, sok.CacheStrategy.LRU])
def test_generic_optimizers_equal_the_one_tier_table(strategy):
    rng = np.random.RandomState(5)
    ids = [rng.randint(-30, 30, size=8).astype(np.int64) for _ in range(12)]
    assert_generic_optimizer_matches(hbm_dram(strategy), lambda: tf.keras.optimizers.RMSprop(0.01),
                                     ids)


@on_gpu
def test_dump_load_round_trip(tmp_path):
    name = unique_name("hbm_dump")
    rng = np.random.RandomState(3)
    ids = [rng.randint(-30, 30, size=8).astype(np.int64) for _ in range(12)]
    a = make(hbm_dram(), name)
    eager_run(a, "adam", ids[:6])
    sok.dump(str(tmp_path), [a])
    b = make(hbm_dram(), name)
    sok.load(str(tmp_path), [b])
    got = eager_run(b, "adam", ids[6:])
    one = make(None, name)
    eager_run(one, "adam", ids[:6])
    want = eager_run(one, "adam", ids[6:])
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)
    ea, eb = sorted_export(b), sorted_export(one)
    for field in ea:
        np.testing.assert_array_equal(ea[field], eb[field], err_msg=field)
