"""sok.all_reduce, sok.all_gather and the collectives' choice in one process (several ranks:
tests/distributed)."""
import numpy as np
import pytest
import tensorflow as tf

import sparse_operation_kit as sok
from sparse_operation_kit.runtime import collectives


def test_one_process_has_no_collectives():
    sok.init(use_horovod=False)
    assert collectives.kind() is None


def test_all_reduce_in_one_process_is_the_identity():
    sok.init(use_horovod=False)
    xs = [tf.constant([[1.0, 2.0]]), tf.constant([3, 4], tf.int64)]
    out = sok.all_reduce(xs, op="sum")
    for got, want in zip(out, xs, strict=True):
        np.testing.assert_array_equal(got.numpy(), want.numpy())
    np.testing.assert_array_equal(sok.all_reduce(xs[:1])[0].numpy(), xs[0].numpy())
    assert sok.all_reduce([]) == []


def test_all_reduce_refuses_what_it_cannot_do():
    with pytest.raises(ValueError, match="op must be 'mean' or 'sum'"):
        sok.all_reduce([tf.constant([1.0])], op="max")
    with pytest.raises(ValueError, match="mean of a int64 tensor"):
        sok.all_reduce([tf.constant([1], tf.int64)], op="mean")


def test_all_reduce_in_a_tf1_graph():
    with tf.Graph().as_default():
        x = tf.compat.v1.placeholder(tf.float32, [2])
        out = sok.all_reduce([x], op="mean")[0]
        with tf.compat.v1.Session() as sess:
            np.testing.assert_array_equal(sess.run(out, {x: [1.0, 5.0]}), [1.0, 5.0])


def test_all_gather_in_one_process_is_the_identity():
    sok.init(use_horovod=False)
    xs = [tf.constant([[1.0, 2.0]]), tf.constant([3, 4], tf.int64), tf.zeros([0, 3])]
    out = sok.all_gather(xs)
    for got, want in zip(out, xs, strict=True):
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got.numpy(), want.numpy())
    assert sok.all_gather([], training=True) == []
    with tf.Graph().as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None])
        out = sok.all_gather([x])[0]
        with tf.compat.v1.Session() as sess:
            np.testing.assert_array_equal(sess.run(out, {x: [1.0, 5.0]}), [1.0, 5.0])


def test_all_gather_refuses_a_scalar():
    with pytest.raises(ValueError, match="tensor 1 is a scalar"):
        sok.all_gather([tf.constant([1.0]), tf.constant(2.0)])


def _collective(x, chain=collectives.TRAIN, opens_lookup=False, ends_step=False):
    """A stand-in collective placed in a TF1 chain as SOK places its own (NCCL ones)."""
    with collectives._after_previous(chain, opens_lookup):
        out = tf.identity(x)
    collectives._remember(out, chain, ends_step)
    return out


def test_tf1_chains_order_a_step_and_leave_the_next_one_alone():
    """In a TF1 graph each collective depends on its chain's previous one, except a lookup's
    first collective after a step's gradients (a new step: depending on the old one would run
    it again). sok.all_reduce keeps the state it follows: before a lookup it stays ordered with
    it, after the gradients (dense ones) it ends the step with them."""
    with tf.Graph().as_default():
        x = tf.constant(1.0)
        forward_reduce = _collective(x, ends_step=None)
        keys = _collective(x, opens_lookup=True)
        assert keys.op.control_inputs == [forward_reduce.op]
        rows = _collective(x)
        other_keys = _collective(x, opens_lookup=True)  # a second lookup of the same step
        assert other_keys.op.control_inputs == [rows.op]
        grad = _collective(x, ends_step=True)
        dense_reduce = _collective(x, ends_step=None)
        assert dense_reduce.op.control_inputs == [grad.op]
        next_step = _collective(x, opens_lookup=True)
        assert next_step.op.control_inputs == []
        first_eval = _collective(x, chain=collectives.LOOKUP, opens_lookup=True)
        assert first_eval.op.control_inputs == []
        second_eval = _collective(x, chain=collectives.LOOKUP, opens_lookup=True)
        assert second_eval.op.control_inputs == [first_eval.op]


class _FakeHorovod:
    """Three ranks' allgather of the GPU identities, seen from rank `rank`."""

    def __init__(self, rank, gathered):
        self._rank, self._gathered = rank, gathered

    def rank(self):
        return self._rank

    def allgather(self, tensor, name=None):
        return tf.constant(self._gathered, tf.int64)


def test_ranks_sharing_a_gpu_do_not_use_nccl():
    """Two ranks on one GPU cannot join one NCCL communicator: every rank sees the same gathered
    identities and falls back alike (a negative identity: a rank without NCCL of its own)."""
    gid = collectives._gpu_identity(0)
    assert collectives._gpu_identity(0) == gid != collectives._gpu_identity(1)
    reason = collectives._shared_gpu_reason(_FakeHorovod(1, [gid, 7, gid]), "no GPU")
    assert reason is not None and "ranks [0, 2] share one GPU" in reason
    assert collectives._shared_gpu_reason(_FakeHorovod(0, [gid, 7, -3]), None) is None


def test_gpu_identity_follows_cuda_visible_devices(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    three = collectives._gpu_identity(0)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,3")
    assert collectives._gpu_identity(1) == three != collectives._gpu_identity(0)
