"""NVIDIA SOK 2.x's variables on one CPU process: sok.Variable, sok.DynamicVariable, sok.export /
sok.assign, and user code written in the style of SOK 2.x's documented examples, which must run
unchanged (`from sparse_operation_kit import experiment as sok`)."""
import numpy as np
import pytest
import tensorflow as tf

import sparse_operation_kit
from tests.python.support import TEST_DEVICE, graph_session, unique_name


def test_static_variable_modes():
    from sparse_operation_kit import experiment as sok
    values = np.arange(12, dtype=np.float32).reshape(4, 3)
    v = sok.Variable(values, mode="localized:0")
    assert isinstance(v, tf.Variable) and v.target_gpu == 0
    assert sok.Variable(values).target_gpu == -1
    assert sok.Variable(values, mode="distributed").target_gpu == -1
    with pytest.raises(ValueError, match="unknown mode"):
        sok.Variable(values, mode="localized")
    keys, rows = sok.export(v)
    np.testing.assert_array_equal(keys.numpy(), [0, 1, 2, 3])
    np.testing.assert_array_equal(rows.numpy(), values)
    sok.assign(v, tf.constant([2], tf.int64), tf.constant([[-1.0, -2.0, -3.0]]))
    np.testing.assert_array_equal(v.numpy()[2], [-1.0, -2.0, -3.0])
    np.testing.assert_array_equal(v.numpy()[[0, 1, 3]], values[[0, 1, 3]])


def test_dynamic_variable_attributes_and_initializers():
    from sparse_operation_kit import experiment as sok
    v = sok.DynamicVariable(dimension=3, initializer="13", var_type="hybrid")
    assert v.dimension == 3 and v.key_type == tf.int64 and v.dtype == tf.float32
    assert v.shape.as_list() == [None, 3] and v.target_gpu == -1 and v.var_type == "hybrid"
    np.testing.assert_array_equal(v.size.numpy(), [0, 3])
    emb = tf.nn.embedding_lookup(v, tf.constant([0, 1, 2**40], tf.int64))
    np.testing.assert_array_equal(emb.numpy(), np.full([3, 3], 13.0))
    np.testing.assert_array_equal(v.size.numpy(), [3, 3])  # SOK 2.x: v.size is [rows, dimension]
    r = sok.DynamicVariable(dimension=8, name=unique_name("dyn_random"))  # default "random"
    rows = tf.nn.embedding_lookup(
        r, [1, 2, 3]
    ).numpy()  # a Python list: int32 ids, cast like SOK 2.x
    assert rows.shape == (3, 8) and np.abs(rows).max() <= 0.05 and len(np.unique(rows)) == 24
    z = sok.DynamicVariable(
        dimension=2,
        initializer=tf.keras.initializers.Constant(0.25),
        key_type=tf.int32,
        mode="localized:0",
    )
    assert z.key_type == tf.int32 and z.target_gpu == 0
    np.testing.assert_array_equal(
        z.sparse_read(tf.constant([-4], tf.int32)).numpy(), [[0.25, 0.25]]
    )


def test_dense_reads_and_writes_of_a_dynamic_variable_name_the_table():
    """SOK 2.x's DynamicVariable is a tf.Variable: its dense methods are TypeErrors naming the
    table and what to call instead (as tf.convert_to_tensor(v)), and leave the table as it is."""
    from sparse_operation_kit import experiment as sok
    name = unique_name("dense_ops")
    v = sok.DynamicVariable(dimension=2, initializer="0.5", name=name)
    sok.assign(v, tf.constant([4], tf.int64), tf.constant([[1.0, 2.0]]))
    reads = [v.value, v.numpy, v.read_value, lambda: tf.convert_to_tensor(v)]
    for read in reads:
        with pytest.raises(TypeError, match=f"'{name}' is a hash table.*sparse_read"):
            read()
    for write, scatter in (("assign_add", "scatter_add"), ("assign_sub", "scatter_sub")):
        with pytest.raises(TypeError, match=f"'{name}' is a hash table.*{scatter}"):
            getattr(v, write)(tf.ones([1, 2]))
    np.testing.assert_array_equal(v.size.numpy(), [1, 2])
    np.testing.assert_array_equal(v.sparse_read(tf.constant([4], tf.int64)).numpy(), [[1.0, 2.0]])


def test_assign_to_a_fused_slot_names_it_read_only():
    """Adagrad's accumulator lives in the table's rows (fused kernel): sok.export reads it,
    sok.assign is a TypeError naming the table and the slot, and the slot keeps its values."""
    from sparse_operation_kit import experiment as sok
    name = unique_name("fused_slot")
    v = sok.DynamicVariable(dimension=2, initializer="1", name=name)
    opt = sok.OptimizerWrapper(tf.compat.v1.train.AdagradOptimizer(0.5, 0.1))
    ids = tf.constant([3, 7], tf.int64)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(v.sparse_read(ids) ** 2)
    opt.apply_gradients(zip(tape.gradient(loss, [v]), [v]))
    slot = opt.get_slot(v, "accumulator")
    keys, before = [t.numpy() for t in sok.export(slot)]
    np.testing.assert_allclose(before, np.full([2, 2], 0.1 + 2.0**2))  # gradient 2 * row
    with pytest.raises(TypeError, match=f"'accumulator' slot of table '{name}'.*read-only"):
        sok.assign(slot, keys, np.zeros_like(before))
    np.testing.assert_array_equal(sok.export(slot)[1].numpy(), before)


def test_static_variable_ids_beyond_its_rows_name_the_table():
    """sok.assign, sparse_read and tf.nn.embedding_lookup of a sok.Variable check ids against its
    rows on the table's device (TensorFlow's GPU gather reads zeros for a bad id, its GPU scatter
    skips it): an error naming the table, its rows and the first bad id, eager and in a
    tf.function, int32 and int64 ids; the table keeps its values."""
    from sparse_operation_kit import experiment as sok
    name = unique_name("static_rows")
    init = np.arange(15 * 2, dtype=np.float32).reshape(15, 2)
    v = sok.Variable(init, name=name)
    beyond = f"of static table {name}: id out of range \\[0, 15\\): "
    with pytest.raises(tf.errors.InvalidArgumentError, match=f"sok.assign {beyond}15 at position 15"):
        sok.assign(v, tf.range(24, dtype=tf.int64), tf.ones([24, 2]))
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=f"sparse_read of static table {name}: negative id -1 at position 1 "
                       "\\(the table has 15 rows\\)"):
        v.sparse_read(tf.constant([2, -1], tf.int64))
    with pytest.raises(tf.errors.InvalidArgumentError, match=f"sparse_read {beyond}20 at position 1"):
        tf.function(lambda: v.sparse_read(tf.constant([[3, 20], [21, 0]], tf.int32)))()
    with pytest.raises(tf.errors.InvalidArgumentError, match=f"sparse_read {beyond}15"):
        tf.nn.embedding_lookup(v, tf.constant([15], tf.int64))
    with pytest.raises(tf.errors.InvalidArgumentError, match=f"sok.assign {beyond}16"):
        tf.function(lambda: sok.assign(v, tf.constant([16]), tf.ones([1, 2])))()
    np.testing.assert_array_equal(v.numpy(), init)
    before = sok.kernel_run_counts(by_op=True).get("SokCheckRowIds", {})
    sok.assign(v, tf.constant([14]), tf.ones([1, 2]))  # the last row is still writable
    after = sok.kernel_run_counts(by_op=True)["SokCheckRowIds"]
    device = "GPU" if TEST_DEVICE == "gpu" else "CPU"  # the check runs on the table's device
    assert after[device] == before.get(device, 0) + 1, (before, after)
    np.testing.assert_array_equal(v.sparse_read(tf.constant([14, 0])).numpy(), [[1, 1], [0, 1]])


def test_static_variable_ids_checked_in_a_tf1_session():
    """The same check in a TF1 graph: sparse_read and sok.assign of ids fed at run time."""
    from sparse_operation_kit import experiment as sok
    name = unique_name("static_graph_rows")
    with graph_session() as sess:
        v = sok.Variable(np.ones([6, 2], np.float32), name=name)
        ids = tf.compat.v1.placeholder(tf.int64, [None])
        read = v.sparse_read(ids)
        write = sok.assign(v, ids, tf.zeros([tf.size(ids), 2]))
        sess.run(v.initializer)
        np.testing.assert_array_equal(sess.run(read, {ids: [5, 0]}), np.ones([2, 2]))
        for op, what in ((read, "sparse_read"), (write, "sok.assign")):
            with pytest.raises(tf.errors.InvalidArgumentError,
                               match=f"{what} of static table {name}: id out of range "
                               "\\[0, 6\\): 6 at position 1"):
                sess.run(op, {ids: [1, 6]})
        np.testing.assert_array_equal(sess.run(read, {ids: [1, 2]}), np.ones([2, 2]))


def test_sok2_assign_and_export():
    """In the style of SOK 2.x's assign/export example."""
    from sparse_operation_kit import experiment as sok
    vocab_size, dim = 1000, 8
    indices = tf.convert_to_tensor([i for i in range(vocab_size)], dtype=tf.int64)
    values = tf.convert_to_tensor(np.random.rand(vocab_size, dim), dtype=tf.float32)
    v = sok.DynamicVariable(dimension=dim)
    sok.assign(v, indices, values)
    shape = v.size
    assert shape[0] == vocab_size
    ex_indices, ex_values = sok.export(v)
    out = tf.gather(values, ex_indices)
    diff = tf.reduce_sum((ex_values - out) ** 2.0)
    assert diff < 1e-6
    assert sorted(ex_indices.numpy().tolist()) == list(range(vocab_size))


def test_sok2_lookup_sparse_training_loop():
    """In the style of SOK 2.x's lookup_sparse examples: DynamicVariables with constant
    initializers and a sok.Variable, a tf.function step with lookup_sparse and a wrapped Keras SGD,
    checked against tf.nn.embedding_lookup_sparse on tf.Variables trained by the same optimizer."""
    from sparse_operation_kit import experiment as sok
    sok.init()
    assert sok.rank() == 0 and sok.num_ranks() == 1

    rows = [256, 64, 128]
    cols = [16, 4, 8]
    hotness = [5, 3, 2]
    combiners = ["sum", "mean", "sqrtn"]
    batch_size = 32
    iters = 8
    initial_vals = [13, 17]
    rng = np.random.default_rng(0)
    static_init = rng.random((rows[2], cols[2])).astype(np.float32)

    sok_vars = [
        sok.DynamicVariable(dimension=cols[i], initializer=str(initial_vals[i]), var_type="hybrid")
        for i in range(2)
    ]
    sok_vars.append(sok.Variable(static_init, mode="localized:0"))
    tf_vars = [tf.Variable(tf.constant(initial_vals[i], shape=[rows[i], cols[i]], dtype=tf.float32))
               for i in range(2)]
    tf_vars.append(tf.Variable(static_init))

    total_indices = []
    for i in range(len(rows)):
        offsets = rng.integers(1, hotness[i] + 1, iters * batch_size)
        values = rng.integers(0, rows[i], int(offsets.sum()))
        total_indices.append(tf.RaggedTensor.from_row_lengths(tf.constant(values, tf.int64),
                                                              tf.constant(offsets, tf.int64)))

    # Two instances: a Keras 3 optimizer refuses variables it was not built with, and the wrapped
    # one builds on the sok.Variable.
    optimizer = tf.keras.optimizers.SGD(learning_rate=0.5)
    sok_optimizer = sok.OptimizerWrapper(tf.keras.optimizers.SGD(learning_rate=0.5))
    emb_vars, other = sok.filter_variables(sok_vars + [tf.Variable(1.0)])
    assert len(emb_vars) == 3 and len(other) == 1

    @tf.function
    def step(params, indices):
        with tf.GradientTape() as tape:
            embeddings = sok.lookup_sparse(params, indices, combiners=combiners)
            loss = 0
            for i in range(len(embeddings)):
                loss = loss + tf.reduce_sum(embeddings[i] * embeddings[i])
        grads = tape.gradient(loss, params)
        sok_optimizer.apply_gradients(zip(grads, params))
        return loss

    @tf.function
    def step2(params, indices):
        with tf.GradientTape() as tape:
            loss = 0
            for i in range(len(params)):
                embedding = tf.nn.embedding_lookup_sparse(
                    params[i], indices[i], None, combiner=combiners[i]
                )
                loss = loss + tf.reduce_sum(embedding * embedding)
        grads = tape.gradient(loss, params)
        optimizer.apply_gradients(zip(grads, params))
        return loss

    for i in range(iters):
        indices = [t[i * batch_size:(i + 1) * batch_size] for t in total_indices]
        loss1 = step(sok_vars, indices)
        loss2 = step2(tf_vars, [x.to_sparse() for x in indices])
        np.testing.assert_allclose(loss1.numpy(), loss2.numpy(), rtol=1e-4)

    for i in range(len(rows)):
        local_indices = tf.range(rows[i], dtype=tf.int64)
        out1 = tf.nn.embedding_lookup(sok_vars[i], local_indices)
        out2 = tf.nn.embedding_lookup(tf_vars[i], local_indices)
        np.testing.assert_allclose(out1.numpy(), out2.numpy(), rtol=1e-4, atol=1e-4)
    # Rows of dynamic tables exist only for looked-up keys.
    seen = len(np.unique(total_indices[0].flat_values.numpy()))
    assert int(sok_vars[0].size[0]) <= rows[0] and seen <= rows[0]


@pytest.mark.parametrize("make_optimizer", [lambda: tf.keras.optimizers.SGD(learning_rate=1.0),
                                            lambda: tf.keras.optimizers.Adagrad(learning_rate=1.0)],
                         ids=["sgd", "adagrad"])
def test_sok2_dynamic_variable_with_embedding_lookup(make_optimizer):
    """In the style of SOK 2.x's DynamicVariable example: tf.nn.embedding_lookup on the variable,
    one Keras optimizer instance shared by the wrapper and the reference (ids unique per step,
    because Keras's Adagrad does not sum repeated ids first)."""
    from sparse_operation_kit import experiment as sok
    dim, vocab_size, batch = 8, 512, 64
    optimizer = make_optimizer()
    sok_var = sok.DynamicVariable(dimension=dim)
    sok_optimizer = sok.OptimizerWrapper(optimizer)
    indices_val = [idx for idx in range(vocab_size)]
    table_val = tf.nn.embedding_lookup(sok_var, indices_val)
    tf_var = tf.Variable(table_val)

    def sok_step(indices, weight, var):
        with tf.GradientTape() as tape:
            emb = tf.nn.embedding_lookup(var, indices)
            loss = tf.reduce_sum(emb * weight)
        grads = tape.gradient(loss, [var])
        sok_optimizer.apply_gradients(zip(grads, [var]))
        return loss

    @tf.function
    def tf_step(indices, weight, var):
        with tf.GradientTape() as tape:
            emb = tf.nn.embedding_lookup(var, indices)
            loss = tf.reduce_sum(emb * weight)
        grads = tape.gradient(loss, [var])
        optimizer.apply_gradients(zip(grads, [var]))
        return loss

    rng = np.random.default_rng(1)
    for _ in range(10):
        indices_val = tf.convert_to_tensor(
            rng.choice(vocab_size, batch, replace=False), dtype=tf.int64
        )
        weight_val = tf.convert_to_tensor(rng.random((batch, dim)), dtype=tf.float32)
        sok_loss = sok_step(indices_val, weight_val, sok_var)
        tf_loss = tf_step(indices_val, weight_val, tf_var)
        np.testing.assert_allclose(sok_loss.numpy(), tf_loss.numpy(), rtol=1e-4)
    table_val = tf.nn.embedding_lookup(sok_var, [idx for idx in range(vocab_size)])
    diff = tf.reduce_mean((table_val - tf_var) ** 2.0)
    assert diff < 1e-10
    assert int(sok_var.size[0]) == vocab_size


def test_experiment_module_is_the_package():
    from sparse_operation_kit import experiment
    for name in ("init", "DynamicVariable", "Variable", "lookup_sparse", "OptimizerWrapper", "SGD",
                 "export", "assign", "filter_variables"):
        assert getattr(experiment, name) is getattr(sparse_operation_kit, name)
