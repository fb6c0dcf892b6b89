"""sok.dump / sok.load with SOK 2.x's optimizer contract: static tables (sok.Variable) trained by
the program's own optimizer, dynamic tables through sok.OptimizerWrapper, and the wrapper's slots
read as SOK 2.x programs read them (`_slots.get(var._unique_id)`)."""
import contextlib
import os

import numpy as np
import pytest
import tensorflow as tf

import sparse_operation_kit as sok
from sparse_operation_kit.checkpoint import dump as dump_module
from sparse_operation_kit.checkpoint.shard_file import ShardFile
from sparse_operation_kit.tables import storage
from sparse_operation_kit.tables.embedding_variable import EmbeddingVariable
from tests.python.support import TEST_DEVICE, sorted_export, unique_name
from tests.python.tables import tier_support

ROWS, DIM = 12, 3


def _legacy_sgd():
    tf_keras = pytest.importorskip("tf_keras")
    return tf_keras.optimizers.legacy.SGD(learning_rate=0.1, momentum=0.9)


PLAIN_OPTIMIZERS = {
    "tf_keras_legacy": _legacy_sgd,
    "v1": lambda: tf.compat.v1.train.MomentumOptimizer(0.1, momentum=0.9),
    "keras": lambda: tf.keras.optimizers.SGD(learning_rate=0.1, momentum=0.9),
}


def _step(var, optimizer, ids):
    """One SOK 2.x training step: lookup_sparse, then the program's own apply_gradients."""
    with tf.GradientTape() as tape:
        emb = sok.lookup_sparse([var], [tf.ragged.constant(ids, dtype=tf.int64)], combiners=["sum"])
        loss = tf.reduce_sum(emb[0] ** 2)
    optimizer.apply_gradients(zip(tape.gradient(loss, [var]), [var]))


def _batches(seed, n):
    rng = np.random.default_rng(seed)
    return [[list(rng.integers(0, ROWS, 3)) for _ in range(4)] for _ in range(n)]


def _momentum(optimizer, var):
    names = optimizer.get_slot_names() if hasattr(optimizer, "get_slot_names") else None
    if names is not None:
        return optimizer.get_slot(var, "momentum").numpy()
    # Keras 3 / tf_keras: the one variable shaped like the table ("..._momentum" or "m/...").
    slot = [v for v in optimizer.variables if tuple(v.shape) == tuple(var.shape)]
    assert len(slot) == 1, [v.name for v in optimizer.variables]
    return np.asarray(slot[0].numpy())


@pytest.mark.parametrize("flavor", sorted(PLAIN_OPTIMIZERS))
def test_static_table_dumps_the_plain_optimizers_slots(tmp_path, flavor, request):
    """A sok.Variable trained by a plain optimizer (no wrapper) dumps and reloads its slots with
    it; the restored table + optimizer then trains exactly as the uninterrupted run."""
    make = PLAIN_OPTIMIZERS[flavor]
    name = unique_name("static")
    init = np.random.default_rng(0).random([ROWS, DIM]).astype(np.float32)
    # TensorFlow has no GPU kernel for v1 Momentum's sparse update: that table lives on the CPU.
    if flavor == "v1":
        request.node.add_marker(pytest.mark.cpu_placement)
    with tf.device("/CPU:0" if flavor == "v1" else None):
        var, opt = sok.Variable(init, name=name), make()
    batches = _batches(1, 6)
    for ids in batches[:3]:
        _step(var, opt, ids)
    sok.dump(str(tmp_path), [var], opt)

    with tf.device("/CPU:0" if flavor == "v1" else None):
        var2, opt2 = sok.Variable(np.zeros_like(init), name=name), make()
    if hasattr(opt2, "build"):  # a Keras optimizer creates its slots when it is built
        opt2.build([var2])
    sok.load(str(tmp_path), [var2], opt2)
    np.testing.assert_array_equal(var2.numpy(), var.numpy())
    np.testing.assert_array_equal(_momentum(opt2, var2), _momentum(opt, var))
    assert np.abs(_momentum(opt, var)).sum() > 0

    for ids in batches[3:]:
        _step(var, opt, ids)
        _step(var2, opt2, ids)
    np.testing.assert_allclose(var2.numpy(), var.numpy(), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(_momentum(opt2, var2), _momentum(opt, var), rtol=1e-6, atol=1e-7)


def test_dynamic_table_with_a_plain_optimizer_is_refused(tmp_path):
    name = unique_name("dyn_plain")
    static = sok.Variable(np.ones([ROWS, DIM], np.float32), name=unique_name("static"))
    table = sok.DynamicVariable(dimension=DIM, initializer="0.5", name=name)
    opt = tf.compat.v1.train.MomentumOptimizer(0.1, momentum=0.9)
    for call in (sok.dump, sok.load):
        with pytest.raises(TypeError, match=rf"\['{name}'\].*sok.OptimizerWrapper"):
            call(str(tmp_path), [static, table], opt)
    with pytest.raises(TypeError, match="optimizer must be"):
        sok.dump(str(tmp_path), [static], object())


@pytest.mark.cpu_placement  # the dense variable's lookup runs on the CPU, beside it
def test_wrapper_slots_read_by_unique_id_as_sok2():
    """SOK 2.x programs: `optimizer._slots.get(var._unique_id)`, then get_slot / get_slot_names."""
    trained = sok.DynamicVariable(dimension=DIM, initializer="0.5", name=unique_name("uid"))
    untouched = sok.DynamicVariable(dimension=DIM, initializer="0.5", name=unique_name("uid"))
    with tf.device("/CPU:0"):  # TensorFlow has no GPU kernel for v1 Momentum's sparse update
        dense = tf.Variable(np.ones([ROWS, DIM], np.float32))
    assert isinstance(trained._unique_id, str)
    assert len({trained._unique_id, untouched._unique_id, dense._unique_id}) == 3
    opt = sok.OptimizerWrapper(tf.compat.v1.train.MomentumOptimizer(0.1, momentum=0.9))
    for ids in _batches(2, 2):
        _step(trained, opt, ids)
        _step(dense, opt, ids)

    assert opt._slots.get(untouched._unique_id) is None
    assert opt._slots.get("no such variable") is None
    assert opt.get_slot_names() == ["momentum"]
    slots = opt._slots.get(trained._unique_id)
    assert set(slots) == {"momentum"}
    assert slots["momentum"] is opt.get_slot(trained, "momentum")
    keys, values = sok.export(opt.get_slot(trained, "momentum"))
    assert keys.shape[0] == values.shape[0] > 0
    # A dense variable's slots come from the wrapped optimizer, keyed the same way.
    assert opt._slots[dense._unique_id]["momentum"] is opt.get_slot(dense, "momentum")
    assert dense._unique_id in opt._slots and untouched._unique_id not in opt._slots


def test_load_refuses_a_dumped_slot_the_plain_optimizer_lacks(tmp_path):
    """A Keras optimizer built without one of the tables has no slot to load its momentum into:
    an error naming the slot and the table, not a skipped slot."""
    init = np.random.default_rng(0).random([ROWS, DIM]).astype(np.float32)
    a, b = sok.Variable(init, name=unique_name("a")), sok.Variable(init, name=unique_name("b"))
    opt = tf.keras.optimizers.SGD(learning_rate=0.1, momentum=0.9)
    for ids in _batches(2, 2):
        with tf.GradientTape() as tape:
            embs = sok.lookup_sparse([a, b], [tf.ragged.constant(ids, dtype=tf.int64)] * 2)
            loss = tf.add_n([tf.reduce_sum(e**2) for e in embs])
        opt.apply_gradients(zip(tape.gradient(loss, [a, b]), [a, b]))
    sok.dump(str(tmp_path), [a, b], opt)
    fresh = tf.keras.optimizers.SGD(learning_rate=0.1, momentum=0.9)
    fresh.build([a])
    with pytest.raises(ValueError, match="slot of '.*b.*' but the SGD has none"):
        sok.load(str(tmp_path), [a, b], fresh)


def test_eager_snapshots_stay_in_host_memory(tmp_path, monkeypatch):
    """An eager export hands its rows over on the CPU and sok.load builds the snapshot it imports
    there, so a snapshot never needs GPU memory and a table larger than the GPU dumps and loads
    (under SOK_TEST_DEVICE=gpu the table is on the GPU)."""
    ev = sok.EmbeddingVariable(unique_name("host_snapshot"), DIM,
                               initializer=tf.random_uniform_initializer(-1, 1, seed=5))
    ev.sparse_read(tf.constant([1, 5, 9], tf.int64))  # inserts the keys
    exported = ev.export()
    assert all(t.device.endswith("CPU:0") for t in exported), [t.device for t in exported]
    want = ev.sparse_read(tf.constant([1, 5, 9], tf.int64), training=False).numpy()
    devices = []
    real = EmbeddingVariable.import_snapshot

    def recording(self, tensors, append=False, reserve_rows=0):
        devices.extend(t.device for t in tensors.values())
        return real(self, tensors, append, reserve_rows)

    monkeypatch.setattr(EmbeddingVariable, "import_snapshot", recording)
    sok.dump(str(tmp_path), [ev])
    ev.assign(tf.constant([1], tf.int64), tf.zeros([1, DIM]))
    sok.load(str(tmp_path), [ev])
    assert devices and all(d.endswith("CPU:0") for d in devices), devices
    np.testing.assert_array_equal(
        ev.sparse_read(tf.constant([1, 5, 9], tf.int64), training=False).numpy(), want)


def _storage(kind, path, dim):
    """A StorageOption whose upper tier holds 4 rows of Adagrad (None: one tier)."""
    row = 4 * dim * 2 + storage.ROW_META_BYTES
    return {
        "one_tier": None,
        "dram_ssdhash": sok.StorageOption(sok.StorageType.DRAM_SSDHASH, str(path), [4 * row]),
        "hbm_dram": sok.StorageOption(sok.StorageType.HBM_DRAM, storage_size=[4 * row]),
        "hbm_dram_ssdhash": sok.StorageOption(sok.StorageType.HBM_DRAM_SSDHASH, str(path),
                                              [4 * row, 12 * row]),
    }[kind]


_GPU_ONLY = pytest.mark.skipif(TEST_DEVICE != "gpu", reason="an HBM tier needs SOK_TEST_DEVICE=gpu")


@pytest.mark.parametrize("kind", [
    "one_tier", pytest.param("dram_ssdhash", marks=pytest.mark.cpu_placement),
    pytest.param("hbm_dram", marks=_GPU_ONLY), pytest.param("hbm_dram_ssdhash", marks=_GPU_ONLY),
])
def test_load_a_chunk_at_a_time_equals_one_import(tmp_path, monkeypatch, kind):
    """sok.load gives a table a dump LOAD_CHUNK_BYTES at a time (5 rows here), so a load holds
    little more than the table: its rows, slots, counts and versions equal the dumped table's and
    those of a load in one import, and later steps equal the latter's (under SOK_TEST_DEVICE=gpu
    the one-tier table is a GPU table)."""
    device = {"dram_ssdhash": "/CPU:0", "hbm_dram": "/GPU:0", "hbm_dram_ssdhash": "/GPU:0"}
    with tf.device(device[kind]) if kind in device else contextlib.nullcontext():
        _load_in_chunks_and_compare(tmp_path, monkeypatch, kind)


def _load_in_chunks_and_compare(tmp_path, monkeypatch, kind):
    dim = tier_support.DIM
    option = _storage(kind, tmp_path, dim)
    name = unique_name("chunked_load")
    adagrad = lambda: sok.OptimizerWrapper(tf.compat.v1.train.AdagradOptimizer(0.1))  # noqa: E731
    rng = np.random.default_rng(7)
    batches = [rng.integers(-40, 40, size=11).astype(np.int64) for _ in range(8)]
    dumped, opt = tier_support.make(option, name), adagrad()
    tier_support.train(dumped, None, batches[:5], opt)
    sok.dump(str(tmp_path / "dump"), [dumped], opt)
    rows = int(sorted_export(dumped)["keys"].size)

    calls = []
    real = EmbeddingVariable.import_snapshot

    def recording(self, tensors, append=False, reserve_rows=0):
        calls.append((int(tensors["keys"].shape[0]), append))
        return real(self, tensors, append, reserve_rows)

    monkeypatch.setattr(EmbeddingVariable, "import_snapshot", recording)
    loaded = {}
    for how, chunk_bytes in (("whole", 1 << 30), ("chunked", 5 * 4 * dim * 2)):
        monkeypatch.setattr(dump_module, "LOAD_CHUNK_BYTES", chunk_bytes)
        calls.clear()
        table, opt = tier_support.make(option, name), adagrad()
        sok.load(str(tmp_path / "dump"), [table], opt)
        tier_support.assert_same_table(table, dumped)
        loaded[how] = (table, opt)
    assert [a for _, a in calls] == [False] + [True] * (len(calls) - 1), calls
    assert [n for n, _ in calls] == [5] * (rows // 5) + ([rows % 5] if rows % 5 else [])
    steps = {how: tier_support.train(t, None, batches[5:], o) for how, (t, o) in loaded.items()}
    for want, got in zip(steps["whole"], steps["chunked"], strict=True):
        np.testing.assert_array_equal(got, want)
    tier_support.assert_same_table(loaded["chunked"][0], loaded["whole"][0])


def test_load_chunks_pick_the_rows_a_rank_owns_across_shards(tmp_path, monkeypatch):
    """sok.load's chunks over two shards with some rows owned elsewhere (a dump of N ranks loaded
    onto M): together they are the owned rows in order; a chunk owning nothing is left out; a
    shard without slots gives its rows the slots' initial values."""
    rng = np.random.default_rng(5)
    shards, want = [], {f: [] for f in ("keys", "values", "slots", "freqs", "versions")}
    init = np.array([0.5, 0.25], np.float32)
    for r, n in enumerate((10, 7)):
        arrays = {
            "keys": np.arange(n, dtype=np.int64) + 100 * r,
            "values": rng.standard_normal((n, 3)).astype(np.float32),
            "slots": (rng.standard_normal((n, 2, 3)).astype(np.float32) if r == 0
                      else np.zeros([n, 0, 3], np.float32)),
            "freqs": rng.integers(0, 9, n), "versions": rng.integers(0, 9, n),
            "dim": np.int64(3), "slot_kind": np.int32(1 if r == 0 else -1),
            "slot_init": init if r == 0 else np.zeros([0], np.float32),
        }
        np.savez(str(tmp_path / f"rank{r}-of-2.npz"), **arrays)
        shards.append(ShardFile(str(tmp_path / f"rank{r}-of-2.npz"), "t"))
        if r == 1:
            arrays["slots"] = np.broadcast_to(init[None, :, None], (n, 2, 3))
        for f in want:
            want[f].append(arrays[f])
    keys = np.concatenate(want["keys"])
    mine = np.zeros(keys.size, bool)
    mine[[1, 2, 8, 12, 16]] = True  # rows 3-7 (the second chunk of shard 0) are owned elsewhere
    layout = dump_module._slot_layout([(s.shape("slots"), s.read("slot_kind"), s.read("slot_init"))
                                for s in shards], "t")
    assert layout[0] == 1 and layout[2] == 2
    monkeypatch.setattr(dump_module, "LOAD_CHUNK_BYTES", 3 * 4 * 3 * 3)  # 3 rows of dim 3, 2 slots
    chunks = list(dump_module._chunks(shards, keys, mine, 3, layout))
    assert [c["keys"].tolist() for c in chunks] == [[1, 2], [8], [102], [106]]
    for f, parts in want.items():
        np.testing.assert_array_equal(np.concatenate([c[f] for c in chunks]),
                                      np.concatenate(parts)[mine], err_msg=f)


@pytest.mark.parametrize("damage", ["short_values", "repeated_key"])
def test_a_bad_dump_fails_before_the_table_changes(tmp_path, monkeypatch, damage):
    """A shard with fewer rows of a field than keys, or a key twice, is an error naming the table,
    raised before the first chunk replaces the table's rows."""
    ev = sok.EmbeddingVariable(unique_name("bad_dump"), DIM,
                               initializer=tf.random_uniform_initializer(-1, 1, seed=4))
    ev.sparse_read(tf.constant(np.arange(9), tf.int64))
    sok.dump(str(tmp_path), [ev])
    (shard,) = [os.path.join(d, f) for d, _, fs in os.walk(tmp_path) for f in fs]
    with np.load(shard) as data:
        arrays = {k: data[k] for k in data.files}
    if damage == "short_values":
        arrays["values"] = arrays["values"][:7]
    else:
        arrays["keys"][3] = arrays["keys"][5]
    np.savez(shard, **arrays)
    before = sorted_export(ev)
    monkeypatch.setattr(dump_module, "LOAD_CHUNK_BYTES", 2 * 4 * DIM)
    with pytest.raises(ValueError) as e:
        sok.load(str(tmp_path), [ev])
    want = "has 9 keys but values" if damage == "short_values" else "appears twice in the dump"
    assert ev.name in str(e.value) and want in str(e.value), str(e.value)
    after = sorted_export(ev)
    for field in before:
        np.testing.assert_array_equal(after[field], before[field], err_msg=field)


def _tf_keras_adagrad():
    tf_keras = pytest.importorskip("tf_keras")
    return tf_keras.optimizers.Adagrad(learning_rate=0.5)


def _wrapper_resume_of_static_table(tmp_path, make):
    """Trains a sok.Variable through sok.OptimizerWrapper(make()), dumps it with the wrapper and
    checks that a sok.load into the same objects (after more steps) and into fresh ones (a
    restarted program) both resume the step that followed the dump. -> the dump's folders."""
    name = unique_name("static_wrapped")
    init = np.random.default_rng(0).uniform(-1, 1, [ROWS, DIM]).astype(np.float32)
    var, opt = sok.Variable(init, name=name), make()
    wrapper = sok.OptimizerWrapper(opt)
    batches = _batches(3, 5)
    for ids in batches[:2]:
        _step(var, wrapper, ids)
    sok.dump(str(tmp_path), [var], wrapper)
    _step(var, wrapper, batches[2])
    expected = var.numpy()

    for ids in batches[3:]:  # moves the rows and the slots past the dump
        _step(var, wrapper, ids)
    sok.load(str(tmp_path), [var], wrapper)
    _step(var, wrapper, batches[2])
    np.testing.assert_allclose(var.numpy(), expected, rtol=1e-6, atol=1e-7)

    var2, opt2 = sok.Variable(np.zeros_like(init), name=name), make()
    opt2.build([var2])  # a Keras optimizer creates its slots when it is built
    wrapper2 = sok.OptimizerWrapper(opt2)
    sok.load(str(tmp_path), [var2], wrapper2)
    _step(var2, wrapper2, batches[2])
    np.testing.assert_allclose(var2.numpy(), expected, rtol=1e-6, atol=1e-7)
    return sorted(os.listdir(tmp_path))


def test_tf_keras_wrapper_dumps_the_static_tables_slots(tmp_path):
    """tf_keras names a slot that apply_gradients creates "<optimizer>/<slot>/<variable>": the
    wrapper still finds the static table's accumulator, dumps it and loads it back."""
    folders = _wrapper_resume_of_static_table(tmp_path, _tf_keras_adagrad)
    assert folders == sorted([folders[0], f"{folders[0]}_accumulator"])


def _tf_keras_momentum():
    tf_keras = pytest.importorskip("tf_keras")
    return tf_keras.optimizers.SGD(learning_rate=0.1, momentum=0.9)


WRAPPED_MOMENTUM = {
    "keras": (lambda: tf.keras.optimizers.SGD(learning_rate=0.1, momentum=0.9), "momentum"),
    "tf_keras": (_tf_keras_momentum, "m"),
}


@pytest.mark.parametrize("flavor", sorted(WRAPPED_MOMENTUM))
def test_wrapper_with_only_static_tables_dumps_their_momentum(tmp_path, flavor):
    """The generic path (momentum has no fused kernel) learns slot names from the dynamic tables it
    updates; with static tables only the wrapper still dumps and loads their momentum."""
    make, slot = WRAPPED_MOMENTUM[flavor]
    folders = _wrapper_resume_of_static_table(tmp_path, make)
    assert folders == sorted([folders[0], f"{folders[0]}_{slot}"])


def test_wrapper_load_refuses_a_dumped_slot_its_optimizer_lacks(tmp_path):
    """A wrapped Keras optimizer built without the static table has no momentum to load into: an
    error naming the table and the slot, not the momentum it has now kept."""
    name = unique_name("static_wrapped")
    var = sok.Variable(np.ones([ROWS, DIM], np.float32), name=name)
    wrapper = sok.OptimizerWrapper(tf.keras.optimizers.SGD(learning_rate=0.1, momentum=0.9))
    _step(var, wrapper, _batches(4, 1)[0])
    sok.dump(str(tmp_path), [var], wrapper)
    fresh = tf.keras.optimizers.SGD(learning_rate=0.1, momentum=0.9)
    fresh.build([tf.Variable(np.ones([ROWS, DIM], np.float32))])
    with pytest.raises(ValueError, match=f"'momentum' slot of '{name}' but the SGD has none"):
        sok.load(str(tmp_path), [var], sok.OptimizerWrapper(fresh))
