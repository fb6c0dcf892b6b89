"""Criteo benchmark: trains a DLRM-style CTR model on SOK Embedding Variables (TF1 graph mode),
then evaluates it, and prints throughput, losses and AUC.

    # default: deterministic synthetic Criteo data
    PYTHONPATH=addons/sparse_operation_kit/python .venv/bin/python benchmarks/criteo/run.py
    # real Kaggle Criteo lines (a few epochs over small files)
    ... run.py --data a.tsv,b.tsv --eval_data c.tsv --epochs 2 --batch_size 128 --optimizer adam \
        --min_count 2 --embedding_init 0.01
    # several workers (needs SOK's multi-rank support)
    horovodrun -np 2 ... run.py --horovod

Under --horovod, --batch_size is the global batch: every rank trains on rows rank::size of each
global batch; dense gradients are averaged over ranks (hvd.allreduce), the Embedding Variables'
rows and gradients are exchanged by SOK. Throughput is printed by rank 0 in global samples/s.
"""
import argparse
import math
import os
import sys
import time

import numpy as np

_T_START = time.time()
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import data as criteo_data  # noqa: E402
import model as criteo_model  # noqa: E402
import tensorflow as tf  # noqa: E402

import sparse_operation_kit as sok  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--data",
        default="synthetic",
        help="'synthetic' (default) or comma-separated Criteo TSV files to train on",
    )
    p.add_argument(
        "--eval_data",
        default=None,
        help="Criteo TSV file(s) to evaluate on (real data); default: hold out the last 10%% of "
             "--data",
    )
    p.add_argument(
        "--min_count",
        type=int,
        default=1,
        help="real data: ids seen fewer times in the training data share one 'rare' id per field "
             "(1: off)",
    )
    p.add_argument("--batch_size", type=int, default=2048, help="global batch size")
    p.add_argument("--eval_batch_size", type=int, default=16384)
    p.add_argument(
        "--steps",
        type=int,
        default=None,
        help="training steps (synthetic default 600; real data default: --epochs passes)",
    )
    p.add_argument(
        "--epochs", type=float, default=1.0, help="passes over the training data (real data)"
    )
    p.add_argument("--embedding_dim", type=int, default=16)
    p.add_argument(
        "--embedding_init",
        type=float,
        default=None,
        help="new embedding rows start uniform in [-x, x] (default 1/sqrt(embedding_dim))",
    )
    p.add_argument(
        "--num_tables",
        type=int,
        default=26,
        help="Embedding Variables (fields share tables if < 26)",
    )
    p.add_argument(
        "--bottom_mlp",
        default="64,32",
        help="hidden sizes of the bottom MLP (it ends in embedding_dim)",
    )
    p.add_argument(
        "--top_mlp", default="256,128", help="hidden sizes of the top MLP (it ends in 1)"
    )
    p.add_argument("--optimizer", choices=("adagrad", "adam"), default="adagrad")
    p.add_argument(
        "--learning_rate", type=float, default=None, help="default: adagrad 0.1, adam 0.001"
    )
    p.add_argument("--adagrad_initial_accumulator", type=float, default=0.001)
    p.add_argument(
        "--embedding_l2",
        type=float,
        default=0.0,
        help="L2 penalty on the looked-up embedding rows (per sample, summed over fields)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--synthetic_train_samples",
        type=int,
        default=None,
        help="size of the synthetic training split (default: steps * batch_size, one pass)",
    )
    p.add_argument("--synthetic_eval_samples", type=int, default=131072)
    p.add_argument("--synthetic_via_tsv", action="store_true",
                   help="route synthetic rows through Criteo TSV text and the TSV reader")
    p.add_argument("--warmup_steps", type=int, default=20, help="steps left out of the throughput")
    p.add_argument("--log_every", type=int, default=100)
    p.add_argument(
        "--horovod", action="store_true", help="run under horovodrun (hvd.init() before sok.init())"
    )
    p.add_argument(
        "--threads", type=int, default=0, help="TF intra/inter-op threads (0: TF's default)"
    )
    p.add_argument(
        "--input",
        choices=("auto", "dataset", "feed"),
        default="auto",
        help="training batches through tf.data with prefetching to the GPU, or feed_dict; "
        "auto: dataset when TensorFlow sees a GPU, else feed (faster on the CPU alone)",
    )
    args = p.parse_args(argv)
    if args.learning_rate is None:
        args.learning_rate = 0.1 if args.optimizer == "adagrad" else 0.001
    args.bottom_mlp = [int(x) for x in args.bottom_mlp.split(",") if x]
    args.top_mlp = [int(x) for x in args.top_mlp.split(",") if x]
    return args


# ---------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------
def _synthetic_split(gen, split, n, via_tsv):
    if not via_tsv:
        return gen.batch(split, 0, n)
    chunks, step = [], 65536
    for start in range(0, n, step):
        chunks.append(criteo_data.parse_lines(gen.tsv_lines(split, start, min(step, n - start))))
    return criteo_data.featurize(criteo_data.concat_raw(chunks))


def load_data(args):
    """(train Batch, eval Batch, description). Every rank loads the same global data."""
    if args.data == "synthetic":
        gen = criteo_data.SyntheticCriteo(args.seed)
        steps = args.steps if args.steps is not None else 600
        n_train = args.synthetic_train_samples or steps * args.batch_size
        train = _synthetic_split(gen, 0, n_train, args.synthetic_via_tsv)
        evals = _synthetic_split(gen, 1, args.synthetic_eval_samples, args.synthetic_via_tsv)
        return train, evals, f"synthetic(seed={args.seed})"
    train = criteo_data.read_tsv(args.data)
    if args.eval_data:
        evals = criteo_data.read_tsv(args.eval_data)
    else:
        n = criteo_data.num_rows(train)
        cut = n - max(1, n // 10)
        train, evals = (
            criteo_data.take(train, slice(0, cut)),
            criteo_data.take(train, slice(cut, n)),
        )
    train, (evals,) = criteo_data.apply_min_count(train, [evals], args.min_count)
    return train, evals, args.data


class BatchSchedule:
    """Global batches over `epochs` shuffled passes (seeded); yields index arrays."""

    def __init__(self, n, batch_size, seed, shuffle):
        self.n, self.batch_size, self.seed, self.shuffle = n, batch_size, seed, shuffle

    def __iter__(self):
        epoch = 0
        while True:
            order = np.arange(self.n)
            if self.shuffle:
                np.random.default_rng([self.seed, epoch]).shuffle(order)
            for start in range(0, self.n - self.batch_size + 1 if self.n >= self.batch_size else 1,
                               self.batch_size):
                yield order[start:start + self.batch_size]
            epoch += 1


# ---------------------------------------------------------------------------------------------
# Graph
# ---------------------------------------------------------------------------------------------
def _average_over_ranks(hvd, grad, var):
    """The gradient of the global batch's mean loss from this rank's local-mean gradient.

    Dense variables: hvd.allreduce average. Embedding Variables: SOK's exchange already sends
    every rank's per-key gradient to the key's owner, where they add up, so only the 1/size of
    the average is left to apply.
    """
    if grad is None:
        return None
    if isinstance(var, sok.EmbeddingVariable):
        return tf.IndexedSlices(grad.values / hvd.size(), grad.indices, grad.dense_shape)
    return hvd.allreduce(grad, op=hvd.Average)


_BATCH_SIGNATURE = (
    tf.TensorSpec([None, criteo_data.NUM_DENSE], tf.float32),
    tf.TensorSpec([None, criteo_data.NUM_CAT], tf.int64),
    tf.TensorSpec([None], tf.float32),
)


def train_dataset(train, batches, rank, size):
    """This rank's training batches as a tf.data pipeline: numpy slicing runs in tf.data's thread
    while the previous step trains, and batches are copied to the GPU ahead of use."""
    def generate():
        for idx in batches:
            b = criteo_data.take(train, idx[rank::size])
            yield b.dense, b.ids, b.labels
    ds = tf.data.Dataset.from_generator(generate, output_signature=_BATCH_SIGNATURE).prefetch(2)
    gpus = tf.config.list_logical_devices("GPU")
    if gpus:
        ds = ds.apply(tf.data.experimental.prefetch_to_device(gpus[0].name, buffer_size=2))
    return ds


class Graph:
    def __init__(self, args, hvd, dataset=None):
        self.graph = tf.Graph()
        with self.graph.as_default():
            tf.compat.v1.set_random_seed(args.seed)
            self.dense = tf.compat.v1.placeholder(
                tf.float32, [None, criteo_data.NUM_DENSE], "dense"
            )
            self.ids = tf.compat.v1.placeholder(tf.int64, [None, criteo_data.NUM_CAT], "ids")
            self.labels = tf.compat.v1.placeholder(tf.float32, [None], "labels")
            self.model = criteo_model.DLRM(
                args.embedding_dim,
                args.num_tables,
                args.bottom_mlp,
                args.top_mlp,
                seed=args.seed,
                embedding_init=args.embedding_init,
            )
            self.input_init = None
            if dataset is None:
                dense, ids, labels = self.dense, self.ids, self.labels
            else:
                it = tf.compat.v1.data.make_initializable_iterator(dataset())
                self.input_init = it.initializer
                dense, ids, labels = it.get_next()
            logits = self.model(dense, ids, training=True)
            self.loss = tf.reduce_mean(
                tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits)
            )
            objective = self.loss
            if args.embedding_l2 > 0:
                penalty = tf.add_n(
                    [tf.reduce_sum(tf.square(e), axis=1) for e in self.model.embeddings]
                )
                objective = objective + args.embedding_l2 * tf.reduce_mean(penalty)
            if args.optimizer == "adagrad":
                base = tf.compat.v1.train.AdagradOptimizer(
                    args.learning_rate, args.adagrad_initial_accumulator
                )
            else:
                base = tf.compat.v1.train.AdamOptimizer(args.learning_rate)
            opt = sok.OptimizerWrapper(base)
            grads_and_vars = opt.compute_gradients(objective)
            if hvd is not None and hvd.size() > 1:
                grads_and_vars = [(_average_over_ranks(hvd, g, v), v) for g, v in grads_and_vars]
            self.global_step = tf.compat.v1.train.get_or_create_global_step()
            self.train_op = opt.apply_gradients(grads_and_vars, global_step=self.global_step)
            # Reported loss: the global batch's mean (equal local batches) under Horovod.
            self.report_loss = (
                self.loss if hvd is None else hvd.allreduce(self.loss, op=hvd.Average)
            )
            self.eval_logits = self.model(self.dense, self.ids, training=False)
            self.eval_out = [self.eval_logits, self.labels]
            if hvd is not None:
                self.eval_out = [hvd.allgather(self.eval_logits), hvd.allgather(self.labels)]
            self.init_op = tf.compat.v1.group(tf.compat.v1.global_variables_initializer(),
                                              tf.compat.v1.local_variables_initializer())
            self.broadcast_op = None
            if hvd is not None:
                _, dense_vars = sok.filter_variables(tf.compat.v1.global_variables())
                self.broadcast_op = hvd.broadcast_variables(dense_vars, root_rank=0)
            self.table_size = tf.add_n([tf.cast(t.size(), tf.int64) for t in self.model.tables])
            self.num_dense_params = int(sum(np.prod(v.shape.as_list())
                                            for v in tf.compat.v1.trainable_variables()
                                            if not isinstance(v, sok.EmbeddingVariable)))

    def feed(self, batch):
        return {self.dense: batch.dense, self.ids: batch.ids, self.labels: batch.labels}


def _sigmoid_xent(labels, logits):
    logits = np.asarray(logits, np.float64)
    return float(
        np.mean(np.maximum(logits, 0) - logits * labels + np.log1p(np.exp(-np.abs(logits))))
    )


# ---------------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------------
def main(argv=None):
    args = parse_args(argv)
    tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.ERROR)
    hvd = None
    if args.horovod:
        try:
            import horovod.tensorflow as hvd
        except ImportError as e:
            raise SystemExit(f"--horovod needs Horovod ({e})") from e
        hvd.init()
    sok.init(use_horovod=True if hvd is not None else False)
    rank, size = sok.rank(), sok.num_ranks()
    is_chief = rank == 0

    def log(*a):
        if is_chief:
            print(*a, flush=True)

    if args.batch_size % size:
        raise SystemExit(f"--batch_size {args.batch_size} is not a multiple of the {size} ranks")

    t0 = time.time()
    train, evals, desc = load_data(args)
    n_train = criteo_data.num_rows(train)
    load_s = time.time() - t0
    steps_per_epoch = max(1, n_train // args.batch_size)
    steps = args.steps
    if steps is None:
        steps = max(1, int(math.ceil(args.epochs * steps_per_epoch)))
    log(
        f"data={desc} train_rows={n_train} (positives {train.labels.mean():.3f}) "
        f"eval_rows={criteo_data.num_rows(evals)} (positives {evals.labels.mean():.3f}) "
        f"load_s={load_s:.1f}"
    )

    schedule = iter(
        BatchSchedule(n_train, args.batch_size, args.seed, shuffle=args.data != "synthetic")
    )
    dataset = None
    if args.input == "auto":
        args.input = "dataset" if tf.config.list_physical_devices("GPU") else "feed"
    if args.input == "dataset":
        def dataset():
            return train_dataset(train, schedule, rank, size)

    g = Graph(args, hvd, dataset)
    log(
        f"model: DLRM dim={args.embedding_dim} tables={args.num_tables} "
        f"bottom={args.bottom_mlp + [args.embedding_dim]} "
        f"top={args.top_mlp + [1]} interactions={g.model.num_interactions} "
        f"dense_params={g.num_dense_params} "
        f"optimizer={args.optimizer}(lr={args.learning_rate}) ranks={size}"
    )
    log(
        f"training: steps={steps} global_batch={args.batch_size} "
        f"local_batch={args.batch_size // size} "
        f"epochs={steps / steps_per_epoch:.2f} input={args.input}"
    )

    config = tf.compat.v1.ConfigProto()
    if args.threads:
        config.intra_op_parallelism_threads = args.threads
        config.inter_op_parallelism_threads = args.threads
    sess = tf.compat.v1.Session(graph=g.graph, config=config)
    sess.run(g.init_op)
    if g.input_init is not None:
        sess.run(g.input_init)
    gpus = [d.name for d in tf.config.list_physical_devices("GPU")]
    before = sok.kernel_run_counts()
    if g.broadcast_op is not None:
        sess.run(g.broadcast_op)

    losses = []
    warmup = min(args.warmup_steps, max(0, steps - 1))
    t_start = time.time()
    t_timed = None
    for step in range(steps):
        if step == warmup:
            t_timed = time.time()
        if dataset is None:
            idx = next(schedule)[rank::size]  # this rank's slice of the global batch
            loss, _ = sess.run(
                [g.report_loss, g.train_op], feed_dict=g.feed(criteo_data.take(train, idx))
            )
        else:
            loss, _ = sess.run([g.report_loss, g.train_op])
        if not np.isfinite(loss):
            raise SystemExit(f"step {step}: loss is {loss}")
        losses.append(float(loss))
        if args.log_every and (step + 1) % args.log_every == 0:
            recent = np.mean(losses[-args.log_every:])
            log(f"step {step + 1}/{steps} loss={recent:.4f} elapsed={time.time() - t_start:.1f}s")
    t_end = time.time()
    ran = {d: n - before[d] for d, n in sok.kernel_run_counts().items()}
    log(f"device:     GPUs visible to TensorFlow: {gpus or 'none'}; SOK kernels run in training: "
        f"{ran['GPU']} on the GPU, {ran['CPU']} on the CPU")
    timed_steps = steps - warmup
    train_s = t_end - t_timed
    steps_per_sec = timed_steps / train_s if train_s > 0 else float("nan")
    samples_per_sec = steps_per_sec * args.batch_size  # global samples

    # Evaluation: every rank evaluates its slice of each global eval batch; rank 0 gathers all.
    t0 = time.time()
    n_eval = criteo_data.num_rows(evals)
    all_logits, all_labels = [], []
    for start in range(0, n_eval, args.eval_batch_size):
        part = criteo_data.take(evals, slice(start, min(start + args.eval_batch_size, n_eval)))
        part = criteo_data.take(part, slice(rank, None, size))
        lg, lb = sess.run(g.eval_out, feed_dict=g.feed(part))
        all_logits.append(lg)
        all_labels.append(lb)
    eval_s = time.time() - t0
    logits = np.concatenate(all_logits)
    labels = np.concatenate(all_labels)
    tail = max(1, min(50, len(losses) // 5))
    result = {
        "samples_per_sec": samples_per_sec,
        "steps_per_sec": steps_per_sec,
        "train_loss_first": float(np.mean(losses[:tail])),
        "train_loss": float(np.mean(losses[-tail:])),
        "eval_loss": _sigmoid_xent(labels, logits),
        "eval_auc": criteo_model.auc(labels, logits),
        "eval_rows": int(labels.size),
        "steps": steps,
        "train_s": t_end - t_start,
        "eval_s": eval_s,
        "table_rows": int(sess.run(g.table_size)),
    }
    sess.close()
    result["wall_s"] = time.time() - _T_START
    log("==== Criteo benchmark summary ====")
    log(f"data:       {desc}, {n_train} training rows, {result['eval_rows']} evaluation rows")
    log(
        f"throughput: {samples_per_sec:.0f} samples/s, {steps_per_sec:.2f} steps/s (global batch "
        f"{args.batch_size}, "
        f"{size} rank(s), {timed_steps} of {steps} steps timed: first {warmup} left out)"
    )
    log(
        f"train loss: {result['train_loss_first']:.4f} (first {tail} steps) -> "
        f"{result['train_loss']:.4f} "
        f"(last {tail} steps)"
    )
    log(f"eval:       loss {result['eval_loss']:.4f}, AUC {result['eval_auc']:.4f}")
    log(
        f"time:       training {result['train_s']:.1f}s, evaluation {eval_s:.1f}s, loading "
        f"{load_s:.1f}s, "
        f"wall {result['wall_s']:.1f}s; embedding rows on rank {rank}: {result['table_rows']}"
    )
    log(
        f"RESULT data={desc} ranks={size} steps={steps} batch_size={args.batch_size} "
        f"samples_per_sec={samples_per_sec:.0f} steps_per_sec={steps_per_sec:.2f} "
        f"train_loss_first={result['train_loss_first']:.4f} train_loss={result['train_loss']:.4f} "
        f"eval_loss={result['eval_loss']:.4f} eval_auc={result['eval_auc']:.4f} "
        f"wall_s={result['wall_s']:.1f}"
    )
    return result


if __name__ == "__main__":
    main()
