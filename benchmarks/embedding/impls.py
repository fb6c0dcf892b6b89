"""The embedding benchmark's three implementations (benchmarks/embedding/run.py): sok, tf and
hash, each its tables, its optimizer and its forward pass, plus the loss every one of them takes."""
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


def loss_of(embs):
    # A cheap stand-in for the dense part (which takes the embeddings side by side, as DLRM's
    # interaction or an MLP does): every embedding gets a gradient.
    return tf.reduce_sum(tf.square(tf.concat(embs, 1))) * 1e-3
