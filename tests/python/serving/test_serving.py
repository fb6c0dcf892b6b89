"""sok.save_stock_saved_model: a SavedModel with stock TensorFlow ops only, served by stock
TensorFlow in a process where sparse_operation_kit cannot be imported, with SOK's read-only
outputs (unseen keys read their initial value, or default_value_no_permission under a filter)."""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf

import sparse_operation_kit as sok
from tests.python.support import unique_name

# Runs in a fresh interpreter: SOK's package is made unimportable, so only stock ops can serve.
SERVE_WITHOUT_SOK = textwrap.dedent("""
    import importlib.abc, json, sys
    class NoSok(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] == "sparse_operation_kit":
                raise ImportError("sparse_operation_kit is not installed here")
    sys.meta_path.insert(0, NoSok())
    import numpy as np, tensorflow as tf
    args = json.load(open(sys.argv[1]))
    served = tf.saved_model.load(args["dir"]).signatures["serving_default"]
    inputs = {k: tf.constant(np.asarray(v, dtype=args["dtypes"][k])) for k, v in args["inputs"].items()}
    out = served(**inputs)
    assert not any(m.startswith("sparse_operation_kit") for m in sys.modules)
    np.savez(args["out"], **{k: v.numpy() for k, v in out.items()})
""")


def serve_in_fresh_process(tmp_path, export_dir, inputs):
    args = {
        "dir": str(export_dir),
        "out": str(tmp_path / "served.npz"),
        "inputs": {k: np.asarray(v).tolist() for k, v in inputs.items()},
        "dtypes": {k: np.asarray(v).dtype.name for k, v in inputs.items()},
    }
    (tmp_path / "args.json").write_text(json.dumps(args))
    (tmp_path / "serve.py").write_text(SERVE_WITHOUT_SOK)
    # The script's import blocker keeps SOK out whatever the path (TensorFlow may come from it).
    env = {k: v for k, v in os.environ.items() if k != "SOK_OPS_LIBRARY"}
    done = subprocess.run(
        [sys.executable, str(tmp_path / "serve.py"), str(tmp_path / "args.json")],
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(np.load(tmp_path / "served.npz"))


def saved_op_types(export_dir):
    from tensorflow.core.protobuf import saved_model_pb2

    sm = saved_model_pb2.SavedModel()
    sm.ParseFromString((export_dir / "saved_model.pb").read_bytes())
    types = set()
    for mg in sm.meta_graphs:
        types |= {n.op for n in mg.graph_def.node}
        for f in mg.graph_def.library.function:
            types |= {n.op for n in f.node_def}
    return types


INITIALIZERS = {
    "uniform": tf.random_uniform_initializer(-0.5, 0.5, seed=3),
    "normal": tf.random_normal_initializer(0.1, 0.3, seed=4),
    "truncated": tf.initializers.TruncatedNormal(0.0, 0.2, seed=5),
    "constant": tf.constant_initializer(0.25),
}


class Ranker(tf.Module):
    """Several kinds of tables and lookups: pooled (sum / weighted mean / sqrtn), sparse_read and
    tf.nn.embedding_lookup on Embedding Variables, a static table, then a dense layer."""

    def __init__(self):
        super().__init__()
        self.evs = {
            k: sok.get_embedding_variable(unique_name(f"serve_{k}"), 4, initializer=init)
            for k, init in INITIALIZERS.items()
        }
        self.matrix_ev = (
            sok.get_embedding_variable(  # DeepRec's default-value matrix (default_value_dim rows)
                unique_name("serve_matrix"),
                4,
                ev_option=sok.EmbeddingVariableOption(
                    init_option=sok.InitializerOption(
                        tf.random_uniform_initializer(-1.0, 1.0, seed=6), default_value_dim=7
                    )
                ),
            )
        )
        self.filtered = sok.get_embedding_variable(
            unique_name("serve_filtered"),
            4,
            initializer=INITIALIZERS["uniform"],
            ev_option=sok.EmbeddingVariableOption(
                filter_option=sok.CounterFilter(filter_freq=2),
                init_option=sok.InitializerOption(default_value_no_permission=-0.5),
            ),
        )
        self.static = tf.Variable(np.arange(40, dtype=np.float32).reshape(10, 4) / 40.0)
        self.w = tf.Variable(np.linspace(-1, 1, 8 * 4 * 4, dtype=np.float32).reshape(32, 4))

    def tables(self):
        return list(self.evs.values()) + [self.matrix_ev, self.filtered]

    def features(self, ids, weights, small_ids, training):
        sp = tf.sparse.from_dense(ids)  # 0 = no id
        sw = tf.SparseTensor(sp.indices, tf.gather_nd(weights, sp.indices), sp.dense_shape)
        tables = self.tables()
        pooled = sok.lookup_sparse(
            tables,
            [sp] * len(tables),
            sp_weights=[None, sw, None, sw, None, None],
            combiners=["sum", "mean", "sqrtn", "mean", "sum", "sum"],
            training=training,
        )
        first = ids[:, 0]
        read = self.evs["uniform"].sparse_read(first, training=training)
        looked = (
            tf.nn.embedding_lookup(self.evs["normal"], first)
            if training
            else self.evs["normal"].sparse_read(first, training=False)
        )
        static = sok.lookup_sparse(
            self.static, tf.sparse.from_dense(small_ids), combiners="sum", training=training
        )
        return tf.concat(pooled + [read, looked], axis=1), static

    @tf.function(
        input_signature=[
            tf.TensorSpec([None, 3], tf.int64),
            tf.TensorSpec([None, 3], tf.float32),
            tf.TensorSpec([None, 2], tf.int64),
        ]
    )
    def serve(self, ids, weights, small_ids):
        feats, static = self.features(ids, weights, small_ids, training=False)
        return {"score": tf.matmul(feats, self.w) + static, "features": feats}


def test_stock_saved_model_serves_without_sok_like_sok(tmp_path):
    model = Ranker()
    rng = np.random.default_rng(0)
    train_ids = rng.integers(1, 60, [32, 3])
    for _ in range(2):  # inserts keys; the filtered table admits keys seen twice
        model.features(
            tf.constant(train_ids),
            tf.ones([32, 3]),
            tf.constant(rng.integers(0, 10, [32, 2])),
            training=True,
        )
    for t in model.tables():  # trained-looking rows: distinct from the initial values
        keys = sok.export(t)[0]
        t.assign(keys, tf.random.stateless_uniform([tf.size(keys), 4], [1, 2]))
    ids = np.concatenate([train_ids[:6], rng.integers(50, 90, [6, 3])])  # seen and unseen keys
    ids[2, 1:] = 0  # short samples
    weights = rng.uniform(0.5, 2.0, ids.shape).astype(np.float32)
    small = rng.integers(0, 10, [12, 2])
    sizes = [int(t.size()) for t in model.tables()]
    expected = model.serve(tf.constant(ids), tf.constant(weights), tf.constant(small))
    assert [
        int(t.size()) for t in model.tables()
    ] == sizes  # the read-only reference inserted nothing

    export_dir = tmp_path / "stock"
    frozen = sok.save_stock_saved_model(model.serve, str(export_dir), model.serve.input_signature)
    assert frozen == [t.name for t in model.tables()]
    types = saved_op_types(export_dir)
    assert not {t for t in types if t.startswith("Sok")} and "LookupTableFindV2" in types

    served = serve_in_fresh_process(
        tmp_path, export_dir, {"ids": ids, "weights": weights, "small_ids": small}
    )
    np.testing.assert_allclose(
        served["features"], expected["features"].numpy(), rtol=2e-6, atol=2e-6
    )
    np.testing.assert_allclose(served["score"], expected["score"].numpy(), rtol=1e-5, atol=1e-5)
    # Unseen keys read their initial values (computed in stock ops), the filter's keys not yet
    # admitted read default_value_no_permission.
    unseen = served["features"][6:]
    assert np.abs(unseen).sum() > 0


def test_keras_model_with_ragged_ids_exports_to_stock_ops(tmp_path):
    keras = pytest.importorskip("keras")
    inp = keras.Input(shape=(None,), dtype="int64", ragged=True)
    emb = sok.SparseEmbedding(
        8, combiners="mean", initializers=INITIALIZERS["uniform"], name=unique_name("stock_keras")
    )
    model = keras.Model(inp, keras.layers.Dense(1, activation="sigmoid")(emb(inp)))
    model.compile(
        optimizer=sok.OptimizerWrapper(keras.optimizers.Adam(0.05)), loss="binary_crossentropy"
    )
    rng = np.random.default_rng(1)
    rows = [list(rng.integers(0, 100, rng.integers(1, 4))) for _ in range(256)]
    labels = np.array([r[0] % 2 for r in rows], np.float32)
    ids = tf.ragged.constant(rows, dtype=tf.int64)
    model.fit(tf.data.Dataset.from_tensor_slices((ids, labels)).batch(32), epochs=2, verbose=0)

    test_rows = [[3, 150], [7], [220, 221, 5]]  # 150, 220, 221 unseen
    test_ids = tf.ragged.constant(test_rows, dtype=tf.int64)
    size = int(emb.embedding_variables[0].size())
    expected = model(test_ids, training=False).numpy()
    assert int(emb.embedding_variables[0].size()) == size

    export_dir = tmp_path / "keras_stock"
    spec = tf.RaggedTensorSpec([None, None], tf.int64, ragged_rank=1)
    sok.save_stock_saved_model(model, str(export_dir), [spec])
    assert not {t for t in saved_op_types(export_dir) if t.startswith("Sok")}
    served = serve_in_fresh_process(
        tmp_path,
        export_dir,
        {
            "args_0_values": test_ids.flat_values.numpy(),
            "args_0_row_splits": test_ids.row_splits.numpy(),
        },
    )
    np.testing.assert_allclose(served["output_0"], expected, rtol=1e-6, atol=1e-6)


def test_sok_ops_left_in_the_function_are_an_error(tmp_path):
    ev = sok.get_embedding_variable(unique_name("serve_size"), 2)

    def serve(ids):
        return tf.cast(ev.size(), tf.float32) + tf.reduce_sum(ev.sparse_read(ids, training=False))

    with pytest.raises(ValueError, match="still runs SOK ops.*SokEmbeddingVariableSize"):
        sok.save_stock_saved_model(serve, str(tmp_path / "x"), [tf.TensorSpec([None], tf.int64)])


def test_partitioned_tables_are_refused_by_name(tmp_path):
    ev = sok.get_embedding_variable(unique_name("serve_parts"), 2,
                                    partitioner=tf.compat.v1.fixed_size_partitioner(2))

    def serve(ids):
        return sok.lookup_sparse(ev, tf.RaggedTensor.from_tensor(ids), training=False)

    with pytest.raises(ValueError, match=f"table '{ev.name}' is partitioned"):
        sok.save_stock_saved_model(serve, str(tmp_path / "x"), [tf.TensorSpec([None, 2], tf.int64)])
