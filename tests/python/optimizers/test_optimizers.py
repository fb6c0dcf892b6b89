"""20 optimizer steps of SOK's fused sparse updates against plain TensorFlow on tf.Variables.

Model: emb = mean-pooled lookup of an Embedding Variable (EV); logits = emb @ w (a dense
tf.Variable); loss = sum((logits - y)^2). The reference holds the EV's initial rows in a dense
tf.Variable (row i <-> key VOCAB[i]) and a copy of w.

TF1: tf.compat.v1.train optimizers wrapped in sok.OptimizerWrapper; the reference trains with the
same TF1 optimizer (its sparse updates deduplicate ids and touch only gathered rows), except Adam,
whose TF1 version is not lazy: the table's reference there is a lazy Adam in plain TF ops.
TF2: Keras 3 optimizers wrapped, eager. References: Keras SGD (scatter updates on IndexedSlices)
and Keras Adagrad given deduplicated gradients (Keras does not sum repeated ids first, SOK and
TF1 do); Adam and FTRL in plain TF ops, because Keras 3's Adam and FTRL update every row of a
dense variable (Adam decays all moments; FTRL rewrites all rows from their linear term).
"""
import numpy as np
import pytest
import tensorflow as tf

import sparse_operation_kit as sok
from tests.python.support import (
    ev_rows,
    exported,
    graph_session,
    sparse_value,
    to_ragged,
    unique_name,
)

DIM = 4
BATCH = 5
STEPS = 20
VOCAB = np.array(
    [3, -8, 2**33 + 1, 17, 0, 999999999999, -(2**40), 5, 12, 77, 1 << 45, -1, 64, 31, 6, 2],
    np.int64,
)
UNIFORM = tf.random_uniform_initializer(-0.5, 0.5, seed=11)


def make_batches(repeated, seed=3):
    """STEPS batches of (positions per sample, targets). unique: no id twice in a batch;
    repeated: ids drawn with replacement from 5 positions, so ids repeat in and across samples."""
    rng = np.random.default_rng(seed)
    batches = []
    for _ in range(STEPS):
        if repeated:
            rows = [list(rng.integers(0, 5, int(rng.integers(2, 5)))) for _ in range(BATCH)]
        else:
            perm = list(rng.permutation(len(VOCAB)))
            rows = [[int(perm.pop()) for _ in range(int(rng.integers(1, 3)))] for _ in range(BATCH)]
        rows = [[int(x) for x in r] for r in rows]
        batches.append((rows, rng.normal(size=[BATCH, 1]).astype(np.float32)))
    return batches


def keyed(rows):
    return [[int(VOCAB[p]) for p in r] for r in rows]


def check_tables(ev_table, ref_table, w, ref_w, batches, rtol=2e-4, atol=2e-5):
    touched = sorted({p for rows, _ in batches for r in rows for p in r})
    assert sorted(ev_table) == sorted(int(VOCAB[p]) for p in touched)
    for p in touched:
        np.testing.assert_allclose(ev_table[int(VOCAB[p])], ref_table[p], rtol=rtol, atol=atol,
                                   err_msg=f"key {VOCAB[p]}")
    np.testing.assert_allclose(w, ref_w, rtol=rtol, atol=atol)


# ---------------------------------------------------------------------------------------------
# TF1: tf.compat.v1.train optimizers in a Session
# ---------------------------------------------------------------------------------------------
V1_OPTIMIZERS = {
    "sgd": lambda: tf.compat.v1.train.GradientDescentOptimizer(0.1),
    "adagrad": lambda: tf.compat.v1.train.AdagradOptimizer(0.1, initial_accumulator_value=0.2),
    "adam": lambda: tf.compat.v1.train.AdamOptimizer(0.05, beta1=0.8, beta2=0.95, epsilon=1e-3),
    "ftrl": lambda: tf.compat.v1.train.FtrlOptimizer(
        0.2, l1_regularization_strength=0.01, l2_regularization_strength=0.02
    ),
    "ftrl_beta": lambda: tf.compat.v1.train.FtrlOptimizer(
        0.2, initial_accumulator_value=0.3, l1_regularization_strength=0.01, beta=0.5
    ),
}


def lazy_adam_v1(var, grad, lr, beta1, beta2, epsilon):
    """Lazy Adam on a tf.Variable in plain TF ops: only the rows in `grad` (IndexedSlices, ids may
    repeat and are summed first) and their moments move. Returns the update op."""
    m = tf.compat.v1.get_variable(
        var.op.name + "_m",
        initializer=tf.zeros_like(var.initial_value),
        use_resource=True,
        trainable=False,
    )
    v = tf.compat.v1.get_variable(
        var.op.name + "_v",
        initializer=tf.zeros_like(var.initial_value),
        use_resource=True,
        trainable=False,
    )
    t = tf.compat.v1.get_variable(
        var.op.name + "_t", initializer=0.0, use_resource=True, trainable=False
    )
    ids, inverse = tf.unique(grad.indices)
    g = tf.math.unsorted_segment_sum(grad.values, inverse, tf.size(ids))
    step = t.read_value() + 1.0
    alpha = lr * tf.sqrt(1.0 - beta2 ** step) / (1.0 - beta1 ** step)
    m_new = beta1 * tf.gather(m, ids) + (1.0 - beta1) * g
    v_new = beta2 * tf.gather(v, ids) + (1.0 - beta2) * g * g
    updates = [
        m.scatter_update(tf.IndexedSlices(m_new, ids)),
        v.scatter_update(tf.IndexedSlices(v_new, ids)),
        var.scatter_sub(tf.IndexedSlices(alpha * m_new / (tf.sqrt(v_new) + epsilon), ids)),
    ]
    with tf.control_dependencies([u.op if hasattr(u, "op") else u for u in updates]):
        return t.assign_add(1.0, read_value=False)


@pytest.mark.parametrize("repeated", [False, True], ids=["unique_ids", "repeated_ids"])
@pytest.mark.parametrize("kind", sorted(V1_OPTIMIZERS))
def test_tf1_optimizer_matches_tf(kind, repeated):
    batches = make_batches(repeated)
    w0 = np.random.default_rng(5).normal(size=[DIM, 1]).astype(np.float32)
    with graph_session() as sess:
        ev = sok.get_embedding_variable("table", DIM, initializer=UNIFORM)
        w = tf.compat.v1.get_variable("w", initializer=w0, use_resource=True)
        ids = tf.compat.v1.sparse_placeholder(tf.int64)
        y = tf.compat.v1.placeholder(tf.float32, [BATCH, 1])
        emb = sok.lookup_sparse([ev], [ids], combiners=["mean"])[0]
        loss = tf.reduce_sum((tf.matmul(emb, w) - y) ** 2)
        train = sok.OptimizerWrapper(V1_OPTIMIZERS[kind]()).minimize(loss)

        ref = tf.compat.v1.get_variable(
            "ref", shape=[len(VOCAB), DIM], initializer=tf.zeros_initializer(), use_resource=True
        )
        ref_w = tf.compat.v1.get_variable("ref_w", initializer=w0, use_resource=True)
        ref_init = tf.compat.v1.placeholder(tf.float32, [len(VOCAB), DIM])
        load_ref = ref.assign(ref_init, read_value=False)
        positions = tf.compat.v1.sparse_placeholder(tf.int64)
        ref_emb = tf.nn.embedding_lookup_sparse(ref, positions, None, combiner="mean")
        ref_loss = tf.reduce_sum((tf.matmul(ref_emb, ref_w) - y) ** 2)
        if kind == "adam":
            opt = V1_OPTIMIZERS[kind]()
            (ref_grad,) = tf.gradients(ref_loss, [ref])
            ref_train = tf.group(
                opt.minimize(ref_loss, var_list=[ref_w]),
                lazy_adam_v1(ref, ref_grad, opt._lr, opt._beta1, opt._beta2, opt._epsilon),
            )
        else:
            ref_train = V1_OPTIMIZERS[kind]().minimize(ref_loss, var_list=[ref, ref_w])

        sess.run(tf.compat.v1.global_variables_initializer())
        initial = ev_rows(ev, VOCAB, sess)  # the EV's initial rows, read without inserting
        assert sess.run(ev.size()) == 0
        sess.run(load_ref, {ref_init: initial})
        for rows, target in batches:
            got, want, _, _ = sess.run(
                [loss, ref_loss, train, ref_train],
                {ids: sparse_value(keyed(rows)), positions: sparse_value(rows), y: target},
            )
            np.testing.assert_allclose(got, want, rtol=2e-4, atol=1e-5)
        check_tables(exported(ev, sess), sess.run(ref), *sess.run([w, ref_w]), batches)
        # Untouched rows of the (lazy) reference kept their initial values.
        touched = {p for rows, _ in batches for r in rows for p in r}
        untouched = [p for p in range(len(VOCAB)) if p not in touched]
        np.testing.assert_array_equal(sess.run(ref)[untouched], initial[untouched])


# ---------------------------------------------------------------------------------------------
# TF2: Keras 3 optimizers, eager
# ---------------------------------------------------------------------------------------------
def _dedup(grad):
    ids, inverse = tf.unique(grad.indices)
    return tf.IndexedSlices(tf.math.unsorted_segment_sum(grad.values, inverse, tf.size(ids)), ids,
                            grad.dense_shape)


class KerasReference:
    """A Keras optimizer on the reference table, fed deduplicated gradients."""

    def __init__(self, make):
        self.opt = make()

    def apply(self, grad, table, w_grad, w):
        self.opt.apply_gradients([(_dedup(grad), table), (w_grad, w)])


class LazyAdamReference:
    """Lazy Adam in plain TF ops for the table (Keras's Adam is not lazy); w with Keras Adam."""

    def __init__(self, make):
        self.opt = make()
        self.w_opt = make()
        self.m = self.v = None

    def apply(self, grad, table, w_grad, w):
        if self.m is None:
            self.m, self.v = tf.Variable(tf.zeros_like(table)), tf.Variable(tf.zeros_like(table))
        o = self.opt
        step = tf.cast(self.w_opt.iterations + 1, tf.float32)  # before w's update increments it
        lr = tf.cast(o.learning_rate, tf.float32)
        g = _dedup(grad)
        alpha = lr * tf.sqrt(1.0 - o.beta_2 ** step) / (1.0 - o.beta_1 ** step)
        m_new = o.beta_1 * tf.gather(self.m, g.indices) + (1.0 - o.beta_1) * g.values
        v_new = o.beta_2 * tf.gather(self.v, g.indices) + (1.0 - o.beta_2) * g.values ** 2
        self.m.scatter_update(tf.IndexedSlices(m_new, g.indices))
        self.v.scatter_update(tf.IndexedSlices(v_new, g.indices))
        table.scatter_sub(tf.IndexedSlices(alpha * m_new / (tf.sqrt(v_new) + o.epsilon), g.indices))
        self.w_opt.apply_gradients([(w_grad, w)])


class FtrlReference:
    """TensorFlow's own sparse FTRL kernel for the table (Keras's FTRL rewrites every row of a dense
    variable); w with Keras FTRL. Keras folds beta into l2 as l2 + beta / (2 lr)."""

    def __init__(self, make):
        self.opt = make()
        self.w_opt = make()
        self.accum = self.linear = None

    def apply(self, grad, table, w_grad, w):
        o = self.opt
        if self.accum is None:
            self.accum = tf.Variable(tf.fill(tf.shape(table), o.initial_accumulator_value))
            self.linear = tf.Variable(tf.zeros_like(table))
        g = _dedup(grad)
        lr = float(o.learning_rate.numpy())
        tf.raw_ops.ResourceSparseApplyFtrl(
            var=table.handle, accum=self.accum.handle, linear=self.linear.handle, grad=g.values,
            indices=g.indices, lr=lr, l1=o.l1_regularization_strength,
            l2=o.l2_regularization_strength + o.beta / (2.0 * lr), lr_power=o.learning_rate_power)
        self.w_opt.apply_gradients([(w_grad, w)])


KERAS_OPTIMIZERS = {
    "sgd": (lambda: tf.keras.optimizers.SGD(0.1), KerasReference),
    # epsilon large enough that sqrt(acc + eps) and sqrt(acc) + eps differ visibly
    "adagrad": (
        lambda: tf.keras.optimizers.Adagrad(0.1, initial_accumulator_value=0.2, epsilon=0.05),
        KerasReference,
    ),
    "adam": (
        lambda: tf.keras.optimizers.Adam(0.05, beta_1=0.8, beta_2=0.95, epsilon=1e-3),
        LazyAdamReference,
    ),
    "ftrl": (
        lambda: tf.keras.optimizers.Ftrl(
            0.2, l1_regularization_strength=0.01, l2_regularization_strength=0.02
        ),
        FtrlReference,
    ),
    "ftrl_beta": (
        lambda: tf.keras.optimizers.Ftrl(
            0.2, initial_accumulator_value=0.3, beta=0.5, l1_regularization_strength=0.01
        ),
        FtrlReference,
    ),
}


@pytest.mark.parametrize("repeated", [False, True], ids=["unique_ids", "repeated_ids"])
@pytest.mark.parametrize("kind", sorted(KERAS_OPTIMIZERS))
def test_keras_optimizer_matches_tf(kind, repeated):
    make, reference_cls = KERAS_OPTIMIZERS[kind]
    batches = make_batches(repeated)
    w0 = np.random.default_rng(5).normal(size=[DIM, 1]).astype(np.float32)
    ev = sok.get_embedding_variable(unique_name("keras_table"), DIM, initializer=UNIFORM)
    w = tf.Variable(w0)
    initial = ev_rows(ev, VOCAB)
    ref, ref_w = tf.Variable(initial), tf.Variable(w0)
    wrapper = sok.OptimizerWrapper(make())
    reference = reference_cls(make)
    for rows, target in batches:
        with tf.GradientTape() as tape:
            emb = sok.lookup_sparse([ev], [to_ragged(keyed(rows))], combiners=["mean"])[0]
            loss = tf.reduce_sum((tf.matmul(emb, w) - target) ** 2)
        grads = tape.gradient(loss, [ev, w])
        wrapper.apply_gradients(zip(grads, [ev, w]))
        with tf.GradientTape() as tape:
            ref_emb = tf.nn.embedding_lookup_sparse(
                ref, to_ragged(rows).to_sparse(), None, combiner="mean"
            )
            ref_loss = tf.reduce_sum((tf.matmul(ref_emb, ref_w) - target) ** 2)
        ref_grads = tape.gradient(ref_loss, [ref, ref_w])
        reference.apply(ref_grads[0], ref, ref_grads[1], ref_w)
        np.testing.assert_allclose(loss.numpy(), ref_loss.numpy(), rtol=2e-4, atol=1e-5)
    check_tables(exported(ev), ref.numpy(), w.numpy(), ref_w.numpy(), batches)
    assert int(wrapper.iterations.numpy()) == STEPS  # the wrapper's own step


def test_keras_wrapper_only_embedding_variables_counts_steps():
    """With no dense variable the wrapper still advances its step counter (Adam's t)."""
    ev = sok.get_embedding_variable(unique_name(), 2, initializer=tf.zeros_initializer())
    wrapper = sok.OptimizerWrapper(tf.keras.optimizers.Adam(0.1))
    key = tf.constant([4], tf.int64)
    for _ in range(3):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(ev.sparse_read(key))
        wrapper.apply_gradients([(tape.gradient(loss, ev), ev)])
    assert int(wrapper.iterations.numpy()) == 3  # the wrapper's own step
    # A constant gradient 1: lazy Adam moves the row by lr every step (bias-corrected
    # m/sqrt(v) = 1).
    np.testing.assert_allclose(exported(ev)[4], [-0.3, -0.3], rtol=1e-4)


# ---------------------------------------------------------------------------------------------
# sok.SGD (NVIDIA SOK 2.x) on Embedding Variables and tf.Variables
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["eager", "function"])
def test_sok_sgd(mode):
    ev = sok.DynamicVariable(dimension=3, initializer="0.5", name=unique_name("dyn"))
    table = tf.Variable(np.ones([6, 3], np.float32))
    bias = tf.Variable([1.0, 2.0, 3.0])
    opt = sok.SGD(lr=0.5)

    def step():
        with tf.GradientTape() as tape:
            a, b = sok.lookup_sparse(
                [ev, table],
                [
                    tf.ragged.constant([[1, 1], [2]], dtype=tf.int64),
                    tf.ragged.constant([[0], [5, 5]], dtype=tf.int64),
                ],
                combiners=["sum", "sum"],
            )
            loss = tf.reduce_sum(a) + tf.reduce_sum(b) + tf.reduce_sum(bias * bias)
        grads = tape.gradient(loss, [ev, table, bias])
        opt.apply_gradients(zip(grads, [ev, table, bias]))

    if mode == "function":
        step = tf.function(step)
    step()
    step()
    table_rows = exported(ev)
    np.testing.assert_allclose(
        table_rows[1], [0.5 - 2 * 0.5 * 2] * 3
    )  # gradient 2 (twice in a sample)
    np.testing.assert_allclose(table_rows[2], [0.5 - 2 * 0.5] * 3)
    want = np.ones([6, 3], np.float32)
    want[0] -= 2 * 0.5
    want[5] -= 2 * 0.5 * 2
    np.testing.assert_allclose(table.numpy(), want)
    np.testing.assert_allclose(bias.numpy(), [0.0, 0.0, 0.0])  # b -= 0.5 * 2b


@pytest.mark.parametrize("mode", ["eager", "function"])
def test_keras_learning_rate_schedule_is_followed(mode):
    """The wrapped optimizer's learning rate is read at every step (schedules, assignments)."""
    def schedule():
        return tf.keras.optimizers.schedules.ExponentialDecay(0.5, decay_steps=1, decay_rate=0.5)

    ev = sok.get_embedding_variable(unique_name(), 2, initializer=tf.zeros_initializer())
    w, ref_w = tf.Variable([1.0]), tf.Variable([1.0])
    wrapper = sok.OptimizerWrapper(tf.keras.optimizers.SGD(schedule()))
    reference = tf.keras.optimizers.SGD(schedule())
    key = tf.constant([3], tf.int64)

    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(ev.sparse_read(key)) + tf.reduce_sum(w)
        wrapper.apply_gradients(zip(tape.gradient(loss, [ev, w]), [ev, w]))

    if mode == "function":
        step = tf.function(step)
    for _ in range(4):
        step()
        reference.apply_gradients([(tf.ones([1]), ref_w)])
    np.testing.assert_allclose(w.numpy(), ref_w.numpy(), rtol=1e-6)  # 1 - (0.5 + 0.25 + ...)
    np.testing.assert_allclose(exported(ev)[3], np.repeat(ref_w.numpy() - 1.0, 2), rtol=1e-6)
    # A plain learning rate assigned later is used from then on.
    plain = sok.OptimizerWrapper(tf.keras.optimizers.SGD(0.1))
    plain.optimizer.learning_rate = 0.7
    grad = tf.IndexedSlices(tf.ones([1, 2]), tf.constant([9], tf.int64))
    plain.apply_gradients([(grad, ev)])
    np.testing.assert_allclose(exported(ev)[9], [-0.7, -0.7], rtol=1e-6)


def test_keras_adam_inside_tf_function_matches_eager():
    """The wrapper inside tf.function (Keras step counter read in the graph) trains as in eager."""
    batches = make_batches(repeated=True)
    tables = []
    for mode in ("eager", "function"):
        ev = sok.get_embedding_variable("adam_fn", DIM, initializer=UNIFORM)  # same initial rows
        wrapper = sok.OptimizerWrapper(
            tf.keras.optimizers.Adam(0.05, beta_1=0.8, beta_2=0.95, epsilon=1e-3)
        )

        def step(ids, target, ev=ev, wrapper=wrapper):
            with tf.GradientTape() as tape:
                emb = sok.lookup_sparse([ev], [ids], combiners=["mean"])[0]
                loss = tf.reduce_sum((tf.reduce_sum(emb, axis=1, keepdims=True) - target) ** 2)
            wrapper.apply_gradients([(tape.gradient(loss, ev), ev)])

        if mode == "function":
            step = tf.function(step)
        for rows, target in batches[:8]:
            step(to_ragged(keyed(rows)), tf.constant(target))
        assert int(wrapper.iterations.numpy()) == 8  # the wrapper's own step
        tables.append(exported(ev))
    assert tables[0].keys() == tables[1].keys()
    for k in tables[0]:
        np.testing.assert_allclose(tables[1][k], tables[0][k], rtol=1e-6, atol=1e-7)


def test_update_ops_do_not_grow_per_table():
    """OptimizerWrapper's update of lookup_sparse's gradients adds no op per table beyond the
    gradient itself: the [n, dim] gradients go to the one fused update as they are."""

    def num_ops(n):
        graph = tf.Graph()
        with graph.as_default():
            evs = [
                sok.get_embedding_variable(f"upd{n}_{i}", 4, key_dtype=tf.int64) for i in range(n)
            ]
            ids = tf.compat.v1.placeholder(tf.int64, [None, n])
            loss = tf.add_n(
                [tf.reduce_sum(e) for e in sok.lookup_sparse(evs, tf.unstack(ids, axis=1))]
            )
            opt = sok.OptimizerWrapper(tf.compat.v1.train.AdagradOptimizer(0.1))
            grads = opt.compute_gradients(loss)
            before = len(graph.get_operations())
            opt.apply_gradients(grads)
            return len(graph.get_operations()) - before

    assert num_ops(10) == num_ops(2), (num_ops(2), num_ops(10))
