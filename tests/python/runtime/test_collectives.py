"""sok.all_reduce and the collectives' choice in one process (several ranks: tests/distributed)."""
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
