"""sok.OptimizerWrapper(..., average_over_ranks=True): under Horovod, each step is the one a
single process takes on the global batch with the loss averaged over it, as Horovod's
DistributedOptimizer gives a dense model (Keras 3's `fit` has no working Horovod optimizer).

Data-parallel variables: their gradients are averaged over the ranks (sok.all_reduce, one call
for all). SOK tables (Embedding Variables and sok.Variable shards) are model-parallel: the
exchange already sums each row's gradient over the ranks at its owner, so theirs are divided by
the number of ranks.
"""
import tensorflow as tf

from sparse_operation_kit.runtime.collectives import all_reduce
from sparse_operation_kit.runtime.context import context
from sparse_operation_kit.tables.tables import is_sok_table


def _divided(grad, n):
    if grad is None:
        return None
    if isinstance(grad, tf.IndexedSlices):  # the same indices: uniqueness.py knows them
        return tf.IndexedSlices(grad.values / n, grad.indices, grad.dense_shape)
    return grad / n


def average_over_ranks(sparse, dense):
    """(sparse, dense) [(gradient, variable)] pairs -> the same with the gradients of the global
    batch's mean loss, given each rank's gradients of its own mean loss."""
    world = context.world_size
    if world == 1:
        return sparse, dense
    sparse = [(_divided(g, world), v) for g, v in sparse]
    shards = [i for i, (_, v) in enumerate(dense) if is_sok_table(v)]
    replicated = [i for i, (g, v) in enumerate(dense) if g is not None and not is_sok_table(v)]
    out = list(dense)
    for i in shards:
        out[i] = (_divided(dense[i][0], world), dense[i][1])
    averaged = all_reduce([dense[i][0] for i in replicated], op="mean")
    for i, g in zip(replicated, averaged, strict=True):
        out[i] = (g, dense[i][1])
    return sparse, out
