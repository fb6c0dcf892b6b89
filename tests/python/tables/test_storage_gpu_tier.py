"""HBM, HBM_DRAM and HBM_DRAM_SSDHASH (GPU memory as a tier): with SOK_TEST_DEVICE=gpu, a table
whose GPU cache holds a few rows (and, with an SSD tier, whose host memory holds a few more, the
rest on file) trains exactly like a one-tier table, and an HBM table is that one-tier table; on the
CPU these types are refused, naming the table."""
import gc
import os

import pytest
import tensorflow as tf

import sparse_operation_kit as sok
from sparse_operation_kit.tables import storage
from tests.python.support import TEST_DEVICE, unique_name
from tests.python.tables.tier_support import (
    ADAM_ROW,
    DIM,
    assert_continues_like_one_tier,
    assert_generic_optimizer_matches,
    assert_same_steps,
    assert_same_table,
    assert_trains_like_one_tier,
    id_batches,
    make,
    ssd_dirs,
    train,
)

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


def hbm_dram_ssd(path, strategy=sok.CacheStrategy.LFU, hbm_rows=3, dram_rows=4):
    return sok.StorageOption(sok.StorageType.HBM_DRAM_SSDHASH, str(path),
                             [hbm_rows * ADAM_ROW, dram_rows * ADAM_ROW], strategy)


def eager_run(ev, opt_name, ids_batches):
    return train(ev, OPTIMIZERS[opt_name], ids_batches)


def trained_on_ssd(tmp_path, name, strategy, opt_name, ids_batches):
    """An HBM_DRAM_SSDHASH table with its files in tmp_path/ssd, trained; and that directory, for
    the table it is restored into."""
    ssd = tmp_path / "ssd"
    ssd.mkdir()
    table = make(hbm_dram_ssd(ssd, strategy), name)
    eager_run(table, opt_name, ids_batches)
    return table, ssd


def test_python_accepts_hbm_dram():
    plan = storage.resolve(hbm_dram(), "t", DIM)
    assert plan.tiered and plan.storage_type == sok.StorageType.HBM_DRAM
    assert plan.path == "" and plan.sizes == [3 * ADAM_ROW]
    with pytest.raises(ValueError, match="storage_path '/x' is given but HBM_DRAM has no SSD"):
        storage.resolve(sok.StorageOption("HBM_DRAM", "/x", [1 << 20]), "t", DIM)
    with pytest.raises(ValueError, match="the HBM budget storage_size\\[0\\] = 8 bytes"):
        storage.resolve(sok.StorageOption("HBM_DRAM", None, [8]), "t", DIM)


def test_python_accepts_hbm_dram_ssdhash(tmp_path):
    plan = storage.resolve(hbm_dram_ssd(tmp_path), "t", DIM)
    assert plan.tiered and plan.storage_type == sok.StorageType.HBM_DRAM_SSDHASH
    assert plan.path == str(tmp_path) and plan.sizes == [3 * ADAM_ROW, 4 * ADAM_ROW]
    assert storage.tiers_of(plan.storage_type) == ("HBM", "DRAM", "SSDHASH")
    with pytest.raises(ValueError, match="HBM_DRAM_SSDHASH needs storage_path"):
        storage.resolve(sok.StorageOption("HBM_DRAM_SSDHASH", None, [1 << 20] * 2), "t", DIM)
    with pytest.raises(ValueError, match="storage_size has 1 entries, but HBM_DRAM_SSDHASH has 2"):
        storage.resolve(sok.StorageOption("HBM_DRAM_SSDHASH", str(tmp_path), [1 << 20]), "t", DIM)
    with pytest.raises(ValueError, match="the DRAM budget storage_size\\[1\\] = 8 bytes"):
        storage.resolve(sok.StorageOption("HBM_DRAM_SSDHASH", str(tmp_path), [1 << 20, 8]), "t",
                        DIM)


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


@pytest.mark.cpu_placement
def test_hbm_dram_ssdhash_cpu_placement_is_refused_naming_the_table(tmp_path):
    name = unique_name("hbm_ssd_on_cpu")
    with tf.device("/CPU:0"):
        with pytest.raises(tf.errors.InvalidArgumentError,
                           match="storage HBM_DRAM_SSDHASH caches rows in GPU memory; place the "
                                 "table on a GPU") as err:
            ev = make(hbm_dram_ssd(tmp_path), name)
            ev.sparse_read(tf.constant([1, 2], tf.int64)).numpy()
    assert f"table '{name}" in str(err.value)
    assert ssd_dirs(tmp_path) == []


@on_gpu
def test_hbm_alone_is_the_one_tier_gpu_table():
    name = unique_name("hbm_alone")
    ids = id_batches(6, seed=5, span=40)
    hbm, one = make(sok.StorageOption(sok.StorageType.HBM), name), make(None, name)
    assert "GPU" in hbm.device
    assert_same_steps(eager_run(hbm, "adam", ids), eager_run(one, "adam", ids))
    assert_same_table(hbm, one)


@on_gpu
@pytest.mark.parametrize("strategy", [sok.CacheStrategy.LFU, sok.CacheStrategy.LRU])
@pytest.mark.parametrize("opt_name", sorted(OPTIMIZERS))
def test_training_equals_the_one_tier_table(opt_name, strategy):
    name = unique_name("hbm")  # one name: both tables start from the same initial values
    two, one = make(hbm_dram(strategy), name), make(None, name)
    assert_trains_like_one_tier(two, one, OPTIMIZERS[opt_name], id_batches(15, seed=7, span=40),
                                more_rows_than=3 * 8)


@on_gpu
@pytest.mark.parametrize("strategy", [sok.CacheStrategy.LFU, sok.CacheStrategy.LRU])
def test_generic_optimizers_equal_the_one_tier_table(strategy):
    assert_generic_optimizer_matches(hbm_dram(strategy), lambda: tf.keras.optimizers.RMSprop(0.01),
                                     id_batches(12, seed=5, span=30, size=8))


@on_gpu
def test_dump_load_round_trip(tmp_path):
    name = unique_name("hbm_dump")
    ids = id_batches(12, seed=3, span=30, size=8)
    a = make(hbm_dram(), name)
    eager_run(a, "adam", ids[:6])
    sok.dump(str(tmp_path), [a])
    b = make(hbm_dram(), name)
    sok.load(str(tmp_path), [b])
    assert_continues_like_one_tier(b, name, OPTIMIZERS["adam"], ids[:6], ids[6:])


# ---------------------------------------------------------------------------------------------
# HBM_DRAM_SSDHASH: 3 rows in GPU memory, 4 in host memory, the rest on file
# ---------------------------------------------------------------------------------------------
@on_gpu
@pytest.mark.parametrize("strategy", [sok.CacheStrategy.LFU, sok.CacheStrategy.LRU])
@pytest.mark.parametrize("opt_name", sorted(OPTIMIZERS))
def test_ssd_training_equals_the_one_tier_table(tmp_path, opt_name, strategy):
    name = unique_name("hbm_ssd")
    three, one = make(hbm_dram_ssd(tmp_path, strategy), name), make(None, name)
    assert "GPU" in three.device
    assert_trains_like_one_tier(three, one, OPTIMIZERS[opt_name],
                                id_batches(15, seed=7, span=40), more_rows_than=7 * 4)
    (d,) = ssd_dirs(tmp_path)  # most rows are in the table's file
    assert os.path.getsize(os.path.join(str(tmp_path), d, "rows.log")) > 10 * (4 * DIM)
    del three
    gc.collect()
    assert ssd_dirs(tmp_path) == []  # the directory went with the table


@on_gpu
def test_ssd_generic_optimizer_equals_the_one_tier_table(tmp_path):
    _, stores = assert_generic_optimizer_matches(
        hbm_dram_ssd(tmp_path, sok.CacheStrategy.LRU), lambda: tf.keras.optimizers.RMSprop(0.01),
        id_batches(12, seed=5, span=30, size=8))
    assert len(ssd_dirs(tmp_path)) == 1 + len(stores)  # a directory per slot store


@on_gpu
def test_ssd_dump_load_round_trip(tmp_path):
    name = unique_name("hbm_ssd_dump")
    ids = id_batches(12, seed=3, span=30, size=8)
    a, ssd = trained_on_ssd(tmp_path, name, sok.CacheStrategy.LFU, "adam", ids[:6])
    sok.dump(str(tmp_path / "dump"), [a])
    b = make(hbm_dram_ssd(ssd), name)
    sok.load(str(tmp_path / "dump"), [b])
    assert_same_table(a, b)
    assert_continues_like_one_tier(b, name, OPTIMIZERS["adam"], ids[:6], ids[6:])


@on_gpu
def test_ssd_checkpoint_round_trip(tmp_path):
    name = unique_name("hbm_ssd_ckpt")
    a, ssd = trained_on_ssd(tmp_path, name, sok.CacheStrategy.LRU, "adagrad",
                            id_batches(10, seed=4, span=30, size=8))
    path = tf.train.Checkpoint(table=a).save(str(tmp_path / "ckpt"))
    b = make(hbm_dram_ssd(ssd, sok.CacheStrategy.LRU), name)
    tf.train.Checkpoint(table=b).restore(path).assert_existing_objects_matched()
    assert_same_table(a, b)
