"""sok.feature_column (DeepRec's Embedding Variable feature columns) in TF1 graphs: input_layer
with string / integer / weighted / shared / partitioned columns next to a stock numeric column
trains with sok.OptimizerWrapper(Adagrad) exactly like plain tf.Variable tables with
embedding_lookup_sparse; Saver round trip; sequence_input_layer."""

import numpy as np
import pytest
import tensorflow as tf

import sparse_operation_kit as sok
from tests.python.support import ev_rows, exported, graph_session, sparse_value

fc = sok.feature_column
STEPS = [
    {
        "user": [["a", "b"], ["c"], ["a"]],
        "item": [[1, 2], [2], [7, 1]],
        "item_w": [[0.5, 2.0], [1.0], [1.5, 1.0]],
        "click": [[10, 11], [12], [10]],
        "view": [[11], [13, 10], [12]],
        "age": [[1.0], [2.0], [0.5]],
    },
    {
        "user": [["b"], ["d", "a"], ["c", "c"]],
        "item": [[7], [1, 2], [3]],
        "item_w": [[1.0], [0.5, 0.5], [2.0]],
        "click": [[13], [10, 12], [11]],
        "view": [[10, 12], [11], [13]],
        "age": [[0.0], [1.0], [3.0]],
    },
    {
        "user": [["a"], ["b"], ["d"]],
        "item": [[2, 3], [1], [7]],
        "item_w": [[1.0, 1.0], [3.0], [0.5]],
        "click": [[12], [11], [10, 13]],
        "view": [[13], [12], [11, 10]],
        "age": [[2.0], [2.0], [1.0]],
    },
]
LABELS = np.array([[1.0], [-0.5], [0.25]], np.float32)
DIMS = {"click": 2, "item": 3, "user": 4, "view": 2}


def _columns():
    user = fc.categorical_column_with_embedding("user", dtype=tf.string, partition_num=2)
    item = fc.weighted_categorical_column(
        fc.categorical_column_with_embedding("item", dtype=tf.int64), "item_w"
    )
    click = fc.categorical_column_with_embedding("click", dtype=tf.int64)
    view = fc.categorical_column_with_embedding("view", dtype=tf.int64)
    init = tf.random_uniform_initializer(-1.0, 1.0, seed=4)
    return [
        fc.embedding_column(user, 4, combiner="mean", initializer=init),
        fc.embedding_column(item, 3, combiner="sum", initializer=init),
        *fc.shared_embedding_columns(
            [click, view],
            2,
            combiner="sqrtn",
            initializer=init,
            shared_embedding_collection_name="cv_shared",
        ),
        tf.feature_column.numeric_column("age"),
    ]


def _placeholders():
    ph = {
        k: tf.compat.v1.sparse_placeholder(tf.string if k == "user" else tf.int64, name=k)
        for k in ("user", "item", "click", "view")
    }
    ph["item_w"] = tf.compat.v1.sparse_placeholder(tf.float32, name="item_w")
    ph["age"] = tf.compat.v1.placeholder(tf.float32, [None, 1], name="age")
    return ph


def _feed(ph, step):
    feed = {ph["age"]: np.array(step["age"], np.float32)}
    for k in ("user", "item", "click", "view", "item_w"):
        dtype = object if k == "user" else (np.float32 if k == "item_w" else np.int64)
        feed[ph[k]] = sparse_value(step[k], dtype)
    return feed


def _sok_model():
    ph = _placeholders()
    dense = fc.input_layer(ph, _columns())
    head = tf.compat.v1.get_variable(
        "head", initializer=tf.constant(np.linspace(-0.5, 0.5, 12)[:, None], tf.float32)
    )
    loss = tf.reduce_sum((tf.matmul(dense, head) - LABELS) ** 2)
    train = sok.OptimizerWrapper(tf.compat.v1.train.AdagradOptimizer(0.1)).minimize(loss)
    return ph, dense, train


def _tables():
    by_name = {}
    for v in tf.compat.v1.global_variables():
        if isinstance(v, (sok.EmbeddingVariable, sok.PartitionedEmbeddingVariable)):
            by_name[v.name] = v
    return by_name


def _keys_of(sess, feature, values):
    if feature == "user":
        return [
            int(k)
            for k in sess.run(tf.strings.to_hash_bucket_fast(np.array(values, object), 2**63 - 1))
        ]
    return [int(v) for v in values]


def test_input_layer_trains_like_plain_tensorflow_and_saver_round_trips(tmp_path):
    path = str(tmp_path / "fc.ckpt")
    with graph_session() as sess:
        ph, dense, train = _sok_model()
        tables = _tables()
        assert sorted(tables) == [
            "input_layer/cv_shared/embedding_weights",
            "input_layer/item_embedding/embedding_weights",
            "input_layer/user_embedding/embedding_weights",
        ]
        user_table = tables["input_layer/user_embedding/embedding_weights"]
        assert isinstance(user_table, sok.PartitionedEmbeddingVariable) and len(user_table) == 2
        sess.run(tf.compat.v1.global_variables_initializer())
        # Initial rows of every key the steps use, read without inserting.
        vocab = {
            f: sorted({x for s in STEPS for r in s[f] for x in r})
            for f in ("user", "item", "click", "view")
        }
        keys = {f: _keys_of(sess, f, vocab[f]) for f in vocab}
        shared_keys = sorted(set(keys["click"]) | set(keys["view"]))
        table_of = {
            "user": "input_layer/user_embedding/embedding_weights",
            "item": "input_layer/item_embedding/embedding_weights",
            "cv": "input_layer/cv_shared/embedding_weights",
        }
        initial = {
            "user": ev_rows(tables[table_of["user"]], keys["user"], sess),
            "item": ev_rows(tables[table_of["item"]], keys["item"], sess),
            "cv": ev_rows(tables[table_of["cv"]], shared_keys, sess),
        }
        outs = [sess.run([dense, train], _feed(ph, s))[0] for s in STEPS]
        trained = {t: exported(tables[table_of[t]], sess) for t in table_of}
        tf.compat.v1.train.Saver().save(sess, path)

    # The reference: plain tables over the same ids (as positions), the same optimizer.
    with graph_session() as sess:
        ph = _placeholders()
        pos = {f: {v: i for i, v in enumerate(vocab[f])} for f in ("user", "item")}
        pos["cv"] = {k: i for i, k in enumerate(shared_keys)}
        tabs = {t: tf.compat.v1.get_variable(f"ref_{t}", initializer=initial[t]) for t in initial}
        p = {
            k: tf.compat.v1.sparse_placeholder(tf.int64) for k in ("user", "item", "click", "view")
        }
        lookup = tf.compat.v1.nn.embedding_lookup_sparse
        parts = {
            "age": ph["age"],
            "click": lookup(tabs["cv"], p["click"], None, combiner="sqrtn"),
            "item": lookup(tabs["item"], p["item"], ph["item_w"], combiner="sum"),
            "user": lookup(tabs["user"], p["user"], None, combiner="mean"),
            "view": lookup(tabs["cv"], p["view"], None, combiner="sqrtn"),
        }
        # Name order: age, click_shared_embedding, item_weighted_by_item_w_embedding, user_embedding,
        # view_shared_embedding.
        ref_dense = tf.concat([parts[k] for k in ("age", "click", "item", "user", "view")], 1)
        head = tf.compat.v1.get_variable(
            "head", initializer=tf.constant(np.linspace(-0.5, 0.5, 12)[:, None], tf.float32)
        )
        loss = tf.reduce_sum((tf.matmul(ref_dense, head) - LABELS) ** 2)
        train = tf.compat.v1.train.AdagradOptimizer(0.1).minimize(loss)
        sess.run(tf.compat.v1.global_variables_initializer())
        cv_pos = {v: pos["cv"][k] for v, k in zip(vocab["click"], keys["click"])}
        cv_pos.update({v: pos["cv"][k] for v, k in zip(vocab["view"], keys["view"])})
        for s, got in zip(STEPS, outs):
            feed = {
                ph["age"]: np.array(s["age"], np.float32),
                ph["item_w"]: sparse_value(s["item_w"], np.float32),
                p["user"]: sparse_value([[pos["user"][x] for x in r] for r in s["user"]]),
                p["item"]: sparse_value([[pos["item"][x] for x in r] for r in s["item"]]),
                p["click"]: sparse_value([[cv_pos[x] for x in r] for r in s["click"]]),
                p["view"]: sparse_value([[cv_pos[x] for x in r] for r in s["view"]]),
            }
            want, _ = sess.run([ref_dense, train], feed)
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        final = sess.run(tabs)
    for t, fkeys in (("user", keys["user"]), ("item", keys["item"]), ("cv", shared_keys)):
        assert sorted(trained[t]) == sorted(fkeys)
        for i, k in enumerate(fkeys):
            np.testing.assert_allclose(trained[t][k], final[t][i], rtol=1e-5, atol=1e-6)

    # Saver round trip: a fresh graph restores every table (the partitioned one included).
    with graph_session() as sess:
        ph, dense, train = _sok_model()
        tf.compat.v1.train.Saver().restore(sess, path)
        tables = _tables()
        for t, name in table_of.items():
            got = exported(tables[name], sess)
            assert sorted(got) == sorted(trained[t])
            for k in got:
                np.testing.assert_array_equal(got[k], trained[t][k])


def test_sequence_input_layer():
    with graph_session() as sess:
        col = fc.categorical_column_with_embedding("hist", dtype=tf.int64)
        seq = fc.sequence_categorical_column_with_embedding("hist_seq", dtype=tf.int64)
        emb = fc.embedding_column(seq, 3, initializer=tf.random_uniform_initializer(-1, 1, seed=2))
        ids = tf.SparseTensor(
            [[0, 0], [0, 1], [1, 0], [2, 2]], tf.constant([5, 6, 5, 9], tf.int64), [3, 4]
        )
        out, length = fc.sequence_input_layer({"hist_seq": ids}, [emb])
        sess.run(tf.compat.v1.global_variables_initializer())
        out, length = sess.run([out, length])
        table = _tables()["sequence_input_layer/hist_seq_embedding/embedding_weights"]
        rows = dict(zip([5, 6, 9], ev_rows(table, [5, 6, 9], sess)))
        assert out.shape == (3, 4, 3) and list(length) == [2, 1, 3]
        np.testing.assert_array_equal(out[0, :2], [rows[5], rows[6]])
        np.testing.assert_array_equal(out[2, 2], rows[9])
        np.testing.assert_array_equal(out[2, :2], np.zeros([2, 3]))
        with pytest.raises(ValueError, match="sequence column: use sequence_input_layer"):
            fc.input_layer({"hist_seq": ids}, [emb])
        with pytest.raises(TypeError, match="must be an embedding column of a sequence"):
            fc.sequence_input_layer({"hist": ids}, [fc.embedding_column(col, 3)])


def test_argument_errors():
    col = fc.categorical_column_with_embedding("x", dtype=tf.int64)
    with pytest.raises(ValueError, match="combiner must be one of"):
        fc.embedding_column(col, 3, combiner="max")
    with pytest.raises(ValueError, match="dimension must be a positive integer"):
        fc.embedding_column(col, 0)
    with pytest.raises(ValueError, match="partition_num must be a positive integer"):
        fc.categorical_column_with_embedding("x", partition_num=0)
    with pytest.raises(TypeError, match="must come from sok.feature_column"):
        fc.embedding_column(tf.feature_column.categorical_column_with_identity("x", 10), 3)
    with pytest.raises(RuntimeError, match="builds TF1 graphs"):
        fc.input_layer({"x": tf.constant([[1]], tf.int64)}, [fc.embedding_column(col, 3)])
    with graph_session(), pytest.raises(ValueError, match="no feature 'x'"):
        fc.input_layer({"y": tf.constant([[1]], tf.int64)}, [fc.embedding_column(col, 3)])
