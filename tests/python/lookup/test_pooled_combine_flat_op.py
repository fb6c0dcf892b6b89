"""SokPooledCombineFlat / SokPooledCombineFlatGrad called directly: the pooled combine of rows read
in place from one flat buffer (the exchange's returned rows: each table's rows at places given by
row_at, some absent) equals the numpy reference on the rows gathered out of it, and its gradient
is the reference's row gradients at the same places, in eager mode and in a TF1 graph, with and
without checked segments and orders (the GPU reads in place only when checked), and under op
determinism (the GPU gathers first). Bad sizes are refused."""
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf

from sparse_operation_kit.runtime._ops import ops
from tests.python.lookup.test_pooled_combine_op import TABLES as MIXED  # dims 1-16, 3 combiners
from tests.python.lookup.test_pooled_combine_op import make_table, reference
from tests.python.support import REPO_ROOT, TEST_DEVICE, graph_session, subprocess_env

# Per table: dim, combiner, weighted, sorted segment ids, batch, ids per sample (max). Every dim
# a multiple of 4: the GPU reads float4s.
BY_FOUR = [
    (4, "sum", True, True, 9, 4),
    (8, "sqrtn", False, False, 5, 6),
    (16, "mean", True, True, 7, 3),
]
# More tables than one GPU launch takes (29), dims up to 256 (past the backward's shared-memory
# cache of hot rows).
MANY = [((4, 8, 256, 12)[i % 4], ("sum", "mean", "sqrtn")[i % 3], i % 2 == 0, i % 5 != 1,
         3 + i % 7, 4) for i in range(31)]


def flat_case(specs, seed=3):
    """Random tables laid out in one flat buffer: (tables, flat, row_at, sizes). Each table's rows
    are at shuffled places; row 0 of every table is absent (row_at -1), so its reference row is
    zero. The flat buffer ends with no padding (as the exchange returns it)."""
    rng = np.random.default_rng(seed)
    tables = [list(make_table(rng, d, w, s, b, p)) for d, _, w, s, b, p in specs]
    places = [(t, r) for t, tab in enumerate(tables) for r in range(1, len(tab[0]))]
    rng.shuffle(places)
    row_at = [np.full(len(tab[0]), -1, np.int64) for tab in tables]
    chunks, at = [], 0
    for t, r in places:
        row_at[t][r] = at
        chunks.append(tables[t][0][r])
        at += tables[t][0].shape[1]
    for tab in tables:
        tab[0][0] = 0.0
    flat = np.concatenate(chunks).astype(np.float32)
    return tables, flat, np.concatenate(row_at), np.array([len(t[0]) for t in tables], np.int64)


def call(specs, tables, flat, row_at, sizes, variant):
    """The op on `flat` (a tensor) for variant "m0" (no orders), "unchecked" or "checked"."""
    orders = []
    if variant != "m0":
        orders = [tf.constant(t[4] if not s[3] else np.zeros([0], np.int32), tf.int32)
                  for t, s in zip(tables, specs)]
    return ops.sok_pooled_combine_flat(
        flat, tf.constant(row_at), tf.constant(sizes),
        [tf.constant(t[1]) for t in tables], [tf.constant(t[2]) for t in tables],
        [tf.constant(t[3] if t[3] is not None else np.zeros([0], np.float32)) for t in tables],
        orders, tf.constant([s[4] for s in specs], tf.int64),
        dims=[s[0] for s in specs], combiners=[s[1] for s in specs],
        table_names=[f"t{i}" for i in range(len(specs))], segments_checked=variant == "checked")


def want(specs, tables, row_at, sizes, flat_len):
    """Reference outputs, incoming gradients, and the gradient of the flat rows."""
    rng = np.random.default_rng(5)
    grads = [rng.normal(size=(s[4], s[0])).astype(np.float32) for s in specs]
    outs, d_flat, start = [], np.zeros(flat_len), 0
    for t, s, g in zip(tables, specs, grads):
        out, d_rows = reference(t[0], t[1], t[2], t[3], s[1], s[4], g)
        outs.append(out)
        for r in range(len(t[0])):
            if row_at[start + r] >= 0:
                d_flat[row_at[start + r]:row_at[start + r] + s[0]] = d_rows[r]
        start += len(t[0])
    return outs, grads, d_flat


@pytest.mark.parametrize("specs", [MIXED, BY_FOUR, MANY],
                         ids=["mixed_dims", "dims_by_four", "many_tables"])
@pytest.mark.parametrize("variant", ["m0", "unchecked", "checked"])
def test_values_and_gradients_eager(specs, variant):
    tables, flat, row_at, sizes = flat_case(specs)
    outs_want, grads, d_want = want(specs, tables, row_at, sizes, len(flat))
    returned = tf.Variable(flat)
    with tf.GradientTape() as tape:
        out = call(specs, tables, returned, row_at, sizes, variant)
        loss = tf.add_n([tf.reduce_sum(o * g) for o, g in zip(out.embeddings, grads)])
    d_flat = tape.gradient(loss, returned)
    assert out.returned_floats.numpy().tolist() == [len(flat)]
    for i, (o, w) in enumerate(zip(out.embeddings, outs_want)):
        np.testing.assert_allclose(o.numpy(), w, rtol=1e-5, atol=1e-6, err_msg=f"table {i}")
    np.testing.assert_allclose(tf.convert_to_tensor(d_flat).numpy(), d_want, rtol=1e-5,
                               atol=1e-6)


def test_values_and_gradients_tf1_graph():
    tables, flat, row_at, sizes = flat_case(BY_FOUR)
    outs_want, grads, d_want = want(BY_FOUR, tables, row_at, sizes, len(flat))
    with graph_session() as sess:
        # A placeholder, not a constant: Grappler would fold an all-constant op on the host.
        returned = tf.compat.v1.placeholder(tf.float32, [None])
        out = call(BY_FOUR, tables, returned, row_at, sizes, "checked")
        loss = tf.add_n([tf.reduce_sum(o * g) for o, g in zip(out.embeddings, grads)])
        d_flat = tf.gradients(loss, returned)[0]
        grad_op = [op for op in sess.graph.get_operations()
                   if op.type == "SokPooledCombineFlatGrad"]
        assert len(grad_op) == 1 and grad_op[0].get_attr("segments_checked")
        got, got_d = sess.run([out.embeddings, d_flat], {returned: flat})
    for i, (o, w) in enumerate(zip(got, outs_want)):
        np.testing.assert_allclose(o, w, rtol=1e-5, atol=1e-6, err_msg=f"table {i}")
    np.testing.assert_allclose(got_d, d_want, rtol=1e-5, atol=1e-6)


def test_gradient_under_op_determinism():
    """Op determinism (its own process): the gradient gathers and scatters around the ordered
    backward, bit-for-bit repeatable and equal to the reference."""
    code = textwrap.dedent("""
        import sys
        import numpy as np
        import tensorflow as tf
        sys.path.insert(0, sys.argv[1])
        import tests.python.lookup.test_pooled_combine_flat_op as t
        tf.config.experimental.enable_op_determinism()
        tables, flat, row_at, sizes = t.flat_case(t.BY_FOUR)
        outs, grads, d_want = t.want(t.BY_FOUR, tables, row_at, sizes, len(flat))
        returned = tf.Variable(flat)
        runs = []
        for _ in range(2):
            with tf.GradientTape() as tape:
                out = t.call(t.BY_FOUR, tables, returned, row_at, sizes, "checked")
                loss = tf.add_n([tf.reduce_sum(o * g) for o, g in zip(out.embeddings, grads)])
            runs.append(tf.convert_to_tensor(tape.gradient(loss, returned)).numpy())
        np.testing.assert_array_equal(runs[0], runs[1])
        np.testing.assert_allclose(runs[0], d_want, rtol=1e-5, atol=1e-6)
        print("OK")
    """)
    r = subprocess.run([sys.executable, "-c", code, REPO_ROOT], env=subprocess_env(),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "OK" in r.stdout, r.stderr[-3000:]


def test_sizes_that_do_not_add_up_to_row_at_are_refused():
    tables, flat, row_at, sizes = flat_case(MIXED)
    with pytest.raises(tf.errors.InvalidArgumentError, match="sizes add up to"):
        call(MIXED, tables, tf.constant(flat), row_at[:-1], sizes, "checked")


def test_more_returned_floats_than_rows_are_refused():
    tables, flat, row_at, sizes = flat_case(MIXED)
    too_many = np.concatenate([flat, np.zeros(64, np.float32)])
    with pytest.raises(tf.errors.InvalidArgumentError, match="returned floats for"):
        call(MIXED, tables, tf.constant(too_many), row_at, sizes, "checked")


def test_gradient_of_the_wrong_width_names_the_table():
    tables, flat, row_at, sizes = flat_case(BY_FOUR)
    n = len(BY_FOUR)
    with pytest.raises(tf.errors.InvalidArgumentError, match="gradient of table 't1' must be"):
        ops.sok_pooled_combine_flat_grad(
            [tf.zeros([s[4], s[0] + (i == 1)]) for i, s in enumerate(BY_FOUR)],
            tf.constant(row_at), tf.constant(sizes), [tf.constant(t[1]) for t in tables],
            [tf.constant(t[2]) for t in tables], [tf.zeros([0])] * n, [],
            tf.constant([len(flat)], tf.int64), dims=[s[0] for s in BY_FOUR],
            combiners=["sum"] * n, table_names=[f"t{i}" for i in range(n)])


def test_no_rows_and_no_samples():
    """A rank whose batch is empty: no rows came back, no samples to pool."""
    specs = [(4, "sum", False, True, 0, 3), (8, "mean", True, True, 0, 3)]
    empty = [tf.zeros([0], tf.int32), tf.zeros([0], tf.int64), tf.zeros([0], tf.float32)]
    returned = tf.Variable(tf.zeros([0]))
    with tf.GradientTape() as tape:
        out = ops.sok_pooled_combine_flat(
            returned, tf.zeros([0], tf.int64), tf.constant([0, 0], tf.int64), [empty[0]] * 2,
            [empty[1]] * 2, [empty[2]] * 2, [], tf.constant([0, 0], tf.int64), dims=[4, 8],
            combiners=[s[1] for s in specs], table_names=["a", "b"], segments_checked=False)
        loss = tf.add_n([tf.reduce_sum(e) for e in out.embeddings])
    assert [e.shape.as_list() for e in out.embeddings] == [[0, 4], [0, 8]]
    assert tf.convert_to_tensor(tape.gradient(loss, returned)).shape == [0]


@pytest.mark.skipif(TEST_DEVICE == "gpu", reason="on a GPU row_at lies in device memory: the "
                    "op trusts the exchange's plan, which made it there")
def test_a_row_outside_the_returned_floats_names_the_table():
    tables, flat, row_at, sizes = flat_case(MIXED)
    bad = row_at.copy()
    bad[int(sizes[0]) + 2] = len(flat)  # table t1's row 2
    with pytest.raises(tf.errors.InvalidArgumentError, match="table 't1': row 2 at float"):
        call(MIXED, tables, tf.constant(flat), bad, sizes, "checked")
