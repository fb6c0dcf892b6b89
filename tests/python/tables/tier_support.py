"""What the storage-tier tests share: a table under a StorageOption, a few eager training steps,
and the comparison of a tiered table with its one-tier twin."""
import os

import numpy as np
import tensorflow as tf

import sparse_operation_kit as sok
from sparse_operation_kit.tables import storage
from tests.python.support import sorted_export, unique_name

DIM = 4
ADAM_ROW = 4 * DIM * 3 + storage.ROW_META_BYTES  # a row with Adam's two slots


def make(option, name=None, dim=DIM, **ev_options):
    """An Embedding Variable with `option` (None: no StorageOption), deterministic initial rows;
    `ev_options`: more of EmbeddingVariableOption's arguments (filter_option, evict_option)."""
    name = name or unique_name("tiered")
    return sok.EmbeddingVariable(
        name, dim, initializer=tf.random_uniform_initializer(-1, 1, seed=3),
        ev_option=sok.EmbeddingVariableOption(storage_option=option, **ev_options))


def train(ev, new_optimizer, ids_batches, opt=None):
    """One eager step per batch through `opt` (default: sok.OptimizerWrapper(new_optimizer()));
    the rows each step read."""
    opt = opt or sok.OptimizerWrapper(new_optimizer())
    outs = []
    for ids in ids_batches:
        with tf.GradientTape() as tape:
            rows = ev.sparse_read(tf.constant(ids))
            loss = tf.reduce_sum(rows * rows * tf.range(1.0, ev.embedding_dim + 1.0))
        opt.apply_gradients([(tape.gradient(loss, ev), ev)])
        outs.append(rows.numpy())
    return outs


def id_batches(steps, seed, span=25, size=9):
    """`steps` batches of `size` int64 ids in [-span, span), the same for a given seed."""
    rng = np.random.RandomState(seed)
    return [rng.randint(-span, span, size=size).astype(np.int64) for _ in range(steps)]


def ssd_dirs(path):
    """The tables' directories under an SSD tier's storage_path."""
    return [d for d in os.listdir(path) if d.startswith("sok_ev_")]


def assert_same_steps(got, want):
    """The rows each training step read, bit for bit."""
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)


def assert_trains_like_one_tier(tiered, one, new_optimizer, ids_batches, more_rows_than):
    """`tiered` and its one-tier twin `one` (same name: the same initial rows) train alike: the
    rows of every step, the size, an evaluation read of keys trained or not, and the tables."""
    assert_same_steps(train(tiered, new_optimizer, ids_batches),
                      train(one, new_optimizer, ids_batches))
    assert int(tiered.size()) == int(one.size()) > more_rows_than
    every = tf.constant(np.arange(-50, 50, dtype=np.int64))
    np.testing.assert_array_equal(tiered.sparse_read(every, training=False).numpy(),
                                  one.sparse_read(every, training=False).numpy())
    assert int(tiered.size()) == int(one.size())  # the evaluation read inserted nothing
    assert_same_table(tiered, one)


def assert_continues_like_one_tier(restored, name, new_optimizer, done, rest):
    """`restored`, loaded from a table `name` trained on the batches `done`, trains on `rest` as
    a one-tier table trained on both does, and ends equal to it."""
    got = train(restored, new_optimizer, rest)
    one = make(None, name)
    train(one, new_optimizer, done)
    assert_same_steps(got, train(one, new_optimizer, rest))
    assert_same_table(restored, one)


def assert_generic_optimizer_matches(option, new_optimizer, ids_batches):
    """An optimizer without a fused kernel on a table under `option` and on a one-tier table:
    the rows of every step, the tables and the slot stores equal bit for bit, and each slot store
    is tiered like its table. Returns the tiered table and its slot stores."""
    name = unique_name("generic")
    runs = []
    for o in (option, None):
        ev, opt = make(o, name), sok.OptimizerWrapper(new_optimizer())
        runs.append((ev, opt, train(ev, None, ids_batches, opt)))
    (two, opt2, got), (one, opt1, want) = runs
    assert_same_steps(got, want)
    assert_same_table(two, one)
    names = opt1.get_slot_names()
    assert names and opt2.get_slot_names() == names
    stores = [opt2.get_slot(two, n) for n in names]
    for store, n in zip(stores, names):
        assert store._storage.storage_type == two._storage.storage_type
        assert store._storage.sizes == two._storage.sizes
        assert_same_table(store, opt1.get_slot(one, n))
    return two, stores


def assert_same_table(a, b):
    ea, eb = sorted_export(a), sorted_export(b)
    assert set(ea) == set(eb)
    for field in ea:
        np.testing.assert_array_equal(ea[field], eb[field], err_msg=field)
