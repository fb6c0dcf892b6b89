"""Criteo benchmark: trains a DLRM-style CTR model on SOK Embedding Variables (TF1 graph mode),
evaluates it during and after training, and prints throughput, losses and AUC. It writes a metrics
file (JSON lines) and a plot of loss and AUC over steps to --out_dir; --save adds a checkpoint and a
serving SavedModel.

    # default: deterministic synthetic Criteo data
    .venv/bin/python benchmarks/criteo/run.py
    # real Kaggle Criteo lines (a few epochs over small files)
    ... run.py --data a.tsv,b.tsv --eval_data c.tsv --epochs 2 --batch_size 128 --optimizer adam \
        --min_count 2 --embedding_init 0.01
    # several workers
    horovodrun -np 2 ... run.py --horovod

Under --horovod, --batch_size is the global batch: every rank trains on rows rank::size of each
global batch; each rank differentiates its mean loss divided by the number of ranks, the dense
gradients are summed over ranks (sok.all_reduce), the Embedding Variables' rows and gradients are
exchanged (and summed on their owners) by SOK. Throughput is printed by rank 0 in global samples/s.
"""

import argparse
import concurrent.futures
import math
import os
import sys
import time
import types

import numpy as np

_T_START = time.time()
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, _HERE)
import data as criteo_data  # noqa: E402  (numpy only: --help stays fast)
import report  # noqa: E402

DEFAULT_OUT_DIR = os.path.join(os.path.dirname(os.path.dirname(_HERE)), "build", "criteo")


def _positive_int(s):
    v = int(s)
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {s}")
    return v


def _non_negative_int(s):
    v = int(s)
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {s}")
    return v


def _positive_float(s):
    v = float(s)
    if not v > 0 or not math.isfinite(v):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {s}")
    return v


def _non_negative_float(s):
    v = float(s)
    if not v >= 0 or not math.isfinite(v):
        raise argparse.ArgumentTypeError(f"must be >= 0, got {s}")
    return v


def _layer_sizes(s):
    try:
        sizes = [int(x) for x in s.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"must be comma-separated positive integers, got '{s}'"
        ) from None
    if any(v < 1 for v in sizes):
        raise argparse.ArgumentTypeError(f"must be comma-separated positive integers, got '{s}'")
    return sizes


def build_parser():
    p = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        argument_default=None,
    )
    # In this order in --help.
    for add in (_add_data_args, _add_batch_args, _add_model_args, _add_optimizer_args,
                _add_seed_args, _add_progress_args, _add_output_args, _add_runtime_args):
        add(p.add_argument)
    return p


def _add_data_args(a):
    """What to train and evaluate on."""
    a(
        "--data",
        default="synthetic",
        help="'synthetic' or comma-separated Criteo TSV files to train on (default: %(default)s)",
    )
    a(
        "--eval_data",
        help="Criteo TSV file(s) to evaluate on (real data); default: hold out the last 10%% of --data",
    )
    a(
        "--min_count",
        type=_positive_int,
        default=1,
        help="real data: ids seen fewer times in the training data share one 'rare' id per field "
        "(default: %(default)s = off)",
    )


def _add_batch_args(a):
    """Batch sizes and how long to train."""
    a(
        "--batch_size",
        type=_positive_int,
        default=2048,
        help="global batch size (default: %(default)s)",
    )
    a("--eval_batch_size", type=_positive_int, default=16384, help="(default: %(default)s)")
    a(
        "--steps",
        type=_positive_int,
        help="training steps (default: synthetic 600; real data: --epochs passes)",
    )
    a(
        "--epochs",
        type=_positive_float,
        default=1.0,
        help="passes over real training data (default: %(default)s)",
    )


def _add_model_args(a):
    """The DLRM model: embeddings, tables and MLPs."""
    a("--embedding_dim", type=_positive_int, default=16, help="(default: %(default)s)")
    a(
        "--embedding_init",
        type=_positive_float,
        help="new embedding rows start uniform in [-x, x] (default: 1/sqrt(embedding_dim))",
    )
    a(
        "--num_tables",
        type=int,
        default=26,
        choices=range(1, 27),
        metavar="{1..26}",
        help="Embedding Variables; fields share tables if < 26 (default: %(default)s)",
    )
    a(
        "--bottom_mlp",
        type=_layer_sizes,
        default=[64, 32],
        help="hidden sizes of the bottom MLP, which ends in embedding_dim (default: 64,32)",
    )
    a(
        "--top_mlp",
        type=_layer_sizes,
        default=[256, 128],
        help="hidden sizes of the top MLP, which ends in 1 (default: 256,128)",
    )


def _add_optimizer_args(a):
    """The optimizer and the loss's penalty."""
    a("--optimizer", choices=("adagrad", "adam"), default="adagrad", help="(default: %(default)s)")
    a("--learning_rate", type=_positive_float, help="default: adagrad 0.1, adam 0.001")
    a(
        "--adagrad_initial_accumulator",
        type=_positive_float,
        default=0.001,
        help="(default: %(default)s)",
    )
    a(
        "--embedding_l2",
        type=_non_negative_float,
        default=0.0,
        help="L2 penalty on the looked-up embedding rows, per sample summed over fields (default: %(default)s)",
    )


def _add_seed_args(a):
    """The seed and the synthetic data it generates."""
    a("--seed", type=int, default=0, help="(default: %(default)s)")
    a(
        "--synthetic_train_samples",
        type=_positive_int,
        help="size of the synthetic training split (default: steps * batch_size, one pass)",
    )
    a("--synthetic_eval_samples", type=_positive_int, default=131072, help="(default: %(default)s)")
    a(
        "--synthetic_via_tsv",
        action="store_true",
        help="route synthetic rows through Criteo TSV text and the reader",
    )


def _add_progress_args(a):
    """Timing, progress lines and evaluations during training."""
    a(
        "--warmup_steps",
        type=_non_negative_int,
        help="steps left out of the throughput; must leave at least one timed step (default: min(20, steps/5))",
    )
    a(
        "--log_every",
        type=_non_negative_int,
        default=100,
        help="progress line and metrics record every N steps; 0: none (default: %(default)s)",
    )
    a(
        "--eval_every",
        type=_non_negative_int,
        help="evaluate every N steps (AUC over steps in the metrics and plot); 0: only at the end "
        "(default: steps/4)",
    )


def _add_output_args(a):
    """Where the files go, and what is reported besides the summary."""
    a(
        "--out_dir",
        default=DEFAULT_OUT_DIR,
        help="where metrics.jsonl, plot.png and --save's files go (default: build/criteo in the repo)",
    )
    a("--no_plot", action="store_true", help="write no plot.png")
    a(
        "--profile",
        action="store_true",
        help="after training, trace 3 more steps and print the time per stage (input, embedding "
        "forward/backward/update, dense) on the GPU and on the host (also in metrics.jsonl)",
    )
    a(
        "--trace_dir",
        default=None,
        help="after training, record 5 more steps with TensorFlow's profiler (host ops and GPU "
        "kernels on one clock, little overhead) into this directory; "
        "benchmarks/common/timeline.py reads it",
    )


def _add_runtime_args(a):
    """How TensorFlow runs the job (XLA, ranks, threads, input path), and --save."""
    a(
        "--xla",
        action="store_true",
        help="let XLA compile the dense part (TensorFlow's auto-clustering, global_jit_level ON_1): "
        "the MLPs, interaction and loss run as a few fused kernels instead of ~250 ops; SOK's "
        "ops stay as they are",
    )
    a(
        "--save",
        action="store_true",
        help="also write a checkpoint (out_dir/checkpoint) and a serving SavedModel (out_dir/serving)",
    )
    a("--horovod", action="store_true", help="run under horovodrun (sok.init() initialises Horovod)")
    a(
        "--threads",
        type=_non_negative_int,
        default=0,
        help="TF intra/inter-op threads (default: 0 = TF's)",
    )
    a(
        "--input",
        choices=("auto", "dataset", "resident", "feed"),
        default="auto",
        help="training batches through tf.data with prefetching to the GPU, or feed_dict; auto: dataset "
        "when TensorFlow sees a GPU, else feed (faster on the CPU alone); resident: the training "
        "split is copied to the GPU once, each epoch's batch order too, and each step gathers its "
        "rows there (nothing travels per step) (default: %(default)s)",
    )


def parse_args(argv=None):
    p = build_parser()
    args = p.parse_args(argv)
    if args.data != "synthetic":
        for path in args.data.split(",") + (args.eval_data.split(",") if args.eval_data else []):
            if not os.path.isfile(path):
                p.error(f"--data/--eval_data: no such file: {path}")
    elif args.eval_data:
        p.error("--eval_data needs --data files (synthetic data has its own evaluation split)")
    if (
        args.data == "synthetic"
        and args.synthetic_train_samples is not None
        and args.synthetic_train_samples < args.batch_size
    ):
        p.error(
            f"--synthetic_train_samples {args.synthetic_train_samples} is smaller than one batch "
            f"(--batch_size {args.batch_size})"
        )
    if args.steps is not None and args.warmup_steps is not None and args.warmup_steps >= args.steps:
        p.error(
            f"--warmup_steps {args.warmup_steps} leaves no timed step out of --steps {args.steps}: "
            f"make it smaller than the steps"
        )
    if args.learning_rate is None:
        args.learning_rate = 0.1 if args.optimizer == "adagrad" else 0.001
    args.parser = p
    return args


def resolve_steps(args, steps_per_epoch):
    """Training steps, warm-up and evaluation cadence once the data size is known."""
    steps = args.steps
    if steps is None:
        steps = (
            600
            if args.data == "synthetic"
            else max(1, int(math.ceil(args.epochs * steps_per_epoch)))
        )
    if args.warmup_steps is None:
        warmup = min(20, steps // 5)
    elif args.warmup_steps >= steps:
        args.parser.error(
            f"--warmup_steps {args.warmup_steps} leaves no timed step out of {steps} training "
            f"steps: make it smaller than the steps"
        )
    else:
        warmup = args.warmup_steps
    eval_every = (
        args.eval_every if args.eval_every is not None else (steps // 4 if steps >= 8 else 0)
    )
    return steps, warmup, eval_every


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
        self.batches_per_epoch = max(1, n // batch_size)
        self._epoch = self._order = None  # batch(): the order of the epoch it is in
        self._next = None  # load_resident_order(): (epoch, the future drawing its order)
        self._drawer = None  # the thread that draws shuffled orders ahead

    def order(self, epoch):
        """The rows of `epoch` in the order its batches take them."""
        order = np.arange(self.n)
        if self.shuffle:
            np.random.default_rng([self.seed, epoch]).shuffle(order)
        return order

    def batch(self, step):
        """The global batch of training step `step` (the feed_dict input)."""
        epoch, b = divmod(step, self.batches_per_epoch)
        if self._epoch != epoch:
            self._epoch, self._order = epoch, self.order(epoch)
        return self._order[b * self.batch_size : (b + 1) * self.batch_size]

    def load_resident_order(self, resident, sess, step):
        """Before training step `step` with --input resident: at an epoch's first step, its order
        into device memory (graph.ResidentSplit). Shuffled epochs: the next epoch's order is drawn
        on another thread while this one trains; unshuffled ones load once."""
        epoch, b = divmod(step, self.batches_per_epoch)
        if b or (epoch and not self.shuffle):
            return
        ahead = self._next is not None and self._next[0] == epoch
        resident.load_order(sess, self._next[1].result() if ahead else self.order(epoch))
        if self.shuffle:
            self._drawer = self._drawer or concurrent.futures.ThreadPoolExecutor(1)
            self._next = (epoch + 1, self._drawer.submit(self.order, epoch + 1))

    def __iter__(self):  # the tf.data input's generator (its own thread, its own state)
        epoch = 0
        while True:
            order = self.order(epoch)
            for b in range(self.batches_per_epoch):
                yield order[b * self.batch_size : (b + 1) * self.batch_size]
            epoch += 1


def _sigmoid_xent(labels, logits):
    logits = np.asarray(logits, np.float64)
    return float(
        np.mean(np.maximum(logits, 0) - logits * labels + np.log1p(np.exp(-np.abs(logits))))
    )


# ---------------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------------
def evaluate(sess, g, evals, args, rank, size, auc):
    """(AUC, log loss, rows) over the whole evaluation split; every rank evaluates its slice of
    each batch (read-only lookups: nothing is inserted), rank 0 gathers all."""
    n_eval = criteo_data.num_rows(evals)
    all_logits, all_labels = [], []
    for start in range(0, n_eval, args.eval_batch_size):
        part = criteo_data.take(evals, slice(start, min(start + args.eval_batch_size, n_eval)))
        part = criteo_data.take(part, slice(rank, None, size))
        lg, lb = sess.run(g.eval_out, feed_dict=g.feed(part))
        all_logits.append(lg)
        all_labels.append(lb)
    logits, labels = np.concatenate(all_logits), np.concatenate(all_labels)
    return auc(labels, logits), _sigmoid_xent(labels, logits), int(labels.size)


def main(argv=None):
    args = parse_args(argv)
    job = _start(args)
    data = _load(args, job)
    g, schedule, dataset = _build_graph(args, job, data)
    metrics = _open_metrics(args, job, data)
    sess = _open_session(job, g, args)
    gpus = [d.name for d in job.tf.config.list_physical_devices("GPU")]
    before = job.sok.kernel_run_counts()
    if g.broadcast_op is not None:
        sess.run(g.broadcast_op)
    trained = _train(args, job, data, g, sess, schedule, dataset, metrics)
    _log_device(job, gpus, before)
    steps_per_sec, samples_per_sec = _throughput(args, data, trained)
    final = _final_evaluation(args, job, data, g, sess, metrics)
    # After the evaluation: the traced steps train too; what the run reports is of --steps steps.
    _profile(args, job, g, sess, dataset, metrics)
    _trace(args, job, g, sess, dataset)
    result = _result(data, trained, steps_per_sec, samples_per_sec, final)
    saved = g.save(sess, args.out_dir, job.rank, job.size) if args.save else None
    sess.close()
    result["wall_s"] = time.time() - _T_START
    metrics.write("summary", **result)
    metrics.close()
    _log_summary(args, job, data, result)
    _log_files(args, job, data, metrics, saved)
    _log_result_line(args, job, data, result)
    return result


def _start(args):
    """Loads TensorFlow and SOK (after the arguments are checked: --help stays fast), starts
    Horovod under --horovod and SOK. -> the job: tf, sok, rank, size, is_chief, log, ..."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import graph as criteo_graph
    import model as criteo_model
    import tensorflow as tf

    import sparse_operation_kit as sok

    tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.ERROR)
    hvd = None
    if args.horovod:
        try:
            import horovod.tensorflow as hvd
        except ImportError as e:
            raise SystemExit(f"--horovod needs Horovod ({e})") from None
    # sok.init() initialises Horovod itself, with the stall timeout that ends every rank with an
    # error when one dies or diverges.
    sok.init(use_horovod=hvd is not None)
    rank, size = sok.rank(), sok.num_ranks()
    is_chief = rank == 0

    def log(*a):
        if is_chief:
            print(*a, flush=True)

    if args.batch_size % size:
        args.parser.error(f"--batch_size {args.batch_size} is not a multiple of the {size} ranks")
    return types.SimpleNamespace(tf=tf, sok=sok, hvd=hvd, graph=criteo_graph, auc=criteo_model.auc,
                                 rank=rank, size=size, is_chief=is_chief, log=log)


def _load(args, job):
    """The data and the training length: train, evals, desc, n_train, load_s, steps_per_epoch,
    steps, warmup, eval_every."""
    t0 = time.time()
    train, evals, desc = load_data(args)
    n_train = criteo_data.num_rows(train)
    load_s = time.time() - t0
    steps_per_epoch = max(1, n_train // args.batch_size)
    steps, warmup, eval_every = resolve_steps(args, steps_per_epoch)
    job.log(
        f"data={desc} train_rows={n_train} (positives {train.labels.mean():.3f}) "
        f"eval_rows={criteo_data.num_rows(evals)} (positives {evals.labels.mean():.3f}) load_s={load_s:.1f}"
    )
    return types.SimpleNamespace(train=train, evals=evals, desc=desc, n_train=n_train,
                                 load_s=load_s, steps_per_epoch=steps_per_epoch, steps=steps,
                                 warmup=warmup, eval_every=eval_every)


def _build_graph(args, job, data):
    """(graph, the batch schedule, the tf.data input's maker or None for feed_dict and resident
    input)."""
    schedule = BatchSchedule(data.n_train, args.batch_size, args.seed,
                             shuffle=args.data != "synthetic")
    dataset = None
    if args.input == "auto":
        args.input = "dataset" if job.tf.config.list_physical_devices("GPU") else "feed"
    if args.input == "dataset":

        def dataset():
            return job.graph.train_dataset(data.train, iter(schedule), job.rank, job.size)

    resident = None
    if args.input == "resident":

        def resident():
            return job.graph.ResidentSplit(data.train, schedule, job.rank, job.size)

    g = job.graph.Graph(args, job.hvd, dataset, resident)
    job.log(
        f"model: DLRM dim={args.embedding_dim} tables={args.num_tables} "
        f"bottom={args.bottom_mlp + [args.embedding_dim]} "
        f"top={args.top_mlp + [1]} interactions={g.model.num_interactions} dense_params={g.num_dense_params} "
        f"optimizer={args.optimizer}(lr={args.learning_rate}) ranks={job.size}"
    )
    job.log(
        f"training: steps={data.steps} global_batch={args.batch_size} "
        f"local_batch={args.batch_size // job.size} "
        f"epochs={data.steps / data.steps_per_epoch:.2f} input={args.input} warmup={data.warmup} "
        f"eval_every={data.eval_every}"
    )
    return g, schedule, dataset


def _open_metrics(args, job, data):
    """The metrics file (rank 0 writes it), opened with the run's configuration."""
    metrics = report.MetricsLog(
        os.path.join(args.out_dir, "metrics.jsonl") if job.is_chief else None
    )
    metrics.write(
        "config",
        data=data.desc,
        ranks=job.size,
        steps=data.steps,
        warmup_steps=data.warmup,
        eval_every=data.eval_every,
        args={k: v for k, v in vars(args).items() if k != "parser"},
    )
    return metrics


def _open_session(job, g, args):
    """A Session on the graph, its variables initialized and its input started."""
    tf = job.tf
    config = tf.compat.v1.ConfigProto()
    # A Session's own ConfigProto overrides tf.config's visible devices (sok.init gave this rank
    # its GPU there): the same GPUs.
    config.gpu_options.visible_device_list = ",".join(
        d.name.rsplit(":", 1)[1] for d in tf.config.get_visible_devices("GPU"))
    if args.threads:
        config.intra_op_parallelism_threads = args.threads
        config.inter_op_parallelism_threads = args.threads
    if args.xla:
        config.graph_options.optimizer_options.global_jit_level = tf.compat.v1.OptimizerOptions.ON_1
    sess = tf.compat.v1.Session(graph=g.graph, config=config)
    sess.run(g.init_op)
    if g.resident is not None:
        sess.run(g.resident.initializer, feed_dict=g.resident.feed())
    if g.input_init is not None:
        sess.run(g.input_init)
    return sess


def _train(args, job, data, g, sess, schedule, dataset, metrics):
    """The training steps, with progress lines and evaluations every so often. -> losses,
    progress, t_timed (start of the timed steps), eval_s_timed (evaluations among them), t_end."""
    losses = []
    progress = report.Progress(data.steps, args.batch_size)
    t_timed = None
    eval_s_timed = 0.0  # evaluations inside the timed span are not training
    for step in range(data.steps):
        if step == data.warmup:
            t_timed = time.time()
            eval_s_timed = 0.0
        losses.append(_train_step(job, data, g, sess, schedule, dataset, step))
        done = step + 1
        if args.log_every and done % args.log_every == 0:
            _log_progress(args, job, data, metrics, progress, losses, done)
        if data.eval_every and done % data.eval_every == 0 and done < data.steps:
            eval_s_timed += _evaluate_during_training(args, job, data, g, sess, metrics, progress,
                                                      done)
    t_end = time.time()
    steps = data.steps
    if not args.log_every or steps % args.log_every:  # the last span, so the file covers every step
        rate, _, train_s = progress.update(steps)
        tail_n = steps % args.log_every if args.log_every else steps
        metrics.write(
            "train",
            step=steps,
            loss=float(np.mean(losses[-tail_n:])),
            samples_per_sec=rate,
            elapsed_s=train_s,
        )
    return types.SimpleNamespace(losses=losses, progress=progress, t_timed=t_timed,
                                 eval_s_timed=eval_s_timed, t_end=t_end)


def _train_step(job, data, g, sess, schedule, dataset, step):
    """One training step: its loss."""
    if g.resident is not None:
        schedule.load_resident_order(g.resident, sess, step)
        loss, _ = sess.run([g.report_loss, g.train_op])
    elif dataset is None:
        idx = schedule.batch(step)[job.rank :: job.size]  # this rank's slice of the global batch
        loss, _ = sess.run(
            [g.report_loss, g.train_op], feed_dict=g.feed(criteo_data.take(data.train, idx))
        )
    else:
        loss, _ = sess.run([g.report_loss, g.train_op])
    if not np.isfinite(loss):
        raise SystemExit(f"step {step}: loss is {loss}")
    return float(loss)


def _log_progress(args, job, data, metrics, progress, losses, done):
    rate, eta, train_s = progress.update(done)
    recent = float(np.mean(losses[-args.log_every :]))
    job.log(
        f"step {done}/{data.steps} ({100 * done / data.steps:.0f}%) loss={recent:.4f} "
        f"{rate:,.0f} samples/s ETA {report.format_eta(eta)}"
    )
    metrics.write("train", step=done, loss=recent, samples_per_sec=rate, elapsed_s=train_s)


def _evaluate_during_training(args, job, data, g, sess, metrics, progress, done):
    """An evaluation at step `done`, paused out of the progress. -> its seconds."""
    t_eval = time.time()
    auc, eval_loss, rows = evaluate(sess, g, data.evals, args, job.rank, job.size, job.auc)
    spent = time.time() - t_eval
    progress.pause(spent)
    job.log(
        f"eval at step {done}: AUC {auc:.4f} loss {eval_loss:.4f} ({rows} rows, {spent:.1f}s)"
    )
    metrics.write("eval", step=done, auc=auc, loss=eval_loss, rows=rows)
    return spent


def _log_device(job, gpus, before):
    ran = {d: n - before[d] for d, n in job.sok.kernel_run_counts().items()}
    job.log(
        f"device:     GPUs visible to TensorFlow: {gpus or 'none'}; SOK kernels run in training: "
        f"{ran['GPU']} on the GPU, {ran['CPU']} on the CPU"
    )


def _throughput(args, data, trained):
    """(steps/s, global samples/s) of the timed steps, evaluations left out."""
    timed_steps = data.steps - data.warmup
    train_s = trained.t_end - trained.t_timed - trained.eval_s_timed
    steps_per_sec = timed_steps / train_s if train_s > 0 else float("nan")
    return steps_per_sec, steps_per_sec * args.batch_size  # global samples


def _final_evaluation(args, job, data, g, sess, metrics):
    """The evaluation after training: eval_auc, eval_loss, eval_rows, eval_s, and the table
    rows on this rank."""
    t0 = time.time()
    eval_auc, eval_loss, eval_rows = evaluate(sess, g, data.evals, args, job.rank, job.size,
                                              job.auc)
    eval_s = time.time() - t0
    metrics.write("eval", step=data.steps, auc=eval_auc, loss=eval_loss, rows=eval_rows)
    table_rows = int(sess.run(g.table_size))
    return types.SimpleNamespace(eval_auc=eval_auc, eval_loss=eval_loss, eval_rows=eval_rows,
                                 eval_s=eval_s, table_rows=table_rows)


def _loss_tail(steps):
    """Over how many steps the first and the last training loss are averaged."""
    return max(1, min(50, steps // 5))


def _result(data, trained, steps_per_sec, samples_per_sec, final):
    """The run's result (what main returns; wall_s is added at the end)."""
    losses, progress = trained.losses, trained.progress
    tail = _loss_tail(len(losses))
    return {
        "samples_per_sec": samples_per_sec,
        "steps_per_sec": steps_per_sec,
        "train_loss_first": float(np.mean(losses[:tail])),
        "train_loss": float(np.mean(losses[-tail:])),
        "eval_loss": final.eval_loss,
        "eval_auc": final.eval_auc,
        "eval_rows": final.eval_rows,
        "steps": data.steps,
        "train_s": trained.t_end - progress.t0 - progress.paused_s,  # evaluations left out
        "eval_s": final.eval_s,
        "table_rows": final.table_rows,
    }


def _profile(args, job, g, sess, dataset, metrics):
    """--profile: traces 3 more steps and logs (and records) the time per stage and top ops."""
    if args.profile and (dataset is not None or g.resident is not None):
        import profile as criteo_profile  # noqa: E402  (benchmarks/criteo/profile.py)

        stages, wall_ms, busy_ms, recs = criteo_profile.profile_steps(
            sess, [g.report_loss, g.train_op], g.graph
        )
        for line in criteo_profile.format_profile(stages, wall_ms, busy_ms):
            job.log(line)
        for line in criteo_profile.top_ops(recs):
            job.log(line)
        metrics.write("profile", wall_ms=wall_ms, gpu_busy_ms=busy_ms,
                      stages={s: dict(zip(("gpu_ms", "kernels", "host_ms", "ops"), v))
                              for s, v in stages.items()})
    elif args.profile:
        job.log("profile:    needs --input dataset or resident (feed_dict steps are not traced)")


def _trace(args, job, g, sess, dataset, steps=5):
    """--trace_dir: a few steps under TensorFlow's profiler, per rank (rank_<r> below the dir)."""
    if not args.trace_dir:
        return
    if dataset is None and g.resident is None:
        job.log("trace:      needs --input dataset or resident (feed_dict steps are not traced)")
        return
    tf = job.tf
    logdir = os.path.join(args.trace_dir, f"rank_{job.rank}")
    sess.run([g.report_loss, g.train_op])  # not traced: the profiler's first step costs more
    options = tf.profiler.experimental.ProfilerOptions(host_tracer_level=2, python_tracer_level=0,
                                                       device_tracer_level=1)
    tf.profiler.experimental.start(logdir, options=options)
    for _ in range(steps):
        sess.run([g.report_loss, g.train_op])
    tf.profiler.experimental.stop()
    job.log(f"trace:      {steps} steps of each rank in {args.trace_dir}")


def _log_summary(args, job, data, result):
    log, tail, r = job.log, _loss_tail(data.steps), result
    log("==== Criteo benchmark summary ====")
    log(f"data:       {data.desc}, {data.n_train} training rows, {r['eval_rows']} evaluation rows")
    log(
        f"throughput: {r['samples_per_sec']:.0f} samples/s, {r['steps_per_sec']:.2f} steps/s "
        f"(global batch {args.batch_size}, {job.size} rank(s), {data.steps - data.warmup} of "
        f"{data.steps} steps timed: first {data.warmup} left out)"
    )
    log(
        f"train loss: {r['train_loss_first']:.4f} (first {tail} steps) -> {r['train_loss']:.4f} "
        f"(last {tail} steps)"
    )
    log(f"eval:       loss {r['eval_loss']:.4f}, AUC {r['eval_auc']:.4f}")
    log(
        f"time:       training {r['train_s']:.1f}s, evaluation {r['eval_s']:.1f}s, loading "
        f"{data.load_s:.1f}s, wall {r['wall_s']:.1f}s; embedding rows on rank {job.rank}: "
        f"{r['table_rows']}"
    )


def _log_files(args, job, data, metrics, saved):
    """Rank 0: draws the plot and lists the files the run wrote."""
    if not job.is_chief:
        return
    files = [metrics.path]
    if not args.no_plot:
        files.append(
            report.plot(
                metrics.path,
                os.path.join(args.out_dir, "plot.png"),
                title=f"Criteo DLRM on SOK: {data.desc}, batch {args.batch_size}",
            )
        )
    if saved is not None:
        ckpt, serving, note = saved
        files += [ckpt] + ([serving] if serving else [])
        if note:
            job.log(f"note:       {note}")
    job.log("files:      " + ", ".join(files))


def _log_result_line(args, job, data, result):
    """The RESULT line that scripts and tests parse."""
    job.log(
        f"RESULT data={data.desc} ranks={job.size} steps={data.steps} batch_size={args.batch_size} "
        f"samples_per_sec={result['samples_per_sec']:.0f} steps_per_sec={result['steps_per_sec']:.2f} "
        f"train_loss_first={result['train_loss_first']:.4f} train_loss={result['train_loss']:.4f} "
        f"eval_loss={result['eval_loss']:.4f} eval_auc={result['eval_auc']:.4f} wall_s={result['wall_s']:.1f}"
    )


if __name__ == "__main__":
    main()
