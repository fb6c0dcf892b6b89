"""sok.incremental_model_dump with a wall-clock `since` (SOK 2.x's datetime form): the rows updated
at or after the time, the same rows as the step form, in TF2 eager, tf.function and a TF1
Session, for fused and generic optimizers; and its refusals (docs/COMPATIBILITY_SOK.md)."""
import datetime
import time

import numpy as np
import pytest
import tensorflow as tf

import sparse_operation_kit as sok
from sparse_operation_kit.checkpoint import incremental
from tests.python.support import graph_session, unique_name

PAUSE = 0.05  # between a step and a time taken: the clock has microseconds
UTC = datetime.UTC


def _batches(steps, batch=4, vocab=40):
    rng = np.random.default_rng(11)
    return [rng.choice(vocab, batch, replace=False).astype(np.int64) for _ in range(steps)]


def _check_times_match_steps(run_step, dump, batches, now=lambda: datetime.datetime.now(UTC)):
    """Before each step: a time and the step number; after the last step, the increment since
    each time holds the rows of that step and later, as the step form gives."""
    marks = []
    for ids in batches:
        time.sleep(PAUSE)
        marks.append((now(), dump("step")))
        time.sleep(PAUSE)
        run_step(ids)
    for i, (when, step) in enumerate(marks):
        by_time, by_step = dump(when), dump(step)
        np.testing.assert_array_equal(np.sort(by_time[0]), np.sort(by_step[0]))
        np.testing.assert_array_equal(np.sort(by_time[0]), np.unique(np.concatenate(batches[i:])))
        np.testing.assert_array_equal(by_time[1][np.argsort(by_time[0])],
                                      by_step[1][np.argsort(by_step[0])])
    time.sleep(PAUSE)
    assert dump(now())[0].size == 0  # no step ran since


def _eager_dump(v, optimizer):
    def dump(since):
        if since == "step":
            return sok.update_step(optimizer)
        keys, values = sok.incremental_model_dump([v], since)
        return keys[0], values[0]
    return dump


OPTIMIZERS = {
    "keras_adagrad": lambda: tf.keras.optimizers.Adagrad(learning_rate=0.1),  # fused, iterations
    "v1_adagrad": lambda: tf.compat.v1.train.AdagradOptimizer(0.1),  # fused, SOK's own step
    "keras_momentum": lambda: tf.keras.optimizers.SGD(0.1, momentum=0.9),  # generic, iterations
    "v1_momentum": lambda: tf.compat.v1.train.MomentumOptimizer(0.1, 0.9),  # generic, own step
}


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_datetime_form_matches_step_form_eager(name):
    v = sok.DynamicVariable(dimension=2, initializer="1", name=unique_name("inc_time"))
    optimizer = sok.OptimizerWrapper(OPTIMIZERS[name]())

    def run_step(ids):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.nn.embedding_lookup(v, tf.constant(ids)) ** 2)
        optimizer.apply_gradients(zip(tape.gradient(loss, [v]), [v]))

    _check_times_match_steps(run_step, _eager_dump(v, optimizer), _batches(3))


def test_datetime_form_in_tf_function_naive_and_other_zones():
    v = sok.DynamicVariable(dimension=2, initializer="1", name=unique_name("inc_fn"))
    optimizer = sok.SGD(learning_rate=0.1)

    @tf.function
    def run_step(ids):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.nn.embedding_lookup(v, ids) ** 2)
        optimizer.apply_gradients(zip(tape.gradient(loss, [v]), [v]))

    batches = _batches(3)
    # A naive time is local time (datetime.now()), as Python's timestamp() takes it.
    _check_times_match_steps(lambda ids: run_step(tf.constant(ids)), _eager_dump(v, optimizer),
                             batches, now=datetime.datetime.now)
    # An aware time in another zone is the same instant.
    first = datetime.datetime.now(UTC) - datetime.timedelta(hours=1)
    zone = datetime.timezone(datetime.timedelta(hours=-5))
    keys = sok.incremental_model_dump([v], first.astimezone(zone))[0][0]
    np.testing.assert_array_equal(np.sort(keys), np.unique(np.concatenate(batches)))


@pytest.mark.parametrize("name", ["v1_adagrad", "v1_momentum"])
def test_datetime_form_in_a_session(name):
    batches = _batches(3)
    with graph_session() as sess:
        v = sok.DynamicVariable(dimension=2, initializer="1", name=unique_name("inc_session"))
        optimizer = sok.OptimizerWrapper(OPTIMIZERS[name]())
        ids = tf.compat.v1.placeholder(tf.int64, [None])
        loss = tf.reduce_sum(tf.nn.embedding_lookup(v, ids) ** 2)
        train = optimizer.apply_gradients(zip(tf.gradients(loss, [v]), [v]))
        step = sok.update_step(optimizer)
        sess.run(tf.compat.v1.global_variables_initializer())

        def dump(since):
            if since == "step":
                return int(sess.run(step))
            keys, values = sok.incremental_model_dump([v], since, sess)
            return keys[0], values[0]

        _check_times_match_steps(lambda b: sess.run(train, {ids: b}), dump, batches)


def test_datetime_refusals():
    v = sok.DynamicVariable(dimension=2, initializer="1", name=unique_name("inc_refuse"))
    now = datetime.datetime.now(UTC)
    with pytest.raises(ValueError, match=f"no optimizer update of '{v.name}' ran in this process"):
        sok.incremental_model_dump([v], now)
    optimizer = sok.SGD(learning_rate=0.1)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.nn.embedding_lookup(v, tf.constant([1, 2], tf.int64)))
    optimizer.apply_gradients(zip(tape.gradient(loss, [v]), [v]))
    with pytest.raises(TypeError, match="an optimizer step .* or a datetime"):
        sok.incremental_model_dump([v], now.timestamp())
    other = sok.OptimizerWrapper(tf.keras.optimizers.Adagrad(learning_rate=0.1))
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.nn.embedding_lookup(v, tf.constant([3], tf.int64)))
    other.apply_gradients(zip(tape.gradient(loss, [v]), [v]))
    with pytest.raises(ValueError, match=f"'{v.name}' was updated by optimizers with different"):
        sok.incremental_model_dump([v], now)
    assert sok.incremental_model_dump([v], 0)[0][0].size == 3  # the step form still works


def test_a_time_before_the_kept_history_is_refused():
    """Steps ran that the clock no longer (or never) knew: a time before its oldest is refused."""
    steps = np.arange(5, 9, dtype=np.int64)
    times = np.arange(4, dtype=np.float64) + 100.0
    assert incremental._first_step_since(steps, times, 101.5, "t") == 7
    assert incremental._first_step_since(steps, times, 200.0, "t") == 9
    with pytest.raises(ValueError, match="predates the wall-clock history of the updates of 't'"):
        incremental._first_step_since(steps, times, 50.0, "t")
    assert incremental._first_step_since(steps - 5, times, 50.0, "t") == 0  # training began after


DETERMINISTIC_PROGRAM = """
import datetime, time
import numpy as np
import tensorflow as tf
import sparse_operation_kit as sok
tf.config.experimental.enable_op_determinism()
v = sok.DynamicVariable(dimension=4, initializer="0.5", name="deterministic")
opt = sok.OptimizerWrapper(tf.keras.optimizers.Adagrad(0.1))
for ids in ([1, 2], [3]):
    when = datetime.datetime.now(datetime.UTC)
    time.sleep(0.05)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(sok.lookup_sparse([v], [tf.ragged.constant([ids], tf.int64)])[0])
    opt.apply_gradients(zip(tape.gradient(loss, [v]), [v]))
keys, _ = sok.incremental_model_dump([v], when)
print("KEYS", sorted(keys[0].tolist()))
"""


def test_datetime_form_under_op_determinism():
    """tf.timestamp is refused once op determinism is on (the Criteo job turns it on); the step
    clock's own op is not: training and the dump by time still work."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", DETERMINISTIC_PROGRAM], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "KEYS [3]" in out.stdout, out.stdout
