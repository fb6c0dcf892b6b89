"""Optimizers without a fused SOK kernel (the generic path) against the same optimizer on a
tf.Variable holding the same rows, over 20 steps.

Model: emb = per-sample sum of the looked-up rows; loss = sum((emb @ w - y)^2) with a dense
tf.Variable w trained by the same optimizer object. Tables: DeepRec Embedding Variables,
sok.DynamicVariable and sok.Variable (a static table: a tf.Variable the wrapped optimizer updates
itself). The reference is a tf.Variable with row i <-> key VOCAB[i].

tf.compat.v1 optimizers apply IndexedSlices lazily (touched rows and their slots only), which is
the generic path's semantics: they must agree exactly, with ids repeating in a batch. Keras
optimizers update all rows of a tf.Variable (e.g. momentum decays untouched rows); their batches
here touch every row, and their reference gets the gradient with repeated ids summed first (as
SOK does). test_keras_updates_touched_rows_only checks the touched-rows semantics.
"""

import contextlib
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import sparse_operation_kit as sok
from sparse_operation_kit.optimizers import generic_optimizer
from tests.python.support import TEST_DEVICE, graph_session, subprocess_env, unique_name

DIM = 3
BATCH = 4
STEPS = 20
VOCAB = np.array([3, -8, 2**33 + 1, 17, 0, 999, 64, 31], np.int64)
INIT = np.random.default_rng(5).uniform(-0.5, 0.5, [len(VOCAB), DIM]).astype(np.float32)
W0 = np.random.default_rng(6).uniform(-0.5, 0.5, [DIM, 1]).astype(np.float32)


def make_batches(every_row, seed=3):
    """STEPS batches of (positions, segment of each position, targets). Ids repeat within a
    batch; every_row: each batch also touches every row."""
    rng = np.random.default_rng(seed)
    batches = []
    for _ in range(STEPS):
        positions = list(rng.integers(0, 5, 7))
        if every_row:
            positions += list(rng.permutation(len(VOCAB)))
        positions = np.array(positions, np.int64)
        segments = np.sort(rng.integers(0, BATCH, positions.size)).astype(np.int32)
        segments[:BATCH] = np.arange(BATCH)  # every sample has an id
        segments = np.sort(segments)
        batches.append((positions, segments, rng.normal(size=[BATCH, 1]).astype(np.float32)))
    return batches


def make_table(kind):
    """(table, keys of position p) for a table kind; the table holds INIT's rows."""
    if kind == "static":
        return sok.Variable(INIT, name=unique_name("static")), np.arange(len(VOCAB), dtype=np.int64)
    if kind == "ev":
        table = sok.get_embedding_variable(
            unique_name("generic"), DIM, initializer=tf.zeros_initializer()
        )
    else:
        table = sok.DynamicVariable(DIM, initializer="zeros", name=unique_name("dyn"))
    return table, VOCAB


def seed_table(table, keys):
    """Writes INIT into an Embedding Variable (returns the op), nothing for a static table."""
    if isinstance(table, sok.EmbeddingVariable):
        return sok.assign(table, tf.constant(keys), tf.constant(INIT))
    return None


def loss_of(table, ids, segments, w, y):
    emb = tf.math.segment_sum(tf.nn.embedding_lookup(table, ids), segments)
    return tf.reduce_sum((emb @ w - y) ** 2)


def summed(grad):
    """The gradient with repeated ids summed first (the generic path's input)."""
    unique, position = tf.unique(grad.indices)
    return tf.IndexedSlices(
        tf.math.unsorted_segment_sum(grad.values, position, tf.size(unique)),
        unique,
        grad.dense_shape,
    )


def rows_of(table, keys):
    if isinstance(table, sok.EmbeddingVariable):
        return table.sparse_read(tf.constant(np.asarray(keys, np.int64)), training=False)
    return tf.convert_to_tensor(table)


def ref_device(flavor):
    """Where a reference tf.Variable can use the optimizer: TF has CPU kernels only for the
    sparse updates of tf.compat.v1 / tf_keras legacy optimizers (SOK's generic path puts their
    scratch there too)."""
    if TEST_DEVICE == "gpu" and flavor in ("v1", "keras_legacy"):
        return tf.device("/CPU:0")
    return contextlib.nullcontext()


def check(values, ref_values, exact=True):
    # On the GPU the scratch's dense update and the reference's sparse one may round the last
    # bit differently (fused multiply-add): exact on the CPU, to float precision on the GPU.
    if exact and TEST_DEVICE != "gpu":
        np.testing.assert_array_equal(values, ref_values)
    else:
        np.testing.assert_allclose(values, ref_values, rtol=1e-6, atol=1e-6)


# ---------------------------------------------------------------------------------------------
# tf.compat.v1.train optimizers
# ---------------------------------------------------------------------------------------------
def _adagrad_da(global_step):
    return tf.compat.v1.train.AdagradDAOptimizer(
        0.1,
        global_step,
        initial_gradient_squared_accumulator_value=0.2,
        l1_regularization_strength=0.01,
        l2_regularization_strength=0.02,
    )


V1 = {
    "momentum": lambda gs: tf.compat.v1.train.MomentumOptimizer(0.05, 0.9),
    "momentum_nesterov": lambda gs: tf.compat.v1.train.MomentumOptimizer(
        0.05, 0.9, use_nesterov=True
    ),
    "rmsprop": lambda gs: tf.compat.v1.train.RMSPropOptimizer(0.01, decay=0.8, momentum=0.5),
    "rmsprop_centered": lambda gs: tf.compat.v1.train.RMSPropOptimizer(
        0.01, momentum=0.3, centered=True
    ),
    "adadelta": lambda gs: tf.compat.v1.train.AdadeltaOptimizer(1.0, rho=0.9, epsilon=1e-6),
    "adagrad_da": _adagrad_da,
    "proximal_adagrad": lambda gs: tf.compat.v1.train.ProximalAdagradOptimizer(
        0.1,
        initial_accumulator_value=0.3,
        l1_regularization_strength=0.01,
        l2_regularization_strength=0.01,
    ),
    "proximal_sgd": lambda gs: tf.compat.v1.train.ProximalGradientDescentOptimizer(
        0.1, l1_regularization_strength=0.01, l2_regularization_strength=0.01
    ),
    "ftrl_shrinkage": lambda gs: tf.compat.v1.train.FtrlOptimizer(
        0.2, l1_regularization_strength=0.01, l2_shrinkage_regularization_strength=0.05
    ),
}


@pytest.mark.parametrize("kind", ["ev", "dynamic", "static"])
@pytest.mark.parametrize("name", sorted(V1))
def test_tf1_session_matches_tf(name, kind):
    batches = make_batches(every_row=False)
    with graph_session() as sess:
        table, keys = make_table(kind)
        ref = tf.Variable(INIT)
        w, ref_w = tf.Variable(W0), tf.Variable(W0)
        gs = tf.compat.v1.train.get_or_create_global_step()
        ref_gs = tf.Variable(0, dtype=tf.int64, trainable=False)
        ids = tf.compat.v1.placeholder(tf.int64, [None])
        pos = tf.compat.v1.placeholder(tf.int64, [None])
        seg = tf.compat.v1.placeholder(tf.int32, [None])
        y = tf.compat.v1.placeholder(tf.float32, [BATCH, 1])
        opt = sok.OptimizerWrapper(V1[name](gs), max_touched_rows=16)
        train = opt.minimize(loss_of(table, ids, seg, w, y), var_list=[table, w], global_step=gs)
        ref_opt = V1[name](ref_gs)
        ref_train = ref_opt.minimize(
            loss_of(ref, pos, seg, ref_w, y), var_list=[ref, ref_w], global_step=ref_gs
        )
        seed = seed_table(table, keys)
        sess.run(tf.compat.v1.global_variables_initializer())
        if seed is not None:
            sess.run(seed)
        for positions, segments, targets in batches:
            sess.run(train, {ids: keys[positions], seg: segments, y: targets})
            sess.run(ref_train, {pos: positions, seg: segments, y: targets})
        check(*sess.run([rows_of(table, keys), ref]))
        check(*sess.run([w, ref_w]))
        assert sess.run(gs) == STEPS
        if kind != "static":  # slots of touched rows, read through get_slot, equal the reference's
            names = ref_opt.get_slot_names()
            assert opt.get_slot_names() == sorted(names)
            touched = sorted({int(p) for b in batches for p in b[0]})
            for slot_name in names:
                slot = opt.get_slot(table, slot_name)
                assert isinstance(slot, sok.EmbeddingVariable), slot_name
                got = sess.run(slot.sparse_read(tf.constant(keys[touched]), training=False))
                check(got, sess.run(ref_opt.get_slot(ref, slot_name))[touched])


V1_EAGER = ["momentum_nesterov", "rmsprop_centered", "adagrad_da"]


@pytest.mark.parametrize("mode", ["eager", "function"])
@pytest.mark.parametrize("kind", ["ev", "dynamic"])
@pytest.mark.parametrize("name", V1_EAGER)
def test_tf1_optimizer_in_tf2_matches_tf(name, kind, mode):
    table, keys = make_table(kind)
    seed_table(table, keys)
    with ref_device("v1"):
        ref = tf.Variable(INIT)
        w, ref_w = tf.Variable(W0), tf.Variable(W0)
        gs, ref_gs = tf.Variable(0, dtype=tf.int64), tf.Variable(0, dtype=tf.int64)
    opt, ref_opt = sok.OptimizerWrapper(V1[name](gs), max_touched_rows=16), V1[name](ref_gs)

    def step(positions, segments, targets):
        with tf.GradientTape() as tape:
            loss = loss_of(table, tf.gather(tf.constant(keys), positions), segments, w, targets)
        opt.apply_gradients(zip(tape.gradient(loss, [table, w]), [table, w]), global_step=gs)
        with tf.GradientTape() as tape:
            loss = loss_of(ref, positions, segments, ref_w, targets)
        ref_opt.apply_gradients(
            zip(tape.gradient(loss, [ref, ref_w]), [ref, ref_w]), global_step=ref_gs
        )

    if mode == "function":
        step = tf.function(step)
    for positions, segments, targets in make_batches(every_row=False):
        step(tf.constant(positions), tf.constant(segments), tf.constant(targets))
    check(rows_of(table, keys).numpy(), ref.numpy())
    check(w.numpy(), ref_w.numpy())


# ---------------------------------------------------------------------------------------------
# Keras optimizers
# ---------------------------------------------------------------------------------------------
KERAS = {
    "sgd_momentum": lambda: tf.keras.optimizers.SGD(0.01, momentum=0.9, nesterov=True),
    "rmsprop_centered": lambda: tf.keras.optimizers.RMSprop(0.01, momentum=0.5, centered=True),
    "adadelta": lambda: tf.keras.optimizers.Adadelta(1.0),
    "adam_amsgrad": lambda: tf.keras.optimizers.Adam(0.01, amsgrad=True),
    "adamw": lambda: tf.keras.optimizers.AdamW(0.01, weight_decay=0.01),
    "nadam": lambda: tf.keras.optimizers.Nadam(0.01),
    "lion": lambda: tf.keras.optimizers.Lion(0.01),
}


def keras_train(make, kind, mode, batches, max_touched_rows=16):
    """(table rows, reference rows, w, reference w, wrapper, reference optimizer, table, ref)."""
    table, keys = make_table(kind)
    seed_table(table, keys)
    opt, ref_opt = sok.OptimizerWrapper(make(), max_touched_rows=max_touched_rows), make()
    with ref_device(generic_optimizer.optimizer_flavor(ref_opt)):
        ref = tf.Variable(INIT)
        w, ref_w = tf.Variable(W0), tf.Variable(W0)

    def step(positions, segments, targets):
        with tf.GradientTape() as tape:
            loss = loss_of(table, tf.gather(tf.constant(keys), positions), segments, w, targets)
        opt.apply_gradients(zip(tape.gradient(loss, [table, w]), [table, w]))
        with tf.GradientTape() as tape:
            loss = loss_of(ref, positions, segments, ref_w, targets)
        grads = tape.gradient(loss, [ref, ref_w])
        if kind != "static":  # a static table is a tf.Variable: Keras gets its gradient as it is
            grads[0] = summed(grads[0])
        ref_opt.apply_gradients(zip(grads, [ref, ref_w]))

    if mode == "function":
        step = tf.function(step)
    for positions, segments, targets in batches:
        step(tf.constant(positions), tf.constant(segments), tf.constant(targets))
    return (
        rows_of(table, keys).numpy(),
        ref.numpy(),
        w.numpy(),
        ref_w.numpy(),
        opt,
        ref_opt,
        table,
        keys,
    )


@pytest.mark.parametrize("mode", ["eager", "function"])
@pytest.mark.parametrize("name", sorted(KERAS))
def test_keras_optimizer_matches_tf(name, mode):
    rows, ref_rows, w, ref_w, *_ = keras_train(
        KERAS[name], "ev", mode, make_batches(every_row=True)
    )
    check(rows, ref_rows)
    check(w, ref_w)


@pytest.mark.parametrize("kind", ["dynamic", "static"])
def test_keras_optimizer_on_sok_variables(kind):
    rows, ref_rows, w, ref_w, opt, ref_opt, table, keys = keras_train(
        KERAS["rmsprop_centered"], kind, "function", make_batches(every_row=True)
    )
    check(rows, ref_rows)
    check(w, ref_w)
    if kind == "dynamic":  # slots through get_slot, in the reference's row order
        assert opt.get_slot_names() == ["average_gradient", "momentum", "velocity"]
        for name in opt.get_slot_names():
            ref_slot = [
                v
                for v in ref_opt.variables
                if v.name.endswith("_" + name) and v.shape == ref_rows.shape
            ]
            check(
                opt.get_slot(table, name).sparse_read(tf.constant(keys), training=False).numpy(),
                ref_slot[0].numpy(),
            )


def test_keras_updates_touched_rows_only():
    """SGD with momentum: a row without gradient keeps its value and its momentum (a tf.Variable
    under Keras would keep moving on its decaying momentum)."""
    table, keys = make_table("ev")
    seed_table(table, keys)
    opt = sok.OptimizerWrapper(tf.keras.optimizers.SGD(0.1, momentum=0.9), max_touched_rows=8)
    for ids in ([3, -8], [3]):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.nn.embedding_lookup(table, tf.constant(ids, tf.int64)))
        opt.apply_gradients([(tape.gradient(loss, table), table)])
    momentum = opt.get_slot(table, "momentum")
    # -8 moved once: value INIT - 0.1, momentum -0.1; 3 moved twice: momentum -0.1*0.9 - 0.1.
    np.testing.assert_allclose(rows_of(table, [-8]).numpy()[0], INIT[1] - 0.1, rtol=1e-6)
    np.testing.assert_allclose(
        momentum.sparse_read(tf.constant([-8], tf.int64)).numpy()[0], [-0.1] * DIM, rtol=1e-6
    )
    np.testing.assert_allclose(
        momentum.sparse_read(tf.constant([3], tf.int64)).numpy()[0], [-0.19] * DIM, rtol=1e-6
    )
    assert int(momentum.size()) == 2  # slot rows exist for touched keys only


def test_tf_keras_legacy_optimizer():
    tf_keras = pytest.importorskip("tf_keras")
    rows, ref_rows, w, ref_w, opt, *_ = keras_train(
        lambda: tf_keras.optimizers.legacy.RMSprop(0.01, momentum=0.5, centered=True),
        "ev",
        "function",
        make_batches(every_row=False),
    )
    check(rows, ref_rows)  # legacy Keras updates sparse gradients lazily, like tf.compat.v1
    check(w, ref_w)
    assert sorted(opt.get_slot_names()) == ["mg", "momentum", "rms"]


def test_too_many_touched_rows_in_a_graph_is_an_error():
    """A tf.function's scratch is fixed when it is traced: a larger step fails, naming the table."""
    table, _ = make_table("ev")
    opt = sok.OptimizerWrapper(tf.keras.optimizers.SGD(0.1, momentum=0.9), max_touched_rows=2)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.int64)])
    def step(ids):
        opt.apply_gradients([(tf.IndexedSlices(tf.ones([tf.size(ids), DIM]), ids), table)])

    with pytest.raises(
        tf.errors.InvalidArgumentError,
        match=f"more rows of table .{{0,4}}{table.name}.*max_touched_rows=2",
    ):
        step(tf.constant([1, 2, 3], tf.int64))


@pytest.mark.parametrize("name", ["sgd_momentum", "rmsprop_centered"])
def test_eager_steps_past_max_touched_rows_grow_the_scratch(name):
    """Eager steps touching more rows than max_touched_rows (SOK 2.x has no such bound) get a
    larger scratch and still equal the reference."""
    rows, ref_rows, w, ref_w, *_ = keras_train(
        KERAS[name], "ev", "eager", make_batches(every_row=True), max_touched_rows=2
    )
    check(rows, ref_rows)
    check(w, ref_w)


def test_eager_v1_steps_past_max_touched_rows_grow_the_scratch():
    table, keys = make_table("ev")
    seed_table(table, keys)
    with ref_device("v1"):
        ref = tf.Variable(INIT)
    opt = sok.OptimizerWrapper(tf.compat.v1.train.MomentumOptimizer(0.05, 0.9), max_touched_rows=2)
    ref_opt = tf.compat.v1.train.MomentumOptimizer(0.05, 0.9)
    for positions, segments, targets in make_batches(every_row=True):
        w = tf.constant(W0)
        with tf.GradientTape() as tape:
            loss = loss_of(table, tf.gather(tf.constant(keys), positions), segments, w, targets)
        opt.apply_gradients(zip(tape.gradient(loss, [table]), [table]))
        with tf.GradientTape() as tape:
            loss = loss_of(ref, tf.constant(positions), segments, w, targets)
        ref_opt.apply_gradients(zip(tape.gradient(loss, [ref]), [ref]))
    check(rows_of(table, keys).numpy(), ref.numpy())


def test_counter_filter_is_refused():
    ev = sok.get_embedding_variable(
        unique_name("filtered"),
        DIM,
        ev_option=sok.EmbeddingVariableOption(filter_option=sok.CounterFilter(filter_freq=3)),
    )
    opt = sok.OptimizerWrapper(tf.compat.v1.train.MomentumOptimizer(0.1, 0.9))
    grad = tf.IndexedSlices(tf.ones([1, DIM]), tf.constant([1], tf.int64))
    with pytest.raises(ValueError, match=f"table '{ev.name}' has a CounterFilter"):
        opt.apply_gradients([(grad, ev)])


# ---------------------------------------------------------------------------------------------
# Slots in checkpoints and dumps
# ---------------------------------------------------------------------------------------------
def _train_steps(opt, table, keys, batches, w):
    for positions, segments, targets in batches:
        with tf.GradientTape() as tape:
            loss = loss_of(
                table, tf.constant(keys[positions]), tf.constant(segments), w, tf.constant(targets)
            )
        opt.apply_gradients(zip(tape.gradient(loss, [table, w]), [table, w]))


@pytest.mark.parametrize("how", ["checkpoint", "dump"])
@pytest.mark.parametrize(
    "make",
    [
        lambda: tf.compat.v1.train.RMSPropOptimizer(0.01, momentum=0.5),
        lambda: tf.keras.optimizers.SGD(0.01, momentum=0.9),
    ],
    ids=["v1", "keras"],
)
def test_slots_round_trip(tmp_path, make, how):
    """Train 10 steps, save, train 10 more; a fresh table + optimizer restored from the save and
    trained the same 10 steps ends equal (it could not without the slots)."""
    batches = make_batches(every_row=True)
    name = unique_name("saved")

    def build():
        table = sok.get_embedding_variable(name, DIM, initializer=tf.zeros_initializer())
        return table, tf.Variable(W0, name="w"), sok.OptimizerWrapper(make(), max_touched_rows=16)

    table, w, opt = build()
    seed_table(table, VOCAB)
    _train_steps(opt, table, VOCAB, batches[:10], w)
    if how == "checkpoint":
        path = tf.train.Checkpoint(table=table, w=w, optimizer=opt).write(str(tmp_path / "ckpt"))
    else:
        sok.dump(str(tmp_path / "dump"), [table, w], opt)
    _train_steps(opt, table, VOCAB, batches[10:], w)

    table2, w2, opt2 = build()
    if how == "checkpoint":
        tf.train.Checkpoint(table=table2, w=w2, optimizer=opt2).read(path)
    else:
        if hasattr(opt2, "build"):  # a Keras optimizer has its slots once it is built
            opt2.build([table2, w2])
        sok.load(str(tmp_path / "dump"), [table2, w2], opt2)
    _train_steps(opt2, table2, VOCAB, batches[10:], w2)
    check(rows_of(table2, VOCAB).numpy(), rows_of(table, VOCAB).numpy())
    check(w2.numpy(), w.numpy())


def test_dump_load_restores_slot_values(tmp_path):
    table, keys = make_table("dynamic")
    seed_table(table, keys)
    w = tf.Variable(W0)
    opt = sok.OptimizerWrapper(tf.compat.v1.train.MomentumOptimizer(0.05, 0.9), max_touched_rows=16)
    _train_steps(opt, table, keys, make_batches(every_row=False)[:5], w)
    sok.dump(str(tmp_path), [table], opt)
    table2 = sok.DynamicVariable(DIM, initializer="zeros", name=table.name)
    opt2 = sok.OptimizerWrapper(
        tf.compat.v1.train.MomentumOptimizer(0.05, 0.9), max_touched_rows=16
    )
    sok.load(str(tmp_path), [table2], opt2)
    before, after = (
        sok.export(opt.get_slot(table, "momentum")),
        sok.export(opt2.get_slot(table2, "momentum")),
    )
    order, order2 = np.argsort(before[0].numpy()), np.argsort(after[0].numpy())
    check(after[0].numpy()[order2], before[0].numpy()[order])
    check(after[1].numpy()[order2], before[1].numpy()[order])


def test_tf1_saver_round_trip_of_slots(tmp_path):
    batches = make_batches(every_row=False)
    name = unique_name("saver")

    def build(sess_graph_steps):
        table = sok.get_embedding_variable(name, DIM, initializer=tf.zeros_initializer())
        w = tf.compat.v1.get_variable("w", initializer=W0, use_resource=True)
        ids = tf.compat.v1.placeholder(tf.int64, [None])
        seg = tf.compat.v1.placeholder(tf.int32, [None])
        y = tf.compat.v1.placeholder(tf.float32, [BATCH, 1])
        opt = sok.OptimizerWrapper(
            tf.compat.v1.train.MomentumOptimizer(0.05, 0.9), max_touched_rows=16
        )
        train = opt.minimize(loss_of(table, ids, seg, w, y), var_list=[table, w])
        return table, train, (ids, seg, y), opt

    def run(sess, train, phs, part):
        for positions, segments, targets in part:
            sess.run(train, dict(zip(phs, (VOCAB[positions], segments, targets))))

    with graph_session() as sess:
        table, train, phs, opt = build(sess)
        seed = seed_table(table, VOCAB)
        saver = tf.compat.v1.train.Saver()
        sess.run(tf.compat.v1.global_variables_initializer())
        sess.run(seed)
        run(sess, train, phs, batches[:10])
        path = saver.save(sess, str(tmp_path / "model"))
        run(sess, train, phs, batches[10:])
        expected = sess.run(rows_of(table, VOCAB))
        momentum = sess.run(
            opt.get_slot(table, "momentum").sparse_read(tf.constant(VOCAB), training=False)
        )
    with graph_session() as sess:
        table, train, phs, opt = build(sess)
        saver = tf.compat.v1.train.Saver()
        saver.restore(sess, path)
        run(sess, train, phs, batches[10:])
        check(sess.run(rows_of(table, VOCAB)), expected)
        check(
            sess.run(
                opt.get_slot(table, "momentum").sparse_read(tf.constant(VOCAB), training=False)
            ),
            momentum,
        )


def test_fused_slots_read_through_get_slot():
    table, keys = make_table("ev")
    opt = sok.OptimizerWrapper(
        tf.compat.v1.train.AdagradOptimizer(0.1, initial_accumulator_value=0.2)
    )
    grad = tf.IndexedSlices(tf.constant([[1.0] * DIM, [2.0] * DIM]), tf.constant(keys[:2]))
    opt.apply_gradients([(grad, table)])
    assert opt.get_slot_names() == ["accumulator"]
    slot_keys, values = sok.export(opt.get_slot(table, "accumulator"))
    table_keys, _ = sok.export(table)
    check(slot_keys.numpy(), table_keys.numpy())
    expected = {int(keys[0]): 1.2, int(keys[1]): 4.2}
    for k, v in zip(slot_keys.numpy(), values.numpy()):
        np.testing.assert_allclose(v, [expected[int(k)]] * DIM, rtol=1e-6)


# ---------------------------------------------------------------------------------------------
# sok.init(use_legacy_optimizer=True) with tf_keras
# ---------------------------------------------------------------------------------------------
LEGACY_PROGRAM = r"""
import numpy as np, tensorflow as tf
import sparse_operation_kit as sok
sok.init(comm_tool="horovod", use_legacy_optimizer=True)
import tf_keras
assert tf.keras.optimizers.SGD is tf_keras.optimizers.legacy.SGD, tf.keras.optimizers.SGD
table = sok.DynamicVariable(2, initializer="ones", name="t")
dense = tf.Variable([[1.0, 1.0]])
opt = tf.keras.optimizers.SGD(0.5)
wrapper = sok.OptimizerWrapper(opt)
with tf.GradientTape() as tape:
    loss = tf.reduce_sum(tf.nn.embedding_lookup(table, tf.constant([4], tf.int64)))
wrapper.apply_gradients([(tape.gradient(loss, table), table)])
with tf.GradientTape() as tape:
    loss = tf.reduce_sum(dense * 3.0)
opt.apply_gradients([(tape.gradient(loss, dense), dense)])
np.testing.assert_allclose(table.sparse_read(tf.constant([4], tf.int64)).numpy(), [[0.5, 0.5]])
np.testing.assert_allclose(dense.numpy(), [[-0.5, -0.5]])
print("OK")
"""


def test_init_use_legacy_optimizer_with_tf_keras():
    pytest.importorskip("tf_keras")
    env = dict(subprocess_env(), TF_USE_LEGACY_KERAS="1")
    done = subprocess.run(
        [sys.executable, "-c", LEGACY_PROGRAM],
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "OK" in done.stdout
    assert done.stderr.count("use_legacy_optimizer=True") == 1, done.stderr[-3000:]


def test_init_leaves_keras3_alone():
    before = tf.keras.optimizers.SGD
    sok.init(use_legacy_optimizer=True)
    assert tf.keras.optimizers.SGD is before
    assert os.environ.get("TF_USE_LEGACY_KERAS") != "1"
