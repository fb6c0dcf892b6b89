"""Layer arguments and ids that cannot work are errors naming the layer, the table and what was
expected: dense ids of a pooling layer other than [batch, n], a table of another dimension than
the layer's embedding_dim."""
import numpy as np
import pytest
import tensorflow as tf

import sparse_operation_kit as sok
from tests.python.support import unique_name

UNIFORM = tf.random_uniform_initializer(-1.0, 1.0, seed=2)


@pytest.mark.parametrize("shape", [[3], [2, 2, 2]], ids=["1-D", "3-D"])
@pytest.mark.parametrize("kind", ["embedding", "sparse"])
def test_pooled_dense_ids_must_be_batch_by_n(kind, shape):
    name = unique_name("pooled")
    if kind == "embedding":
        layer = sok.Embedding(3, combiner="sum", initializer=UNIFORM, name=name)
    else:
        layer = sok.SparseEmbedding(3, combiners="sum", initializers=UNIFORM, name=name)
    table = layer.embedding_variables[0]
    ids = tf.reshape(tf.range(int(np.prod(shape)), dtype=tf.int64), shape)
    with pytest.raises(ValueError, match=rf"layer '{name}': table '{table.name}': dense ids to "
                                         rf"pool must be \[batch, n\].*got shape \({shape[0]},"):
        layer(ids, training=True)
    assert int(table.size()) == 0  # refused before any lookup
    # [batch, n] still pools its n ids per sample.
    rows = table.sparse_read(tf.constant([0, 1, 2, 3], tf.int64), training=False).numpy()
    out = layer(tf.constant([[0, 1], [2, 3]], tf.int64), training=False)
    np.testing.assert_allclose(out, [rows[0] + rows[1], rows[2] + rows[3]], rtol=1e-6)


def test_embedding_dim_must_match_the_given_table():
    table = sok.EmbeddingVariable(unique_name("dim3"), 3, initializer=UNIFORM)
    name = unique_name("mismatch")
    with pytest.raises(ValueError, match=rf"layer '{name}': embedding_dim=5 but its table "
                                         rf"'{table.name}' has dimension 3"):
        sok.Embedding(5, embedding_variable=table, name=name)
    layer = sok.Embedding(3, embedding_variable=table)  # the same dimension: accepted
    assert layer.embedding_dim == 3 and layer.embedding_variable is table
    assert sok.Embedding(embedding_variable=table).embedding_dim == 3
