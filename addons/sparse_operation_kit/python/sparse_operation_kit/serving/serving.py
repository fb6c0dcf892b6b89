"""Serving without SOK: a SavedModel whose graph holds stock TensorFlow ops only.

`save_stock_saved_model(fn, export_dir, input_signature)` traces `fn` (a Keras model, a tf.Module
method, any callable) with every SOK table frozen: its rows become a dense variable, its keys a
`tf.lookup.StaticHashTable` (key -> row), and keys not in the table read what SOK's read-only
lookup reads (their initial value, computed by the same counter hash as core/initializer.h, in
stock ops; or `default_value_no_permission` under a counter filter). Pooled lookups become stock
gathers and segment sums. Stock TensorFlow then loads and serves the model with SOK not installed.
"""

import contextlib
import inspect
import threading
from collections.abc import Callable, Sequence

import numpy as np
import tensorflow as tf

from sparse_operation_kit.runtime import compat, context, initializers

_state = threading.local()

# splitmix64 constants (core/common.h mix64): the same bits as the C++/CUDA initialiser.
_GOLDEN, _MUL1, _MUL2 = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
_FNV_PRIME = 0x100000001B3


def _u64(x):
    return tf.constant(x, tf.uint64)


def _mix64(x):
    x = x + _u64(_GOLDEN)
    x = tf.bitwise.bitwise_xor(x, tf.bitwise.right_shift(x, _u64(30))) * _u64(_MUL1)
    x = tf.bitwise.bitwise_xor(x, tf.bitwise.right_shift(x, _u64(27))) * _u64(_MUL2)
    return tf.bitwise.bitwise_xor(x, tf.bitwise.right_shift(x, _u64(31)))


def _uniform01(seed, row, col, draw):
    """[0, 1) from 24 bits of the counter hash of (seed, row, col, draw), all uint64."""
    h = _mix64(
        tf.bitwise.bitwise_xor(
            seed, _mix64(tf.bitwise.bitwise_xor(row, _mix64(col * _u64(_FNV_PRIME) + draw)))
        )
    )
    return tf.cast(tf.bitwise.right_shift(h, _u64(40)), tf.float32) * (1.0 / 16777216.0)


def _standard_normal(seed, row, col, draw):
    u1 = 1.0 - _uniform01(seed, row, col, 2 * draw)
    u2 = _uniform01(seed, row, col, 2 * draw + 1)
    return tf.sqrt(-2.0 * tf.math.log(u1)) * tf.cos(6.28318530717958647692 * u2)


class FrozenTable(tf.Module):
    """One SOK table as stock TensorFlow state: rows, a key -> row index, and the rule for keys
    that are not there. Built eagerly from the table's current contents (one process)."""

    def __init__(self, table):
        super().__init__(name=None)
        self.table_name = table.name[:-2] if table.name.endswith(":0") else table.name
        self.dim = int(table.embedding_dim)
        keys, values, _, freqs, _, _, _ = (t.numpy() for t in table.export())
        self.filter_freq = int(table._filter_freq)
        if (
            self.filter_freq > 0
        ):  # keys not admitted yet read default_value_no_permission, as in SOK
            keep = freqs >= self.filter_freq
            keys, values = keys[keep], values[keep]
        self.key_dtype = table.key_dtype
        self.no_permission = float(table._no_permission)
        self.rows = tf.Variable(
            np.concatenate([values.astype(np.float32), np.zeros([1, self.dim], np.float32)]),
            trainable=False,
            name="rows",
        )  # the last row: a placeholder for misses
        self.index = None  # an empty table: every key is a miss (a StaticHashTable cannot be empty)
        if len(keys):
            self.index = tf.lookup.StaticHashTable(
                tf.lookup.KeyValueTensorInitializer(
                    tf.constant(keys, tf.int64), tf.range(len(keys), dtype=tf.int64)
                ),
                default_value=-1,
            )
        spec = table._init_spec
        self.init_kind, self.init_a, self.init_b = spec.kind, spec.a, spec.b
        self.init_seed = np.uint64(spec.seed & 0xFFFFFFFFFFFFFFFF)
        self.default_value_dim = int(table._default_value_dim)
        self.matrix = None
        if spec.kind == initializers.MATRIX:
            self.matrix = tf.Variable(
                np.asarray(spec.matrix, np.float32), trainable=False, name="default_rows"
            )

    def _initial_rows(self, keys):
        """[n, dim] initial values of `keys` (int64), as core/initializer.h computes them."""
        if self.default_value_dim > 0:
            row_ids = tf.math.floormod(keys, self.default_value_dim)
        else:
            row_ids = keys
        if self.init_kind == initializers.MATRIX:
            return tf.gather(self.matrix, row_ids)
        n = tf.shape(keys)[0]
        if self.init_kind == initializers.CONSTANT:
            return tf.fill([n, self.dim], tf.constant(self.init_a, tf.float32))
        row = tf.bitcast(row_ids, tf.uint64)[:, None]
        col = tf.range(self.dim, dtype=tf.int64)
        col = tf.bitcast(col, tf.uint64)[None, :] + tf.zeros_like(row)
        row = row + tf.zeros_like(col)
        seed = tf.fill(tf.shape(row), _u64(int(self.init_seed)))
        a, b = tf.constant(self.init_a, tf.float32), tf.constant(self.init_b, tf.float32)
        if self.init_kind == initializers.UNIFORM:
            return a + (b - a) * _uniform01(seed, row, col, tf.zeros_like(row))
        if self.init_kind == initializers.NORMAL:
            return a + b * _standard_normal(seed, row, col, tf.zeros_like(row))
        if self.init_kind == initializers.TRUNCATED_NORMAL:
            return a + b * self._truncated_normal(seed, row, col)
        raise ValueError(f"table '{self.table_name}': unknown initializer kind {self.init_kind}")

    @staticmethod
    def _truncated_normal(seed, row, col):
        # Redraw outside 2 stddev, at most 64 draws, then 0 (core/initializer.h).
        def body(draw, z, done):
            cand = _standard_normal(
                seed, row, col, tf.fill(tf.shape(row), tf.cast(draw, tf.uint64))
            )
            ok = tf.logical_and(cand > -2.0, cand < 2.0)
            take = tf.logical_and(ok, tf.logical_not(done))
            return draw + 1, tf.where(take, cand, z), tf.logical_or(done, ok)

        zeros = tf.zeros(tf.shape(row), tf.float32)
        _, z, _ = tf.while_loop(
            lambda d, z, done: tf.logical_and(d < 64, tf.logical_not(tf.reduce_all(done))),
            body,
            (tf.constant(0, tf.int64), zeros, tf.zeros(tf.shape(row), tf.bool)),
        )
        return z

    def lookup(self, keys):
        """Rows of `keys` (any shape) -> [*keys.shape, dim], read-only."""
        keys = tf.convert_to_tensor(keys)
        if keys.dtype != self.key_dtype:
            raise TypeError(
                f"table '{self.table_name}' has key dtype {self.key_dtype.name}, but ids of dtype "
                f"{keys.dtype.name} were given"
            )
        flat = tf.cast(tf.reshape(keys, [-1]), tf.int64)
        pos = (
            self.index.lookup(flat)
            if self.index is not None
            else tf.fill(tf.shape(flat), tf.constant(-1, tf.int64))
        )
        found = pos >= 0
        rows = tf.gather(
            self.rows, tf.where(found, pos, tf.shape(self.rows, out_type=tf.int64)[0] - 1)
        )
        if self.filter_freq > 0:
            missing = tf.fill(tf.shape(rows), tf.constant(self.no_permission, tf.float32))
        else:
            # The counter hash is uint64 math, which TensorFlow's GPU kernels do not all cover
            # (Grappler turns the adds into a uint64 AddN): it runs on the CPU.
            with tf.device("/CPU:0"):
                missing = self._initial_rows(flat)
        rows = tf.where(found[:, None], rows, missing)
        return tf.reshape(rows, tf.concat([tf.shape(keys), [self.dim]], 0))


class _Freezer:
    def __init__(self, root):
        self.root = root
        self.frozen = {}

    def table(self, table):
        key = id(table)
        if key not in self.frozen:
            if not hasattr(table, "export"):  # a static table (tf.Variable): stock gathers already
                self.frozen[key] = _StaticTable(table)
            elif not hasattr(table, "_init_spec"):  # a partitioned table: its parts hold the rows
                raise ValueError(
                    f"save_stock_saved_model: table '{table.name}' is partitioned; freezing "
                    "partitioned Embedding Variables is not supported yet"
                )
            else:
                with tf.init_scope():
                    self.frozen[key] = FrozenTable(table)
            self.root.sok_frozen_tables.append(self.frozen[key])
        return self.frozen[key]


class _StaticTable:
    def __init__(self, variable):
        self.variable = variable

    def lookup(self, keys):
        return tf.gather(self.variable, keys)


def active():
    """The freezer while `save_stock_saved_model` traces, else None."""
    return getattr(_state, "freezer", None)


@contextlib.contextmanager
def _freezing(root, freezer=None):
    if context.num_ranks() > 1:
        raise ValueError(
            "save_stock_saved_model: tables are sharded over ranks; load them into one process "
            "(sok.load) and export there"
        )
    _state.freezer = freezer or _Freezer(root)
    try:
        yield _state.freezer
    finally:
        _state.freezer = None


def pooled_lookup(params, keys, segments, batches, weights, combiners):
    """lookup_sparse in stock ops (the frozen tables): per table, rows of each id, times its weight,
    summed per sample; mean divides by the sum of weights, sqrtn by the root of the sum of squares."""
    freezer = active()
    outs = []
    for p, k, s, b, w, combiner in zip(params, keys, segments, batches, weights, combiners):
        rows = freezer.table(p).lookup(k)
        if w.shape.rank == 1 and w.shape[0] == 0:  # no weights: every id counts once
            w = tf.ones(tf.shape(k), tf.float32)
        total = tf.math.unsorted_segment_sum(rows * w[:, None], s, b)
        if combiner == "mean":
            total = tf.math.divide_no_nan(total, tf.math.unsorted_segment_sum(w, s, b)[:, None])
        elif combiner == "sqrtn":
            total = tf.math.divide_no_nan(
                total, tf.sqrt(tf.math.unsorted_segment_sum(w * w, s, b))[:, None]
            )
        outs.append(total)
    return outs


def save_stock_saved_model(
    fn: Callable,
    export_dir: str,
    input_signature: Sequence[tf.TensorSpec],
    signature_name: str = "serving_default",
    output_names: Sequence[str] | None = None,
):
    """Writes a SavedModel at `export_dir` serving `fn(*inputs)` with stock TensorFlow ops only.

    `fn` runs read-only (nothing is inserted): call SOK lookups in it with training=False, or pass a
    Keras model (it is called with training=False). Tables are frozen with their current rows.
    Returns the list of frozen table names. Raises ValueError if a SOK op would remain in the graph.
    """
    root = tf.Module()
    root.sok_frozen_tables = []
    call = compat.python_function_of(
        fn
    )  # a tf.function traced before (with SOK ops) is traced afresh
    if hasattr(fn, "layers") and hasattr(
        fn, "call"
    ):  # a Keras model: inference mode, one input or a list

        def call(*args):
            return fn(args[0] if len(args) == 1 else list(args), training=False)

    with _freezing(root) as freezer:
        serve = tf.function(call, input_signature=list(input_signature))
        concrete = serve.get_concrete_function()
        # The serving signature (plain tensors in) wraps it; traced here too, on the frozen tables.
        signature = _flat_signature(
            serve,
            list(input_signature),
            _arg_names(fn, len(input_signature)),
            concrete.structured_outputs,
            output_names,
        )
    sok_ops = sorted(
        {
            op.type
            for g in (concrete.graph, signature.graph)
            for op in g.get_operations()
            if op.type.startswith("Sok")
        }
    )
    if sok_ops:
        raise ValueError(
            f"save_stock_saved_model: the traced function still runs SOK ops ({', '.join(sok_ops)}); "
            "only lookups (lookup_sparse, sparse_read, tf.nn.embedding_lookup) can be frozen"
        )
    root.serve = serve  # Python callers pass the composite inputs (ragged, sparse) as they are
    root.captured_variables = list(concrete.graph.variables)  # the model's dense weights, tracked
    with _freezing(root, freezer):  # saving traces the functions again
        tf.saved_model.save(root, export_dir, signatures={signature_name: signature})
    return [t.table_name for t in root.sok_frozen_tables if isinstance(t, FrozenTable)]


def _arg_names(fn, n):
    """Names for the signature's inputs: the Python parameters of `fn` where they can be read."""
    try:
        params = inspect.signature(getattr(fn, "python_function", fn)).parameters.values()
    except (TypeError, ValueError):
        return [f"args_{i}" for i in range(n)]
    names = [
        p.name
        for p in params
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.name != "self"
    ]
    return names if len(names) == n else [f"args_{i}" for i in range(n)]


def _flat_signature(serve, input_signature, arg_names, outputs, output_names):
    """A signature of plain tensors (what serving systems feed): a ragged input `x` arrives as
    x_values and x_row_splits, a sparse one as x_indices, x_values and x_dense_shape; outputs are
    a dict (named by `output_names`, or output_0..)."""
    specs, builders = [], []
    for i, spec in enumerate(input_signature):
        name = getattr(spec, "name", None) or arg_names[i]
        if isinstance(spec, tf.RaggedTensorSpec):
            if spec.ragged_rank != 1:
                raise ValueError(
                    f"save_stock_saved_model: input '{name}' must be ragged_rank 1 for serving"
                )
            specs += [
                tf.TensorSpec([None], spec.dtype, name=f"{name}_values"),
                tf.TensorSpec([None], spec.row_splits_dtype, name=f"{name}_row_splits"),
            ]
            builders.append((2, lambda v, s: tf.RaggedTensor.from_row_splits(v, s)))
        elif isinstance(spec, tf.SparseTensorSpec):
            specs += [
                tf.TensorSpec([None, spec.shape.rank], tf.int64, name=f"{name}_indices"),
                tf.TensorSpec([None], spec.dtype, name=f"{name}_values"),
                tf.TensorSpec([spec.shape.rank], tf.int64, name=f"{name}_dense_shape"),
            ]
            builders.append((3, lambda i, v, d: tf.SparseTensor(i, v, d)))
        else:
            specs.append(tf.TensorSpec(spec.shape, spec.dtype, name=name))
            builders.append((1, lambda t: t))
    flat_out = tf.nest.flatten(outputs)
    if output_names is not None:
        names = list(output_names)
    elif isinstance(outputs, dict):
        names = None
    else:
        names = (
            ["output_0"] if len(flat_out) == 1 else [f"output_{i}" for i in range(len(flat_out))]
        )
    if names is not None and len(names) != len(flat_out):
        raise ValueError(
            f"save_stock_saved_model: {len(flat_out)} outputs but {len(names)} output_names"
        )

    def flat_serve(*flat):
        args, pos = [], 0
        for count, build in builders:
            args.append(build(*flat[pos : pos + count]))
            pos += count
        out = serve(*args)
        return out if names is None else dict(zip(names, tf.nest.flatten(out)))

    return tf.function(flat_serve, input_signature=specs).get_concrete_function()
