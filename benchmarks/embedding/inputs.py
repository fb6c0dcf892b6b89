"""The embedding benchmark's ids (benchmarks/embedding/run.py): the shared constants of the
tables and the optimizer, the pre-built id batches, the ways a step reads them (--inputs), and
--dump-ids' files for the CUDA harness."""
import os

import numpy as np
import tensorflow as tf

# Shared constants: the tables' initial values and Adagrad's (impls.py builds with them, dump_ids
# writes them for the harness).
INIT_MIN, INIT_MAX = -0.05, 0.05
INITIAL_ACCUMULATOR = 0.1  # tf.compat.v1.train.AdagradOptimizer's default (epsilon 0)
SOK_DEFAULT_VALUE_DIM = 4096  # sok.get_embedding_variable's default InitializerOption


# ---------------------------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------------------------
def make_batches(args, dist, rank=0, world_size=1):
    """batches[b][f] = (ids, row_splits) of batch b and field f: int64 ids of the samples one after
    another, and int64 row_splits [batch + 1] (sample s has ids[row_splits[s]:row_splits[s+1]]).
    Each sample has ids_per_field ids, or, when min_ids_per_field is lower, a length drawn
    uniformly from [min, max] per sample. Power-law ids are ranked by a random permutation per
    field so hot ids are spread over the id space. Under --horovod each rank draws its own
    stream (the seed offset by the rank), so ranks look up different ids; world_size is unused.
    (Fixed lengths draw nothing from the generator: only the ids come from it.)"""
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


def keys_per_owner(batches, world):
    """[batches, world]: per batch, the distinct (field, id) keys each rank owns, which is what
    SOK's lookup sends that rank (it dedups per table first). Owner as in SOK's default placement
    (target_gpu -1): id k lives on rank k mod world."""
    out = np.zeros([len(batches), world], np.int64)
    for b, fields in enumerate(batches):
        for ids, _ in fields:
            out[b] += np.bincount(np.unique(ids) % world, minlength=world)
    return out


INPUT_SCOPE = "inputs"  # the batch selection, left out of the placement counts


def _pad8(n):
    return max(8, (n + 7) // 8 * 8)  # rows of 8 int64 keep every batch's slice 64-byte aligned


def _sparse_indices(splits):
    """[n, 2] SparseTensor indices (sample, position in the sample) of ids with row_splits."""
    lengths = np.diff(splits)
    rows = np.repeat(np.arange(len(lengths), dtype=np.int64), lengths)
    return np.stack([rows, np.arange(splits[-1], dtype=np.int64) - splits[:-1][rows]], 1)


def _held(x, name, feeds):
    """A non-trainable variable holding the array x. In a TF1 graph its value is fed once, when
    the variables are initialized (run `feeds`): as a constant it would be copied into the graph,
    gigabytes for fields100 at batch 65,536, slow to build, serialize and run."""
    if tf.executing_eagerly():
        return tf.Variable(x, trainable=False, name=name)
    value = tf.compat.v1.placeholder(tf.as_dtype(x.dtype), x.shape, name=f"{name}_value")
    feeds[value] = x
    return tf.Variable(value, trainable=False, name=name)


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
        self.init_feed = {}  # the variables' values, fed when they are initialized (TF1)
        self.fixed = args.min_ids_per_field == args.ids_per_field
        self.shape = _dense_shape(args)
        self.values, self.indices, self.nnz = [], [], []
        if self.fixed:
            rows = np.repeat(np.arange(args.batch, dtype=np.int64), args.ids_per_field)
            cols = np.tile(np.arange(args.ids_per_field, dtype=np.int64), args.batch)
            self.shared_indices = tf.constant(np.stack([rows, cols], 1))
            for f in range(args.fields):
                data = np.stack([batches[b][f][0] for b in range(nb)])  # [nb, n]
                self.values.append(_held(data, f"ids_{f}", self.init_feed))
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
            self.values.append(_held(vals, f"ids_{f}", self.init_feed))
            self.indices.append(_held(idx, f"indices_{f}", self.init_feed))
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
        self.init_feed = {}  # the variables' values, fed when they are initialized (TF1)
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
        self.values = _held(vals, "ids", self.init_feed)
        self.indices = _held(idx, "indices", self.init_feed)
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
        # host and one back per field (a GPU timeline). The same bits as float64 split on the GPU (a
        # split only moves bytes).
        parts = tf.split(tf.bitcast(x, tf.float64), sizes, num=self.fields + 1)
        return [tf.bitcast(p, tf.int64) for p in parts[: self.fields]]


class ResidentIdInputs:
    """Every field of every pre-built batch in device memory: sparse(b) takes the batch as a
    Python int, so each batch gets its own step graph (TF1) or trace (tf.function), which reads
    its ids and slices or splits nothing (BatchedIdInputs spends some 60 ops per step on that, as
    much host time as SOK's whole embedding step on a GPU). A TF1 graph reads them from
    non-trainable variables (one ReadVariableOp per tensor); a tf.function (`eager`) captures them
    as tensors, its inputs as an iterator's get_next hands them over: 52 variable reads cost SOK's
    criteo26 step about 0.45 ms in function mode (H200)."""

    per_batch = True

    def __init__(self, args, batches, eager=False):
        self.shape = _dense_shape(args)
        self.init_feed = {}  # the variables' values, fed when they are initialized (TF1)
        hold = tf.constant if eager else (lambda x, name: _held(x, name, self.init_feed))
        self.values, self.indices = [], []
        for b, fields in enumerate(batches):
            self.values.append([hold(ids, name=f"ids_{b}_{f}")
                                for f, (ids, _) in enumerate(fields)])
            self.indices.append([hold(_sparse_indices(splits), name=f"indices_{b}_{f}")
                                 for f, (_, splits) in enumerate(fields)])

    def sparse(self, which):
        with tf.name_scope(INPUT_SCOPE):
            return [tf.SparseTensor(i, v, self.shape)
                    for i, v in zip(self.indices[which], self.values[which])]


def id_inputs(args, batches, eager=False):
    """The --inputs kind's ids; `eager`: for a tf.function (resident ids as captured tensors)."""
    if args.inputs == "resident":
        return ResidentIdInputs(args, batches, eager=eager)
    kinds = {"batched": BatchedIdInputs, "per-field": IdInputs}
    return kinds[args.inputs](args, batches)



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
