"""SokPooledCombine / SokPooledCombineGrad called directly: the segment_order input (M = 0 or
M = N) and segments_checked give the same values and gradients as a numpy reference, in eager
mode and in a TF1 graph, and the gradient op gets the forward's orders and attributes."""
import numpy as np
import pytest
import tensorflow as tf
from conftest import graph_session

from sparse_operation_kit._ops import ops

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


def pooled(tables, variant, rows_vars):
    """The op's outputs for variant "m0" (no orders), "unchecked" or "checked" (M = N)."""
    n = len(tables)
    orders = []
    if variant != "m0":
        # Sorted tables give an empty order, like SokUniqueKeys.
        orders = [tf.constant(o if not s else np.zeros([0], np.int32), tf.int32)
                  for (_, _, _, _, o), (_, _, _, s, _, _) in zip(tables, TABLES)]
    return ops.sok_pooled_combine(
        rows_vars,
        [tf.constant(t[1]) for t in tables],
        [tf.constant(t[2]) for t in tables],
        [tf.constant(t[3] if t[3] is not None else np.zeros([0], np.float32)) for t in tables],
        orders,
        tf.constant([b for _, _, _, _, b, _ in TABLES], tf.int64),
        combiners=[c for _, c, _, _, _, _ in TABLES],
        table_names=[f"t{i}" for i in range(n)],
        segments_checked=variant == "checked",
    )


def expected(tables, grads):
    return [
        reference(t[0], t[1], t[2], t[3], c, b, g)
        for t, (_, c, _, _, b, _), g in zip(tables, TABLES, grads)
    ]


def incoming_grads(tables):
    rng = np.random.default_rng(5)
    return [rng.normal(size=(b, d)).astype(np.float32) for d, _, _, _, b, _ in TABLES]


@pytest.mark.parametrize("variant", ["m0", "unchecked", "checked"])
def test_values_and_gradients_eager(tables, variant):
    grads = incoming_grads(tables)
    rows = [tf.Variable(t[0]) for t in tables]
    with tf.GradientTape() as tape:
        outs = pooled(tables, variant, rows)
        loss = tf.add_n([tf.reduce_sum(o * g) for o, g in zip(outs, grads)])
    drows = tape.gradient(loss, rows)
    for i, (o, dr, (want, want_d)) in enumerate(zip(outs, drows, expected(tables, grads))):
        np.testing.assert_allclose(o.numpy(), want, rtol=1e-5, atol=1e-6, err_msg=f"table {i}")
        np.testing.assert_allclose(tf.convert_to_tensor(dr).numpy(), want_d, rtol=1e-5,
                                   atol=1e-6, err_msg=f"gradient of table {i}")


@pytest.mark.parametrize("variant", ["m0", "checked"])
def test_values_and_gradients_tf1_graph(tables, variant):
    grads = incoming_grads(tables)
    with graph_session() as sess:
        rows = [tf.constant(t[0]) for t in tables]
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
        got, got_d = sess.run([outs, drows])
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
