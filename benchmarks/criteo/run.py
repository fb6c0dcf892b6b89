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
    a = p.add_argument
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
    a("--horovod", action="store_true", help="run under horovodrun (hvd.init() before sok.init())")
    a(
        "--threads",
        type=_non_negative_int,
        default=0,
        help="TF intra/inter-op threads (default: 0 = TF's)",
    )
    a(
        "--input",
        choices=("auto", "dataset", "feed"),
        default="auto",
        help="training batches through tf.data with prefetching to the GPU, or feed_dict; auto: dataset "
        "when TensorFlow sees a GPU, else feed (faster on the CPU alone) (default: %(default)s)",
    )
    return p


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

    def __iter__(self):
        epoch = 0
        while True:
            order = np.arange(self.n)
            if self.shuffle:
                np.random.default_rng([self.seed, epoch]).shuffle(order)
            for start in range(
                0, self.n - self.batch_size + 1 if self.n >= self.batch_size else 1, self.batch_size
            ):
                yield order[start : start + self.batch_size]
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
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import graph as criteo_graph  # TensorFlow and SOK load here, after the arguments are checked
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
        hvd.init()
    sok.init(use_horovod=hvd is not None)
    rank, size = sok.rank(), sok.num_ranks()
    is_chief = rank == 0

    def log(*a):
        if is_chief:
            print(*a, flush=True)

    if args.batch_size % size:
        args.parser.error(f"--batch_size {args.batch_size} is not a multiple of the {size} ranks")

    t0 = time.time()
    train, evals, desc = load_data(args)
    n_train = criteo_data.num_rows(train)
    load_s = time.time() - t0
    steps_per_epoch = max(1, n_train // args.batch_size)
    steps, warmup, eval_every = resolve_steps(args, steps_per_epoch)
    log(
        f"data={desc} train_rows={n_train} (positives {train.labels.mean():.3f}) "
        f"eval_rows={criteo_data.num_rows(evals)} (positives {evals.labels.mean():.3f}) load_s={load_s:.1f}"
    )

    schedule = iter(
        BatchSchedule(n_train, args.batch_size, args.seed, shuffle=args.data != "synthetic")
    )
    dataset = None
    if args.input == "auto":
        args.input = "dataset" if tf.config.list_physical_devices("GPU") else "feed"
    if args.input == "dataset":

        def dataset():
            return criteo_graph.train_dataset(train, schedule, rank, size)

    g = criteo_graph.Graph(args, hvd, dataset)
    log(
        f"model: DLRM dim={args.embedding_dim} tables={args.num_tables} "
        f"bottom={args.bottom_mlp + [args.embedding_dim]} "
        f"top={args.top_mlp + [1]} interactions={g.model.num_interactions} dense_params={g.num_dense_params} "
        f"optimizer={args.optimizer}(lr={args.learning_rate}) ranks={size}"
    )
    log(
        f"training: steps={steps} global_batch={args.batch_size} local_batch={args.batch_size // size} "
        f"epochs={steps / steps_per_epoch:.2f} input={args.input} warmup={warmup} eval_every={eval_every}"
    )
    metrics = report.MetricsLog(os.path.join(args.out_dir, "metrics.jsonl") if is_chief else None)
    metrics.write(
        "config",
        data=desc,
        ranks=size,
        steps=steps,
        warmup_steps=warmup,
        eval_every=eval_every,
        args={k: v for k, v in vars(args).items() if k != "parser"},
    )

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
    if g.input_init is not None:
        sess.run(g.input_init)
    gpus = [d.name for d in tf.config.list_physical_devices("GPU")]
    before = sok.kernel_run_counts()
    if g.broadcast_op is not None:
        sess.run(g.broadcast_op)

    losses = []
    progress = report.Progress(steps, args.batch_size)
    t_timed = None
    eval_s_timed = 0.0  # evaluations inside the timed span are not training
    for step in range(steps):
        if step == warmup:
            t_timed = time.time()
            eval_s_timed = 0.0
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
        done = step + 1
        if args.log_every and done % args.log_every == 0:
            rate, eta, train_s = progress.update(done)
            recent = float(np.mean(losses[-args.log_every :]))
            log(
                f"step {done}/{steps} ({100 * done / steps:.0f}%) loss={recent:.4f} "
                f"{rate:,.0f} samples/s ETA {report.format_eta(eta)}"
            )
            metrics.write("train", step=done, loss=recent, samples_per_sec=rate, elapsed_s=train_s)
        if eval_every and done % eval_every == 0 and done < steps:
            t_eval = time.time()
            auc, eval_loss, rows = evaluate(sess, g, evals, args, rank, size, criteo_model.auc)
            spent = time.time() - t_eval
            progress.pause(spent)
            eval_s_timed += spent
            log(
                f"eval at step {done}: AUC {auc:.4f} loss {eval_loss:.4f} ({rows} rows, {spent:.1f}s)"
            )
            metrics.write("eval", step=done, auc=auc, loss=eval_loss, rows=rows)
    t_end = time.time()
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
    ran = {d: n - before[d] for d, n in sok.kernel_run_counts().items()}
    log(
        f"device:     GPUs visible to TensorFlow: {gpus or 'none'}; SOK kernels run in training: "
        f"{ran['GPU']} on the GPU, {ran['CPU']} on the CPU"
    )
    timed_steps = steps - warmup
    train_s = t_end - t_timed - eval_s_timed
    steps_per_sec = timed_steps / train_s if train_s > 0 else float("nan")
    samples_per_sec = steps_per_sec * args.batch_size  # global samples

    t0 = time.time()
    eval_auc, eval_loss, eval_rows = evaluate(sess, g, evals, args, rank, size, criteo_model.auc)
    eval_s = time.time() - t0
    metrics.write("eval", step=steps, auc=eval_auc, loss=eval_loss, rows=eval_rows)
    table_rows = int(sess.run(g.table_size))
    # After the evaluation: the traced steps train too; what the run reports is of --steps steps.
    if args.profile and dataset is not None:
        import profile as criteo_profile  # noqa: E402  (benchmarks/criteo/profile.py)

        stages, wall_ms, busy_ms, recs = criteo_profile.profile_steps(
            sess, [g.report_loss, g.train_op], g.graph
        )
        for line in criteo_profile.format_profile(stages, wall_ms, busy_ms):
            log(line)
        for line in criteo_profile.top_ops(recs):
            log(line)
        metrics.write("profile", wall_ms=wall_ms, gpu_busy_ms=busy_ms,
                      stages={s: dict(zip(("gpu_ms", "kernels", "host_ms", "ops"), v))
                              for s, v in stages.items()})
    elif args.profile:
        log("profile:    needs --input dataset (feed_dict steps are not traced)")
    tail = max(1, min(50, len(losses) // 5))
    result = {
        "samples_per_sec": samples_per_sec,
        "steps_per_sec": steps_per_sec,
        "train_loss_first": float(np.mean(losses[:tail])),
        "train_loss": float(np.mean(losses[-tail:])),
        "eval_loss": eval_loss,
        "eval_auc": eval_auc,
        "eval_rows": eval_rows,
        "steps": steps,
        "train_s": t_end - progress.t0 - progress.paused_s,  # evaluations left out
        "eval_s": eval_s,
        "table_rows": table_rows,
    }
    saved = None
    if args.save:
        saved = g.save(sess, args.out_dir, rank, size)
    sess.close()
    result["wall_s"] = time.time() - _T_START
    metrics.write("summary", **result)
    metrics.close()
    log("==== Criteo benchmark summary ====")
    log(f"data:       {desc}, {n_train} training rows, {result['eval_rows']} evaluation rows")
    log(
        f"throughput: {samples_per_sec:.0f} samples/s, {steps_per_sec:.2f} steps/s (global batch {args.batch_size}, "
        f"{size} rank(s), {timed_steps} of {steps} steps timed: first {warmup} left out)"
    )
    log(
        f"train loss: {result['train_loss_first']:.4f} (first {tail} steps) -> {result['train_loss']:.4f} "
        f"(last {tail} steps)"
    )
    log(f"eval:       loss {result['eval_loss']:.4f}, AUC {result['eval_auc']:.4f}")
    log(
        f"time:       training {result['train_s']:.1f}s, evaluation {eval_s:.1f}s, loading {load_s:.1f}s, "
        f"wall {result['wall_s']:.1f}s; embedding rows on rank {rank}: {result['table_rows']}"
    )
    if is_chief:
        files = [metrics.path]
        if not args.no_plot:
            files.append(
                report.plot(
                    metrics.path,
                    os.path.join(args.out_dir, "plot.png"),
                    title=f"Criteo DLRM on SOK: {desc}, batch {args.batch_size}",
                )
            )
        if saved is not None:
            ckpt, serving, note = saved
            files += [ckpt] + ([serving] if serving else [])
            if note:
                log(f"note:       {note}")
        log("files:      " + ", ".join(files))
    log(
        f"RESULT data={desc} ranks={size} steps={steps} batch_size={args.batch_size} "
        f"samples_per_sec={samples_per_sec:.0f} steps_per_sec={steps_per_sec:.2f} "
        f"train_loss_first={result['train_loss_first']:.4f} train_loss={result['train_loss']:.4f} "
        f"eval_loss={result['eval_loss']:.4f} eval_auc={result['eval_auc']:.4f} wall_s={result['wall_s']:.1f}"
    )
    return result


if __name__ == "__main__":
    main()
