"""SokPooledCombine / SokPooledCombineGrad called directly: the segment_order input (M = 0 or
M = N) and segments_checked give the same values and gradients as a numpy reference, in eager
mode and in a TF1 graph, and the gradient op gets the forward's orders and attributes. Dense
tables (empty segment_ids: k ids per sample) match a plain-TF reference, alone and mixed with
sparse ones, and bad dense shapes are refused naming the table."""
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf

from sparse_operation_kit.runtime._ops import ops
from tests.python.support import REPO_ROOT, graph_session, subprocess_env

# Per table: dim, combiner, weighted, sorted segment ids, batch, ids per sample (max).
TABLES = [
    (1, "sum", False, True, 5, 3),
    (4, "mean", True, False, 6, 4),
    (3, "sqrtn", True, True, 4, 3),
    (16, "mean", False, False, 7, 5),
    (2, "sum", True, True, 3, 0),  # no ids at all
]


def make_table(rng, dim, weighted, is_sorted, batch, per_sample):
    """Random ids of one table: rows, inverse, segment ids, weights and the sample order."""
    counts = rng.integers(0, per_sample + 1, size=batch)
    if batch > 1 and per_sample:
        counts[1] = 0  # an empty sample
    seg = np.repeat(np.arange(batch), counts).astype(np.int64)
    n = len(seg)
    num_rows = 6
    inverse = rng.integers(0, num_rows, size=n).astype(np.int32)
    weights = rng.uniform(0.0, 1.0, size=n).astype(np.float32) if weighted else None
    if weighted and n and counts[0]:
        weights[: counts[0]] = 0.0  # sample 0 sums to zero weight: zeros for mean / sqrtn
    if not is_sorted:
        perm = rng.permutation(n)
        seg, inverse = seg[perm], inverse[perm]
        weights = weights[perm] if weighted else None
    order = np.argsort(seg, kind="stable").astype(np.int32)
    rows = rng.normal(size=(num_rows, dim)).astype(np.float32)
    return rows, inverse, seg, weights, order


def reference(rows, inverse, seg, weights, combiner, batch, grad):
    """numpy forward [batch, dim] and gradient wrt rows for the incoming gradient `grad`."""
    w = np.ones(len(seg), np.float64) if weights is None else weights.astype(np.float64)
    denom = np.zeros(batch)
    np.add.at(denom, seg, w if combiner == "mean" else w * w)
    if combiner == "sqrtn":
        denom = np.sqrt(denom)
    scale = np.ones(batch) if combiner == "sum" else np.divide(
        1.0, denom, out=np.zeros(batch), where=denom != 0)
    coef = w * scale[seg] if len(seg) else w
    out = np.zeros((batch, rows.shape[1]))
    np.add.at(out, seg, coef[:, None] * rows[inverse])
    drows = np.zeros(rows.shape)
    np.add.at(drows, inverse, coef[:, None] * grad[seg])
    return out, drows


@pytest.fixture
def tables():
    rng = np.random.default_rng(11)
    return [make_table(rng, d, w, s, b, p) for d, _, w, s, b, p in TABLES]


def as_indices(seg):
    """SparseTensor-like indices [n, 2] whose column 0 is `seg` (column 1: anything)."""
    return np.stack([seg, np.arange(len(seg), dtype=np.int64) % 3], axis=1).astype(np.int64)


def pooled(tables, variant, rows_vars, indices=False):
    """The op's outputs for variant "m0" (no orders), "unchecked" or "checked" (M = N); with
    `indices`, each table's samples given as indices [n, 2] (column 0) instead of [n]."""
    n = len(tables)
    orders = []
    if variant != "m0":
        # Sorted tables give an empty order, like SokUniqueKeys.
        orders = [tf.constant(o if not s else np.zeros([0], np.int32), tf.int32)
                  for (_, _, _, _, o), (_, _, _, s, _, _) in zip(tables, TABLES)]
    out = ops.sok_pooled_combine(
        rows_vars,
        [tf.constant(t[1]) for t in tables],
        [tf.constant(as_indices(t[2]) if indices else t[2]) for t in tables],
        [tf.constant(t[3] if t[3] is not None else np.zeros([0], np.float32)) for t in tables],
        orders,
        tf.constant([b for _, _, _, _, b, _ in TABLES], tf.int64),
        combiners=[c for _, c, _, _, _, _ in TABLES],
        table_names=[f"t{i}" for i in range(n)],
        segments_checked=variant == "checked",
    )
    check_num_rows(out, rows_vars)
    return out.embeddings


def check_num_rows(out, rows):
    """The op's last output: each table's row count (in host memory; its gradient's num_rows)."""
    assert out.num_rows.shape == [len(rows)]
    if tf.executing_eagerly():
        np.testing.assert_array_equal(out.num_rows.numpy(), [r.shape[0] for r in rows])


def expected(tables, grads):
    return [
        reference(t[0], t[1], t[2], t[3], c, b, g)
        for t, (_, c, _, _, b, _), g in zip(tables, TABLES, grads)
    ]


def incoming_grads(tables):
    rng = np.random.default_rng(5)
    return [rng.normal(size=(b, d)).astype(np.float32) for d, _, _, _, b, _ in TABLES]


def check_eager(tables, variant, indices):
    """Eager values and gradients of the op against the numpy reference."""
    grads = incoming_grads(tables)
    rows = [tf.Variable(t[0]) for t in tables]
    with tf.GradientTape() as tape:
        outs = pooled(tables, variant, rows, indices=indices)
        loss = tf.add_n([tf.reduce_sum(o * g) for o, g in zip(outs, grads)])
    drows = tape.gradient(loss, rows)
    for i, (o, dr, (want, want_d)) in enumerate(zip(outs, drows, expected(tables, grads))):
        np.testing.assert_allclose(o.numpy(), want, rtol=1e-5, atol=1e-6, err_msg=f"table {i}")
        np.testing.assert_allclose(tf.convert_to_tensor(dr).numpy(), want_d, rtol=1e-5,
                                   atol=1e-6, err_msg=f"gradient of table {i}")


@pytest.mark.parametrize("variant", ["m0", "unchecked", "checked"])
def test_values_and_gradients_eager(tables, variant):
    check_eager(tables, variant, indices=False)


@pytest.mark.parametrize("variant", ["m0", "unchecked", "checked"])
def test_sparse_indices_as_segment_ids(tables, variant):
    """Indices [n, rank] in place of segment ids [n] (lookup_sparse passes a SparseTensor's
    indices as they are): the same values and gradients."""
    check_eager(tables, variant, indices=True)


def test_segment_ids_of_a_wrong_shape_name_the_table(tables):
    rows = [tf.constant(t[0]) for t in tables[:1]]
    n = len(tables[0][1])
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=rf"table 't0': sample indices of shape \[{n + 1},2\]"):
        ops.sok_pooled_combine(
            rows, [tf.constant(tables[0][1])], [tf.zeros([n + 1, 2], tf.int64)],
            [tf.zeros([0])], [], tf.constant([TABLES[0][4]], tf.int64),
            combiners=["sum"], table_names=["t0"])


@pytest.mark.parametrize("variant", ["m0", "checked"])
def test_values_and_gradients_tf1_graph(tables, variant):
    grads = incoming_grads(tables)
    with graph_session() as sess:
        # Placeholders, not constants: Grappler would fold an all-constant op on the host.
        rows = [tf.compat.v1.placeholder(tf.float32, [None, t[0].shape[1]]) for t in tables]
        outs = pooled(tables, variant, rows)
        loss = tf.add_n([tf.reduce_sum(o * g) for o, g in zip(outs, grads)])
        drows = tf.gradients(loss, rows)
        grad_ops = [op for op in sess.graph.get_operations() if op.type == "SokPooledCombineGrad"]
        assert len(grad_ops) == 1
        m = 0 if variant == "m0" else len(tables)
        assert grad_ops[0].get_attr("M") == m
        assert grad_ops[0].get_attr("segments_checked") == (variant == "checked")
        fwd = [op for op in sess.graph.get_operations() if op.type == "SokPooledCombine"][0]
        n = len(tables)
        assert list(grad_ops[0].inputs[4 * n:4 * n + m]) == list(fwd.inputs[4 * n:4 * n + m])
        got, got_d = sess.run([outs, drows], {r: t[0] for r, t in zip(rows, tables)})
    for i, (o, dr, (want, want_d)) in enumerate(zip(got, got_d, expected(tables, grads))):
        np.testing.assert_allclose(o, want, rtol=1e-5, atol=1e-6, err_msg=f"table {i}")
        np.testing.assert_allclose(dr, want_d, rtol=1e-5, atol=1e-6, err_msg=f"table {i}")


def test_order_of_the_wrong_length_names_the_table(tables):
    rows = [tf.constant(t[0]) for t in tables]
    orders = [tf.zeros([0], tf.int32)] * len(tables)
    orders[1] = tf.constant([0, 1], tf.int32)  # table t1 has more ids than that
    with pytest.raises(tf.errors.InvalidArgumentError, match="table 't1': a segment order of 2"):
        ops.sok_pooled_combine(
            rows, [tf.constant(t[1]) for t in tables], [tf.constant(t[2]) for t in tables],
            [tf.zeros([0])] * len(tables), orders,
            tf.constant([b for _, _, _, _, b, _ in TABLES], tf.int64),
            combiners=["sum"] * len(tables), table_names=[f"t{i}" for i in range(len(tables))],
            segments_checked=True)


def test_orders_for_some_tables_only_are_refused(tables):
    rows = [tf.constant(t[0]) for t in tables[:2]]
    with pytest.raises(tf.errors.InvalidArgumentError, match="1 segment orders for 2 tables"):
        ops.sok_pooled_combine(
            rows, [tf.constant(t[1]) for t in tables[:2]], [tf.constant(t[2]) for t in tables[:2]],
            [tf.zeros([0])] * 2, [tf.zeros([0], tf.int32)], tf.constant([5, 6], tf.int64),
            combiners=["sum"] * 2, table_names=["a", "b"])


# Dense tables: dim, combiner, weighted, batch, ids per sample.
DENSE = [
    (16, "sum", False, 6, 1),
    (4, "mean", True, 5, 3),
    (3, "sqrtn", True, 4, 2),
    (1, "sum", True, 3, 3),
]


def make_dense(rng, dim, weighted, batch, k):
    """rows, inverse, segment ids (i // k, for the reference only) and weights of a dense table."""
    num_rows = 7
    n = batch * k
    inverse = rng.integers(0, num_rows, size=n).astype(np.int32)
    weights = rng.uniform(0.0, 1.0, size=n).astype(np.float32) if weighted else None
    if weighted and k:
        weights[:k] = 0.0  # sample 0 sums to zero weight: zeros for mean / sqrtn
    rows = rng.normal(size=(num_rows, dim)).astype(np.float32)
    return rows, inverse, (np.arange(n) // max(k, 1)).astype(np.int64), weights


def tf_reference(rows, inverse, seg, weights, combiner, batch):
    """Plain TF: the combine of the gathered rows by sample (differentiable wrt rows)."""
    w = tf.ones([len(seg)]) if weights is None else tf.constant(weights)
    parts = tf.gather(rows, inverse) * w[:, None]
    out = tf.math.unsorted_segment_sum(parts, seg, batch)
    if combiner == "sum":
        return out
    denom = tf.math.unsorted_segment_sum(w if combiner == "mean" else w * w, seg, batch)
    if combiner == "sqrtn":
        denom = tf.sqrt(denom)
    return tf.math.divide_no_nan(out, denom[:, None])


def mixed_tables():
    """Dense tables interleaved with the sparse ones of TABLES: (spec, arrays, dense) each."""
    rng = np.random.default_rng(23)
    out = []
    for (dim, comb, w, batch, k), (d, c, ws, srt, b, p) in zip(DENSE, TABLES):
        out.append(((dim, comb, batch), make_dense(rng, dim, w, batch, k), True))
        rows, inverse, seg, weights, order = make_table(rng, d, ws, srt, b, p)
        out.append(((d, c, b), (rows, inverse, seg, weights, order if not srt else None), False))
    return out


def dense_call(tables, rows, variant, op=None):
    """SokPooledCombine over `tables` (dense ones get empty segment ids); variant as in pooled."""
    orders = []
    if variant != "m0":
        orders = [tf.constant(a[4] if not dense and a[4] is not None else np.zeros([0], np.int32))
                  for _, a, dense in tables]
    empty_seg = np.zeros([0], np.int64)
    out = ops.sok_pooled_combine(
        rows,
        [tf.constant(a[1]) for _, a, _ in tables],
        [tf.constant(empty_seg if dense else a[2]) for _, a, dense in tables],
        [tf.constant(a[3] if a[3] is not None else np.zeros([0], np.float32))
         for _, a, _ in tables],
        orders,
        tf.constant([spec[2] for spec, _, _ in tables], tf.int64),
        combiners=[spec[1] for spec, _, _ in tables],
        table_names=[f"t{i}" for i in range(len(tables))],
        segments_checked=variant == "checked",
    )
    check_num_rows(out, rows)
    return out.embeddings


@pytest.mark.parametrize("only_dense", [True, False])
@pytest.mark.parametrize("variant", ["m0", "unchecked", "checked"])
def test_dense_tables_match_plain_tf(variant, only_dense):
    tables = [t for t in mixed_tables() if t[2] or not only_dense]
    rng = np.random.default_rng(3)
    grads = [rng.normal(size=(spec[2], spec[0])).astype(np.float32) for spec, _, _ in tables]
    rows = [tf.Variable(a[0]) for _, a, _ in tables]
    with tf.GradientTape(persistent=True) as tape:
        outs = dense_call(tables, rows, variant)
        loss = tf.add_n([tf.reduce_sum(o * g) for o, g in zip(outs, grads)])
        want = [tf_reference(r, a[1], a[2], a[3], spec[1], spec[2])
                for r, (spec, a, _) in zip(rows, tables)]
        want_loss = tf.add_n([tf.reduce_sum(o * g) for o, g in zip(want, grads)])
    got_d, want_d = tape.gradient(loss, rows), tape.gradient(want_loss, rows)
    for i, (o, w, gd, wd) in enumerate(zip(outs, want, got_d, want_d)):
        np.testing.assert_allclose(o.numpy(), w.numpy(), rtol=1e-5, atol=1e-6, err_msg=f"t{i}")
        np.testing.assert_allclose(tf.convert_to_tensor(gd).numpy(),
                                   tf.convert_to_tensor(wd).numpy(), rtol=1e-5, atol=1e-6,
                                   err_msg=f"gradient of t{i}")


def test_dense_tables_in_a_tf1_graph():
    tables = mixed_tables()
    rng = np.random.default_rng(4)
    grads = [rng.normal(size=(spec[2], spec[0])).astype(np.float32) for spec, _, _ in tables]
    with graph_session() as sess:
        rows = [tf.compat.v1.placeholder(tf.float32, [None, spec[0]]) for spec, _, _ in tables]
        outs = dense_call(tables, rows, "checked")
        loss = tf.add_n([tf.reduce_sum(o * g) for o, g in zip(outs, grads)])
        drows = tf.gradients(loss, rows)
        want = [tf_reference(r, a[1], a[2], a[3], spec[1], spec[2])
                for r, (spec, a, _) in zip(rows, tables)]
        want_loss = tf.add_n([tf.reduce_sum(o * g) for o, g in zip(want, grads)])
        want_d = [tf.convert_to_tensor(g) for g in tf.gradients(want_loss, rows)]
        feed = {r: a[0] for r, (_, a, _) in zip(rows, tables)}
        got, got_d, exp, exp_d = sess.run([outs, drows, want, want_d], feed)
    for i in range(len(tables)):
        np.testing.assert_allclose(got[i], exp[i], rtol=1e-5, atol=1e-6, err_msg=f"t{i}")
        np.testing.assert_allclose(got_d[i], exp_d[i], rtol=1e-5, atol=1e-6, err_msg=f"t{i}")


def dense_args(n, batch, order=None):
    """Arguments of a two-table call whose table 'd1' is dense with n ids for `batch` samples."""
    rows = [tf.ones([3, 2]), tf.ones([3, 2])]
    inverse = [tf.zeros([2], tf.int32), tf.zeros([n], tf.int32)]
    seg = [tf.constant([0, 1], tf.int64), tf.zeros([0], tf.int64)]
    weights = [tf.zeros([0])] * 2
    orders = [] if order is None else [tf.zeros([0], tf.int32), tf.constant(order, tf.int32)]
    return rows, inverse, seg, weights, orders, tf.constant([2, batch], tf.int64)


@pytest.mark.parametrize("n,batch", [(10, 4), (3, 0)])
def test_dense_ids_not_a_multiple_of_the_batch_name_the_table(n, batch):
    rows, inverse, seg, weights, orders, sizes = dense_args(n, batch)
    msg = (f"lookup_sparse: table 'd1': {n} ids without segment ids must be k ids per sample "
           f"of batch {batch}")
    with pytest.raises(tf.errors.InvalidArgumentError, match=msg):
        ops.sok_pooled_combine(rows, inverse, seg, weights, orders, sizes,
                               combiners=["sum"] * 2, table_names=["s0", "d1"])
    with pytest.raises(tf.errors.InvalidArgumentError, match=msg):
        ops.sok_pooled_combine_grad([tf.ones([2, 2]), tf.ones([batch, 2])], inverse, seg,
                                    weights, orders, tf.constant([3, 3], tf.int64),
                                    combiners=["sum"] * 2, table_names=["s0", "d1"])


def test_dense_table_with_a_segment_order_is_refused():
    rows, inverse, seg, weights, orders, sizes = dense_args(4, 2, order=[1, 0, 3, 2])
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match="table 'd1': a segment order of 4 entries for a table without"):
        ops.sok_pooled_combine(rows, inverse, seg, weights, orders, sizes,
                               combiners=["sum"] * 2, table_names=["s0", "d1"],
                               segments_checked=True)


def test_dense_gradients_under_op_determinism():
    """Op determinism (its own process: it cannot be turned off): dense and sparse tables'
    gradients are bit-for-bit repeatable and match the plain-TF reference."""
    code = textwrap.dedent("""
        import sys
        import numpy as np
        import tensorflow as tf
        sys.path.insert(0, sys.argv[1])
        import tests.python.lookup.test_pooled_combine_op as t
        tf.config.experimental.enable_op_determinism()
        tables = t.mixed_tables()
        rng = np.random.default_rng(8)
        grads = [rng.normal(size=(s[2], s[0])).astype(np.float32) for s, _, _ in tables]
        rows = [tf.Variable(a[0]) for _, a, _ in tables]
        runs = []
        for _ in range(2):
            with tf.GradientTape() as tape:
                outs = t.dense_call(tables, rows, "checked")
                loss = tf.add_n([tf.reduce_sum(o * g) for o, g in zip(outs, grads)])
            runs.append([tf.convert_to_tensor(g).numpy() for g in tape.gradient(loss, rows)])
        with tf.GradientTape() as tape:
            want = [t.tf_reference(r, a[1], a[2], a[3], s[1], s[2])
                    for r, (s, a, _) in zip(rows, tables)]
            loss = tf.add_n([tf.reduce_sum(o * g) for o, g in zip(want, grads)])
        want_d = [tf.convert_to_tensor(g).numpy() for g in tape.gradient(loss, rows)]
        for i, (a, b, w) in enumerate(zip(runs[0], runs[1], want_d)):
            np.testing.assert_array_equal(a, b, err_msg=f"t{i}")
            np.testing.assert_allclose(a, w, rtol=1e-5, atol=1e-6, err_msg=f"t{i}")
        print("OK")
    """)
    here = REPO_ROOT
    r = subprocess.run([sys.executable, "-c", code, here], env=subprocess_env(),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "OK" in r.stdout, r.stderr[-3000:]
