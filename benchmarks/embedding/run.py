"""Embedding-layer training-step benchmark: SOK vs. stock TensorFlow, on the CPU or the GPU, in
TF1 graph mode (Session) and TF2 tf.function mode, plus the framework-free CUDA harness.

One step = forward (pooled "sum" lookup of every field), backward and an Adagrad update, for
  sok     : one sok.EmbeddingVariable per field, ONE sok.lookup_sparse call over all fields,
            sok.OptimizerWrapper(tf.compat.v1.train.AdagradOptimizer);
  tf      : one tf.Variable [vocab, dim] per field, tf.nn.embedding_lookup_sparse,
            tf.compat.v1.train.AdagradOptimizer;
  hash    : TF's own dynamic path: a tf.lookup.experimental.MutableHashTable (or DenseHashTable)
            per field maps ids -> row indices of a tf.Variable (new ids get fresh rows inside the
            step), then tf.nn.embedding_lookup_sparse on the rows, TF Adagrad on the variable;
  harness : (--harness BINARY, GPU only) the same step on the same ids in the framework-free CUDA
            core (benchmarks/gpu/bench_fields.cu): per field unique_keys -> find_or_insert ->
            pooled_forward -> pooled_backward -> Adagrad apply_gradients, CUDA events.

All read the same ids, kept on the device of the run (non-trainable variables holding a few
pre-built batches; a scalar picks the batch). --mode graph: each implementation in its own graph
and tf.compat.v1.Session, timed around sess.run(train_op); --mode function: each implementation's
step is a tf.function (eager variables, GradientTape, the same optimizers), timed around the call
plus .numpy() of the returned loss. Prints, per distribution of ids and mode, the median wall time
per step of each implementation, the ratios tf/sok, hash/sok and sok/harness, the median CPU time
of all threads per step (a cross-check that suffers less from other processes' load), where each
implementation ran, and under the table the details: devices of the tables, ops per device in the
partitioned step graph, SOK kernel runs per device during the timed steps.
--profile K traces steps instead (graph mode: RunOptions.FULL_TRACE; function mode: TensorFlow's
profiler, with when the function started and the GPU first and last worked); --check N compares
the losses of N steps of all implementations from identical initial values instead of timing;
--dump-ids DIR writes the ids.

    PYTHONPATH=addons/sparse_operation_kit/python .venv/bin/python benchmarks/embedding/run.py
    python benchmarks/embedding/run.py --config criteo26 --mode both \\
        --harness benchmarks/gpu/build/fields/bench_fields          # on a GPU machine

Multi-rank: the implementations take the per-rank inputs and the runners only time the step; a
later `--horovod` mode plugs in by sharding `make_batches` per rank and wrapping the optimizers.
"""
import argparse
import collections
import contextlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
import step_trace  # noqa: E402
import xplane_trace  # noqa: E402

IMPLS = ("sok", "tf", "hash")
# Shapes of the benchmark; explicit flags override them.
CONFIGS = {
    "fields100": dict(
        fields=100, ids_per_field=10, min_ids_per_field=10, vocab=8192, dim=16, batch=4096
    ),
    # Criteo-like: 26 categorical fields, 1..8 ids per sample and field (lengths drawn per sample).
    "criteo26": dict(
        fields=26, ids_per_field=8, min_ids_per_field=1, vocab=200000, dim=16, batch=8192
    ),
}
INIT_MIN, INIT_MAX = -0.05, 0.05
INITIAL_ACCUMULATOR = 0.1  # tf.compat.v1.train.AdagradOptimizer's default (epsilon 0)
SOK_DEFAULT_VALUE_DIM = 4096  # sok.get_embedding_variable's default InitializerOption


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--config",
        choices=sorted(CONFIGS),
        default="fields100",
        help="shape preset (fields100: 100 fields x 10 ids, vocab 8192, batch 4096; criteo26: "
        "26 fields x 1..8 ids, vocab 200000, batch 8192; both dim 16); flags below override it",
    )
    p.add_argument("--fields", type=int)
    p.add_argument(
        "--ids-per-field", type=int, help="ids per sample and field (the most, if lengths vary)"
    )
    p.add_argument(
        "--min-ids-per-field",
        type=int,
        help="fewest ids per sample and field; below --ids-per-field, each sample's length is "
        "drawn uniformly from [min, max]",
    )
    p.add_argument("--vocab", type=int, help="distinct ids per field")
    p.add_argument("--dim", type=int)
    p.add_argument("--batch", type=int)
    p.add_argument("--dists", default="uniform,powerlaw", help="comma list of uniform, powerlaw")
    p.add_argument("--zipf", type=float, default=1.1, help="power-law exponent: p(rank k) ~ 1/k^a")
    p.add_argument("--impls", default=",".join(IMPLS), help="comma list of " + ", ".join(IMPLS))
    p.add_argument("--hash-table", choices=("mutable", "dense"), default="mutable")
    p.add_argument("--num-batches", type=int, default=4, help="pre-built batches cycled through")
    p.add_argument("--warmup", type=int, default=5, help="steps before timing (per implementation)")
    p.add_argument("--steps", type=int, default=2, help="timed steps per implementation and round")
    p.add_argument("--rounds", type=int, default=10,
                   help="rounds; each times every implementation in turn, so load from other "
                        "processes hits all alike (median over all timed steps)")
    p.add_argument(
        "--inputs",
        choices=("batched", "per-field", "resident"),
        default="batched",
        help="how a step gets its ids (same for every implementation): batched: every field of a "
        "batch from one variable, split apart in one op (as from an input pipeline); per-field: "
        "a variable and some eight slicing ops per field; resident: every field of every batch in "
        "its own variables and a step graph per batch (reads only: the step is the embedding "
        "work and the loss)",
    )
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--device",
        choices=("auto", "cpu", "gpu"),
        default="auto",
        help="auto: the GPU when TensorFlow sees one, else the CPU; cpu hides the GPUs",
    )
    p.add_argument(
        "--mode",
        choices=("graph", "function", "both"),
        default="graph",
        help="graph: TF1 tf.compat.v1.Session; function: TF2 tf.function steps",
    )
    p.add_argument(
        "--harness",
        metavar="BINARY",
        help="also time the framework-free CUDA harness (benchmarks/gpu/build_harness.sh builds "
        "it) on the same ids: dumps them to a temporary folder and runs BINARY on it",
    )
    p.add_argument("--harness-warmup", type=int, default=20)
    p.add_argument("--harness-steps", type=int, default=100)
    p.add_argument(
        "--dump-ids",
        metavar="DIR",
        help="only write the ids (per distribution, batch and field: int64 ids and row_splits, "
        "plus header.txt) for the harness, then exit",
    )
    p.add_argument(
        "--check",
        type=int,
        default=0,
        metavar="N",
        help="instead of timing, run N steps of every implementation from the same initial "
        "values (SOK's) and compare their losses",
    )
    p.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="K",
        help="instead of timing, trace steps of each implementation and print the K op "
        "types with the most (summed) op time",
    )
    p.add_argument("--trace-out", metavar="FILE",
                   help="with --profile: append every traced step's records (JSON lines) to FILE")
    p.add_argument("--horovod", action="store_true", help="(reserved) one rank per process")
    args = p.parse_args(argv)
    preset = CONFIGS[args.config]
    for key, value in preset.items():
        if getattr(args, key) is None:
            # The fewest ids follow an explicit --ids-per-field when only that is given.
            if key == "min_ids_per_field" and args.ids_per_field != preset["ids_per_field"]:
                value = args.ids_per_field
            setattr(args, key, value)
    if not 1 <= args.min_ids_per_field <= args.ids_per_field:
        p.error("need 1 <= --min-ids-per-field <= --ids-per-field")
    return args


def ids_label(args):
    if args.min_ids_per_field == args.ids_per_field:
        return str(args.ids_per_field)
    return f"{args.min_ids_per_field}..{args.ids_per_field}"


# ---------------------------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------------------------
def make_batches(args, dist, rank=0, world_size=1):
    """batches[b][f] = (ids, row_splits) of batch b and field f: int64 ids of the samples one after
    another, and int64 row_splits [batch + 1] (sample s has ids[row_splits[s]:row_splits[s+1]]).
    Each sample has ids_per_field ids, or, when min_ids_per_field is lower, a length drawn
    uniformly from [min, max] per sample. Power-law ids are ranked by a random permutation per
    field so hot ids are spread over the id space. A multi-rank run would draw a different stream
    per rank. (Fixed lengths draw exactly the ids of earlier versions of this script.)"""
    rng = np.random.default_rng(args.seed + 7919 * rank)
    perms = [rng.permutation(args.vocab) for _ in range(args.fields)]
    if dist == "powerlaw":
        p = 1.0 / np.arange(1, args.vocab + 1, dtype=np.float64) ** args.zipf
        cdf = np.cumsum(p / p.sum())
    elif dist != "uniform":
        raise ValueError(f"unknown distribution '{dist}' (uniform, powerlaw)")
    fixed = args.min_ids_per_field == args.ids_per_field
    out = []
    for _ in range(args.num_batches):
        fields = []
        for f in range(args.fields):
            if fixed:
                lengths = np.full(args.batch, args.ids_per_field, np.int64)
            else:
                lengths = rng.integers(
                    args.min_ids_per_field, args.ids_per_field + 1, size=args.batch
                )
            n = int(lengths.sum())
            if dist == "uniform":
                ids = rng.integers(0, args.vocab, size=n)
            else:
                ids = perms[f][np.minimum(np.searchsorted(cdf, rng.random(n)), args.vocab - 1)]
            splits = np.zeros(args.batch + 1, np.int64)
            np.cumsum(lengths, out=splits[1:])
            fields.append((ids.astype(np.int64), splits))
        out.append(fields)
    return out


INPUT_SCOPE = "inputs"  # the batch selection, left out of the placement counts


def _pad8(n):
    return max(8, (n + 7) // 8 * 8)  # rows of 8 int64 keep every batch's slice 64-byte aligned


def _sparse_indices(splits):
    """[n, 2] SparseTensor indices (sample, position in the sample) of ids with row_splits."""
    lengths = np.diff(splits)
    rows = np.repeat(np.arange(len(lengths), dtype=np.int64), lengths)
    return np.stack([rows, np.arange(splits[-1], dtype=np.int64) - splits[:-1][rows]], 1)


def _dense_shape(args):
    """The SparseTensors' dense shape, in host memory as a fed or tf.shape-made one is: a shape in
    GPU memory costs every implementation copies to the host (output sizes are host values)."""
    with tf.device("/CPU:0"):
        return tf.constant([args.batch, args.ids_per_field], tf.int64)


class IdInputs:
    """The ids of every pre-built batch in non-trainable variables on the current device (graph or
    eager); sparse(which) -> per field a SparseTensor [batch, ids_per_field] of batch `which`
    (an int32 scalar). Selecting a batch slices dim 0 of a variable, which shares its buffer."""

    def __init__(self, args, batches):
        nb = len(batches)
        self.args = args
        self.fixed = args.min_ids_per_field == args.ids_per_field
        self.shape = _dense_shape(args)
        self.values, self.indices, self.nnz = [], [], []
        if self.fixed:
            rows = np.repeat(np.arange(args.batch, dtype=np.int64), args.ids_per_field)
            cols = np.tile(np.arange(args.ids_per_field, dtype=np.int64), args.batch)
            self.shared_indices = tf.constant(np.stack([rows, cols], 1))
            for f in range(args.fields):
                data = np.stack([batches[b][f][0] for b in range(nb)])  # [nb, n]
                self.values.append(tf.Variable(data, trainable=False, name=f"ids_{f}"))
            return
        for f in range(args.fields):
            ns = [len(batches[b][f][0]) for b in range(nb)]
            width = _pad8(max(ns))
            vals = np.zeros([nb, width], np.int64)
            idx = np.zeros([nb, width, 2], np.int64)
            for b in range(nb):
                ids, splits = batches[b][f]
                vals[b, : ns[b]] = ids
                idx[b, : ns[b]] = _sparse_indices(splits)
            self.values.append(tf.Variable(vals, trainable=False, name=f"ids_{f}"))
            self.indices.append(tf.Variable(idx, trainable=False, name=f"indices_{f}"))
            with tf.device("/CPU:0"):  # slice sizes are host-side inputs of Slice
                self.nnz.append(tf.constant(ns, tf.int64, name=f"nnz_{f}"))

    def sparse(self, which):
        out = []
        with tf.name_scope(INPUT_SCOPE):
            for f in range(self.args.fields):
                if self.fixed:
                    out.append(
                        tf.SparseTensor(self.shared_indices, self.values[f][which], self.shape)
                    )
                    continue
                with tf.device("/CPU:0"):  # Slice takes its begin and size in host memory
                    n = tf.gather(self.nnz[f], which)
                    size_v, begin_v = tf.reshape(n, [1]), tf.constant([0], tf.int64)
                    size_i, begin_i = (
                        tf.stack([n, tf.constant(2, tf.int64)]),
                        tf.constant([0, 0], tf.int64),
                    )
                values = tf.slice(self.values[f][which], begin_v, size_v)
                indices = tf.slice(self.indices[f][which], begin_i, size_i)
                out.append(tf.SparseTensor(indices, values, self.shape))
        return out


class BatchedIdInputs:
    """Every field of every pre-built batch in one pair of non-trainable variables: a step picks
    its batch with one slice per variable and splits the fields apart with one op each, as an
    input pipeline's get_next hands a model every field at once. (IdInputs, --inputs per-field,
    spends some eight ops per field on it.) sparse(which) -> per field a SparseTensor."""

    def __init__(self, args, batches):
        nb, fields = len(batches), args.fields
        self.fields = fields
        self.shape = _dense_shape(args)
        ns = np.array([[len(batches[b][f][0]) for f in range(fields)] for b in range(nb)])
        width = _pad8(int(ns.sum(1).max()))
        vals = np.zeros([nb, width], np.int64)
        idx = np.zeros([nb, width, 2], np.int64)
        for b in range(nb):
            at = 0
            for f in range(fields):
                ids, splits = batches[b][f]
                end = at + len(ids)
                vals[b, at:end] = ids
                idx[b, at:end] = _sparse_indices(splits)
                at = end
        self.values = tf.Variable(vals, trainable=False, name="ids")
        self.indices = tf.Variable(idx, trainable=False, name="indices")
        # Per batch: each field's id count, then the padding (SplitV takes its sizes on the host).
        sizes = np.concatenate([ns, width - ns.sum(1, keepdims=True)], 1)
        with tf.device("/CPU:0"):
            self.sizes = tf.constant(sizes, tf.int64, name="field_sizes")

    def sparse(self, which):
        with tf.name_scope(INPUT_SCOPE):
            with tf.device("/CPU:0"):
                sizes = tf.gather(self.sizes, which)
            values = self._split(self.values[which], sizes)
            indices = self._split(self.indices[which], sizes)
        return [tf.SparseTensor(indices[f], values[f], self.shape) for f in range(self.fields)]

    def _split(self, x, sizes):
        # TensorFlow has no GPU SplitV for int64: the split ran on the CPU, with a copy to the
        # host and one back per field (s4run5's timeline). The same bits as float64 split on the
        # GPU (a split only moves bytes).
        parts = tf.split(tf.bitcast(x, tf.float64), sizes, num=self.fields + 1)
        return [tf.bitcast(p, tf.int64) for p in parts[: self.fields]]


class ResidentIdInputs:
    """Every field of every pre-built batch in its own non-trainable variables (values, indices):
    sparse(b) takes the batch as a Python int, so each batch gets its own step graph (TF1) or
    trace (tf.function), which reads its ids with one ReadVariableOp per tensor and slices or
    splits nothing (BatchedIdInputs spends some 60 ops per step on that, as much host time as
    SOK's whole embedding step on a GPU)."""

    per_batch = True

    def __init__(self, args, batches):
        self.shape = _dense_shape(args)
        self.values, self.indices = [], []
        for b, fields in enumerate(batches):
            self.values.append([tf.Variable(ids, trainable=False, name=f"ids_{b}_{f}")
                                for f, (ids, _) in enumerate(fields)])
            self.indices.append([tf.Variable(_sparse_indices(splits), trainable=False,
                                             name=f"indices_{b}_{f}")
                                 for f, (_, splits) in enumerate(fields)])

    def sparse(self, which):
        with tf.name_scope(INPUT_SCOPE):
            return [tf.SparseTensor(i, v, self.shape)
                    for i, v in zip(self.indices[which], self.values[which])]


def id_inputs(args, batches):
    kinds = {"batched": BatchedIdInputs, "per-field": IdInputs, "resident": ResidentIdInputs}
    return kinds[args.inputs](args, batches)


def loss_of(embs):
    # A cheap stand-in for the dense part (which takes the embeddings side by side, as DLRM's
    # interaction or an MLP does): every embedding gets a gradient.
    return tf.reduce_sum(tf.square(tf.concat(embs, 1))) * 1e-3


def dump_ids(args, out_dir, batches_by_dist):
    """Writes what benchmarks/gpu/bench_fields reads: header.txt and, per distribution d, batch b
    and field f, d_b<b>_f<f>_ids.bin (int64 ids) and d_b<b>_f<f>_splits.bin (int64 row_splits)."""
    os.makedirs(out_dir, exist_ok=True)
    for dist, batches in batches_by_dist.items():
        for b, fields in enumerate(batches):
            for f, (ids, splits) in enumerate(fields):
                stem = os.path.join(out_dir, f"{dist}_b{b}_f{f}")
                ids.astype("<i8").tofile(stem + "_ids.bin")
                splits.astype("<i8").tofile(stem + "_splits.bin")
    header = {
        "format": "sok_ids_v1",
        "config": args.config,
        "fields": args.fields,
        "batch": args.batch,
        "dim": args.dim,
        "vocab": args.vocab,
        "min_ids_per_field": args.min_ids_per_field,
        "ids_per_field": args.ids_per_field,
        "optimizer": "adagrad",
        "lr": repr(args.lr),
        "initial_accumulator": repr(INITIAL_ACCUMULATOR),
        "init_min": repr(INIT_MIN),
        "init_max": repr(INIT_MAX),
        "default_value_dim": SOK_DEFAULT_VALUE_DIM,
        "seed": args.seed,
        "num_batches": args.num_batches,
        "zipf": repr(args.zipf),
        "dists": " ".join(batches_by_dist),
    }
    with open(os.path.join(out_dir, "header.txt"), "w") as fh:
        fh.write(
            "# written by benchmarks/embedding/run.py --dump-ids; read by "
            "benchmarks/gpu/bench_fields\n"
        )
        for k, v in header.items():
            fh.write(f"{k} {v}\n")


# ---------------------------------------------------------------------------------------------
# The three implementations: tables + optimizer, and the forward pass (graph or eager/tf.function)
# ---------------------------------------------------------------------------------------------
def _initializer(args):
    return tf.compat.v1.random_uniform_initializer(INIT_MIN, INIT_MAX, seed=args.seed)


def _dense_table(args, name):
    if tf.executing_eagerly():
        return tf.Variable(_initializer(args)([args.vocab, args.dim], tf.float32), name=name)
    return tf.compat.v1.get_variable(name, [args.vocab, args.dim], initializer=_initializer(args),
                                     use_resource=True)


class SokImpl:
    def __init__(self, args):
        import sparse_operation_kit as sok
        self.sok = sok
        sok.init(use_horovod=bool(args.horovod))
        self.n = args.fields
        self.tables = [sok.get_embedding_variable(f"sok_emb_{f}", args.dim, key_dtype=tf.int64,
                                                  initializer=_initializer(args))
                       for f in range(args.fields)]
        self.hash_tables = []
        self.opt = sok.OptimizerWrapper(tf.compat.v1.train.AdagradOptimizer(args.lr))

    def embed(self, sp):
        return self.sok.lookup_sparse(self.tables, sp, combiners=["sum"] * self.n)

    def read_rows(self, f, keys):
        return self.tables[f].sparse_read(keys, training=False)


class TfImpl:
    def __init__(self, args):
        self.tables = [_dense_table(args, f"tf_emb_{f}") for f in range(args.fields)]
        self.hash_tables = []
        self.opt = tf.compat.v1.train.AdagradOptimizer(args.lr)

    def embed(self, sp):
        return [
            tf.nn.embedding_lookup_sparse(t, s, None, combiner="sum")
            for t, s in zip(self.tables, sp)
        ]

    def read_rows(self, f, keys):
        return tf.gather(self.tables[f], keys)


def _hash_rows(table, counter, ids):
    """Row index of every id: looks the distinct ids up, inserts the new ones with fresh rows."""
    uniq, inverse = tf.unique(ids, out_idx=tf.int64)
    found = table.lookup(uniq)
    found.set_shape([None])  # static only (inside tf.function the lookup's rank is unknown)
    is_new = tf.less(found, 0)
    new_keys = tf.boolean_mask(uniq, is_new)
    num_new = tf.shape(new_keys, out_type=tf.int64)[0]
    start = counter.assign_add(num_new, read_value=True) - num_new
    new_rows = start + tf.range(num_new, dtype=tf.int64)
    insert = table.insert(new_keys, new_rows)
    with tf.control_dependencies([insert]):
        # Rows of the new keys come from this step's insertion; the others from the first probe.
        scatter_pos = tf.boolean_mask(tf.range(tf.size(uniq, out_type=tf.int64)), is_new)
        rows = tf.tensor_scatter_nd_update(found, scatter_pos[:, None], new_rows)
    return tf.gather(rows, inverse)


class HashImpl:
    def __init__(self, args):
        self.tables, self.hash_tables, self.counters = [], [], []
        for f in range(args.fields):
            if args.hash_table == "dense":
                table = tf.lookup.experimental.DenseHashTable(
                    tf.int64,
                    tf.int64,
                    default_value=-1,
                    empty_key=-(2**62),
                    deleted_key=-(2**62) - 1,
                    initial_num_buckets=2 * args.vocab,
                    name=f"hash_{f}",
                )
            else:
                table = tf.lookup.experimental.MutableHashTable(
                    tf.int64, tf.int64, default_value=-1, name=f"hash_{f}"
                )
            self.counters.append(
                tf.Variable(0, dtype=tf.int64, trainable=False, name=f"next_row_{f}")
            )
            self.tables.append(_dense_table(args, f"hash_emb_{f}"))
            self.hash_tables.append(table)
        self.opt = tf.compat.v1.train.AdagradOptimizer(args.lr)

    def embed(self, sp):
        embs = []
        for table, counter, var, s in zip(self.hash_tables, self.counters, self.tables, sp):
            rows = _hash_rows(table, counter, s.values)
            embs.append(
                tf.nn.embedding_lookup_sparse(
                    var, tf.SparseTensor(s.indices, rows, s.dense_shape), None, combiner="sum"
                )
            )
        return embs

    def read_rows(self, f, keys):  # keys that have rows
        return tf.gather(self.tables[f], self.hash_tables[f].lookup(keys))


BUILDERS = {"sok": SokImpl, "tf": TfImpl, "hash": HashImpl}


# ---------------------------------------------------------------------------------------------
# Where things ran
# ---------------------------------------------------------------------------------------------
# Nodes that move or name data rather than compute (left out of the per-device op counts).
BOOKKEEPING_OPS = {
    "_Send",
    "_Recv",
    "_HostSend",
    "_HostRecv",
    "_Arg",
    "_Retval",
    "_DeviceArg",
    "_DeviceRetval",
    "NoOp",
    "Const",
    "HostConst",
    "Placeholder",
    "Identity",
    "VarHandleOp",
}
TABLE_RESOURCE_OPS = {
    "VarHandleOp": "variables",
    "SokEmbeddingVariableHandle": "embedding variables",
    "MutableHashTableV2": "hash tables",
    "MutableDenseHashTable": "hash tables",
}
TABLE_NAME = re.compile(r"(^|/)(sok_emb|tf_emb|hash_emb|hash)_\d+$")


def short_device(name):
    m = re.search(r"device:([A-Za-z_]+:\d+)", name or "")
    return m.group(1) if m else (name or "?")


class Placement:
    """Ops per device of one step's partitioned graph, devices of the tables, SOK kernel runs."""

    def __init__(self):
        self.ops = collections.Counter()
        self.cpu_op_types = collections.Counter()
        self.tables = collections.defaultdict(set)
        self.sok_kernels = None  # {"CPU": n, "GPU": m} during the timed steps (sok only)

    def add_nodes(self, nodes, tables_from_graph=True):
        for node in nodes:
            if node.name.startswith(INPUT_SCOPE + "/"):
                continue  # selecting the batch: the same for every implementation
            dev = short_device(node.device)
            kind = TABLE_RESOURCE_OPS.get(node.op)
            if tables_from_graph and kind and TABLE_NAME.search(node.name):
                self.tables[kind].add(dev)
            if node.op in BOOKKEEPING_OPS:
                continue
            self.ops[dev] += 1
            if dev.startswith("CPU"):
                self.cpu_op_types[node.op] += 1

    def add_kernels(self, before, after):
        delta = {d: after[d] - before[d] for d in ("CPU", "GPU")}
        if self.sok_kernels is None:
            self.sok_kernels = {"CPU": 0, "GPU": 0}
        for d in delta:
            self.sok_kernels[d] += delta[d]

    def short(self):
        """What ran where, in a word: GPU, CPU, or GPU+CPU (SOK: where its kernels ran)."""
        if self.sok_kernels is not None:
            kinds = [d for d in ("GPU", "CPU") if self.sok_kernels[d] > 0]
        else:
            kinds = [
                d for d in ("GPU", "CPU") if any(k.startswith(d) and v for k, v in self.ops.items())
            ]
        return "+".join(kinds) or "?"

    def describe(self):
        parts = []
        if self.tables:
            parts.append("tables: " + ", ".join(f"{k} on {'/'.join(sorted(v))}"
                                                for k, v in sorted(self.tables.items())))
        ops = ", ".join(f"{d} {n}" for d, n in sorted(self.ops.items()))
        text = f"step ops per device: {ops or '?'}"
        gpu_ops = sum(v for k, v in self.ops.items() if k.startswith("GPU"))
        if gpu_ops and self.cpu_op_types:
            text += " (on the CPU: " + ", ".join(
                f"{t} x{n}" for t, n in self.cpu_op_types.most_common(8)
            )
            text += ", ..." if len(self.cpu_op_types) > 8 else ""
            text += ")"
        parts.append(text)
        if self.sok_kernels is not None:
            k = self.sok_kernels
            parts.append(f"SOK kernels run in the timed steps: GPU {k['GPU']}, CPU {k['CPU']}")
        return "; ".join(parts)


# ---------------------------------------------------------------------------------------------
# Runners: one implementation, its state, one step; timing is shared
# ---------------------------------------------------------------------------------------------
def device_scope(device):
    return tf.device(device) if device else contextlib.nullcontext()


class _Timed:
    device = None  # entered around the steps (eager: where the tf.function runs)

    def run(self, steps, record):
        before = self.kernel_counts() if record and self.impl == "sok" else None
        with device_scope(self.device):
            for _ in range(steps):
                c0, t0 = time.process_time(), time.perf_counter()
                self.one_step()
                dt, dc = time.perf_counter() - t0, time.process_time() - c0
                self.step += 1
                if record:
                    self.times.append(dt)
                    self.cpu_times.append(dc)  # CPU time of all threads of this process
        if before is not None:
            self.placement.add_kernels(before, self.kernel_counts())


def print_profile(impl, wall, recs, top, landmarks=""):
    """One traced step's summary: per op type, the time its kernels held the executor (host:
    compute or enqueue) and the time of its GPU kernels, the GPU's busy time and the launches."""
    busy, span = step_trace.gpu_busy_ms(recs)
    by_op = step_trace.totals(recs, key=lambda r: r[2])
    host_ms = sum(t[0] for t in by_op.values())
    print(f"[{impl}] traced step {wall:.2f} ms wall; GPU: "
          f"{sum(t[3] for t in by_op.values())} kernels and copies, busy {busy:.2f} ms of a "
          f"{span:.2f} ms span; host op time {host_ms:.2f} ms over "
          f"{sum(t[1] for t in by_op.values())} ops (summed over executor threads){landmarks}")
    print(f"    {'op type':<36} {'host ms':>8} {'ops':>5} {'GPU ms':>8} {'kernels':>8}")
    for op, t in sorted(by_op.items(), key=lambda kv: -max(kv[1][0], kv[1][2]))[:top]:
        print(f"    {op[:36]:<36} {t[0]:8.3f} {t[1]:5d} {t[2]:8.3f} {t[3]:8d}")


def write_trace(args, impl, wall, recs):
    if args.trace_out:  # every record, for a timeline read elsewhere
        with open(args.trace_out, "a") as fh:
            fh.write(json.dumps({"impl": impl, "wall_ms": wall, "records": recs}) + "\n")


class GraphRunner(_Timed):
    """One implementation in its own graph and session (TF1)."""

    def __init__(self, impl, args, batches, device, init_values=None, for_check=False):
        self.impl, self.args, self.nb = impl, args, len(batches)
        self.placement = Placement()
        self.graph = tf.Graph()
        with self.graph.as_default(), device_scope(device):
            tf.compat.v1.set_random_seed(args.seed)
            inputs = id_inputs(args, batches)
            self.model = BUILDERS[impl](args)
            if getattr(inputs, "per_batch", False):  # a step graph per batch, nothing fed
                self.which = None
                self.losses = [loss_of(self.model.embed(inputs.sparse(b))) for b in range(self.nb)]
            else:
                with tf.device("/CPU:0"):
                    self.which = tf.compat.v1.placeholder(tf.int32, [], name="batch_index")
                self.losses = [loss_of(self.model.embed(inputs.sparse(self.which)))]
            self.train_ops = [self.model.opt.minimize(loss, var_list=self.model.tables)
                              for loss in self.losses]
            init = [tf.compat.v1.global_variables_initializer()]
            init += [
                op for op in self.graph.get_collection(tf.compat.v1.GraphKeys.TABLE_INITIALIZERS)
            ]
            assign = []
            if init_values is not None:
                for var, value in zip(self.model.tables, init_values):
                    ph = tf.compat.v1.placeholder(tf.float32, value.shape)
                    assign.append((var.assign(ph, read_value=False), ph, value))
            if for_check:
                self.keys = tf.compat.v1.placeholder(tf.int64, [None])
                self.read_ops = [self.model.read_rows(f, self.keys) for f in range(args.fields)]
            self.counts_op = None
            if impl == "sok":
                from sparse_operation_kit._ops import ops as sok_ops
                with tf.device("/CPU:0"):
                    self.counts_op = sok_ops.sok_kernel_run_counts()
            config = tf.compat.v1.ConfigProto(allow_soft_placement=True) if device else None
            self.sess = tf.compat.v1.Session(graph=self.graph, config=config)
            self.sess.run(init)
            for op, ph, value in assign:
                self.sess.run(op, feed_dict={ph: value})
            self.graph.finalize()
        self.step, self.times, self.cpu_times = 0, [], []

    def kernel_counts(self):
        _, counts = self.sess.run(self.counts_op)  # op types, [n, (CPU, GPU)] runs
        cpu, gpu = (int(x) for x in counts.sum(axis=0))
        return {"CPU": cpu, "GPU": gpu}

    def _step_of(self, step):
        """(loss, train op, feed) of step `step`."""
        b = step % self.nb
        if self.which is None:
            return self.losses[b], self.train_ops[b], None
        return self.losses[0], self.train_ops[0], {self.which: b}

    def one_step(self):
        _, train_op, feed = self._step_of(self.step)
        self.sess.run(train_op, feed_dict=feed)

    def loss_step(self):
        loss, train_op, feed = self._step_of(self.step)
        loss, _ = self.sess.run([loss, train_op], feed_dict=feed)
        self.step += 1
        return float(loss)

    def read_rows(self, f, keys):
        return self.sess.run(self.read_ops[f], feed_dict={self.keys: keys})

    def find_placement(self):
        """One (untimed) step that returns the partitioned graphs: the device of every node."""
        opts = tf.compat.v1.RunOptions(output_partition_graphs=True)
        meta = tf.compat.v1.RunMetadata()
        _, train_op, feed = self._step_of(self.step)
        self.sess.run(train_op, feed_dict=feed, options=opts, run_metadata=meta)
        self.step += 1
        for g in meta.partition_graphs:
            self.placement.add_nodes(g.node)

    def profile(self, top):
        """One traced step (after an untraced one): per op type, the time its kernels held the
        executor (host: compute or enqueue) and the time of its GPU kernels, the GPU's busy time
        and the number of launches: whether the step waits on the host or on the GPU."""
        self.one_step()
        self.step += 1
        _, train_op, feed = self._step_of(self.step)
        stats, wall = step_trace.trace(self.sess, train_op, feed)
        self.step += 1
        recs = step_trace.records(stats, self.graph)
        write_trace(self.args, self.impl, wall, recs)
        print_profile(self.impl, wall, recs, top)

    def close(self):
        self.sess.close()


STEP_FUNCTION = "train_step"  # the step's tf.function: the profiler's host event of each call


class FunctionRunner(_Timed):
    """One implementation in TF2 style: eager variables, its step a tf.function (GradientTape +
    the same optimizer), timed around the call plus .numpy() of the returned loss (a sync)."""

    def __init__(self, impl, args, batches, device, init_values=None, for_check=False):
        self.impl, self.args, self.nb, self.device = impl, args, len(batches), device
        self.placement = Placement()
        with device_scope(device):
            inputs = id_inputs(args, batches)
            model = BUILDERS[impl](args)
        if init_values is not None:
            for var, value in zip(model.tables, init_values):
                var.assign(value)
        self.model, self.inputs = model, inputs
        for kind, objs in (("variables" if impl != "sok" else "embedding variables", model.tables),
                           ("hash tables", model.hash_tables)):
            for obj in objs:
                handle = getattr(obj, "handle", None)
                if handle is None:
                    handle = obj.resource_handle
                self.placement.tables[kind].add(short_device(handle.device))

        @tf.function
        def train_step(which):
            sp = inputs.sparse(which)
            with tf.GradientTape() as tape:
                loss = loss_of(model.embed(sp))
            grads = tape.gradient(loss, model.tables)
            model.opt.apply_gradients(zip(grads, model.tables))
            return loss

        self.fn = train_step
        if getattr(inputs, "per_batch", False):  # Python ints: a trace per batch
            self.whiches = list(range(self.nb))
        else:
            with tf.device("/CPU:0"):
                self.whiches = [tf.constant(b, tf.int32) for b in range(self.nb)]
        self.step, self.times, self.cpu_times = 0, [], []
        # The first call traces and instantiates the function: record its partitioned graphs.
        from tensorflow.python.eager import context  # no public API returns a function's placement
        ctx = context.context()
        ctx.enable_run_metadata()
        ctx.export_run_metadata()  # drops what earlier runners' functions left in the context
        try:
            self.first_loss = self.loss_step()  # a warm-up step (--check compares its loss)
            meta = ctx.export_run_metadata()
        finally:
            ctx.disable_run_metadata()
        # The step is the largest function (the others initialise slots and the step counter).
        by_function = [
            [n for pg in fg.partition_graphs for n in pg.node] for fg in meta.function_graphs
        ]
        if by_function:
            self.placement.add_nodes(max(by_function, key=len), tables_from_graph=False)

    def kernel_counts(self):
        return self.model.sok.kernel_run_counts()

    def one_step(self):
        self.fn(self.whiches[self.step % self.nb]).numpy()

    def loss_step(self):
        with device_scope(self.device):
            loss = float(self.fn(self.whiches[self.step % self.nb]).numpy())
        self.step += 1
        return loss

    def read_rows(self, f, keys):
        with device_scope(self.device):
            return self.model.read_rows(f, tf.constant(keys)).numpy()

    def find_placement(self):
        pass  # recorded at the first call

    def profile(self, top):
        """One step traced by TensorFlow's profiler (after an untraced one): the graph-mode table
        (host time of CPU ops only: the profiler names no GPU op's enqueueing) and when, after the
        Python call began, the runtime started the function and the GPU first and last worked."""
        with device_scope(self.device):
            self.one_step()
            self.step += 1
            walls = []

            def timed_step():
                t0 = time.perf_counter()
                self.one_step()
                walls.append((time.perf_counter() - t0) * 1e3)

            with tempfile.TemporaryDirectory() as logdir:
                path = xplane_trace.trace(timed_step, 1, logdir)
                steps = xplane_trace.step_records(path, STEP_FUNCTION)
            wall = walls[-1]
            self.step += 1
        if not steps:
            print(f"[{self.impl}] the trace holds no '{STEP_FUNCTION}' step")
            return
        s = steps[-1]
        ms = {k: (v / 1e3 if v is not None else float("nan")) for k, v in s.items()
              if k.endswith("_us")}
        landmarks = f"; from the call: the runtime starts the function at {ms['runtime_start_us']:.2f} ms"
        if s["first_gpu_us"] is not None:
            landmarks += (f", the GPU works from {ms['first_gpu_us']:.2f} to "
                          f"{ms['last_gpu_us']:.2f} ms")
        write_trace(self.args, self.impl, wall, s["records"])
        print_profile(self.impl, wall, s["records"], top, landmarks)

    def close(self):
        self.fn = None
        self.model = self.inputs = None


RUNNERS = {"graph": GraphRunner, "function": FunctionRunner}


# ---------------------------------------------------------------------------------------------
# Benchmark, check, harness
# ---------------------------------------------------------------------------------------------
def bench(args, mode, batches, device, impls):
    runners = {}
    for impl in impls:
        runners[impl] = RUNNERS[mode](impl, args, batches, device)
        runners[impl].run(args.warmup, record=False)
        runners[impl].find_placement()
    if args.profile:
        for impl in impls:
            for _ in range(2):
                runners[impl].profile(args.profile)
            runners[impl].close()
        return None
    for _ in range(args.rounds):  # interleaved, so machine load hits every implementation alike
        for impl in impls:
            runners[impl].run(args.steps, record=True)
    med = {impl: statistics.median(r.times) * 1e3 for impl, r in runners.items()}
    cpu = {impl: statistics.median(r.cpu_times) * 1e3 for impl, r in runners.items()}
    placement = {impl: r.placement for impl, r in runners.items()}
    for r in runners.values():
        r.close()
    return med, cpu, placement


def sok_initial_values(args):
    """Initial rows of keys 0..vocab-1 of every field's SOK table (they depend only on the table's
    name, initializer and key), read without inserting."""
    import sparse_operation_kit as sok
    with tf.Graph().as_default() as g, tf.device("/CPU:0"):
        tables = [
            sok.get_embedding_variable(
                f"sok_emb_{f}", args.dim, key_dtype=tf.int64, initializer=_initializer(args)
            )
            for f in range(args.fields)
        ]
        keys = tf.range(args.vocab, dtype=tf.int64)
        reads = [t.sparse_read(keys, training=False) for t in tables]
        init = [t.initializer for t in tables]
        with tf.compat.v1.Session(graph=g) as sess:
            sess.run(init)
            return sess.run(reads)


def hash_initial_values(sok_values, batches, steps):
    """The hash implementation's variable rows set so row r starts as SOK's key that gets row r
    (new keys get rows in order of first appearance, step after step)."""
    out = []
    for f, base in enumerate(sok_values):
        value = base.copy()
        rows = {}
        for s in range(steps):
            ids = batches[s % len(batches)][f][0]
            _, first = np.unique(ids, return_index=True)
            for key in ids[np.sort(first)]:
                if key not in rows:
                    rows[key] = len(rows)
                    value[rows[key]] = base[key]
        out.append(value)
    return out


def check(args, modes, dists, batches_by_dist, device, impls):
    """N steps of every implementation from SOK's initial values: the losses (before each update)
    and, after the N updates, the change of every touched row must agree with sok's."""
    sok_values = sok_initial_values(args)
    ok = True
    for dist in dists:
        batches = batches_by_dist[dist]
        inits = {
            "sok": None,
            "tf": sok_values,
            "hash": hash_initial_values(sok_values, batches, args.check),
        }
        touched = [
            np.unique(np.concatenate([batches[s % len(batches)][f][0] for s in range(args.check)]))
            for f in range(args.fields)
        ]
        for mode in modes:
            losses, deltas = {}, {}
            for impl in impls:
                r = RUNNERS[mode](
                    impl, args, batches, device, init_values=inits[impl], for_check=True
                )
                if mode == "function":  # its constructor ran the first step
                    losses[impl] = [r.first_loss] + [r.loss_step() for _ in range(args.check - 1)]
                else:
                    losses[impl] = [r.loss_step() for _ in range(args.check)]
                deltas[impl] = [
                    r.read_rows(f, touched[f]) - sok_values[f][touched[f]]
                    for f in range(args.fields)
                ]
                r.close()
            ref = "sok" if "sok" in impls else impls[0]
            for impl in impls:
                loss_rel = max(
                    abs(a - b) / max(abs(b), 1e-30) for a, b in zip(losses[impl], losses[ref])
                )
                upd_rel = max(
                    float(np.max(np.abs(d - e))) / max(float(np.max(np.abs(e))), 1e-30)
                    for d, e in zip(deltas[impl], deltas[ref])
                )
                moved = max(float(np.max(np.abs(d))) for d in deltas[impl])
                good = loss_rel <= 1e-5 and upd_rel <= 1e-3 and moved > 0
                ok &= good
                print(
                    f"CHECK mode={mode} dist={dist} impl={impl} "
                    f"losses={' '.join(f'{x:.7g}' for x in losses[impl])} "
                    f"loss rel diff={loss_rel:.1e} row updates: max |change| {moved:.2e}, rel "
                    f"diff={upd_rel:.1e} "
                    f"vs {ref}: {'OK' if good else 'MISMATCH'}",
                    flush=True,
                )
    print("check " + ("passed" if ok else "FAILED"))
    return ok


def run_harness(args, binary, batches_by_dist):
    """Dumps the ids, runs the CUDA harness on them; {dist: {key: value}} from its HARNESS lines."""
    tmp = tempfile.mkdtemp(prefix="sok_embedding_ids_")
    try:
        dump_ids(args, tmp, batches_by_dist)
        cmd = [
            binary,
            tmp,
            "--warmup",
            str(args.harness_warmup),
            "--steps",
            str(args.harness_steps),
        ]
        print("harness: " + " ".join(cmd), flush=True)
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
        except (OSError, subprocess.TimeoutExpired) as e:
            print(f"harness failed: {e}", flush=True)
            return {}, None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    results, device = {}, None
    for line in proc.stdout.splitlines():
        words = line.split()
        if not words or words[0] not in ("HARNESS", "HARNESS_DEVICE"):
            continue
        kv = dict(w.split("=", 1) for w in words[1:] if "=" in w)
        if words[0] == "HARNESS_DEVICE":
            device = kv
            continue
        for k, v in kv.items():
            try:
                kv[k] = float(v)
            except ValueError:
                pass
        results[kv["dist"]] = kv
    if proc.returncode != 0 or not results:
        print(
            f"harness failed (exit {proc.returncode}): "
            f"{(proc.stderr or proc.stdout).strip()[-2000:]}",
            flush=True,
        )
    return results, device


def fmt_ms(v):
    return f"{v:.1f}" if v >= 100 else f"{v:.2f}" if v >= 10 else f"{v:.3f}"


def select_device(args):
    """The device to build under (None: TensorFlow's default placement on a CPU-only process)."""
    gpus = tf.config.list_physical_devices("GPU")
    use_gpu = args.device == "gpu" or (args.device == "auto" and bool(gpus))
    if use_gpu and not gpus:
        sys.exit("--device gpu: TensorFlow sees no GPU (is this TensorFlow's GPU build?)")
    if not use_gpu:
        if gpus:
            tf.config.set_visible_devices([], "GPU")
        return None, "CPU"
    try:
        name = tf.config.experimental.get_device_details(gpus[0]).get("device_name", "GPU")
    except Exception:  # report and go on
        name = "GPU"
    return "/GPU:0", f"GPU:0 ({name})"


def main(argv=None):
    args = parse_args(argv)
    if args.horovod:
        sys.exit("--horovod: not implemented yet (see the module docstring)")
    impls = [i for i in args.impls.split(",") if i]
    dists = [d for d in args.dists.split(",") if d]
    modes = ("graph", "function") if args.mode == "both" else (args.mode,)
    batches_by_dist = {dist: make_batches(args, dist) for dist in dists}
    if args.dump_ids:
        dump_ids(args, args.dump_ids, batches_by_dist)
        print(
            f"wrote the ids of {', '.join(dists)} ({args.num_batches} batches x {args.fields} "
            "fields) and "
            f"header.txt to {args.dump_ids}"
        )
        return 0
    device, device_label = select_device(args)
    harness, harness_device = {}, None
    if args.harness:  # before TensorFlow takes the GPU's memory
        harness, harness_device = run_harness(args, args.harness, batches_by_dist)
    if args.mode == "graph":
        tf.compat.v1.disable_eager_execution()
    if args.check:
        return 0 if check(args, modes, dists, batches_by_dist, device, impls) else 1
    print(
        f"config={args.config} fields={args.fields} ids/sample/field={ids_label(args)} "
        f"vocab/field={args.vocab} "
        f"dim={args.dim} batch={args.batch} inputs={args.inputs} hash_table={args.hash_table} "
        f"steps={args.rounds}x{args.steps} (after {args.warmup} warm-up), TF {tf.__version__}, "
        f"{os.cpu_count()} CPUs, device {device_label}, mode {args.mode}"
    )
    if harness_device:
        print("harness device: " + " ".join(f"{k}={v}" for k, v in harness_device.items()))
    cols = list(impls) + (["harness"] if args.harness else [])
    ratios = [(o, "sok") for o in ("tf", "hash") if o in impls and "sok" in impls]
    if args.harness and "sok" in impls:
        ratios.append(("sok", "harness"))
    header = (f"{'mode':<9} {'ids':<9} {'time':<6} {'distinct/ids':>12} "
              + " ".join(f"{c + ' ms':>10}" for c in cols)
              + "".join(f" {a + '/' + b:>11}" for a, b in ratios))
    print(f"load average at start: {os.getloadavg()[0]:.2f}")
    print(header, flush=True)
    details = []
    for dist in dists:
        batches = batches_by_dist[dist]
        distinct = sum(len(np.unique(ids)) for ids, _ in batches[0]) / sum(
            len(ids) for ids, _ in batches[0]
        )
        h = harness.get(dist, {}).get("step_ms")
        for mode in modes:
            res = bench(args, mode, batches, device, impls)
            if res is None:
                continue
            med, cpu, placement = res
            for kind, vals in (("wall", med), ("cpu", cpu)):
                vals = dict(vals)
                if kind == "wall" and h is not None:
                    vals["harness"] = h
                line = (
                    f"{mode:<9} {dist:<9} {kind:<6} {distinct:>12.3f} "
                    + " ".join(
                        f"{fmt_ms(vals[c]):>10}" if c in vals else f"{'-':>10}" for c in cols
                    )
                    + "".join(
                        f" {vals[a] / vals[b]:>10.2f}x"
                        if a in vals and b in vals
                        else f" {'-':>11}"
                        for a, b in ratios
                    )
                )
                print(line, flush=True)
            ran = {i: placement[i].short() for i in impls}
            if args.harness:
                ran["harness"] = "GPU" if h is not None else "-"
            print(
                f"{mode:<9} {dist:<9} {'ran on':<6} {'':>12} "
                + " ".join(f"{ran[c]:>10}" for c in cols),
                flush=True,
            )
            for impl in impls:
                details.append(f"  {mode:<8} {dist:<8} {impl:<5} {placement[impl].describe()}")
        if dist in harness:
            extra = {k: v for k, v in harness[dist].items()
                     if k.endswith("_ms") or k in ("ids", "unique", "table_keys")}
            details.append(f"  {'':<8} {dist:<8} harness " + " ".join(
                f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in extra.items()))
    harness_note = "; harness: median CUDA-event time per step" if args.harness else ""
    print(f"load average at end: {os.getloadavg()[0]:.2f} (wall: median time per step; cpu: median "
          f"CPU time per step of all threads{harness_note})")
    if details:
        print(
            "where each implementation ran (tables; ops per device of the partitioned step graph, "
            "bookkeeping left out; SOK kernel runs):"
        )
        print("\n".join(details))
    return 0


if __name__ == "__main__":
    sys.exit(main())
