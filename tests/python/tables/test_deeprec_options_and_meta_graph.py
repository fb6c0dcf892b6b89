"""DeepRec's option family (CBFFilter, EvictOption, InitializerOption, steps_to_live), meta graphs
(Saver.save writes Embedding Variables into the exported collections; import_meta_graph in a
fresh graph + restore gives back tables that look up and train) and group_embedding_lookup_sparse."""

import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import sparse_operation_kit as sok
from tests.python.support import (
    REPO_ROOT,
    exported,
    graph_session,
    sparse_value,
    subprocess_env,
    to_ragged,
    to_sparse,
    unique_name,
)

DIM = 3
UNIFORM = tf.random_uniform_initializer(-1.0, 1.0, seed=21)


# ---------------------------------------------------------------------------------------------
# Options
# ---------------------------------------------------------------------------------------------
def test_cbf_filter_admits_exactly_like_the_counter_filter():
    cbf = sok.CBFFilter(
        filter_freq=3,
        max_element_size=2**30,
        false_positive_probability=0.01,
        counter_type=tf.int64,
    )
    assert isinstance(cbf, sok.CounterFilter) and cbf.filter_freq == 3
    seen = {}
    for name, flt in (("cbf", cbf), ("counter", sok.CounterFilter(3))):
        opt = sok.EmbeddingVariableOption(
            filter_option=flt,
            init_option=sok.InitializerOption(
                tf.constant_initializer(2.0), default_value_no_permission=-1.5
            ),
        )
        ev = sok.get_embedding_variable(unique_name(name), DIM, ev_option=opt)
        sgd = sok.SGD(lr=1.0)
        rows = []
        for _ in range(4):
            with tf.GradientTape() as tape:
                r = ev.sparse_read(tf.constant([7], tf.int64))
                loss = tf.reduce_sum(r)
            rows.append(float(r.numpy()[0, 0]))
            sgd.apply_gradients([(tape.gradient(loss, ev), ev)])
        seen[name] = rows
    # Not admitted twice (default_value_no_permission, no update), admitted at the third lookup.
    assert seen["cbf"] == seen["counter"] == [-1.5, -1.5, 2.0, 1.0]


def test_cbf_filter_arguments_are_checked():
    with pytest.raises(ValueError, match="false_positive_probability must be in"):
        sok.CBFFilter(3, false_positive_probability=1.5)
    with pytest.raises(TypeError, match="counter_type must be an integer"):
        sok.CBFFilter(3, counter_type=tf.float32)
    with pytest.raises(ValueError, match="exceeds the largest uint8 counter"):
        sok.CBFFilter(300, counter_type=tf.uint8)
    with pytest.raises(ValueError, match="max_element_size must be >= 0"):
        sok.CBFFilter(3, max_element_size=-1)
    assert sok.CBFFilter().counter_type == tf.uint64  # DeepRec's defaults


def test_evict_options_share_a_base_and_steps_to_live_argument_evicts():
    assert isinstance(sok.GlobalStepEvict(2), sok.EvictOption)
    assert isinstance(sok.L2WeightEvict(1.0), sok.EvictOption)
    # get_embedding_variable(steps_to_live=...) is GlobalStepEvict(steps_to_live).
    with graph_session() as sess:
        ev = sok.get_embedding_variable("stl", DIM, initializer=UNIFORM, steps_to_live=1)
        ids = tf.compat.v1.placeholder(tf.int64, [None])
        step = tf.compat.v1.train.get_or_create_global_step()
        train = sok.OptimizerWrapper(tf.compat.v1.train.GradientDescentOptimizer(0.1)).minimize(
            tf.reduce_sum(ev.sparse_read(ids)), global_step=step
        )
        sess.run(tf.compat.v1.global_variables_initializer())
        for batch in ([1, 2], [2], [3]):  # steps 0, 1, 2
            sess.run(train, {ids: batch})
        # At step 3: keys 1 (updated at step 0) and 2 (step 1) are more than 1 step old.
        assert sess.run(ev.shrink(step)) == 2
        assert sorted(exported(ev, sess)) == [3]


def test_initializer_option_default_value_dim():
    opt = sok.EmbeddingVariableOption(
        init_option=sok.InitializerOption(UNIFORM, default_value_dim=5)
    )
    ev = sok.get_embedding_variable(unique_name("ivd"), DIM, ev_option=opt)
    rows = ev.sparse_read(tf.constant([2, 7, 12, 3], tf.int64)).numpy()
    np.testing.assert_array_equal(rows[0], rows[1])  # 2, 7 and 12 share row 2 of the 5 defaults
    np.testing.assert_array_equal(rows[0], rows[2])
    assert not np.array_equal(rows[0], rows[3])


# ---------------------------------------------------------------------------------------------
# Meta graphs
# ---------------------------------------------------------------------------------------------
def _model():
    ids = tf.compat.v1.sparse_placeholder(tf.int64, name="ids")
    ev = sok.get_embedding_variable("user", DIM, initializer=UNIFORM)
    pev = sok.get_embedding_variable(
        "item", DIM, initializer=UNIFORM, partitioner=tf.compat.v1.fixed_size_partitioner(2)
    )
    head = tf.compat.v1.get_variable("head", initializer=tf.constant([[0.3], [-0.2], [0.5]]))
    pooled = tf.add(
        *sok.lookup_sparse([ev, pev], [ids, ids], combiners=["mean", "sum"]), name="pooled"
    )
    loss = tf.reduce_sum(tf.matmul(pooled, head) ** 2, name="loss")
    step = tf.compat.v1.train.get_or_create_global_step()
    train = sok.OptimizerWrapper(tf.compat.v1.train.AdagradOptimizer(0.1)).minimize(
        loss, global_step=step
    )
    # The wrapper's step (dense and sparse updates) is the graph's train op.
    assert tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.TRAIN_OP) == [train]
    return ids, ev, pev, train


BATCH = [[1, 2], [3], [2, 1002]]


def test_saver_save_exports_tables_into_the_meta_graph_and_import_restores_them(tmp_path):
    path = str(tmp_path / "model.ckpt")
    script = f"""
import sys
import sparse_operation_kit as sok
import tensorflow as tf
sys.path.insert(0, {REPO_ROOT!r})
from tests.python.tables.test_deeprec_options_and_meta_graph import _model, BATCH
from tests.python.support import sparse_value
with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
    ids, ev, pev, train = _model()
    sess.run(tf.compat.v1.global_variables_initializer())
    sess.run(train, {{ids: sparse_value(BATCH)}})
    tf.compat.v1.train.Saver().save(sess, {path!r})
"""
    # Run in a subprocess to see everything the save prints.
    out = subprocess.run(
        [sys.executable, "-c", script],
        env=subprocess_env(),
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert "to_proto" not in out.stderr and "Issue encountered when serializing" not in out.stderr

    with graph_session() as sess:
        ids, ev, pev, train = _model()
        tf.compat.v1.train.Saver().restore(sess, path)
        sess.run(train, {ids: sparse_value(BATCH)})
        want_user, want_item = exported(ev, sess), exported(pev, sess)

    with graph_session() as sess:
        saver = tf.compat.v1.train.import_meta_graph(path + ".meta")
        graph = tf.compat.v1.get_default_graph()
        user = [v for v in tf.compat.v1.global_variables() if getattr(v, "name", "") == "user"]
        item = [
            v
            for v in tf.compat.v1.global_variables()
            if isinstance(v, sok.PartitionedEmbeddingVariable)
        ]
        assert len(user) == 1 and isinstance(user[0], sok.EmbeddingVariable) and len(item) == 1
        assert "head:0" in [
            v.name for v in tf.compat.v1.global_variables() if isinstance(v, tf.Variable)
        ]
        assert all(p in tf.compat.v1.trainable_variables() for p in item[0])
        saver.restore(sess, path)
        sess.run(
            tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.TRAIN_OP)[0],
            {
                graph.get_tensor_by_name("ids/indices:0"): sparse_value(BATCH).indices,
                graph.get_tensor_by_name("ids/values:0"): sparse_value(BATCH).values,
                graph.get_tensor_by_name("ids/shape:0"): sparse_value(BATCH).dense_shape,
            },
        )
        got_user, got_item = exported(user[0], sess), exported(item[0], sess)
        # New ops on the rebuilt tables read the same rows; a new Saver saves them again.
        rows = sess.run(sok.lookup_sparse(item[0], to_sparse([[2], [1002]]), training=False))
        tf.compat.v1.train.Saver().save(sess, str(tmp_path / "again.ckpt"))
    for got, want in ((got_user, want_user), (got_item, want_item)):
        assert sorted(got) == sorted(want)
        for k in want:
            np.testing.assert_array_equal(got[k], want[k])
    np.testing.assert_array_equal(rows, np.stack([want_item[2], want_item[1002]]))
    assert "item/keys" in dict(tf.train.list_variables(str(tmp_path / "again.ckpt")))


# ---------------------------------------------------------------------------------------------
# group_embedding_lookup_sparse
# ---------------------------------------------------------------------------------------------
def test_group_embedding_lookup_sparse_matches_per_table_lookups():
    a = sok.get_embedding_variable(unique_name("ga"), DIM, initializer=UNIFORM)
    b = sok.get_embedding_variable(unique_name("gb"), 2, initializer=UNIFORM)
    rows_a, rows_b = [[1, 2], [3], [1, 1]], [[4], [5, 6, 4], [7]]
    weights = to_sparse([[0.5, 2.0], [1.0], [3.0, 1.0]], tf.float32)
    got = sok.group_embedding_lookup_sparse(
        [a, b], [to_sparse(rows_a), to_ragged(rows_b)], ["sum", "mean"], [weights, None]
    )
    table_a = {
        k: a.sparse_read(tf.constant([k], tf.int64), training=False).numpy()[0] for k in (1, 2, 3)
    }
    table_b = {
        k: b.sparse_read(tf.constant([k], tf.int64), training=False).numpy()[0]
        for k in (4, 5, 6, 7)
    }
    want_a = [0.5 * table_a[1] + 2.0 * table_a[2], table_a[3], 3.0 * table_a[1] + table_a[1]]
    want_b = [table_b[4], (table_b[5] + table_b[6] + table_b[4]) / 3, table_b[7]]
    np.testing.assert_allclose(got[0].numpy(), want_a, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got[1].numpy(), want_b, rtol=1e-5, atol=1e-6)
    seq = sok.group_embedding_lookup_sparse([b], [to_sparse(rows_b)], ["sum"], is_sequence=True)[
        0
    ].numpy()
    assert seq.shape == (3, 3, 2)
    np.testing.assert_array_equal(seq[1], [table_b[5], table_b[6], table_b[4]])
    np.testing.assert_array_equal(seq[0, 1:], np.zeros([2, 2]))
    with pytest.raises(ValueError, match="combiners must be 'mean' or 'sum'"):
        sok.group_embedding_lookup_sparse([a], [to_sparse(rows_a)], ["max"])
    with pytest.raises(ValueError, match="2 params, 1 sp_ids"):
        sok.group_embedding_lookup_sparse([a, b], [to_sparse(rows_a)], ["sum", "sum"])
