"""The embedding benchmark's implementations (benchmarks/embedding/run.py): sok, sok_tier (sok's
tables in DRAM_SSDHASH or HBM_DRAM storage), tf and hash, each its tables, its optimizer and its forward pass,
plus the loss every one of them takes: the stand-in (loss_of) or, with --mlp, the same MLP (Mlp)."""
import os
import shutil
import tempfile

import numpy as np
import tensorflow as tf
from inputs import INIT_MAX, INIT_MIN


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
    tiered = False

    def __init__(self, args, batches=None):
        import sparse_operation_kit as sok
        self.sok = sok
        sok.init(use_horovod=bool(args.horovod))
        self.n = args.fields
        self.tier = Tier(args, batches) if self.tiered else None
        # Same names (so the same initial rows) with or without tiers.
        self.tables = [sok.get_embedding_variable(
            f"sok_emb_{f}", args.dim, key_dtype=tf.int64, initializer=_initializer(args),
            ev_option=self.tier.option(f) if self.tier else None) for f in range(args.fields)]
        self.hash_tables = []
        self.opt = sok.OptimizerWrapper(tf.compat.v1.train.AdagradOptimizer(args.lr))

    def embed(self, sp):
        return self.sok.lookup_sparse(self.tables, sp, combiners=["sum"] * self.n)

    def read_rows(self, f, keys):
        return self.tables[f].sparse_read(keys, training=False)


class SokTierImpl(SokImpl):
    """sok with every table in tiered storage (Tier: DRAM_SSDHASH or HBM_DRAM, by --storage)."""

    tiered = True


ADAGRAD_SLOTS = 1
# --storage -> (the StorageType, its cached tiers from the top: (tier, the flag holding the
# tier's fraction)); the rows below them are in pinned host memory (hbm_dram) or on file.
TIER_KINDS = {
    "dram_ssd": ("DRAM_SSDHASH", (("DRAM", "dram_fraction"),)),
    "hbm_dram": ("HBM_DRAM", (("HBM", "cache_fraction"),)),
    "hbm_dram_ssd": ("HBM_DRAM_SSDHASH", (("HBM", "cache_fraction"), ("DRAM", "dram_fraction"))),
}


class Tier:
    """The storage of sok_tier's tables: per field and cached tier (DRAM for dram_ssd, HBM for
    hbm_dram, both for hbm_dram_ssd) a budget of --dram-fraction / --cache-fraction of the
    table's final size (its distinct ids over all batches, which the warm-up inserts, x a row's
    cost: 4 * dim * (1 + Adagrad's slot) + 32 bytes), in whole rows. dram_ssd and hbm_dram_ssd
    keep the other rows in files below a fresh folder in --storage-path (a file record is as
    long as a row's cost); hbm_dram in pinned host memory."""

    def __init__(self, args, batches):
        from sparse_operation_kit.tables.storage import ROW_META_BYTES
        self.args = args
        self.type_name, tiers = TIER_KINDS[args.storage]
        self.tiers = [(name, getattr(args, flag)) for name, flag in tiers]
        self.row_bytes = 4 * args.dim * (1 + ADAGRAD_SLOTS) + ROW_META_BYTES
        self.final_rows = [len(np.unique(np.concatenate([b[f][0] for b in batches])))
                           for f in range(args.fields)]
        # Per tier, whole rows, at least one: a budget under one row is refused by the storage.
        self.budget_rows = [[max(1, int(fraction * r)) for _, fraction in self.tiers]
                            for r in self.final_rows]
        self.dir = None
        if self.type_name.endswith("SSDHASH"):
            if args.storage_path:
                os.makedirs(args.storage_path, exist_ok=True)
            self.dir = tempfile.mkdtemp(prefix="sok_tier_", dir=args.storage_path)

    def option(self, f):
        import sparse_operation_kit as sok
        return sok.EmbeddingVariableOption(storage_option=sok.StorageOption(
            storage_type=sok.StorageType[self.type_name], storage_path=self.dir,
            storage_size=[rows * self.row_bytes for rows in self.budget_rows[f]],
            cache_strategy=sok.CacheStrategy[self.args.cache_strategy.upper()]))

    def files(self):
        """(files, bytes) under the folder now (the tables' files: live and replaced records)."""
        sizes = [os.path.getsize(os.path.join(d, n)) for d, _, names in os.walk(self.dir)
                 for n in names]
        return len(sizes), sum(sizes)

    def describe(self, io):
        """The tiers' sizes and, for dram_ssd, from `io` ({rchar, wchar, syscr, steps}: the
        process's I/O over the timed steps), the file traffic per step."""
        rows = sum(self.final_rows)
        budgets = [sum(b[t] for b in self.budget_rows) for t in range(len(self.tiers))]
        text = (f"tiers ({self.args.cache_strategy.upper()}): {rows} rows in all tables after "
                f"a cycle of the batches, " + ", ".join(
                    f"{name} budget {budget} rows ({fraction:g})"
                    for (name, fraction), budget in zip(self.tiers, budgets)) +
                f" ({self.row_bytes} B a row), so >= {rows - sum(budgets)} ")
        if self.dir is None:
            return text + "rows in host memory"
        files, size = self.files()
        text += f"rows on file; files: {files}, {size} bytes"
        if not io.get("steps"):
            return text
        # Reads go through a mapping of the file (no system call: /proc/self/io cannot count
        # them); writes: one per demotion batch and the compaction's copy. The records written
        # per step are also the records that moved down, so about as many came back up.
        per = {k: io[k] / io["steps"] for k in ("wchar",)}
        return (f"{text}; file traffic per timed step (demotions, compactions): "
                f"{per['wchar'] / 1e6:.2f} MB (~{per['wchar'] / self.row_bytes:.0f} records) "
                "written")

    def close(self):
        if self.dir:
            shutil.rmtree(self.dir, ignore_errors=True)


class TfImpl:
    def __init__(self, args, batches=None):
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
    def __init__(self, args, batches=None):
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


BUILDERS = {"sok": SokImpl, "sok_tier": SokTierImpl, "tf": TfImpl, "hash": HashImpl}


def loss_of(embs):
    # A cheap stand-in for the dense part (which takes the embeddings side by side, as DLRM's
    # interaction or an MLP does): every embedding gets a gradient.
    return tf.reduce_sum(tf.square(tf.concat(embs, 1))) * 1e-3


class Mlp:
    """--mlp WIDTHS: the dense part every implementation shares. On the pooled embeddings side by
    side ([batch, fields x dim]): one ReLU layer per width, then a linear 1-unit output; the loss
    is the mean over the batch of the squared output (no labels: the step's cost is what counts).
    Its weights are plain tf.Variables (float32) initialised from numpy with --seed (Glorot
    uniform kernels, zero biases): the same on every rank and for every implementation, so the
    implementations' losses agree (--check) and data-parallel ranks start equal. The step updates
    them with the optimizer it uses for the tables (Adagrad: TF's, or SOK's wrapper, which hands
    dense variables to the TF optimizer it wraps)."""

    def __init__(self, args):
        rng = np.random.RandomState(args.seed + 7919)  # not the ids' stream (inputs.py)
        self.widths = list(args.mlp)
        self.kernels, self.biases = [], []
        fan_in = args.fields * args.dim
        for i, width in enumerate(self.widths + [1]):
            limit = np.sqrt(6.0 / (fan_in + width))
            kernel = rng.uniform(-limit, limit, size=(fan_in, width)).astype(np.float32)
            self.kernels.append(tf.Variable(kernel, name=f"mlp_kernel_{i}"))
            self.biases.append(tf.Variable(np.zeros(width, np.float32), name=f"mlp_bias_{i}"))
            fan_in = width
        self.variables = [v for pair in zip(self.kernels, self.biases) for v in pair]

    def num_params(self):
        return sum(int(np.prod(v.shape)) for v in self.variables)

    def __call__(self, embs):
        x = tf.concat(embs, 1)
        last = len(self.kernels) - 1
        for i, (kernel, bias) in enumerate(zip(self.kernels, self.biases)):
            x = tf.nn.bias_add(tf.matmul(x, kernel), bias)
            if i < last:
                x = tf.nn.relu(x)
        return tf.reduce_mean(tf.square(x))


def dense_part(args):
    """(loss function of the pooled embeddings, its trainable dense variables): the stand-in
    (no variables) or, with --mlp, an Mlp built in the current graph / eagerly."""
    if not getattr(args, "mlp", None):
        return loss_of, []
    mlp = Mlp(args)
    return mlp, mlp.variables
