"""Embedding-layer training-step benchmark: SOK vs. stock TensorFlow (TF1 graph mode, CPU).

One step = forward (pooled "sum" lookup of every field), backward and an Adagrad update, for
  sok   : one sok.EmbeddingVariable per field, ONE sok.lookup_sparse call over all fields,
          sok.OptimizerWrapper(tf.compat.v1.train.AdagradOptimizer);
  tf    : one tf.Variable [vocab, dim] per field, tf.nn.embedding_lookup_sparse,
          tf.compat.v1.train.AdagradOptimizer;
  hash  : TF's own dynamic path: a tf.lookup.experimental.MutableHashTable (or DenseHashTable)
          per field maps ids -> row indices of a tf.Variable (new ids get fresh rows inside the
          step), then tf.nn.embedding_lookup_sparse on the rows, TF Adagrad on the variable.

All three read the same ids, kept in the graph (non-trainable variables holding a few
pre-built batches; a fed scalar picks the batch), and run under the same default session config.
Prints, for uniform and power-law ids, the median wall time per step of each implementation and
the ratios tf/sok and hash/sok, then the same for the median CPU time of all threads per step (a
cross-check that suffers less from other processes' load). --profile K traces steps instead.

    PYTHONPATH=addons/sparse_operation_kit/python .venv/bin/python benchmarks/embedding/run.py

Multi-rank: `build_*` take the per-rank inputs and `Runner` only times `sess.run(train_op)`; a
later `--horovod` mode plugs in by sharding `make_batches` per rank and wrapping the optimizers.
"""
import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

IMPLS = ("sok", "tf", "hash")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--fields", type=int, default=100)
    p.add_argument("--ids-per-field", type=int, default=10, help="ids per sample and field")
    p.add_argument("--vocab", type=int, default=8192, help="distinct ids per field")
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--batch", type=int, default=4096)
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
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--profile", type=int, default=0, metavar="K",
                   help="instead of timing, trace one step per implementation and print the K op "
                        "types with the most (summed) op time")
    p.add_argument("--horovod", action="store_true", help="(reserved) one rank per process")
    return p.parse_args(argv)


# ---------------------------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------------------------
def make_batches(args, dist, rank=0, world_size=1):
    """ids[b][f]: int64 [batch * ids_per_field] for batch b and field f (every sample has
    ids_per_field ids). Power-law ids are ranked by a random permutation per field so hot ids
    are spread over the id space. A multi-rank run would draw a different stream per rank."""
    rng = np.random.default_rng(args.seed + 7919 * rank)
    n = args.batch * args.ids_per_field
    perms = [rng.permutation(args.vocab) for _ in range(args.fields)]
    if dist == "powerlaw":
        p = 1.0 / np.arange(1, args.vocab + 1, dtype=np.float64) ** args.zipf
        cdf = np.cumsum(p / p.sum())
    out = []
    for _ in range(args.num_batches):
        fields = []
        for f in range(args.fields):
            if dist == "uniform":
                ids = rng.integers(0, args.vocab, size=n)
            else:
                ids = perms[f][np.minimum(np.searchsorted(cdf, rng.random(n)), args.vocab - 1)]
            fields.append(ids.astype(np.int64))
        out.append(fields)
    return out


def graph_inputs(args, batches):
    """Per field a SparseTensor [batch, ids_per_field] whose values come from an in-graph
    variable holding every pre-built batch; returns (sparse tensors, batch-index placeholder)."""
    nb, nf = len(batches), args.fields
    n = args.batch * args.ids_per_field
    which = tf.compat.v1.placeholder(tf.int32, [], name="batch_index")
    rows = np.repeat(np.arange(args.batch, dtype=np.int64), args.ids_per_field)
    cols = np.tile(np.arange(args.ids_per_field, dtype=np.int64), args.batch)
    indices = tf.constant(np.stack([rows, cols], 1))
    shape = tf.constant([args.batch, args.ids_per_field], tf.int64)
    sp = []
    for f in range(nf):
        data = np.stack([batches[b][f] for b in range(nb)])  # [nb, n]
        holder = tf.Variable(data, trainable=False, name=f"ids_{f}")
        values = holder[which]  # a dim-0 slice: shares the variable's buffer, no copy
        sp.append(tf.SparseTensor(indices, values, shape))
    return sp, which


def loss_of(embs):
    # A cheap stand-in for the dense part: every embedding gets a gradient.
    return tf.add_n([tf.reduce_sum(tf.square(e)) for e in embs]) * 1e-3


# ---------------------------------------------------------------------------------------------
# The three implementations (each builds into the current default graph; returns train_op)
# ---------------------------------------------------------------------------------------------
def build_sok(args, sp):
    import sparse_operation_kit as sok
    sok.init(use_horovod=bool(args.horovod))
    init = tf.compat.v1.random_uniform_initializer(-0.05, 0.05, seed=args.seed)
    tables = [sok.get_embedding_variable(f"sok_emb_{f}", args.dim, key_dtype=tf.int64,
                                         initializer=init)
              for f in range(args.fields)]
    embs = sok.lookup_sparse(tables, sp, combiners=["sum"] * args.fields)
    opt = sok.OptimizerWrapper(tf.compat.v1.train.AdagradOptimizer(args.lr))
    return opt.minimize(loss_of(embs), var_list=tables)


def build_tf(args, sp):
    init = tf.compat.v1.random_uniform_initializer(-0.05, 0.05, seed=args.seed)
    tables = [tf.compat.v1.get_variable(f"tf_emb_{f}", [args.vocab, args.dim], initializer=init,
                                        use_resource=True)
              for f in range(args.fields)]
    embs = [tf.nn.embedding_lookup_sparse(t, s, None, combiner="sum") for t, s in zip(tables, sp)]
    opt = tf.compat.v1.train.AdagradOptimizer(args.lr)
    return opt.minimize(loss_of(embs), var_list=tables)


def _hash_rows(args, table, counter, ids):
    """Row index of every id: looks the distinct ids up, inserts the new ones with fresh rows."""
    uniq, inverse = tf.unique(ids, out_idx=tf.int64)
    found = table.lookup(uniq)
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


def build_hash(args, sp):
    init = tf.compat.v1.random_uniform_initializer(-0.05, 0.05, seed=args.seed)
    embs, tables = [], []
    for f, s in enumerate(sp):
        if args.hash_table == "dense":
            table = tf.lookup.experimental.DenseHashTable(
                tf.int64, tf.int64, default_value=-1, empty_key=-(2 ** 62), deleted_key=-(2 ** 62) - 1,
                initial_num_buckets=2 * args.vocab, name=f"hash_{f}")
        else:
            table = tf.lookup.experimental.MutableHashTable(tf.int64, tf.int64, default_value=-1,
                                                            name=f"hash_{f}")
        counter = tf.Variable(0, dtype=tf.int64, trainable=False, name=f"next_row_{f}")
        var = tf.compat.v1.get_variable(f"hash_emb_{f}", [args.vocab, args.dim], initializer=init,
                                        use_resource=True)
        rows = _hash_rows(args, table, counter, s.values)
        embs.append(tf.nn.embedding_lookup_sparse(var, tf.SparseTensor(s.indices, rows, s.dense_shape),
                                                  None, combiner="sum"))
        tables.append(var)
    opt = tf.compat.v1.train.AdagradOptimizer(args.lr)
    return opt.minimize(loss_of(embs), var_list=tables)


BUILDERS = {"sok": build_sok, "tf": build_tf, "hash": build_hash}


# ---------------------------------------------------------------------------------------------
# Timing
# ---------------------------------------------------------------------------------------------
class Runner:
    """One implementation in its own graph and session (default session config for all)."""

    def __init__(self, impl, args, batches):
        self.impl, self.args, self.nb = impl, args, len(batches)
        self.graph = tf.Graph()
        with self.graph.as_default():
            tf.compat.v1.set_random_seed(args.seed)
            sp, self.which = graph_inputs(args, batches)
            self.train_op = BUILDERS[impl](args, sp)
            init = [tf.compat.v1.global_variables_initializer()]
            init += [op for op in self.graph.get_collection(tf.compat.v1.GraphKeys.TABLE_INITIALIZERS)]
            self.sess = tf.compat.v1.Session(graph=self.graph)
            self.sess.run(init)
            self.graph.finalize()
        self.step, self.times, self.cpu_times = 0, [], []

    def run(self, steps, record):
        for _ in range(steps):
            c0, t0 = time.process_time(), time.perf_counter()
            self.sess.run(self.train_op, feed_dict={self.which: self.step % self.nb})
            dt, dc = time.perf_counter() - t0, time.process_time() - c0
            self.step += 1
            if record:
                self.times.append(dt)
                self.cpu_times.append(dc)  # CPU time of all threads of this process

    def profile(self, top):
        """Summed kernel time per op type over one traced step (both threads' work adds up)."""
        opts = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
        meta = tf.compat.v1.RunMetadata()
        t0 = time.perf_counter()
        self.sess.run(self.train_op, feed_dict={self.which: self.step % self.nb}, options=opts,
                      run_metadata=meta)
        wall = (time.perf_counter() - t0) * 1e3
        self.step += 1
        by_type, ops = {}, {n.name: n.op for n in self.graph.as_graph_def().node}
        for dev in meta.step_stats.dev_stats:
            for ns in dev.node_stats:
                kind = ops.get(ns.node_name.split(":")[0], ns.node_name)
                t, c = by_type.get(kind, (0.0, 0))
                by_type[kind] = (t + ns.all_end_rel_micros / 1e3, c + 1)
        total = sum(t for t, _ in by_type.values())
        print(f"[{self.impl}] traced step {wall:.1f} ms wall, {total:.1f} ms summed op time")
        for kind, (t, c) in sorted(by_type.items(), key=lambda kv: -kv[1][0])[:top]:
            print(f"    {kind:<40} {t:9.1f} ms  {c:5d} ops")

    def close(self):
        self.sess.close()


def bench(args, dist):
    batches = make_batches(args, dist)
    impls = [i for i in args.impls.split(",") if i]
    runners = {}
    for impl in impls:
        runners[impl] = Runner(impl, args, batches)
        runners[impl].run(args.warmup, record=False)
    if args.profile:
        for impl in impls:
            for _ in range(2):
                runners[impl].profile(args.profile)
            runners[impl].close()
        return None, 0.0
    for _ in range(args.rounds):  # interleaved, so machine load hits every implementation alike
        for impl in impls:
            runners[impl].run(args.steps, record=True)
    med = {impl: statistics.median(r.times) * 1e3 for impl, r in runners.items()}
    cpu = {impl: statistics.median(r.cpu_times) * 1e3 for impl, r in runners.items()}
    for r in runners.values():
        r.close()
    n = args.batch * args.ids_per_field
    distinct = np.mean([len(np.unique(f)) for f in batches[0]])
    return (med, cpu), distinct / n


def main(argv=None):
    args = parse_args(argv)
    if args.horovod:
        sys.exit("--horovod: not implemented yet (see the module docstring)")
    tf.compat.v1.disable_eager_execution()
    print(f"fields={args.fields} ids/sample/field={args.ids_per_field} vocab/field={args.vocab} "
          f"dim={args.dim} batch={args.batch} hash_table={args.hash_table} "
          f"steps={args.rounds}x{args.steps} (after {args.warmup} warm-up), TF {tf.__version__}, "
          f"{os.cpu_count()} CPUs")
    impls = [i for i in args.impls.split(",") if i]
    others = [o for o in ("tf", "hash") if o in impls and "sok" in impls]
    header = (f"{'ids':<9} {'time':<5} {'distinct/ids':>12} " + " ".join(f"{i + ' ms':>9}" for i in impls)
              + "".join(f" {o + '/sok':>9}" for o in others))
    print(f"load average at start: {os.getloadavg()[0]:.2f}")
    print(header, flush=True)
    for dist in args.dists.split(","):
        res, frac = bench(args, dist)
        if res is None:
            continue
        for kind, med in zip(("wall", "cpu"), res):
            line = (f"{dist:<9} {kind:<5} {frac:>12.3f} " + " ".join(f"{med[i]:>9.1f}" for i in impls)
                    + "".join(f" {med[o] / med['sok']:>8.2f}x" for o in others))
            print(line, flush=True)
    print(f"load average at end: {os.getloadavg()[0]:.2f} (wall: median time per step; cpu: median "
          f"CPU time per step of all threads)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
