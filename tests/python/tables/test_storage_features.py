"""Counter filters, eviction and tf.train.Checkpoint on tiered tables give what the same table in
one tier gives, bit for bit: DRAM_SSDHASH on the CPU (always), HBM_DRAM on a GPU (with
SOK_TEST_DEVICE=gpu). Each table's upper tier holds a few rows, so most rows live below it."""
import numpy as np
import pytest
import tensorflow as tf

import sparse_operation_kit as sok
from tests.python.support import TEST_DEVICE, unique_name
from tests.python.tables.tier_support import (
    ADAM_ROW,
    assert_same_steps,
    assert_same_table,
    id_batches,
    make,
    train,
)

ADAM = lambda: tf.compat.v1.train.AdamOptimizer(0.05)  # noqa: E731


def dram_ssd(tmp_path):
    return sok.StorageOption(sok.StorageType.DRAM_SSDHASH, str(tmp_path), [3 * ADAM_ROW])


def hbm_dram(tmp_path):
    return sok.StorageOption(sok.StorageType.HBM_DRAM, storage_size=[3 * ADAM_ROW])


TIERS = [
    pytest.param(dram_ssd, "/CPU:0", marks=pytest.mark.cpu_placement, id="dram_ssdhash"),
    pytest.param(hbm_dram, "/GPU:0", id="hbm_dram", marks=pytest.mark.skipif(
        TEST_DEVICE != "gpu", reason="HBM_DRAM needs SOK_TEST_DEVICE=gpu")),
]


def both(tier, tmp_path, name, **ev_options):
    """The tiered table and its one-tier twin (same name: the same initial rows)."""
    return make(tier(tmp_path), name, **ev_options), make(None, name, **ev_options)


@pytest.mark.parametrize("tier, device", TIERS)
def test_counter_filter(tier, device, tmp_path):
    name = unique_name("filtered")
    with tf.device(device):
        two, one = both(tier, tmp_path, name, filter_option=sok.CounterFilter(filter_freq=3),
                        init_option=sok.InitializerOption(default_value_no_permission=-0.5))
        ids = id_batches(10, seed=1)
        assert_same_steps(train(two, ADAM, ids), train(one, ADAM, ids))
        assert_same_table(two, one)
        every = tf.constant(np.arange(-30, 30, dtype=np.int64))
        got = two.sparse_read(every, training=False).numpy()
        np.testing.assert_array_equal(got, one.sparse_read(every, training=False).numpy())
        assert (got == -0.5).all(axis=1).any()  # keys not yet admitted read the default


@pytest.mark.parametrize("tier, device", TIERS)
def test_global_step_and_l2_eviction(tier, device, tmp_path):
    for evict, step in ((sok.GlobalStepEvict(steps_to_live=3), 10),
                        (sok.L2WeightEvict(l2_weight_threshold=0.9), 0)):
        name = unique_name("evicted")
        with tf.device(device):
            two, one = both(tier, tmp_path, name, evict_option=evict)
            ids = id_batches(10, seed=2)
            assert_same_steps(train(two, ADAM, ids), train(one, ADAM, ids))
            removed = int(two.shrink(step))
            assert removed == int(one.shrink(step)) > 0
            assert int(two.size()) == int(one.size()) > 0
            assert_same_table(two, one)
            more = id_batches(4, seed=3)
            assert_same_steps(train(two, ADAM, more), train(one, ADAM, more))
            assert_same_table(two, one)


@pytest.mark.parametrize("tier, device", TIERS)
def test_tf_train_checkpoint(tier, device, tmp_path):
    name = unique_name("ckpt")
    ids = id_batches(12, seed=4)
    with tf.device(device):
        saved, one = both(tier, tmp_path, name)
        opt = sok.OptimizerWrapper(ADAM())
        train(saved, None, ids[:6], opt)
        path = tf.train.Checkpoint(table=saved, optimizer=opt).save(str(tmp_path / "ckpt"))
        restored = make(tier(tmp_path), name)
        opt2 = sok.OptimizerWrapper(ADAM())
        tf.train.Checkpoint(table=restored, optimizer=opt2).restore(path).assert_existing_objects_matched()
        assert_same_table(restored, saved)
        # The slots and the optimizer's step (restored when the first step makes it) came back:
        # training goes on like the one-tier table.
        opt1 = sok.OptimizerWrapper(ADAM())
        train(one, None, ids[:6], opt1)
        assert_same_steps(train(restored, None, ids[6:], opt2), train(one, None, ids[6:], opt1))
        assert_same_table(restored, one)
