"""Keras layers (sok.Embedding, sok.SparseEmbedding) against plain TensorFlow: forward values,
training with sok.OptimizerWrapper(Keras optimizer) in a tf.function custom loop, and Keras's
`training` flag (inference never inserts ids)."""
import numpy as np
import pytest
import tensorflow as tf

import sparse_operation_kit as sok
from tests.python.support import to_ragged, to_sparse, unique_name

VOCAB = 16
UNIFORM = tf.random_uniform_initializer(-1.0, 1.0, seed=11)


def initial_table(var):
    """The [VOCAB, dim] rows keys 0..VOCAB-1 will start from (read without inserting them)."""
    return tf.constant(
        var.sparse_read(tf.range(VOCAB, dtype=var.key_dtype), training=False).numpy()
    )


def test_embedding_forward_matches_tf():
    layer = sok.Embedding(3, initializer=UNIFORM)
    table = layer.embedding_variable
    reference = initial_table(table)
    dense_ids = tf.constant([[1, 2, 3], [4, 1, 7]], tf.int32)  # Keras-style int32 ids are cast
    np.testing.assert_array_equal(layer(dense_ids, training=True),
                                  tf.nn.embedding_lookup(reference, dense_ids))
    rows = [[5, 6], [], [1, 1, 9]]
    ragged_out = layer(to_ragged(rows), training=True)
    assert isinstance(ragged_out, tf.RaggedTensor)
    np.testing.assert_array_equal(ragged_out.flat_values,
                                  tf.gather(reference, [k for r in rows for k in r]))

    pooled = sok.Embedding(embedding_variable=table, combiner="mean")
    assert pooled.embedding_variables == [table]
    np.testing.assert_allclose(pooled(to_sparse(rows), training=True),
                               tf.nn.safe_embedding_lookup_sparse(reference, to_sparse(rows), None,
                                                                  combiner="mean"), rtol=1e-6)
    assert int(table.size()) == len({1, 2, 3, 4, 5, 6, 7, 9})
    with pytest.raises(TypeError, match="combiner"):
        layer(to_sparse(rows))


def test_sparse_embedding_forward_matches_tf():
    existing = sok.DynamicVariable(dimension=4, initializer="random", name=unique_name("dyn"))
    static = sok.Variable(UNIFORM([VOCAB, 2]))
    layer = sok.SparseEmbedding(embedding_variables=[existing, static, sok.EmbeddingVariable(
        unique_name("ev"), 3, initializer=UNIFORM)], combiners=["sum", "mean", "sqrtn"])
    assert layer.embedding_variables[:2] == [existing, static]
    references = [
        initial_table(existing),
        tf.constant(static.numpy()),
        initial_table(layer.embedding_variables[2]),
    ]
    rows = [[[1, 2, 2], [], [3]], [[4], [5, 6, 7], [8, 0]], [[9, 9], [10], [11, 12, 13]]]
    weights = to_sparse([[0.5, 2.0, 1.0], [], [3.0]], dtype=tf.float32)
    ids = [to_sparse(rows[0]), to_ragged(rows[1]), to_ragged(rows[2])]
    outs = layer(ids, weights=[weights, None, None], training=True)
    expected = [
        tf.nn.safe_embedding_lookup_sparse(
            references[0], to_sparse(rows[0]), weights, combiner="sum"
        ),
        tf.nn.safe_embedding_lookup_sparse(
            references[1], to_sparse(rows[1]), None, combiner="mean"
        ),
        tf.nn.safe_embedding_lookup_sparse(
            references[2], to_sparse(rows[2]), None, combiner="sqrtn"
        ),
    ]
    for out, ref in zip(outs, expected):
        np.testing.assert_allclose(out, ref, rtol=1e-6, atol=1e-7)
    single = sok.SparseEmbedding(embedding_variables=[existing], combiners="sum")
    np.testing.assert_allclose(
        single(ids[0], weights=weights, training=False), expected[0], rtol=1e-6
    )
    with pytest.raises(ValueError, match="3 tables but 2 id tensors"):
        layer(ids[:2])


class TwoTableModel(tf.keras.Model):
    def __init__(self):
        super().__init__()
        self.features = sok.SparseEmbedding([4, 2], combiners=["sum", "mean"], initializers=UNIFORM)
        self.head = tf.keras.layers.Dense(1, kernel_initializer=tf.keras.initializers.Constant(0.2))

    def call(self, inputs, training=None):
        return self.head(tf.concat(self.features(list(inputs), training=training), 1))


class ReferenceModel(tf.Module):
    """The same model over dense tables holding the Embedding Variables' initial rows."""

    def __init__(self, tables):
        super().__init__()
        self.initial = [initial_table(t) for t in tables]
        self.tables = [tf.Variable(t) for t in self.initial]
        self.head = tf.keras.layers.Dense(1, kernel_initializer=tf.keras.initializers.Constant(0.2))

    def __call__(self, inputs):
        pooled = [tf.nn.safe_embedding_lookup_sparse(t, x.to_sparse(), None, combiner=c)
                  for t, x, c in zip(self.tables, inputs, ["sum", "mean"])]
        return self.head(tf.concat(pooled, 1))


def test_training_matches_tf_reference():
    rng = np.random.default_rng(7)
    batches = [
        [
            to_ragged(
                [[int(k) for k in rng.integers(0, VOCAB, rng.integers(1, 4))] for _ in range(4)]
            )
            for _ in range(2)
        ]
        for _ in range(4)
    ]
    labels = tf.constant(rng.normal(size=[4, 1]), tf.float32)
    model = TwoTableModel()
    reference = ReferenceModel(model.features.embedding_variables)
    opt = sok.OptimizerWrapper(tf.keras.optimizers.Adagrad(0.1))
    ref_opt = tf.keras.optimizers.Adagrad(0.1)

    @tf.function
    def sok_step(inputs):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum((model(inputs, training=True) - labels) ** 2)
        variables = model.trainable_variables + model.features.embedding_variables
        opt.apply_gradients(zip(tape.gradient(loss, variables), variables))
        return loss

    def reference_step(inputs):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum((reference(inputs) - labels) ** 2)
        variables = reference.head.trainable_variables + reference.tables
        grads = [tf.convert_to_tensor(g) for g in tape.gradient(loss, variables)]
        ref_opt.apply_gradients(zip(grads, variables))
        return loss

    for inputs in batches:
        np.testing.assert_allclose(sok_step(inputs), reference_step(inputs), rtol=2e-5)
    for table, dense, initial in zip(
        model.features.embedding_variables, reference.tables, reference.initial
    ):
        keys, values = (t.numpy() for t in sok.export(table))
        np.testing.assert_allclose(values, tf.gather(dense, keys), rtol=2e-5, atol=1e-6)
        assert (
            not np.isclose(values, tf.gather(initial, keys)).all(axis=1).any()
        )  # every row trained
    np.testing.assert_allclose(model.head.kernel, reference.head.kernel, rtol=2e-5, atol=1e-6)
    assert int(opt.iterations) == len(batches)


def test_training_flag_controls_insertion():
    model = TwoTableModel()
    tables = sok.layers.embedding_variables(model)
    assert tables == model.features.embedding_variables and len(tables) == 2
    inputs = [to_ragged([[1, 2], [3]]), to_ragged([[4], [5, 5]])]

    default = model(inputs)  # Keras's default (training=None) is inference
    assert [int(t.size()) for t in tables] == [0, 0]

    @tf.function
    def serve(x):
        return model(x, training=False)

    np.testing.assert_array_equal(serve(inputs), default)
    assert [int(t.size()) for t in tables] == [0, 0]

    trained = model(inputs, training=True)  # Keras passes the flag down to the nested layer
    np.testing.assert_array_equal(
        trained, default
    )  # same rows: unseen ids read their initial value
    assert [int(t.size()) for t in tables] == [3, 2]
    keys, _, _, freqs = (t.numpy() for t in tables[1].export()[:4])
    assert dict(zip(keys.tolist(), freqs.tolist())) == {4: 1, 5: 2}  # training lookups count ids


def test_layer_tables_are_checkpoint_dependencies(tmp_path):
    model = TwoTableModel()
    model([to_ragged([[1]]), to_ragged([[2]])], training=True)
    path = tf.train.Checkpoint(model=model).save(str(tmp_path / "ckpt"))
    names = {n for n, _ in tf.train.list_variables(path)}
    assert {
        "model/features/table_0/.ATTRIBUTES/values",
        "model/features/table_1/.ATTRIBUTES/keys",
    } <= names
