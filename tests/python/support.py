"""Shared helpers of the tests of the Python package (tests/python/<subpackage>/), imported as
`from tests.python.support import ...`: sessions for TF1 graphs, references built from an
Embedding Variable's own initial rows, gradients densified by key, and the device the suite runs
its SOK ops on (SOK_TEST_DEVICE). The pytest fixtures and hooks are in conftest.py."""
import contextlib
import itertools
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import sparse_operation_kit as sok  # noqa: E402

# Subprocesses import the same package as this process (source tree or installed wheel).
SOK_PYTHONPATH = os.path.dirname(os.path.dirname(os.path.abspath(sok.__file__)))


def subprocess_env():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [SOK_PYTHONPATH] + [p for p in [env.get("PYTHONPATH")] if p]
    )
    return env


# The repository root: a subprocess that imports a test module (as tests.python.<subpackage>.<name>)
# puts it on sys.path.
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_names = itertools.count()


def unique_name(prefix="ev"):
    """Eager tables are process-global by name: every test gets fresh names."""
    return f"{prefix}_{next(_names)}"


@contextlib.contextmanager
def graph_session(config=None):
    """A TF1 graph and a Session on it (the test process stays eager outside)."""
    graph = tf.Graph()
    with graph.as_default():
        with tf.compat.v1.Session(graph=graph, config=config) as sess:
            yield sess


def ev_rows(var, keys, sess=None):
    """Current rows of `keys` without inserting them (evaluation read)."""
    keys = np.asarray(keys)
    t = var.sparse_read(tf.constant(keys, var.key_dtype), training=False)
    return sess.run(t) if sess is not None else t.numpy()


def exported(var, sess=None):
    """{key: row} of every row of an Embedding Variable."""
    keys, values = sok.export(var)
    if sess is not None:
        keys, values = sess.run([keys, values])
    else:
        keys, values = keys.numpy(), values.numpy()
    return {int(k): v for k, v in zip(keys, values)}


def sorted_export(ev):
    """An Embedding Variable's snapshot fields as numpy arrays, rows ordered by key."""
    snap = {k: np.asarray(v) for k, v in ev.snapshot().items()}
    order = np.argsort(snap["keys"])
    return {k: (v[order] if np.ndim(v) and len(v) == len(order) else v) for k, v in snap.items()}


def densify_by_key(grad, dim):
    """{key: summed gradient row} of a tf.IndexedSlices (values numpy-converted by the caller)."""
    indices, values = grad
    out = {}
    for k, v in zip(np.asarray(indices).reshape(-1), np.asarray(values).reshape(-1, dim)):
        out[int(k)] = out.get(int(k), 0) + v
    return out


def random_ragged(rng, batch, max_len, vocab, empty_rows=()):
    """Python lists of ids per sample; `empty_rows` get no ids."""
    rows = []
    for b in range(batch):
        n = 0 if b in empty_rows else int(rng.integers(1, max_len + 1))
        rows.append([int(x) for x in rng.integers(0, vocab, n)])
    return rows


def to_sparse(rows, dtype=tf.int64):
    indices, values = [], []
    width = max([len(r) for r in rows] + [1])
    for b, r in enumerate(rows):
        for j, x in enumerate(r):
            indices.append([b, j])
            values.append(x)
    return tf.SparseTensor(tf.constant(np.array(indices, np.int64).reshape(-1, 2)),
                           tf.constant(values, dtype), [len(rows), width])


def to_ragged(rows, dtype=tf.int64):
    return tf.RaggedTensor.from_row_lengths(
        tf.constant([x for r in rows for x in r], dtype),
        tf.constant([len(r) for r in rows], tf.int64),
    )


def sparse_value(rows, dtype=np.int64):
    """tf.compat.v1.SparseTensorValue of id lists, for sparse placeholders."""
    indices = [[b, j] for b, r in enumerate(rows) for j in range(len(r))]
    values = [x for r in rows for x in r]
    width = max([len(r) for r in rows] + [1])
    return tf.compat.v1.SparseTensorValue(
        np.array(indices, np.int64).reshape(-1, 2),
        np.array(values, dtype),
        np.array([len(rows), width], np.int64),
    )


# SOK_TEST_DEVICE=gpu (on a GPU machine): the suite must run its SOK ops on the GPU. Every test
# that runs SOK kernels in this process must run them there, except tests that pin work to the
# CPU themselves (marked `cpu_placement`). Subprocess tests are not counted.
TEST_DEVICE = os.environ.get("SOK_TEST_DEVICE", "cpu").lower()
if TEST_DEVICE not in ("cpu", "gpu"):
    raise ValueError(f"SOK_TEST_DEVICE must be 'cpu' or 'gpu', got {TEST_DEVICE!r}")
