"""Checkpoints of Embedding Variables (tf.compat.v1.train.Saver, tf.train.Checkpoint) with their
optimizer slots, frequencies and versions; exact resume of training; dimension mismatch; eviction
before saving; SavedModel export served read-only in a fresh process."""
import json
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import sparse_operation_kit as sok
from tests.python.support import graph_session, sparse_value, subprocess_env, to_ragged, unique_name

DIM = 4
UNIFORM = tf.random_uniform_initializer(-1.0, 1.0, seed=3)
# Batches of ids per sample; the ones after the checkpoint bring keys never seen before it.
BEFORE = [[[1, 2, 2], [3], [4, 1]], [[5, 6], [1, 7], [2]], [[3, 3, 8], [9], [6, 2]]]
AFTER = [[[1, 20], [21, 3], [5]], [[22, 2], [20, 20], [9, 23]], [[24], [1, 2], [21]]]
LABELS = np.array([[0.5], [-1.0], [2.0]], np.float32)
FIELDS = ("keys", "values", "slots", "freqs", "versions", "slot_kind", "slot_init")


def table_state(var, sess=None):
    """Every exported field of a table, as numpy arrays."""
    tensors = var.export()
    arrays = sess.run(list(tensors)) if sess is not None else [t.numpy() for t in tensors]
    return dict(zip(FIELDS, arrays))


def assert_bitwise_equal(a, b):
    """Same keys in the same order and bit-identical rows, slots, frequencies and versions."""
    for field in FIELDS:
        x, y = np.asarray(a[field]), np.asarray(b[field])
        assert x.dtype == y.dtype and x.shape == y.shape, (field, x.shape, y.shape)
        assert x.tobytes() == y.tobytes(), f"{field} differs"


# ---------------------------------------------------------------------------------------------
# TF2: tf.train.Checkpoint of a Keras model holding Embedding Variables
# ---------------------------------------------------------------------------------------------
class RankingModel(tf.keras.Model):
    def __init__(self):
        super().__init__()
        # Initial values of new keys depend on the table's name: a fixed layer name gives the
        # restored model the tables (and names) that a fresh process would.
        self.embedding = sok.SparseEmbedding([DIM, 2], combiners=["sum", "mean"],
                                             initializers=[UNIFORM, UNIFORM], name="features")
        self.head = tf.keras.layers.Dense(1, kernel_initializer=tf.keras.initializers.Constant(0.3))

    def call(self, ids, training=None):
        return self.head(tf.concat(self.embedding([ids, ids], training=training), 1))


def _make_optimizer(kind):
    if kind == "adagrad":
        return sok.OptimizerWrapper(tf.keras.optimizers.Adagrad(0.1))
    if kind == "adam":
        return sok.OptimizerWrapper(tf.keras.optimizers.Adam(0.05))
    # A tf.compat.v1 optimizer in eager mode counts steps in the wrapper's own variable.
    return sok.OptimizerWrapper(tf.compat.v1.train.AdamOptimizer(0.05))


def _train_tf2(model, opt, batches, dense_too):
    @tf.function
    def step(ids):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum((model(ids, training=True) - LABELS) ** 2)
        variables = model.embedding.embedding_variables + (
            model.head.trainable_variables if dense_too else []
        )
        opt.apply_gradients(zip(tape.gradient(loss, variables), variables))

    for rows in batches:
        step(to_ragged(rows))


def _tf2_state(model):
    return ([table_state(t) for t in model.embedding.embedding_variables],
            [v.numpy() for v in model.head.weights])


@pytest.mark.parametrize("kind", ["adagrad", "adam", "v1_adam"])
def test_checkpoint_tf2_exact_resume(tmp_path, kind):
    dense_too = kind != "v1_adam"  # v1 optimizers do not update Keras 3 variables
    model, opt = _model_and_optimizer(kind)
    _train_tf2(model, opt, BEFORE, dense_too)
    path = tf.train.Checkpoint(model=model, optimizer=opt).save(str(tmp_path / "ckpt"))
    saved_tables = [table_state(t) for t in model.embedding.embedding_variables]
    _train_tf2(model, opt, AFTER, dense_too)
    tables_a, dense_a = _tf2_state(model)

    fresh, fresh_opt = _model_and_optimizer(kind)
    if dense_too:
        # Keras 3 optimizers restore their slot variables only when built before the restore.
        fresh_opt.build(fresh.head.trainable_variables)
    status = tf.train.Checkpoint(model=fresh, optimizer=fresh_opt).restore(path)
    for saved, table in zip(saved_tables, fresh.embedding.embedding_variables):
        assert_bitwise_equal(saved, table_state(table))
    assert int(saved_tables[0]["slot_kind"]) >= 0 and saved_tables[0]["slots"].shape[1] > 0
    _train_tf2(fresh, fresh_opt, AFTER, dense_too)
    status.assert_consumed()  # slots and the step counter were created, then restored, on first use
    tables_b, dense_b = _tf2_state(fresh)
    for a, b in zip(tables_a, tables_b):
        assert_bitwise_equal(a, b)
    for a, b in zip(dense_a, dense_b):
        assert a.tobytes() == b.tobytes()
    # Keys first seen after the checkpoint were trained in both runs.
    assert {20, 21, 22, 23, 24} <= set(tables_b[0]["keys"].tolist())


def _model_and_optimizer(kind):
    model = RankingModel()
    model(to_ragged([[0]]), training=False)  # builds the Dense layer; inserts nothing
    return model, _make_optimizer(kind)


def test_wrapper_tracks_its_step_counter(tmp_path):
    ev = sok.EmbeddingVariable(unique_name(), DIM, initializer=UNIFORM)
    opt = sok.OptimizerWrapper(tf.compat.v1.train.AdagradOptimizer(0.1))
    for rows in BEFORE:
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(sok.lookup_sparse(ev, to_ragged(rows)))
        opt.apply_gradients([(tape.gradient(loss, ev), ev)])
    path = tf.train.Checkpoint(optimizer=opt).save(str(tmp_path / "ckpt"))
    names = [n for n, _ in tf.train.list_variables(path)]
    assert "optimizer/sok_optimizer_step/.ATTRIBUTES/VARIABLE_VALUE" in names
    assert (
        tf.train.load_variable(path, "optimizer/sok_optimizer_step/.ATTRIBUTES/VARIABLE_VALUE") == 3
    )


def test_checkpoint_tf2_dimension_mismatch_names_the_table(tmp_path):
    name = unique_name("mismatch")
    ev = sok.EmbeddingVariable(name, DIM, initializer=UNIFORM)
    ev.assign(tf.constant([1, 2], tf.int64), tf.ones([2, DIM]))
    path = tf.train.Checkpoint(table=ev).save(str(tmp_path / "ckpt"))
    other = sok.EmbeddingVariable(name, DIM + 1, initializer=UNIFORM)
    with pytest.raises(Exception, match=f"cannot restore Embedding Variable '{name}'.*dimension"):
        tf.train.Checkpoint(table=other).restore(path)
    assert int(other.size()) == 0


# ---------------------------------------------------------------------------------------------
# TF1: tf.compat.v1.train.Saver
# ---------------------------------------------------------------------------------------------
def _tf1_graph(kind):
    """A TF1 training graph: one Embedding Variable, a dense head, a global step."""
    ids = tf.compat.v1.sparse_placeholder(tf.int64)
    labels = tf.constant(LABELS)
    ev = sok.get_embedding_variable("user_emb", DIM, initializer=UNIFORM)
    head = tf.compat.v1.get_variable("head", [DIM, 1], initializer=tf.constant_initializer(0.3))
    logits = tf.matmul(sok.lookup_sparse(ev, ids, combiners="mean"), head)
    loss = tf.reduce_sum((logits - labels) ** 2)
    if kind == "adagrad":
        base = tf.compat.v1.train.AdagradOptimizer(0.1)
    else:
        base = tf.compat.v1.train.AdamOptimizer(0.05)
    global_step = tf.compat.v1.train.get_or_create_global_step()
    train_op = sok.OptimizerWrapper(base).minimize(loss, global_step=global_step)
    return ids, ev, head, train_op


def _run_tf1(sess, ids, train_op, batches):
    for rows in batches:
        sess.run(train_op, {ids: sparse_value(rows)})


@pytest.mark.parametrize("kind", ["adagrad", "adam"])
def test_saver_tf1_exact_resume(tmp_path, kind):
    path = str(tmp_path / "model.ckpt")
    with graph_session() as sess:
        ids, ev, head, train_op = _tf1_graph(kind)
        saver = tf.compat.v1.train.Saver()  # default var_list: global variables, EVs included
        sess.run(tf.compat.v1.global_variables_initializer())
        _run_tf1(sess, ids, train_op, BEFORE)
        saver.save(sess, path)
        saved = table_state(ev, sess)
        _run_tf1(sess, ids, train_op, AFTER)
        table_a, head_a = table_state(ev, sess), sess.run(head)
    names = dict(tf.train.list_variables(path))
    assert "user_emb/keys" in names and "user_emb/slots" in names and "sok_optimizer_step" in names

    with graph_session() as sess:
        ids, ev, head, train_op = _tf1_graph(kind)
        saver = tf.compat.v1.train.Saver()
        sess.run(tf.compat.v1.global_variables_initializer())
        _run_tf1(sess, ids, train_op, BEFORE[:1])  # restoring replaces what was there
        saver.restore(sess, path)
        assert_bitwise_equal(saved, table_state(ev, sess))
        _run_tf1(sess, ids, train_op, AFTER)
        assert_bitwise_equal(table_a, table_state(ev, sess))
        assert sess.run(head).tobytes() == head_a.tobytes()


def test_saver_tf1_explicit_var_list_and_restore_without_initializer(tmp_path):
    path = str(tmp_path / "table.ckpt")
    with graph_session() as sess:
        ids, ev, head, train_op = _tf1_graph("adagrad")
        sess.run(tf.compat.v1.global_variables_initializer())
        _run_tf1(sess, ids, train_op, BEFORE)
        tf.compat.v1.train.Saver({"shared/table": ev}).save(sess, path)
        saved = table_state(ev, sess)
    assert "shared/table/values" in dict(tf.train.list_variables(path))

    with graph_session() as sess:
        other = sok.get_embedding_variable("another_name", DIM, initializer=UNIFORM)
        saver = tf.compat.v1.train.Saver(var_list={"shared/table": other})
        saver.restore(sess, path)  # creates the table: no initializer run needed
        assert_bitwise_equal(saved, table_state(other, sess))

    with graph_session() as sess:
        ev = sok.get_embedding_variable("user_emb", DIM, initializer=UNIFORM)
        sess.run(tf.compat.v1.global_variables_initializer())
        # A list var_list names the table by the variable's own name.
        list_path = str(tmp_path / "list.ckpt")
        tf.compat.v1.train.Saver([ev]).save(sess, list_path)
        assert "user_emb/freqs" in dict(tf.train.list_variables(list_path))


def test_saver_tf1_dimension_mismatch_names_the_table(tmp_path):
    path = str(tmp_path / "table.ckpt")
    with graph_session() as sess:
        ev = sok.get_embedding_variable("wide", DIM, initializer=UNIFORM)
        sess.run(ev.initializer)
        sess.run(ev.assign(tf.constant([1, 2], tf.int64), tf.ones([2, DIM])))
        tf.compat.v1.train.Saver([ev]).save(sess, path)
    with graph_session() as sess:
        ev = sok.get_embedding_variable("wide", DIM * 2, initializer=UNIFORM)
        sess.run(ev.initializer)
        with pytest.raises(tf.errors.InvalidArgumentError, match="wide.*dimension"):
            tf.compat.v1.train.Saver([ev]).restore(sess, path)
        assert sess.run(ev.size()) == 0


# ---------------------------------------------------------------------------------------------
# Eviction: explicit shrink before saving (saving itself never evicts)
# ---------------------------------------------------------------------------------------------
def test_shrink_before_save_drops_stale_rows(tmp_path):
    option = sok.EmbeddingVariableOption(evict_option=sok.GlobalStepEvict(steps_to_live=2))
    ev = sok.get_embedding_variable(
        unique_name("evict"), DIM, initializer=UNIFORM, ev_option=option
    )
    opt = sok.OptimizerWrapper(tf.compat.v1.train.AdagradOptimizer(0.1))
    batches = [[[1, 2]], [[3]], [[4]], [[5]], [[4, 5]]]  # steps 0..4: keys 1, 2 and 3 go stale
    for rows in batches:
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(sok.lookup_sparse(ev, to_ragged(rows)))
        opt.apply_gradients([(tape.gradient(loss, ev), ev)])
    ckpt = tf.train.Checkpoint(table=ev)
    kept_all = ckpt.save(str(tmp_path / "all"))
    assert sorted(tf.train.load_variable(kept_all, "table/.ATTRIBUTES/keys").tolist()) == [
        1,
        2,
        3,
        4,
        5,
    ]
    assert int(ev.shrink(len(batches))) == 3
    shrunk = ckpt.save(str(tmp_path / "shrunk"))
    assert sorted(tf.train.load_variable(shrunk, "table/.ATTRIBUTES/keys").tolist()) == [4, 5]


# ---------------------------------------------------------------------------------------------
# SavedModel: read-only serving in a fresh process
# ---------------------------------------------------------------------------------------------
class ServedModule(tf.Module):
    def __init__(self):
        super().__init__()
        self.table = sok.EmbeddingVariable(unique_name("served"), DIM, initializer=UNIFORM)

    @tf.function(input_signature=[tf.RaggedTensorSpec([None, None], tf.int64, 1)])
    def serve(self, ids):
        return sok.lookup_sparse(self.table, ids, combiners="sum", training=False)


RAGGED_IDS = tf.RaggedTensorSpec([None, None], tf.int64, 1)

# Loads both exports in a fresh process, serves the queries through the restored functions and
# the serving signatures, and reports the tables' sizes before and after.
_LOAD_AND_SERVE = r"""
import json, sys
import tensorflow as tf
import sparse_operation_kit as sok
from sparse_operation_kit.runtime._ops import ops

args = json.loads(sys.argv[1])
ids = tf.RaggedTensor.from_row_lengths(tf.constant(args["keys"], tf.int64),
                                       tf.ones([len(args["keys"])], tf.int64))
flat_ids = {"ids": ids.values, "ids_1": ids.row_splits}
sizes = lambda tables: [int(ops.sok_embedding_variable_size(t.resource_handle, key_dtype=tf.int64))
                        for t in tables]
module = tf.saved_model.load(args["module"])
keras_model = tf.saved_model.load(args["keras"])
tables = [module.table, keras_model.embedding.table_0, keras_model.embedding.table_1]
result = {"before": sizes(tables)}
result["module"] = module.serve(ids).numpy().tolist()
serve_signature = module.signatures["serving_default"]
result["module_signature"] = serve_signature(**flat_ids)["output_0"].numpy().tolist()
result["keras"] = keras_model.signatures["serving_default"](**flat_ids)["output_0"].numpy().tolist()
result["after"] = sizes(tables)
print(json.dumps(result))
"""


def test_saved_model_serves_read_only_in_fresh_process(tmp_path):
    seen, unseen = [1, 2, 9, 5], [100, 7001, 123456789]
    queries = to_ragged([[k] for k in seen + unseen])
    module = ServedModule()
    untrained = module.table.sparse_read(tf.constant(seen, tf.int64), training=False).numpy()
    opt = sok.OptimizerWrapper(tf.keras.optimizers.Adagrad(0.1))
    for rows in BEFORE:
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(sok.lookup_sparse(module.table, to_ragged(rows)) ** 2)
        opt.apply_gradients([(tape.gradient(loss, module.table), module.table)])
    trained = module.table.sparse_read(tf.constant(seen, tf.int64), training=False).numpy()
    initial = module.table.sparse_read(tf.constant(unseen, tf.int64), training=False).numpy()
    module_dir = str(tmp_path / "module")
    tf.saved_model.save(module, module_dir, signatures={"serving_default": module.serve})

    model, model_opt = _model_and_optimizer("adam")
    _train_tf2(model, model_opt, BEFORE, dense_too=True)
    keras_dir = str(tmp_path / "keras")
    serve = tf.function(lambda ids: model(ids, training=False), input_signature=[RAGGED_IDS])
    tf.saved_model.save(model, keras_dir, signatures={"serving_default": serve})
    keras_served = model(queries, training=False).numpy()
    sizes = [int(t.size()) for t in [module.table] + model.embedding.embedding_variables]

    args = json.dumps({"module": module_dir, "keras": keras_dir, "keys": seen + unseen})
    out = subprocess.run([sys.executable, "-c", _LOAD_AND_SERVE, args], env=subprocess_env(),
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    served = np.array(result["module"], np.float32)
    np.testing.assert_array_equal(served[:len(seen)], trained)  # trained rows of seen keys
    np.testing.assert_array_equal(served[len(seen):], initial)  # initial rows of unseen keys
    assert not np.isclose(trained, untrained).any()
    np.testing.assert_array_equal(np.array(result["module_signature"], np.float32), served)
    np.testing.assert_array_equal(np.array(result["keras"], np.float32), keras_served)
    assert result["before"] == sizes and result["after"] == sizes  # serving inserted nothing
