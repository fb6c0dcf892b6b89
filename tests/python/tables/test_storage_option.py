"""Multi-tier storage (DeepRec's StorageOption): the option's checks, each error naming the table."""
import os
import stat

import numpy as np
import pytest
import tensorflow as tf

import sparse_operation_kit as sok
from sparse_operation_kit.tables import storage
from tests.python.support import unique_name

DIM = 4
ROW = 4 * DIM + storage.ROW_META_BYTES  # one row before optimizer slots


def make(option, name=None, dim=DIM):
    name = name or unique_name("tiered")
    return sok.EmbeddingVariable(
        name, dim, initializer=tf.random_uniform_initializer(-1, 1, seed=3),
        ev_option=sok.EmbeddingVariableOption(storage_option=option))


# ---------------------------------------------------------------------------------------------
# API
# ---------------------------------------------------------------------------------------------
def test_names_and_deeprec_numbers():
    for name in ("DRAM", "HBM", "HBM_DRAM", "DRAM_SSDHASH", "HBM_DRAM_SSDHASH", "PMEM_MEMKIND",
                 "PMEM_LIBPMEM", "SSDHASH", "LEVELDB", "DRAM_PMEM", "DRAM_LEVELDB",
                 "DRAM_PMEM_SSDHASH"):
        assert sok.StorageType[name].name == name
    assert sok.StorageType.DRAM_SSDHASH == 12 and sok.StorageType.HBM_DRAM_SSDHASH == 102
    assert (sok.CacheStrategy.LRU, sok.CacheStrategy.LFU) == (0, 1)
    option = sok.StorageOption(sok.StorageType.DRAM)
    assert option.cache_strategy == sok.CacheStrategy.LFU
    assert option.storage_path is None and option.storage_size is None


def test_dram_alone_is_todays_table():
    for t in (sok.StorageType.DRAM, "DRAM", 1, sok.StorageType.DEFAULT):
        ev = make(sok.StorageOption(t))
        assert ev._storage.storage_type == sok.StorageType.DRAM and not ev._storage.tiered


# ---------------------------------------------------------------------------------------------
# Errors, each naming the table
# ---------------------------------------------------------------------------------------------
def expect_error(option, match, cls=ValueError, dim=DIM):
    name = unique_name("bad")
    with pytest.raises(cls, match=f"Embedding Variable '{name}': {match}"):
        make(option, name, dim)


def test_unknown_type_and_strategy():
    expect_error(sok.StorageOption("NVME"), "unknown storage_type 'NVME'")
    expect_error(sok.StorageOption(77), "unknown storage_type 77")
    expect_error(sok.StorageOption(sok.StorageType.DRAM, cache_strategy="MRU"),
                 "unknown cache_strategy 'MRU'")
    expect_error("DRAM", "storage_option must be sok.StorageOption", TypeError)


@pytest.mark.parametrize("t", ["HBM", "HBM_DRAM", "HBM_DRAM_SSDHASH"])
def test_hbm_types_are_refused_not_placed_elsewhere(t, tmp_path):
    expect_error(sok.StorageOption(t, str(tmp_path), [1 << 20] * (len(t.split("_")) - 1)),
                 f"storage_type {t} is not supported yet: HBM tiers need the GPU tier")


@pytest.mark.parametrize("t", ["PMEM_MEMKIND", "PMEM_LIBPMEM", "SSDHASH", "LEVELDB",
                               "DRAM_PMEM", "DRAM_LEVELDB", "DRAM_PMEM_SSDHASH"])
def test_unbuilt_types_are_refused(t, tmp_path):
    expect_error(sok.StorageOption(t, str(tmp_path), [1 << 20] * (len(t.split("_")) - 1)),
                 f"storage_type {t} is not supported: this build has no PMEM or LevelDB tier")


def test_storage_size_checks(tmp_path):
    path = str(tmp_path)
    expect_error(sok.StorageOption("DRAM_SSDHASH", path), "storage_size is missing")
    expect_error(sok.StorageOption("DRAM_SSDHASH", path, [ROW, ROW]),
                 "storage_size has 2 entries, but DRAM_SSDHASH has 1 cached tier")
    expect_error(sok.StorageOption("DRAM_SSDHASH", path, []), "storage_size has 0 entries")
    expect_error(sok.StorageOption("DRAM_SSDHASH", path, [-5]),
                 "storage_size of tier DRAM must be >= 0, got -5")
    expect_error(sok.StorageOption("DRAM_SSDHASH", path, [2.5]),
                 "storage_size of tier DRAM must be an integer", TypeError)
    expect_error(sok.StorageOption("DRAM_SSDHASH", path, [ROW - 1]),
                 f"the DRAM budget storage_size\\[0\\] = {ROW - 1} bytes is smaller than one row "
                 f"\\({ROW} bytes")
    expect_error(sok.StorageOption("DRAM", None, [1 << 20]),
                 "storage_size has 1 entries, but DRAM has 0 cached tier")


def test_storage_path_checks(tmp_path):
    expect_error(sok.StorageOption("DRAM_SSDHASH", None, [1 << 20]),
                 "DRAM_SSDHASH needs storage_path")
    missing = os.path.join(str(tmp_path), "nope")
    expect_error(sok.StorageOption("DRAM_SSDHASH", missing, [1 << 20]),
                 "storage_path '.*nope' is not an existing directory")
    a_file = os.path.join(str(tmp_path), "file")
    open(a_file, "w").close()
    expect_error(sok.StorageOption("DRAM_SSDHASH", a_file, [1 << 20]),
                 "storage_path .* is not an existing directory")
    expect_error(sok.StorageOption("DRAM", str(tmp_path)), "storage_path .* is given but DRAM "
                 "has no SSD tier")
    if os.geteuid() != 0:  # root writes anywhere
        locked = os.path.join(str(tmp_path), "locked")
        os.mkdir(locked)
        os.chmod(locked, stat.S_IRUSR | stat.S_IXUSR)
        try:
            expect_error(sok.StorageOption("DRAM_SSDHASH", locked, [1 << 20]),
                         "storage_path '.*locked' is not writable")
        finally:
            os.chmod(locked, stat.S_IRWXU)


def test_partitioned_table_names_its_part():
    with pytest.raises(ValueError, match="unknown storage_type"):
        sok.get_embedding_variable(
            unique_name("parts"), DIM, partitioner=tf.compat.v1.fixed_size_partitioner(2),
            ev_option=sok.EmbeddingVariableOption(storage_option=sok.StorageOption("X")))


def test_numpy_sizes_are_accepted(tmp_path):
    plan = storage.resolve(sok.StorageOption("DRAM_SSDHASH", str(tmp_path), np.array([ROW])),
                           "t", DIM)
    assert plan.tiered and plan.sizes == [ROW] and plan.path == str(tmp_path)
