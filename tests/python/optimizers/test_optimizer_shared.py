"""The program's optimizer stays its own under sok.OptimizerWrapper (SOK 2.x programs apply the
same object through the wrapper to SOK tables and directly to tf.Variables): every family of the
generic path, interleaving wrapper calls and direct calls on one optimizer object, against two
plain tf.Variables trained by one optimizer of the same configuration (the table's rows are the
first variable's rows). Each apply_gradients call, through either path, advances the step once.

Every step touches every row once, so Keras's dense updates and SOK's touched-rows updates are
the same step (test_optimizers_generic covers the touched-rows semantics)."""

import numpy as np
import pytest
import tensorflow as tf

import sparse_operation_kit as sok
from tests.python.support import TEST_DEVICE, graph_session, unique_name

tf_keras = pytest.importorskip("tf_keras")

DIM = 2
STEPS = 6
KEYS = np.array([5, -3, 2**40, 11], np.int64)
_rng = np.random.default_rng(26)
INIT = _rng.uniform(-0.5, 0.5, [len(KEYS), DIM]).astype(np.float32)
B0 = _rng.uniform(-0.5, 0.5, [3, DIM]).astype(np.float32)
C0 = _rng.uniform(-0.5, 0.5, [DIM]).astype(np.float32)
BATCHES = [
    (
        _rng.permutation(len(KEYS)).astype(np.int64),
        _rng.normal(size=[len(KEYS), DIM]).astype(np.float32),
        _rng.normal(size=B0.shape).astype(np.float32),
        _rng.normal(size=C0.shape).astype(np.float32),
    )
    for _ in range(STEPS)
]

V1 = {
    "momentum": lambda: tf.compat.v1.train.MomentumOptimizer(0.1, 0.9, use_nesterov=True),
    "rmsprop": lambda: tf.compat.v1.train.RMSPropOptimizer(0.05, momentum=0.5, centered=True),
    "adadelta": lambda: tf.compat.v1.train.AdadeltaOptimizer(1.0),
    "proximal_adagrad": lambda: tf.compat.v1.train.ProximalAdagradOptimizer(
        0.1, l1_regularization_strength=0.01
    ),
}


def _keras_families(optimizers, extra=()):
    families = {
        "sgd_momentum": lambda: optimizers.SGD(0.1, momentum=0.9),
        "rmsprop": lambda: optimizers.RMSprop(0.05, momentum=0.5, centered=True),
        "adadelta": lambda: optimizers.Adadelta(1.0),
        "adamax": lambda: optimizers.Adamax(learning_rate=1.0),
        "adam_amsgrad": lambda: optimizers.Adam(0.1, amsgrad=True),
    }
    families.update({name: getattr(optimizers, cls) for name, cls in extra})
    return families


LEGACY = _keras_families(tf_keras.optimizers.legacy)
TF_KERAS = _keras_families(tf_keras.optimizers, [("lion", "Lion")])
KERAS3 = _keras_families(tf.keras.optimizers, [("lion", "Lion")])
FLAVOURS = {"v1": V1, "keras_legacy": LEGACY, "tf_keras": TF_KERAS, "keras3": KERAS3}


def _row_loss(rows, y):
    return tf.reduce_sum((rows - y) ** 2 * tf.range(1.0, DIM + 1.0))


def _dense_loss(var, y):
    return tf.reduce_sum((var - y) ** 2 * var)


def _apply(opt, pairs):
    return opt.apply_gradients(pairs)


def _table():
    table = sok.DynamicVariable(DIM, initializer="zeros", name=unique_name("shared_opt"))
    return table


def _rows(table, sess=None):
    rows = table.sparse_read(tf.constant(KEYS), training=False)
    return sess.run(rows) if sess is not None else rows.numpy()


def _check(got, want):
    if TEST_DEVICE == "gpu":  # fused multiply-add may round the last bit differently
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    else:
        np.testing.assert_array_equal(got, want)


def _grad_pairs(loss_fn, variables):
    with tf.GradientTape() as tape:
        loss = loss_fn()
    return list(zip(tape.gradient(loss, variables), variables))


def _tf2_step(wrapper, opt, table, b, c, refs, ref_opt, batch, with_c):
    """The program: the wrapper on the table (and c), then `opt` directly on b. The reference:
    `ref_opt` on a (and c), then on b."""
    pos, y, yb, yc = batch
    a, rb, rc = refs
    keys = tf.gather(tf.constant(KEYS), pos)

    def sok_loss():
        return _row_loss(tf.nn.embedding_lookup(table, keys), y) + (
            _dense_loss(c, yc) if with_c else 0.0
        )

    def ref_loss():
        return _row_loss(tf.gather(a, pos), y) + (_dense_loss(rc, yc) if with_c else 0.0)

    wrapper.apply_gradients(_grad_pairs(sok_loss, [table, c] if with_c else [table]))
    _apply(opt, _grad_pairs(lambda: _dense_loss(b, yb), [b]))
    _apply(ref_opt, _grad_pairs(ref_loss, [a, rc] if with_c else [a]))
    _apply(ref_opt, _grad_pairs(lambda: _dense_loss(rb, yb), [rb]))


def _run_tf2(flavor, make, mode, with_c):
    table = _table()
    sok.assign(table, tf.constant(KEYS), tf.constant(INIT))
    device = "/CPU:0" if flavor in ("v1", "keras_legacy") else None  # their sparse kernels
    with tf.device(device):
        b, c = tf.Variable(B0), tf.Variable(C0)
        refs = tf.Variable(INIT), tf.Variable(B0), tf.Variable(C0)
    opt, ref_opt = make(), make()
    wrapper = sok.OptimizerWrapper(opt, max_touched_rows=8)
    if flavor in ("tf_keras", "keras3"):
        ref_opt.build(list(refs))  # a Keras optimizer learns its variables once
        if with_c:
            opt.build([b, c])  # the program's own variables; else b's first call builds it
    step = _tf2_step
    if mode == "function":
        step = tf.function(_tf2_step)
    for batch in BATCHES:
        batch = tuple(tf.constant(x) for x in batch)
        step(wrapper, opt, table, b, c, refs, ref_opt, batch, with_c)
    return (_rows(table), b.numpy(), c.numpy()), tuple(r.numpy() for r in refs), opt, ref_opt


def _params(flavors, modes):
    return [
        pytest.param(f, name, mode, id=f"{f}-{name}-{mode}")
        for f in flavors
        for name in sorted(FLAVOURS[f])
        for mode in modes
    ]


@pytest.mark.parametrize("flavor,name,mode", _params(["v1", "keras_legacy", "tf_keras", "keras3"],
                                                     ["eager", "function"]))
def test_wrapper_and_direct_calls_share_the_optimizer_tf2(flavor, name, mode):
    # Eager: the table alone through the wrapper (the wrapped optimizer is first built by the
    # direct call); tf.function: the wrapper's call also carries a dense variable.
    with_c = mode == "function"
    got, want, opt, ref_opt = _run_tf2(flavor, FLAVOURS[flavor][name], mode, with_c)
    for g, w in zip(got, want):
        _check(g, w)
    assert not np.array_equal(got[0], INIT)
    if flavor != "v1":
        assert int(opt.iterations) == int(ref_opt.iterations) == 2 * STEPS


def _session_program(make):
    """TF1 graph ops: ([sok step per kind], [reference step per kind], feeds, table, vars, opts);
    kind 0 without, 1 with c in the wrapper's call. The direct call depends on the wrapper's (one
    fetch per step)."""
    table = _table()
    b, c = tf.Variable(B0), tf.Variable(C0)
    a, rb, rc = tf.Variable(INIT), tf.Variable(B0), tf.Variable(C0)
    pos = tf.compat.v1.placeholder(tf.int64, [len(KEYS)])
    y = tf.compat.v1.placeholder(tf.float32, INIT.shape)
    yb = tf.compat.v1.placeholder(tf.float32, B0.shape)
    yc = tf.compat.v1.placeholder(tf.float32, C0.shape)
    opt, ref_opt = make(), make()
    wrapper = sok.OptimizerWrapper(opt, max_touched_rows=8)
    rows = tf.nn.embedding_lookup(table, tf.gather(tf.constant(KEYS), pos))
    sok_steps, ref_steps = [], []
    for with_c in (False, True):
        sok_vars, ref_vars = ([table, c], [a, rc]) if with_c else ([table], [a])
        sok_loss = _row_loss(rows, y) + (_dense_loss(c, yc) if with_c else 0.0)
        ref_loss = _row_loss(tf.gather(a, pos), y) + (_dense_loss(rc, yc) if with_c else 0.0)
        first = wrapper.apply_gradients(zip(tf.gradients(sok_loss, sok_vars), sok_vars))
        with tf.control_dependencies([first]):
            sok_steps.append(opt.apply_gradients([(tf.gradients(_dense_loss(b, yb), b)[0], b)]))
        first = ref_opt.apply_gradients(zip(tf.gradients(ref_loss, ref_vars), ref_vars))
        with tf.control_dependencies([first]):
            ref_steps.append(
                ref_opt.apply_gradients([(tf.gradients(_dense_loss(rb, yb), rb)[0], rb)])
            )
    return sok_steps, ref_steps, (pos, y, yb, yc), table, (b, c, a, rb, rc), (opt, ref_opt)


@pytest.mark.parametrize("flavor,name,mode", _params(["v1", "keras_legacy"], ["session"]))
def test_wrapper_and_direct_calls_share_the_optimizer_tf1(flavor, name, mode):
    with graph_session() as sess, tf.device("/CPU:0"):
        sok_steps, ref_steps, feeds, table, (b, c, a, rb, rc), (opt, ref_opt) = (
            _session_program(FLAVOURS[flavor][name])
        )
        sess.run(tf.compat.v1.global_variables_initializer())
        sess.run(sok.assign(table, tf.constant(KEYS), tf.constant(INIT)))
        for i, batch in enumerate(BATCHES):
            feed = dict(zip(feeds, batch))
            sess.run(sok_steps[i % 2], feed)
            sess.run(ref_steps[i % 2], feed)
        _check(_rows(table, sess), sess.run(a))
        _check(*sess.run([b, rb]))
        _check(*sess.run([c, rc]))
        assert not np.array_equal(_rows(table, sess), INIT)
        if flavor != "v1":
            assert sess.run(opt.iterations) == sess.run(ref_opt.iterations) == 2 * STEPS


def test_wrapper_leaves_a_keras_optimizer_unbuilt():
    """The wrapper builds no Keras optimizer with SOK's scratch variables: after a table-only
    step the program's optimizer knows none of SOK's variables and builds for its own."""
    for make in (TF_KERAS["rmsprop"], KERAS3["rmsprop"]):
        opt = make()
        wrapper = sok.OptimizerWrapper(opt, max_touched_rows=8)
        table = _table()
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.nn.embedding_lookup(table, KEYS[:2]))
        wrapper.apply_gradients([(tape.gradient(loss, table), table)])
        assert not getattr(opt, "built", False) and not getattr(opt, "_built", False)
        assert int(opt.iterations) == 1
        assert all("sok_scratch" not in v.name for v in opt.variables)
        names = wrapper.get_slot_names()
        assert names and all(wrapper.get_slot(table, n) is not None for n in names)
