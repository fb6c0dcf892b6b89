"""Multi-tier storage (DeepRec's StorageOption): the option's checks, each error naming the table."""
import os
import stat

import numpy as np
import pytest
import tensorflow as tf

import sparse_operation_kit as sok
from sparse_operation_kit.tables import storage
from tests.python.support import unique_name
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

# DRAM_SSDHASH tables live on the CPU (the tier is built there), also under SOK_TEST_DEVICE=gpu;
# HBM_DRAM is tests/python/tables/test_storage_gpu_tier.py's.
pytestmark = pytest.mark.cpu_placement


@pytest.fixture(autouse=True)
def _eager_ops_on_the_cpu():
    with tf.device("/CPU:0"):
        yield


ROW = 4 * DIM + storage.ROW_META_BYTES  # one row before optimizer slots


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


def test_hbm_dram_ssdhash_on_the_cpu_is_refused_not_placed_elsewhere(tmp_path):
    name = unique_name("hbm_ssd_on_cpu")
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=f"table '{name}': storage HBM_DRAM_SSDHASH caches rows in GPU "
                             "memory; place the table on a GPU"):
        ev = make(sok.StorageOption("HBM_DRAM_SSDHASH", str(tmp_path), [1 << 20] * 2), name)
        ev.sparse_read(tf.constant([1, 2], tf.int64)).numpy()
    assert ssd_dirs(tmp_path) == []  # refused before any directory was made


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


# ---------------------------------------------------------------------------------------------
# DRAM_SSDHASH: the same results as the table without StorageOption, to the bit
# ---------------------------------------------------------------------------------------------
OPTIMIZERS = {
    "adagrad": lambda: tf.compat.v1.train.AdagradOptimizer(0.1),
    "adam": lambda: tf.compat.v1.train.AdamOptimizer(0.05),
}
# Optimizers without a fused kernel: their slots live in slot stores (generic_optimizer.py).
GENERIC = {
    "momentum": lambda: tf.compat.v1.train.MomentumOptimizer(0.1, 0.9),
    "rmsprop": lambda: tf.keras.optimizers.RMSprop(0.01),
}


def tiered(path, strategy=sok.CacheStrategy.LFU, rows=3):
    return sok.StorageOption(sok.StorageType.DRAM_SSDHASH, str(path), [rows * ADAM_ROW], strategy)


def batches(steps=12, seed=0):
    return id_batches(steps, seed, size=7)


def eager_run(name, option, opt_name, ids_batches, ev=None):
    ev = ev or make(option, name)
    return ev, train(ev, OPTIMIZERS[opt_name], ids_batches)


@pytest.mark.parametrize("strategy", [sok.CacheStrategy.LFU, sok.CacheStrategy.LRU])
@pytest.mark.parametrize("opt_name", sorted(OPTIMIZERS))
def test_eager_training_equals_the_dram_table(tmp_path, opt_name, strategy):
    name = unique_name("eager")  # one name: both tables start from the same initial values
    two, one = make(tiered(tmp_path, strategy), name), make(None, name)
    assert_trains_like_one_tier(two, one, OPTIMIZERS[opt_name], batches(), more_rows_than=3)
    # Most rows are in the SSD tier's file.
    (d,) = ssd_dirs(tmp_path)
    assert os.path.getsize(os.path.join(str(tmp_path), d, "rows.log")) > 10 * ADAM_ROW


def test_files_are_removed_with_the_table(tmp_path):
    import gc

    ev, _ = eager_run(unique_name("gone"), tiered(tmp_path), "adagrad", batches(4))
    assert len(ssd_dirs(tmp_path)) == 1
    del ev, _
    gc.collect()
    assert ssd_dirs(tmp_path) == []


def test_dump_load_round_trip(tmp_path):
    name = unique_name("dumped")
    ids = batches(16, seed=4)
    ssd = tmp_path / "ssd"
    ssd.mkdir()
    a, _ = eager_run(name, tiered(ssd), "adam", ids[:8])
    sok.dump(str(tmp_path / "dump"), [a])
    b = make(tiered(ssd), name)
    sok.load(str(tmp_path / "dump"), [b])
    assert_same_table(a, b)
    assert_continues_like_one_tier(b, name, OPTIMIZERS["adam"], ids[:8], ids[8:])


def graph_train(name, option, opt_name, ids_batches, save=None, restore=None):
    """TF1 Session training; returns each step's rows and the final (keys, values)."""
    from tests.python.support import graph_session

    with graph_session() as sess, tf.device("/CPU:0"):
        ev = sok.get_embedding_variable(
            name, DIM, initializer=tf.random_uniform_initializer(-1, 1, seed=3),
            ev_option=sok.EmbeddingVariableOption(storage_option=option))
        ids = tf.compat.v1.placeholder(tf.int64, [None])
        rows = tf.nn.embedding_lookup(ev, ids)
        loss = tf.reduce_sum(rows * rows * tf.range(1.0, DIM + 1.0))
        gs = tf.compat.v1.train.get_or_create_global_step()
        new_opt = OPTIMIZERS.get(opt_name) or GENERIC[opt_name]
        train = sok.OptimizerWrapper(new_opt()).minimize(loss, global_step=gs)
        for key, value in ((tf.compat.v1.GraphKeys.TRAIN_OP, train), ("rows", rows), ("ids", ids)):
            tf.compat.v1.add_to_collection(key, value)  # for a meta graph's importer
        saver = tf.compat.v1.train.Saver()
        sess.run(tf.compat.v1.global_variables_initializer())
        if restore:
            saver.restore(sess, restore)
        outs = [sess.run([rows, train], {ids: b})[0] for b in ids_batches]
        if save:
            saver.save(sess, save)
        keys, values = sess.run(ev.export()[:2])
        order = np.argsort(keys)
        return outs, keys[order], values[order]


@pytest.mark.parametrize("opt_name", sorted(OPTIMIZERS) + ["momentum"])
def test_tf1_session_and_saver_equal_the_dram_table(tmp_path, opt_name):
    name = unique_name("graph")
    ids = batches(14, seed=7)
    ssd = tmp_path / "ssd"
    ssd.mkdir()
    want, keys, values = graph_train(name, None, opt_name, ids)
    first, _, _ = graph_train(name, tiered(ssd, sok.CacheStrategy.LRU), opt_name, ids[:7],
                              save=str(tmp_path / "model"))
    second, k2, v2 = graph_train(name, tiered(ssd, sok.CacheStrategy.LRU), opt_name, ids[7:],
                                 restore=str(tmp_path / "model"))
    assert_same_steps(first + second, want)
    np.testing.assert_array_equal(k2, keys)
    np.testing.assert_array_equal(v2, values)
    assert ssd_dirs(ssd) == []  # each session's table went with its session


# ---------------------------------------------------------------------------------------------
# Where the option travels, and where it is refused
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("strategy", [sok.CacheStrategy.LFU, sok.CacheStrategy.LRU])
@pytest.mark.parametrize("opt_name", sorted(GENERIC))
def test_generic_optimizers_equal_the_dram_table(tmp_path, opt_name, strategy):
    table, stores = assert_generic_optimizer_matches(tiered(tmp_path, strategy),
                                                     GENERIC[opt_name], batches())
    # The table and each slot store keep most of their rows in a file of their own.
    dirs = ssd_dirs(tmp_path)
    assert len(dirs) == 1 + len(stores)
    assert sum(d.startswith(f"sok_ev_{table.name}.") for d in dirs) == 1
    for d in dirs:
        assert os.path.getsize(os.path.join(str(tmp_path), d, "rows.log")) > 10 * (4 * DIM)


def test_meta_graph_import_keeps_the_storage(tmp_path):
    from tests.python.support import graph_session

    ssd = tmp_path / "ssd"
    ssd.mkdir()
    name = unique_name("meta")
    with graph_session() as sess, tf.device("/CPU:0"):
        sok.get_embedding_variable(
            name, DIM, ev_option=sok.EmbeddingVariableOption(
                storage_option=tiered(ssd, sok.CacheStrategy.LRU)))
        sess.run(tf.compat.v1.global_variables_initializer())
        tf.compat.v1.train.Saver().save(sess, str(tmp_path / "m"))
    with graph_session():
        tf.compat.v1.train.import_meta_graph(str(tmp_path / "m.meta"))
        (got,) = [v for v in tf.compat.v1.global_variables() if getattr(v, "name", "") == name]
        plan = got._storage
        assert plan.tiered and plan.path == str(ssd) and plan.sizes == [3 * ADAM_ROW]
        assert plan.strategy == sok.CacheStrategy.LRU


def test_meta_graph_import_trains_on_like_the_dram_table(tmp_path):
    """A TF1 program's meta graph with a tiered table and a generic optimizer (Momentum: its slot
    store is tiered too), imported into a new graph and restored, trains on equal to the DRAM
    table."""
    from tests.python.support import graph_session

    ssd = tmp_path / "ssd"
    ssd.mkdir()
    name = unique_name("meta_train")
    ids = batches(12, seed=9)
    want, _, _ = graph_train(name, None, "momentum", ids)
    first, _, _ = graph_train(name, tiered(ssd), "momentum", ids[:6], save=str(tmp_path / "m"))
    with graph_session() as sess:
        saver = tf.compat.v1.train.import_meta_graph(str(tmp_path / "m.meta"))
        saver.restore(sess, str(tmp_path / "m"))
        stores = [v for v in tf.compat.v1.global_variables()
                  if getattr(v, "name", "").startswith(name)]
        assert sorted(v.name for v in stores) == [name, f"{name}/momentum"]
        assert all(v._storage.tiered for v in stores)
        graph = sess.graph
        train = graph.get_collection(tf.compat.v1.GraphKeys.TRAIN_OP)[0]
        rows = graph.get_collection("rows")[0]
        fed = graph.get_collection("ids")[0]
        second = [sess.run([rows, train], {fed: b})[0] for b in ids[6:]]
    assert_same_steps(first + second, want)


def test_keras_config_keeps_the_storage(tmp_path):
    layer = sok.Embedding(DIM, name=unique_name("kcfg"),
                          ev_option=sok.EmbeddingVariableOption(storage_option=tiered(tmp_path)))
    clone = sok.Embedding.from_config(layer.get_config())
    assert clone.embedding_variable._storage.tiered
    assert clone.embedding_variable._storage.sizes == [3 * ADAM_ROW]


def test_partitioned_parts_each_get_a_directory(tmp_path):
    var = sok.get_embedding_variable(
        unique_name("parts"), DIM, partitioner=tf.compat.v1.fixed_size_partitioner(2),
        ev_option=sok.EmbeddingVariableOption(storage_option=tiered(tmp_path)))
    assert len(ssd_dirs(tmp_path)) == 2
    rows = tf.nn.embedding_lookup(var, tf.constant(np.arange(20), tf.int64))
    assert rows.shape == (20, DIM) and sum(int(p.size()) for p in var) == 20


def test_the_kernel_refuses_what_python_would(tmp_path):
    from sparse_operation_kit.runtime._ops import ops

    handle = ops.sok_embedding_variable_handle(key_dtype=tf.int64, shared_name=unique_name("raw"))
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match="Embedding Variable 'raw_t': storage_type 'DRAM_PMEM' is "
                             "not supported"):
        ops.sok_embedding_variable_initialize(
            handle, tf.zeros([0, DIM]), key_dtype=tf.int64, table_name="raw_t", dim=DIM,
            init_kind="constant", storage_type="DRAM_PMEM", storage_size=[1 << 20])
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match="Embedding Variable 'raw_t': storage_size has 1 entries, but "
                             "HBM_DRAM_SSDHASH has 2 cached tier"):
        ops.sok_embedding_variable_initialize(
            handle, tf.zeros([0, DIM]), key_dtype=tf.int64, table_name="raw_t", dim=DIM,
            init_kind="constant", storage_type="HBM_DRAM_SSDHASH", storage_path=str(tmp_path),
            storage_size=[1 << 20])
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match="table 'raw_t': storage HBM_DRAM_SSDHASH caches rows in GPU memory"):
        ops.sok_embedding_variable_initialize(
            handle, tf.zeros([0, DIM]), key_dtype=tf.int64, table_name="raw_t", dim=DIM,
            init_kind="constant", storage_type="HBM_DRAM_SSDHASH", storage_path=str(tmp_path),
            storage_size=[1 << 20, 1 << 20])
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match="table 'raw_t': the DRAM budget of 8 bytes is smaller than one row"):
        ops.sok_embedding_variable_initialize(
            handle, tf.zeros([0, DIM]), key_dtype=tf.int64, table_name="raw_t", dim=DIM,
            init_kind="constant", storage_type="DRAM_SSDHASH", storage_path=str(tmp_path),
            storage_size=[8])
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match="table 'raw_t': cannot make its SSD directory below"):
        ops.sok_embedding_variable_initialize(
            handle, tf.zeros([0, DIM]), key_dtype=tf.int64, table_name="raw_t", dim=DIM,
            init_kind="constant", storage_type="DRAM_SSDHASH",
            storage_path=str(tmp_path / "missing"), storage_size=[1 << 20])


def test_incremental_dump_covers_rows_in_both_tiers(tmp_path):
    name = unique_name("incr")
    ids = batches(10, seed=11)

    def run(option):
        ev = make(option, name)
        opt = sok.OptimizerWrapper(OPTIMIZERS["adagrad"]())
        _, _ = eager_run(name, None, "adagrad", ids[:6], ev=ev)  # its own optimizer: fresh steps
        since = sok.update_step(opt)
        for b in ids[6:]:
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(ev.sparse_read(tf.constant(b)))
            opt.apply_gradients([(tape.gradient(loss, ev), ev)])
        keys, values = sok.incremental_model_dump([ev], since)
        order = np.argsort(keys[0])
        return keys[0][order], values[0][order]

    k2, v2 = run(tiered(tmp_path))
    k1, v1 = run(None)
    assert k1.size > 0
    np.testing.assert_array_equal(k2, k1)
    np.testing.assert_array_equal(v2, v1)
