"""Inputs that would lose or mix up data if accepted raise a clear error that names the table and
the problem."""
import os

import numpy as np
import pytest
import tensorflow as tf

import sparse_operation_kit as sok
from sparse_operation_kit.tables import validation
from tests.python.support import graph_session, unique_name

BIG = 2 ** 32 + 5  # an int64 id that an int32 cast folds onto 5


# ---------------------------------------------------------------------------------------------
# Key dtypes: int64 ids / keys never silently truncated into int32 tables
# ---------------------------------------------------------------------------------------------
def test_embedding_layer_int32_table_refuses_int64_ids_beyond_int32():
    layer = sok.Embedding(2, key_dtype=tf.int32, name=unique_name("keys32"))
    table = layer.embedding_variable.name
    with pytest.raises(
        ValueError,
        match=f"table '{table}' has key dtype int32, but an id given as int64 does not "
        f"fit in int32.*\\(id {BIG}\\)",
    ):
        layer(tf.constant([[5, BIG]], tf.int64), training=True)
    assert int(layer.embedding_variable.size()) == 0  # nothing inserted under the folded key 5
    out = layer(tf.constant([[5, 7]], tf.int64), training=True)  # int64 ids that fit are fine
    assert out.shape == (1, 2, 2) and int(layer.embedding_variable.size()) == 2

    pooled = sok.Embedding(embedding_variable=layer.embedding_variable, combiner="sum")
    with pytest.raises(ValueError, match="does not fit in int32"):
        pooled(tf.ragged.constant([[1], [-BIG]], dtype=tf.int64))

    @tf.function
    def lookup(ids):
        return layer(ids, training=True)

    with pytest.raises(tf.errors.InvalidArgumentError,
                       match="has key dtype int32, but an id given as int64 does not fit"):
        lookup(tf.constant([[BIG]], tf.int64))
    assert int(layer.embedding_variable.size()) == 2


def test_sparse_embedding_int32_tables_refuse_int64_ids_beyond_int32():
    layer = sok.SparseEmbedding([2, 3], key_dtype=tf.int32, name=unique_name("multi32"))
    ok = tf.ragged.constant([[1]], dtype=tf.int64)
    with pytest.raises(ValueError, match=f"table '{layer.name}/table_1' has key dtype int32"):
        layer([ok, tf.ragged.constant([[BIG]], dtype=tf.int64)], training=True)
    assert [int(t.size()) for t in layer.embedding_variables] == [0, 0]


# Ids of any dtype but int32 / int64 would be changed by a cast: floats truncated (1.7 -> 1),
# bools read as keys 0 / 1, uint64 beyond int64 wrapped. Every lookup refuses them.
NON_INTEGER_IDS = {
    "float32": tf.constant([[1.7]]),
    "bool": tf.constant([[True]]),
    "uint64": tf.constant([[2**63 + 5]], tf.uint64),
    "string": tf.constant([["a"]]),
}


# The Keras layers take float ids that are whole numbers (keras.Input's default dtype; see
# test_layers_take_whole_float_ids_and_refuse_fractional_ones).
LAYER_REFUSED = [d for d in NON_INTEGER_IDS if d != "float32"]


@pytest.mark.parametrize("dtype", LAYER_REFUSED)
@pytest.mark.parametrize("combiner", [None, "sum"])
def test_embedding_layer_refuses_non_integer_ids(dtype, combiner):
    layer = sok.Embedding(2, combiner=combiner, name=unique_name("ids"))
    table = layer.embedding_variable.name
    ids = NON_INTEGER_IDS[dtype]
    match = f"table '{table}': ids must be int32 or int64, got {dtype} ids"
    with pytest.raises(TypeError, match=match):
        layer(ids, training=True)
    with pytest.raises(TypeError, match=match):
        tf.function(lambda x: layer(x, training=True))(ids)
    with pytest.raises(TypeError, match=match):
        layer(tf.RaggedTensor.from_tensor(ids), training=True)
    assert int(layer.embedding_variable.size()) == 0  # nothing inserted under a truncated key
    out = layer(tf.constant([[1]], tf.int32), training=True)  # int32 ids are fine
    assert out.shape[-1] == 2 and int(layer.embedding_variable.size()) == 1


@pytest.mark.parametrize("dtype", LAYER_REFUSED)
def test_sparse_embedding_refuses_non_integer_ids(dtype):
    layer = sok.SparseEmbedding([2, 2], combiners="sum", name=unique_name("multi"))
    ok, bad = tf.constant([[1]], tf.int64), NON_INTEGER_IDS[dtype]
    match = f"table '{layer.name}/table_1': ids must be int32 or int64, got {dtype} ids"
    for ids in (bad, tf.RaggedTensor.from_tensor(bad), tf.sparse.from_dense(bad)):
        with pytest.raises(TypeError, match=match):
            layer([ok, ids], training=True)
    # A static table (dtype None: no key dtype to cast to) refuses them too.
    static = sok.SparseEmbedding(embedding_variables=[tf.Variable(tf.ones([4, 2]))],
                                 combiners="sum", name=unique_name("static"))
    with pytest.raises(TypeError, match=f"got {dtype} ids"):
        static(bad)


@pytest.mark.parametrize("combiner", [None, "sum"])
def test_layers_take_whole_float_ids_and_refuse_fractional_ones(combiner):
    layer = sok.Embedding(2, combiner=combiner, name=unique_name("float_ids"))
    table = layer.embedding_variable.name
    want = layer(tf.constant([[3, 5]], tf.int64), training=False).numpy()
    for call in (layer, tf.function(lambda x: layer(x, training=False))):
        np.testing.assert_array_equal(call(tf.constant([[3.0, 5.0]]), training=False)
                                      if call is layer else call(tf.constant([[3.0, 5.0]])), want)
    match = f"{table}.{{0,4}}: float ids must be whole numbers"
    with pytest.raises(tf.errors.InvalidArgumentError, match=match):
        layer(tf.constant([[1.7]]), training=True)
    with pytest.raises(tf.errors.InvalidArgumentError, match=match):
        tf.function(lambda x: layer(x, training=True))(tf.constant([[1.7]]))
    assert int(layer.embedding_variable.size()) == 0  # nothing inserted under a truncated key


@pytest.mark.parametrize("dtype", ["float32", "bool"])
def test_embedding_variable_reads_refuse_non_integer_ids(dtype):
    ev = sok.get_embedding_variable(unique_name("reads"), 2)
    ids = NON_INTEGER_IDS[dtype]
    with pytest.raises(TypeError, match=f"'{ev.name}' has key dtype int64, but ids of dtype {dtype}"):
        ev.sparse_read(ids)
    with pytest.raises(TypeError, match=f"'{ev.name}' has key dtype int64, but ids of dtype {dtype}"):
        tf.nn.embedding_lookup(ev, ids)
    with pytest.raises(TypeError, match=f"ids of table '{ev.name}' must be int32 or int64, got {dtype}"):
        sok.lookup_sparse(ev, tf.RaggedTensor.from_tensor(ids))
    assert int(ev.size()) == 0


def test_load_of_an_int64_dump_into_an_int32_table(tmp_path):
    name = unique_name("dump64")
    big = sok.EmbeddingVariable(name, 2)
    big.assign(tf.constant([5, BIG], tf.int64), np.arange(4, dtype=np.float32).reshape(2, 2))
    sok.dump(str(tmp_path), [big])
    small = sok.EmbeddingVariable(name, 2, key_dtype=tf.int32)
    with pytest.raises(
        ValueError,
        match=f"sok.load from {tmp_path}: table '{name}' has key dtype int32, but the "
        f"saved keys include {BIG}",
    ):
        sok.load(str(tmp_path), [small])
    assert int(small.size()) == 0
    # Keys that fit load into an int32 table.
    fits = sok.EmbeddingVariable(unique_name("dump_fits"), 2)
    fits.assign(tf.constant([5, 6], tf.int64), np.ones([2, 2], np.float32))
    sok.dump(str(tmp_path), [fits])
    target = sok.EmbeddingVariable(fits.name, 2, key_dtype=tf.int32)
    sok.load(str(tmp_path), [target])
    assert sorted(target.export()[0].numpy().tolist()) == [5, 6]


def test_restore_of_int64_keys_into_an_int32_table():
    table = sok.EmbeddingVariable(unique_name("restore32"), 2, key_dtype=tf.int32)
    tensors = {
        "keys": tf.constant([5, BIG], tf.int64),
        "values": tf.ones([2, 2]),
        "slots": tf.zeros([2, 0, 2]),
        "freqs": tf.zeros([2], tf.int64),
        "versions": tf.zeros([2], tf.int64),
        "slot_kind": tf.constant(-1, tf.int32),
        "slot_init": tf.zeros([0]),
    }
    with pytest.raises(
        ValueError,
        match=f"cannot restore Embedding Variable '{table.name}'.*saved keys include {BIG}",
    ):
        table.import_snapshot(tensors)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.int64)])
    def restore(keys):
        table.import_snapshot(dict(tensors, keys=keys))

    with pytest.raises(tf.errors.InvalidArgumentError, match="saved keys do not fit in int32"):
        restore(tensors["keys"])
    assert int(table.size()) == 0


def test_checkpoint_of_an_int64_table_into_an_int32_table(tmp_path):
    name = unique_name("ckpt64")
    big = sok.EmbeddingVariable(name, 2)
    big.assign(tf.constant([5, BIG], tf.int64), np.ones([2, 2], np.float32))
    path = tf.train.Checkpoint(t=big).save(str(tmp_path / "c"))
    small = sok.EmbeddingVariable(name, 2, key_dtype=tf.int32)
    with pytest.raises(
        tf.errors.InvalidArgumentError,
        match="t/.ATTRIBUTES/keys; expected dtype int32 does not equal original dtype int64",
    ):
        tf.train.Checkpoint(t=small).restore(path)
    with graph_session() as sess:
        v64 = sok.get_embedding_variable("saver_keys", 2)
        sess.run(v64.initializer)
        sess.run(v64.assign(tf.constant([BIG], tf.int64), np.ones([1, 2], np.float32)))
        saved = tf.compat.v1.train.Saver([v64]).save(sess, str(tmp_path / "saver"))
    with graph_session() as sess:
        v32 = sok.get_embedding_variable("saver_keys", 2, key_dtype=tf.int32)
        with pytest.raises(
            tf.errors.InvalidArgumentError, match="saver_keys/keys; expected dtype int32"
        ):
            tf.compat.v1.train.Saver([v32]).restore(sess, saved)


# ---------------------------------------------------------------------------------------------
# lookup inputs (validation.check_lookup_inputs: the layers call it; see lookup.py's caller note)
# ---------------------------------------------------------------------------------------------
def _sparse(indices, values, shape, dtype=tf.int64):
    return tf.SparseTensor(tf.constant(indices, tf.int64), tf.constant(values, dtype), shape)


def test_weights_at_other_positions_than_the_ids():
    ids = _sparse([[0, 0], [1, 0]], [1, 2], [2, 2])
    weights = _sparse(
        [[0, 0], [1, 1]], [1.0, 3.0], [2, 2], tf.float32
    )  # same count, other positions
    layer = sok.SparseEmbedding(2, name=unique_name("weighted"))
    with pytest.raises(
        ValueError,
        match=f"weights of table '{layer.name}/table_0' are at other positions "
        r"\(indices\) than its ids.*id at \[1, 0\], weight at \[1, 1\]",
    ):
        layer(ids, weights=weights, training=True)
    assert int(layer.embedding_variables[0].size()) == 0
    ragged_ids = tf.ragged.constant([[1, 2], [3]], dtype=tf.int64)
    ragged_w = tf.ragged.constant([[1.0], [2.0, 3.0]])
    with pytest.raises(ValueError, match="are at other positions"):
        validation.check_lookup_inputs(
            [layer.embedding_variables[0]], [ragged_ids], [ragged_w], ["t"]
        )

    @tf.function
    def lookup(i, w):
        return layer(i, weights=w, training=True)

    with pytest.raises(tf.errors.InvalidArgumentError, match="are at other positions"):
        lookup(ids, weights)
    # Matching positions pass, in any form.
    good = _sparse([[0, 0], [1, 0]], [1.0, 3.0], [2, 2], tf.float32)
    np.testing.assert_allclose(layer(ids, weights=good, training=True), lookup(ids, good))
    same_positions = ragged_ids.with_flat_values(tf.constant([1.0, 2.0, 3.0]))
    validation.check_lookup_inputs(
        [layer.embedding_variables[0]], [ragged_ids], [same_positions], ["t"]
    )


def test_column_indices_beyond_dense_shape():
    layer = sok.SparseEmbedding(2, name=unique_name("cols"))
    bad = _sparse([[0, 0], [1, 5]], [1, 2], [2, 3])
    with pytest.raises(
        ValueError,
        match=f"ids of table '{layer.name}/table_0': an index is negative or beyond "
        r"dense_shape: index \[1, 5\] for dense_shape \[2, 3\]",
    ):
        layer(bad, training=True)
    with pytest.raises(ValueError, match="beyond dense_shape: index \\[2, 0\\]"):
        layer(_sparse([[2, 0]], [1], [2, 3]), training=True)  # a row beyond the batch too

    @tf.function
    def lookup(ids):
        return layer(ids, training=True)

    with pytest.raises(
        tf.errors.InvalidArgumentError, match="an index is negative or beyond dense_shape"
    ):
        lookup(bad)
    assert int(layer.embedding_variables[0].size()) == 0


def test_bad_index_names_the_first_bad_table_among_several():
    """SokUniqueKeys checks every table's indices at once and names the first bad table, with the
    bad index and the dense shape, in eager (ValueError), tf.function and a TF1 Session; nothing
    is inserted."""
    good = ([[0, 0], [1, 1]], [1, 2], [2, 3])
    bad = ([[0, 0], [1, 0], [1, 3]], [1, 2, 3], [2, 3])  # column 3 beyond 3
    worse = ([[0, 0], [-1, 0]], [4, 5], [2, 3])  # negative sample, in a later table
    specs = [good, bad, good, worse]
    dtypes = [tf.int64, tf.int32, tf.int32, tf.int64]
    want = r"an index is negative or beyond dense_shape: index \[1, 3\] for dense_shape \[2, 3\]"

    def tables():
        evs = [sok.EmbeddingVariable(unique_name(f"multi{i}"), 2, key_dtype=d)
               for i, d in enumerate(dtypes)]
        return evs + [sok.EmbeddingVariable(unique_name("multi_ragged"), 2)]

    def ids():
        ragged = tf.ragged.constant([[1], [], [2, 3]], dtype=tf.int64)
        return [_sparse(*s, dtype=d) for s, d in zip(specs, dtypes)] + [ragged]

    evs = tables()
    with pytest.raises(ValueError, match=f"ids of table '{evs[1].name}': {want}"):
        sok.lookup_sparse(evs, ids())
    lookup = tf.function(lambda: sok.lookup_sparse(evs, ids()))
    with pytest.raises(tf.errors.InvalidArgumentError, match=f"ids of table '{evs[1].name}': {want}"):
        lookup()
    assert all(int(ev.size()) == 0 for ev in evs)
    with pytest.raises(ValueError, match=f"ids of table '{evs[3].name}': .*index \\[-1, 0\\]"):
        sok.lookup_sparse(evs[2:], ids()[2:])
    with graph_session() as sess:
        evs = tables()
        out = sok.lookup_sparse(evs, ids())
        sess.run([ev.initializer for ev in evs])
        with pytest.raises(
            tf.errors.InvalidArgumentError, match=f"ids of table '{evs[1].name}': {want}"
        ):
            sess.run(out)
        assert sess.run([ev.size() for ev in evs]) == [0] * len(evs)


def test_no_tables():
    with pytest.raises(ValueError, match="lookup_sparse: no tables given"):
        validation.check_lookup_inputs([], [], None, [])


# ---------------------------------------------------------------------------------------------
# Creation arguments
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dim, error, match", [
    (4.7, ValueError, "embedding_dim must be an integer, got 4.7"),
    ("4", TypeError, "embedding_dim must be a positive integer, got '4'"),
    (True, TypeError, "embedding_dim must be a positive integer, got True"),
    (-2, ValueError, "embedding_dim must be positive, got -2"),
])
def test_embedding_dim_must_be_a_positive_integer(dim, error, match):
    with pytest.raises(error, match=f"Embedding Variable 'dims': {match}"):
        sok.EmbeddingVariable("dims", dim)
    with pytest.raises(error, match=match):
        sok.Embedding(dim, name="dims")
    assert (
        sok.EmbeddingVariable(unique_name("whole"), 4.0).embedding_dim == 4
    )  # an integral float is fine


@pytest.mark.parametrize(
    "make, error, match",
    [
        (
            lambda: sok.CounterFilter(filter_freq=-1),
            ValueError,
            "CounterFilter: filter_freq must be >= 0, got -1",
        ),
        (
            lambda: sok.CounterFilter(filter_freq=2.5),
            ValueError,
            "CounterFilter: filter_freq must be an integer",
        ),
        (
            lambda: sok.GlobalStepEvict(steps_to_live=-5),
            ValueError,
            "GlobalStepEvict: steps_to_live must be >= 0, got -5",
        ),
        (
            lambda: sok.L2WeightEvict(l2_weight_threshold=-0.5),
            ValueError,
            "L2WeightEvict: l2_weight_threshold must be >= 0 \\(or -1 for no eviction\\), got -0.5",
        ),
        (
            lambda: sok.L2WeightEvict(l2_weight_threshold="big"),
            TypeError,
            "l2_weight_threshold must be a number",
        ),
        (
            lambda: sok.InitializerOption(default_value_dim=-3),
            ValueError,
            "default_value_dim must be >= 0, got -3",
        ),
        (
            lambda: sok.get_embedding_variable(unique_name("stl"), 2, steps_to_live=-1),
            ValueError,
            "steps_to_live must be >= 0, got -1",
        ),
    ],
)
def test_negative_filter_and_eviction_options(make, error, match):
    with pytest.raises(error, match=match):
        make()


def test_valid_options_still_accepted():
    assert sok.CounterFilter(3).filter_freq == 3
    assert sok.GlobalStepEvict(None).steps_to_live == 0
    assert sok.L2WeightEvict().l2_weight_threshold == -1.0  # DeepRec's "no eviction"
    assert sok.L2WeightEvict(0.25).l2_weight_threshold == 0.25


@pytest.mark.parametrize("flag", ["no", "False", 2, 0.5])
def test_training_flag_must_be_a_bool(flag):
    layer = sok.Embedding(2, name=unique_name("flag"))
    with pytest.raises(
        TypeError, match=f"layer '{layer.name}': `training` must be True, False or None"
    ):
        layer(tf.constant([[1]], tf.int64), training=flag)
    assert int(layer.embedding_variable.size()) == 0
    with pytest.raises(TypeError, match="must be a bool, got a int32 tensor"):
        layer(tf.constant([[1]], tf.int64), training=tf.constant(1))
    layer(tf.constant([[1]], tf.int64), training=tf.constant(True))
    assert int(layer.embedding_variable.size()) == 1


def test_two_eager_tables_with_one_name_are_separate_tables():
    """Documented, as for tf.Variable in eager execution: the same name gives two independent
    tables (with the same initial values, which depend on the name); sok.dump refuses them."""
    a = sok.EmbeddingVariable("same_name", 2)
    b = sok.EmbeddingVariable("same_name", 2)
    a.assign(tf.constant([1], tf.int64), np.full([1, 2], 7.0, np.float32))
    assert int(a.size()) == 1 and int(b.size()) == 0
    np.testing.assert_array_equal(a.sparse_read(tf.constant([2], tf.int64), training=False),
                                  b.sparse_read(tf.constant([2], tf.int64), training=False))
    with pytest.raises(ValueError, match="several variables are named \\['same_name'\\]"):
        sok.dump("/nonexistent", [a, b])


# ---------------------------------------------------------------------------------------------
# sok.load of a damaged dump
# ---------------------------------------------------------------------------------------------
def test_truncated_shard_names_its_path(tmp_path):
    table = sok.EmbeddingVariable(unique_name("trunc"), 2)
    table.assign(tf.constant(np.arange(100), tf.int64), np.ones([100, 2], np.float32))
    sok.dump(str(tmp_path), [table])
    shard = os.path.join(str(tmp_path), table.name, "rank0-of-1.npz")
    data = open(shard, "rb").read()
    with open(shard, "wb") as f:
        f.write(data[:len(data) // 2])
    fresh = sok.EmbeddingVariable(table.name, 2)
    with pytest.raises(
        ValueError,
        match=f"sok.load: cannot read the shard {shard} of '{table.name}'.*truncated or corrupt",
    ):
        sok.load(str(tmp_path), [fresh])
    assert int(fresh.size()) == 0


def test_lookup_sparse_runs_the_checks():
    """lookup_sparse runs validation.check_lookup_inputs: its errors come from lookup_sparse."""
    ev = sok.EmbeddingVariable(unique_name("lookup_checks"), 2)
    with pytest.raises(ValueError, match="lookup_sparse: no tables given"):
        sok.lookup_sparse([], [])
    with pytest.raises(ValueError, match="are at other positions"):
        sok.lookup_sparse([ev], [_sparse([[0, 0], [1, 0]], [1, 2], [2, 2])],
                          sp_weights=[_sparse([[0, 0], [1, 1]], [1.0, 2.0], [2, 2], tf.float32)])
    with pytest.raises(ValueError, match="beyond dense_shape"):
        sok.lookup_sparse([ev], [_sparse([[0, 4]], [1], [1, 2])])
    assert int(ev.size()) == 0
