"""static_staging.py: static tables whose optimizer updates sparse gradients on the CPU only
(tf.compat.v1 Momentum, RMSProp) go through a CPU scratch. On a GPU that is the only way the step
runs; here the staging is forced (`always`) and must equal the optimizer applied to a tf.Variable
directly: values and the optimizer's slots of the table, over several steps, TF1 and eager."""
import numpy as np
import pytest
import tensorflow as tf

import sparse_operation_kit as sok
from sparse_operation_kit.optimizers import static_staging
from tests.python.support import graph_session

ROWS, DIM, STEPS = 12, 3, 4
IDS = [[1, 4, 4, 7], [0, 1, 11, 11], [4, 5, 6, 7], [2, 2, 2, 9]]


def _init():
    return np.random.default_rng(0).normal(size=[ROWS, DIM]).astype(np.float32)


def _optimizers():
    return {
        "momentum": (lambda: tf.compat.v1.train.MomentumOptimizer(0.05, momentum=0.9), "momentum"),
        "nesterov": (lambda: tf.compat.v1.train.MomentumOptimizer(0.05, momentum=0.9,
                                                                   use_nesterov=True), "momentum"),
        "rmsprop": (lambda: tf.compat.v1.train.RMSPropOptimizer(0.01, momentum=0.5), "rms"),
    }


def _loss(table, ids):
    emb = tf.nn.embedding_lookup(table, tf.cast(ids, tf.int64))
    return tf.reduce_sum(emb * emb * tf.constant([1.0, 2.0, 3.0]))


def test_cpu_only_updates_are_named_by_their_kernels():
    momentum = tf.compat.v1.train.MomentumOptimizer(0.1, 0.9)
    adagrad = tf.compat.v1.train.AdagradOptimizer(0.1)
    assert static_staging.cpu_only_update(momentum, "v1")  # no GPU kernel in TensorFlow
    assert not static_staging.cpu_only_update(adagrad, "v1")


@pytest.mark.parametrize("kind", sorted(_optimizers()))
def test_tf1_staged_static_table_equals_the_optimizer_on_a_variable(kind):
    make, slot_name = _optimizers()[kind]
    with graph_session() as sess:
        table = sok.Variable(_init(), name=f"staged_{kind}")
        ref = tf.Variable(_init(), name=f"ref_{kind}")
        ids = tf.compat.v1.placeholder(tf.int64, [None])
        wrapper = sok.OptimizerWrapper(make())
        wrapper._updater.static.always = True
        direct = make()
        emb_loss = _loss(table, ids)
        train = wrapper.apply_gradients(zip(tf.gradients(emb_loss, [table]), [table]))
        ref_train = direct.minimize(_loss(ref, ids), var_list=[ref])
        sess.run(tf.compat.v1.global_variables_initializer())
        for step in range(STEPS):
            sess.run([train, ref_train], {ids: IDS[step]})
        assert len(wrapper._updater.static._scratch) == 1  # the staged path ran
        np.testing.assert_allclose(*sess.run([table, ref]), rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(*sess.run([wrapper.get_slot(table, slot_name),
                                              direct.get_slot(ref, slot_name)]),
                                   rtol=1e-6, atol=1e-6)


def test_eager_staged_static_table_equals_the_optimizer_on_a_variable():
    make, slot_name = _optimizers()["momentum"]
    table = sok.Variable(_init(), name="staged_eager")
    with tf.device("/CPU:0"):  # TensorFlow has no GPU kernel for v1 Momentum's sparse update
        ref = tf.Variable(_init(), name="ref_eager")
    wrapper, direct = sok.OptimizerWrapper(make()), make()
    wrapper._updater.static.always = True
    for step in range(STEPS):
        with tf.GradientTape() as tape:
            loss = _loss(table, IDS[step])
        wrapper.apply_gradients(zip(tape.gradient(loss, [table]), [table]))
        with tf.GradientTape() as tape:
            loss = _loss(ref, IDS[step])
        direct.apply_gradients(zip(tape.gradient(loss, [ref]), [ref]))
    assert len(wrapper._updater.static._scratch) == 1
    np.testing.assert_allclose(table.numpy(), ref.numpy(), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(wrapper.get_slot(table, slot_name).numpy(),
                               direct.get_slot(ref, slot_name).numpy(), rtol=1e-6, atol=1e-6)
