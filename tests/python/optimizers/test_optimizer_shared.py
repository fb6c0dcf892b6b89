"""One optimizer object used through sok.OptimizerWrapper for a table and directly for a
tf.Variable, calls interleaved (NVIDIA SOK 2.x's tf1/variable/dynamic_variable_test.py does
this). As in SOK 2.x the wrapper counts its own steps: a wrapper call runs at the wrapper's step
and advances it, a direct call runs at `opt.iterations` and advances that, so after n steps of
each both sides have seen steps 0..n-1.

The reference, in plain TF with the same step semantics: two optimizers of the same
configuration, one for the wrapper's side (a plain tf.Variable `a` standing for the table's rows,
and `c` when the wrapper's call carries it) and one for the direct side (`b`). Slots are per
variable, so the step is the only state the two sides of one object share.

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
    # fused
    "sgd": lambda: tf.compat.v1.train.GradientDescentOptimizer(0.1),
    "adagrad": lambda: tf.compat.v1.train.AdagradOptimizer(0.1),
    "adam": lambda: tf.compat.v1.train.AdamOptimizer(0.1),
    "ftrl": lambda: tf.compat.v1.train.FtrlOptimizer(0.1, l1_regularization_strength=0.01),
}
FUSED = {"sgd", "adagrad", "adam", "ftrl"}


def _keras_families(optimizers, extra=()):
    families = {
        "sgd_momentum": lambda: optimizers.SGD(0.1, momentum=0.9),
        "rmsprop": lambda: optimizers.RMSprop(0.05, momentum=0.5, centered=True),
        "adadelta": lambda: optimizers.Adadelta(1.0),
        "adamax": lambda: optimizers.Adamax(learning_rate=1.0),
        "adam_amsgrad": lambda: optimizers.Adam(0.1, amsgrad=True),
        # fused
        "sgd": lambda: optimizers.SGD(0.1),
        "adagrad": lambda: optimizers.Adagrad(0.1),
        "adam": lambda: optimizers.Adam(0.1),
        "ftrl": lambda: optimizers.Ftrl(0.1, l1_regularization_strength=0.01),
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


def _table(name=None):
    """A table; a restored program names it as the saved one (its slot stores take its name)."""
    return sok.DynamicVariable(DIM, initializer="zeros", name=name or unique_name("shared_opt"))


def _rows(table, sess=None):
    rows = table.sparse_read(tf.constant(KEYS), training=False)
    return sess.run(rows) if sess is not None else rows.numpy()


def _check(got, want, name):
    if name in FUSED:  # SOK's kernels round differently (and tf_keras's Adam more so)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)  # a step off: > 1e-2
    elif TEST_DEVICE == "gpu":  # fused multiply-add may round the last bit differently
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    else:
        np.testing.assert_array_equal(got, want)


def _grad_pairs(loss_fn, variables):
    with tf.GradientTape() as tape:
        loss = loss_fn()
    return list(zip(tape.gradient(loss, variables), variables))


def _with_c(flavor, name, mode):
    # A tf.compat.v1 Adam keeps its beta powers beside the slots, per object: a dense variable in
    # the wrapper's call shares them with the direct calls (the tables count SOK's own steps).
    return mode != "eager" and not (flavor == "v1" and name == "adam")


def _tf2_step(wrapper, opt, table, b, c, refs, ref_opts, batch, with_c):
    """The program: the wrapper on the table (and c), then `opt` directly on b. The reference:
    ref_opts[0] on a (and rc), ref_opts[1] on rb."""
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
    opt.apply_gradients(_grad_pairs(lambda: _dense_loss(b, yb), [b]))
    ref_opts[0].apply_gradients(_grad_pairs(ref_loss, [a, rc] if with_c else [a]))
    ref_opts[1].apply_gradients(_grad_pairs(lambda: _dense_loss(rb, yb), [rb]))


class _Tf2Program:
    """The program and its reference, built eagerly; `run(batches)` trains both."""

    def __init__(self, flavor, name, mode, table_name=None):
        make = FLAVOURS[flavor][name]
        self.flavor, self.with_c = flavor, _with_c(flavor, name, mode)
        self.table = _table(table_name)
        sok.assign(self.table, tf.constant(KEYS), tf.constant(INIT))
        device = "/CPU:0" if flavor in ("v1", "keras_legacy") else None  # their sparse kernels
        with tf.device(device):
            self.b, self.c = tf.Variable(B0), tf.Variable(C0)
            self.refs = tf.Variable(INIT), tf.Variable(B0), tf.Variable(C0)
        self.opt, self.ref_opts = make(), (make(), make())
        self.wrapper = sok.OptimizerWrapper(self.opt, max_touched_rows=8)
        if flavor in ("tf_keras", "keras3"):  # a Keras optimizer learns its variables once
            a, rb, rc = self.refs
            self.ref_opts[0].build([a, rc])
            self.ref_opts[1].build([rb])
            if self.with_c:
                self.opt.build([self.b, self.c])  # else b's first direct call builds it
        self.step = tf.function(_tf2_step) if mode == "function" else _tf2_step

    def run(self, batches):
        for batch in batches:
            batch = tuple(tf.constant(x) for x in batch)
            self.step(self.wrapper, self.opt, self.table, self.b, self.c, self.refs,
                      self.ref_opts, batch, self.with_c)

    def check(self, name):
        got = (_rows(self.table), self.b.numpy(), self.c.numpy())
        for g, w in zip(got, self.refs):
            _check(g, w.numpy(), name)
        assert not np.array_equal(got[0], INIT)

    def checkpoint(self):
        """The program's state: tables, variables, the optimizer and its wrapper."""
        return tf.train.Checkpoint(table=self.table, b=self.b, c=self.c, opt=self.opt,
                                   wrapper=self.wrapper)


def _params(flavors, modes):
    return [
        pytest.param(f, name, mode, id=f"{f}-{name}-{mode}")
        for f in flavors
        for name in sorted(FLAVOURS[f])
        for mode in modes
    ]


@pytest.mark.parametrize("flavor,name,mode", _params(["v1", "keras_legacy", "tf_keras", "keras3"],
                                                     ["eager", "function"]))
def test_wrapper_counts_its_own_steps_tf2(flavor, name, mode):
    # Eager: the table alone through the wrapper (the wrapped optimizer is first built by the
    # direct call); tf.function: the wrapper's call also carries a dense variable.
    program = _Tf2Program(flavor, name, mode)
    program.run(BATCHES)
    program.check(name)
    if flavor != "v1":
        assert int(program.opt.iterations) == STEPS  # direct calls only
        assert int(program.wrapper.iterations) == STEPS  # wrapper calls only
    assert sok.update_step(program.wrapper) == STEPS


CHECKPOINTED = [
    ("v1", "adam"), ("v1", "momentum"), ("keras_legacy", "adamax"), ("keras_legacy", "adam"),
    ("tf_keras", "adamax"), ("tf_keras", "adam"), ("keras3", "adamax"), ("keras3", "adam"),
]


@pytest.mark.parametrize("flavor,name", CHECKPOINTED, ids=[f"{f}-{n}" for f, n in CHECKPOINTED])
def test_restored_wrapper_continues_at_its_step_tf2(flavor, name, tmp_path):
    """tf.train.Checkpoint of the wrapper holds its step: a run restored after half the steps
    continues at that step and ends where the uninterrupted run ends."""
    half = STEPS // 2
    table_name = unique_name("restored")
    first = _Tf2Program(flavor, name, "function", table_name)
    first.run(BATCHES[:half])
    path = first.checkpoint().save(str(tmp_path / "ckpt"))
    first.run(BATCHES[half:])
    first.check(name)
    second = _Tf2Program(flavor, name, "function", table_name)
    second.checkpoint().restore(path)
    if flavor != "v1":
        assert int(second.opt.iterations) == half
        assert int(second.wrapper.iterations) == half
    step = tf.function(_program_step)
    for batch in BATCHES[half:]:
        step(second.wrapper, second.opt, second.table, second.b, second.c,
             tuple(tf.constant(x) for x in batch), second.with_c)
    for got, want in zip((_rows(second.table), second.b, second.c),
                         (_rows(first.table), first.b, first.c)):
        _check(np.asarray(got), np.asarray(want), name)
    assert sok.update_step(second.wrapper) == STEPS


def _program_step(wrapper, opt, table, b, c, batch, with_c):
    """The program's half of _tf2_step."""
    pos, y, yb, yc = batch
    keys = tf.gather(tf.constant(KEYS), pos)

    def sok_loss():
        rows = tf.nn.embedding_lookup(table, keys)
        return _row_loss(rows, y) + (_dense_loss(c, yc) if with_c else 0.0)

    wrapper.apply_gradients(_grad_pairs(sok_loss, [table, c] if with_c else [table]))
    opt.apply_gradients(_grad_pairs(lambda: _dense_loss(b, yb), [b]))


def _session_program(make, with_c, table_name=None):
    """TF1 graph ops: (sok step, reference step, feeds, table, variables, (opt, wrapper)). The
    direct call depends on the wrapper's (one fetch per step)."""
    table = _table(table_name)
    b, c = tf.Variable(B0, name="b"), tf.Variable(C0, name="c")
    a, rb, rc = tf.Variable(INIT), tf.Variable(B0), tf.Variable(C0)
    feeds = (
        tf.compat.v1.placeholder(tf.int64, [len(KEYS)]),
        tf.compat.v1.placeholder(tf.float32, INIT.shape),
        tf.compat.v1.placeholder(tf.float32, B0.shape),
        tf.compat.v1.placeholder(tf.float32, C0.shape),
    )
    pos, y, yb, yc = feeds
    opt, ref_opts = make(), (make(), make())
    wrapper = sok.OptimizerWrapper(opt, max_touched_rows=8)
    rows = tf.nn.embedding_lookup(table, tf.gather(tf.constant(KEYS), pos))
    sok_vars, ref_vars = ([table, c], [a, rc]) if with_c else ([table], [a])
    sok_loss = _row_loss(rows, y) + (_dense_loss(c, yc) if with_c else 0.0)
    ref_loss = _row_loss(tf.gather(a, pos), y) + (_dense_loss(rc, yc) if with_c else 0.0)
    first = wrapper.apply_gradients(zip(tf.gradients(sok_loss, sok_vars), sok_vars))
    with tf.control_dependencies([first]):
        sok_step = opt.apply_gradients([(tf.gradients(_dense_loss(b, yb), b)[0], b)])
    first = ref_opts[0].apply_gradients(zip(tf.gradients(ref_loss, ref_vars), ref_vars))
    with tf.control_dependencies([first]):
        ref_step = ref_opts[1].apply_gradients([(tf.gradients(_dense_loss(rb, yb), rb)[0], rb)])
    return sok_step, ref_step, feeds, table, (b, c, a, rb, rc), (opt, wrapper)


# The TF1 programs run on the CPU (their dense optimizers have no GPU sparse kernels).
@pytest.mark.cpu_placement
@pytest.mark.parametrize("flavor,name,mode", _params(["v1", "keras_legacy"], ["session"]))
def test_wrapper_counts_its_own_steps_tf1(flavor, name, mode):
    with graph_session() as sess, tf.device("/CPU:0"):
        sok_step, ref_step, feeds, table, (b, c, a, rb, rc), (opt, wrapper) = _session_program(
            FLAVOURS[flavor][name], _with_c(flavor, name, mode)
        )
        sess.run(tf.compat.v1.global_variables_initializer())
        sess.run(sok.assign(table, tf.constant(KEYS), tf.constant(INIT)))
        for batch in BATCHES:
            feed = dict(zip(feeds, batch))
            sess.run(sok_step, feed)
            sess.run(ref_step, feed)
        _check(_rows(table, sess), sess.run(a), name)
        _check(*sess.run([b, rb]), name)
        _check(*sess.run([c, rc]), name)
        assert not np.array_equal(_rows(table, sess), INIT)
        if flavor != "v1":
            assert sess.run(opt.iterations) == STEPS
            assert sess.run(wrapper.iterations) == STEPS
        assert sess.run(sok.update_step(wrapper)) == STEPS


def _saver_run(make, batches, save=None, restore=None):
    """A TF1 program trained on `batches` (restored from `restore` first, saved to `save` after):
    (table rows, b, c, wrapper's step, optimizer's step or None)."""
    with graph_session() as sess, tf.device("/CPU:0"):
        sok_step, _, feeds, table, (b, c, *_), (opt, wrapper) = _session_program(make, True, "saved_table")
        saver = tf.compat.v1.train.Saver()
        sess.run(tf.compat.v1.global_variables_initializer())
        if restore:
            saver.restore(sess, restore)
        else:
            sess.run(sok.assign(table, tf.constant(KEYS), tf.constant(INIT)))
        for batch in batches:
            sess.run(sok_step, dict(zip(feeds, batch)))
        if save:
            saver.save(sess, save)
        steps = sess.run(sok.update_step(wrapper))
        opt_steps = sess.run(opt.iterations) if hasattr(opt, "iterations") else None
        return _rows(table, sess), sess.run(b), sess.run(c), steps, opt_steps


@pytest.mark.cpu_placement
@pytest.mark.parametrize("flavor,name", [("keras_legacy", "adamax"), ("keras_legacy", "adam"),
                                         ("v1", "momentum")])
def test_restored_wrapper_continues_at_its_step_tf1_saver(flavor, name, tmp_path):
    make, half = FLAVOURS[flavor][name], STEPS // 2
    whole = _saver_run(make, BATCHES)
    _saver_run(make, BATCHES[:half], save=str(tmp_path / "model"))
    resumed = _saver_run(make, BATCHES[half:], restore=str(tmp_path / "model"))
    for got, want in zip(resumed[:3], whole[:3]):
        _check(got, want, name)
    assert resumed[3:] == whole[3:] == (STEPS, None if flavor == "v1" else STEPS)
