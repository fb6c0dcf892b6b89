"""Embedding-layer training-step benchmark: SOK vs. stock TensorFlow, on the CPU or the GPU, in
TF1 graph mode (Session) and TF2 tf.function mode, plus the framework-free CUDA harness.

One step = forward (pooled "sum" lookup of every field), the loss, backward and an Adagrad
update. The loss is a weightless stand-in (sum of the squared pooled embeddings) or, with --mlp
WIDTHS, a dense part every implementation shares (impls.Mlp): on the pooled embeddings side by
side, one ReLU layer per width, then a 1-unit output; loss = mean over the batch of the squared
output. Its weights are plain tf.Variables initialised from --seed (the same on every rank and for
every implementation), updated by the step's Adagrad (TF's, or the TF Adagrad SOK's wrapper
hands dense variables to), in the same backward pass as the tables. Per implementation:
  sok     : one sok.EmbeddingVariable per field, ONE sok.lookup_sparse call over all fields,
            sok.OptimizerWrapper(tf.compat.v1.train.AdagradOptimizer);
  tf      : one tf.Variable [vocab, dim] per field, tf.nn.embedding_lookup_sparse,
            tf.compat.v1.train.AdagradOptimizer;
  hash    : TF's own dynamic path: a tf.lookup.experimental.MutableHashTable (or DenseHashTable)
            per field maps ids -> row indices of a tf.Variable (new ids get fresh rows inside the
            step), then tf.nn.embedding_lookup_sparse on the rows, TF Adagrad on the variable;
  sok_tier: (--storage dram_ssd, CPU) sok with every table in DRAM_SSDHASH storage, DRAM a
            fraction (--dram-fraction) of each table's final size, the rest in files; or
            (--storage hbm_dram, GPU) every table in HBM_DRAM storage, GPU memory a fraction
            (--cache-fraction) of each table's final size, the rest in pinned host memory; or
            (--storage hbm_dram_ssd, GPU) HBM_DRAM_SSDHASH: both fractions, the rest in files;
            timed next to sok, with the ratio sok_tier/sok and the tiers' sizes (and file
            traffic);
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
    python benchmarks/embedding/run.py --config criteo26 --device gpu --batch 65536 \\
        --storage hbm_dram --cache-fraction 0.1 --cache-strategy lfu --impls sok,sok_tier \\
        --dists powerlaw --steps 10 --rounds 3                        # HBM_DRAM, on a GPU machine

The code: inputs.py (the id batches and how a step reads them), impls.py (the three
implementations), runners.py (timing and tracing a step); run.py: flags, check, harness, table.

--horovod (under horovodrun, one rank per process and GPU): SOK only, its Embedding Variables
sharded over all ranks (sok.init under Horovod; target_gpu -1: id k on rank k mod N), one
lookup_sparse exchanging keys and rows between ranks. --batch is PER RANK (weak scaling: a step
of N ranks trains N x --batch samples); --global-batch G instead fixes the step's samples over
all ranks (strong scaling: each rank G / N, which must divide; the two flags exclude each other).
Each rank draws its own ids (seed offset by its rank). Every rank times the same steps; rank 0
prints per mode and distribution one line
  HOROVOD mode= dist= ranks= scaling= global_batch= batch_per_rank= mlp= step_ms= samples_per_s=
          sent_MB_per_rank= allreduce_MB= ...
step_ms: median over steps of the slowest rank's time (gathered over the ranks); samples_per_s:
global_batch / step_ms; sent_MB_per_rank: bytes a rank sends the others per step in the
embedding exchange (the largest rank's, from the ids: 16 B per distinct key sent to its owner,
dim x 4 B per row sent back and per row gradient sent to the owner); allreduce_MB: the MLP's
gradients each rank all-reduces per step (0 without --mlp or on one rank); mlp_in_sync: yes
where every rank's MLP weights were bit-equal after the timed steps. Embedding gradients need no
all-reduce (the exchange's backward sums them at the owner). Without --mlp the step has no dense
variables; with --mlp the MLP is data-parallel: every rank holds all of it, and its gradients are
averaged over the ranks with sok.all_reduce(grads, op="mean") before the update, so every rank's
weights stay equal. tf and hash keep whole tables in one process and are refused, as are --check,
--harness and --dump-ids. --profile K traces on every rank, each printing its own table (the
exchange's all-to-alls are the GPU time of SokAllToAll and SokAllToAllSized). Without --horovod,
--global-batch is the one process's --batch.

    horovodrun -np 8 -H localhost:8 python benchmarks/embedding/run.py --horovod \\
        --config criteo26 --batch 65536 --mode both
    horovodrun -np 4 -H localhost:4 python benchmarks/embedding/run.py --horovod \\
        --config fields100 --mlp 1024,1024,1024,1024,1024,1024 --global-batch 65536 \\
        --impls sok --mode graph --inputs resident     # strong scaling, the seed's synthetic case
"""
import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

# The sibling modules (inputs, impls, runners), from any cwd and when loaded by file location;
# names unused here (F401) stay for callers that reach them through this module. Appended, not
# put first: a process that also imports benchmarks/criteo's `run` must keep finding that one.
_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.append(_HERE)
from impls import _initializer  # noqa: E402
from inputs import (  # noqa: E402, F401
    BatchedIdInputs,
    IdInputs,
    ResidentIdInputs,
    dump_ids,
    keys_per_owner,
    make_batches,
)
from runners import RUNNERS, FunctionRunner, GraphRunner, device_scope  # noqa: E402, F401

IMPLS = ("sok", "tf", "hash")  # the default; also sok_tier (--storage other than dram)
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


def add_storage_args(p):
    """sok_tier's flags: which tiered storage and each table's budget in its upper tier."""
    p.add_argument("--storage", choices=("dram", "dram_ssd", "hbm_dram", "hbm_dram_ssd"),
                   default="dram",
                   help="dram_ssd: also time sok_tier, sok with its tables in DRAM_SSDHASH "
                   "storage (CPU only), next to sok (--impls defaults to sok,sok_tier); "
                   "hbm_dram: the same with HBM_DRAM storage (GPU only); hbm_dram_ssd: with "
                   "HBM_DRAM_SSDHASH storage (GPU only)")
    p.add_argument("--dram-fraction", type=float, default=0.1,
                   help="sok_tier, dram_ssd and hbm_dram_ssd: each table's DRAM budget, a "
                   "fraction of its final size (its distinct ids over all batches x a row's "
                   "cost)")
    p.add_argument("--cache-fraction", type=float, default=0.1,
                   help="sok_tier, hbm_dram and hbm_dram_ssd: each table's GPU-memory (HBM) "
                   "budget, a fraction of its final size (as --dram-fraction)")
    p.add_argument("--cache-strategy", choices=("lfu", "lru"), default="lfu",
                   help="sok_tier: which rows the upper tier (DRAM or HBM) keeps")
    p.add_argument("--storage-path", metavar="DIR",
                   help="sok_tier, dram_ssd and hbm_dram_ssd: where a fresh folder holds the "
                   "tables' files "
                   "(default: the temporary directory); removed afterwards")


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
    p.add_argument("--batch", type=int,
                   help="samples per step; under --horovod per rank (weak scaling: N ranks step "
                   "through N x --batch samples)")
    p.add_argument("--global-batch", type=int, metavar="N",
                   help="samples per step over all ranks: under --horovod each rank gets N / ranks "
                   "(strong scaling; must divide); without it the same as --batch N. Not with "
                   "--batch")
    p.add_argument("--mlp", type=parse_widths, metavar="WIDTHS",
                   help="the dense part: comma list of ReLU layer widths (e.g. 1024,1024,1024,"
                   "1024,1024,1024) then a 1-unit output, loss = mean squared output; the same "
                   "MLP for every implementation, data-parallel under --horovod (gradients "
                   "averaged with sok.all_reduce). Default: a weightless stand-in loss")
    p.add_argument("--dists", default="uniform,powerlaw", help="comma list of uniform, powerlaw")
    p.add_argument("--zipf", type=float, default=1.1, help="power-law exponent: p(rank k) ~ 1/k^a")
    p.add_argument("--impls", help="comma list of " + ", ".join(IMPLS) + " (default: all; "
                   "under --horovod only sok)")
    p.add_argument("--hash-table", choices=("mutable", "dense"), default="mutable")
    add_storage_args(p)
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
    p.add_argument(
        "--horovod",
        action="store_true",
        help="one rank per process under horovodrun: sok only, its tables sharded over the "
        "ranks, each rank its own ids and --batch samples; rank 0 prints a HOROVOD line per "
        "mode and distribution (no --check, --harness or --dump-ids; --profile traces every rank)",
    )
    args = p.parse_args(argv)
    check_horovod_args(p, args)
    check_batch_args(p, args)
    preset = CONFIGS[args.config]
    for key, value in preset.items():
        if key == "batch" and args.global_batch is not None:
            continue  # --horovod: the per-rank batch once the ranks are known (resolve_batch)
        if getattr(args, key) is None:
            # The fewest ids follow an explicit --ids-per-field when only that is given.
            if key == "min_ids_per_field" and args.ids_per_field != preset["ids_per_field"]:
                value = args.ids_per_field
            setattr(args, key, value)
    if not 1 <= args.min_ids_per_field <= args.ids_per_field:
        p.error("need 1 <= --min-ids-per-field <= --ids-per-field")
    if args.dram_fraction <= 0 or args.cache_fraction <= 0:
        p.error("--dram-fraction and --cache-fraction must be positive")
    if args.storage.startswith("hbm"):
        check_hbm_args(p, args)
    return args


def parse_widths(text):
    """--mlp: "1024,1024" -> [1024, 1024] (positive ints)."""
    try:
        widths = [int(w) for w in text.split(",")]
    except ValueError:
        widths = []
    if not widths or min(widths) < 1:
        raise argparse.ArgumentTypeError(
            f"--mlp wants a comma list of positive layer widths (e.g. 1024,1024), not {text!r}")
    return widths


def check_batch_args(p, args):
    """--batch (per rank) and --global-batch (over all ranks) exclude each other; without
    --horovod the one process's batch is --global-batch."""
    if args.global_batch is None:
        return
    if args.batch is not None:
        p.error("--batch (samples per rank: weak scaling) and --global-batch (samples over all "
                "ranks: strong scaling) exclude each other: pass one")
    if args.global_batch < 1:
        p.error("--global-batch must be positive")
    if not args.horovod:
        args.batch = args.global_batch  # one process: the global batch is its batch


def resolve_batch(args, world):
    """--horovod: the per-rank batch (args.batch) from --global-batch over `world` ranks; exits
    with a message where it does not divide. Without --global-batch, --batch stays per rank."""
    if args.global_batch is None:
        return
    if args.global_batch % world:
        sys.exit(f"--global-batch {args.global_batch} does not divide among {world} ranks "
                 f"(strong scaling gives each rank global batch / ranks samples): pass a multiple "
                 f"of {world}")
    args.batch = args.global_batch // world


def mlp_label(args):
    return ",".join(str(w) for w in args.mlp) if args.mlp else "none"


def check_hbm_args(p, args):
    """--storage hbm_dram(_ssd): refused where the run would not be on a GPU (SOK refuses HBM
    tiers on the CPU, so it would fail only after building the batches)."""
    if args.device == "cpu" or not tf.config.list_physical_devices("GPU"):
        why = "--device cpu" if args.device == "cpu" else "TensorFlow sees no GPU"
        p.error(f"--storage {args.storage}: HBM tiers need a GPU ({why})")
    if args.storage == "hbm_dram" and args.storage_path:
        p.error("--storage hbm_dram keeps no files: --storage-path is for dram_ssd and "
                "hbm_dram_ssd")


def check_horovod_args(p, args):
    """Resolves --impls; under --horovod refuses what has no multi-rank meaning."""
    if not args.horovod:
        default = "sok" if args.storage != "dram" else ",".join(IMPLS)
        impls = (args.impls or default).split(",")
        if args.storage != "dram" and "sok_tier" not in impls:
            impls.append("sok_tier")
        args.impls = ",".join(impls)
        return
    args.impls = args.impls or "sok"
    others = [i for i in args.impls.split(",") if i and i != "sok"]
    if others:
        # tf and hash keep whole tables in one process: per rank they would time N unsharded
        # copies, which says nothing about scaling.
        p.error(f"--horovod: only the sok implementation is sharded over ranks, not "
                f"{','.join(others)} (pass --impls sok)")
    for flag in ("check", "harness", "dump_ids"):
        if getattr(args, flag):
            p.error(f"--horovod times steps only: --{flag.replace('_', '-')} is single-process")
    if args.storage != "dram":
        p.error(f"--horovod: --storage {args.storage} (sok_tier) is single-process")


def ids_label(args):
    if args.min_ids_per_field == args.ids_per_field:
        return str(args.ids_per_field)
    return f"{args.min_ids_per_field}..{args.ids_per_field}"

# ---------------------------------------------------------------------------------------------
# Benchmark, check, harness
# ---------------------------------------------------------------------------------------------
def bench(args, mode, batches, device, impls, digests=None):
    """Per implementation: median wall and CPU ms per step, placement, and every timed step's
    wall time in seconds (--horovod gathers those over the ranks); None under --profile. A dict
    `digests` gets per implementation a digest of its MLP's weights after the steps."""
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
    for r in runners.values():
        r.describe_tier()  # before close removes the tables' files
    med = {impl: statistics.median(r.times) * 1e3 for impl, r in runners.items()}
    cpu = {impl: statistics.median(r.cpu_times) * 1e3 for impl, r in runners.items()}
    placement = {impl: r.placement for impl, r in runners.items()}
    times = {impl: list(r.times) for impl, r in runners.items()}
    if digests is not None:
        digests.update({impl: r.dense_digest() for impl, r in runners.items()})
    for r in runners.values():
        r.close()
    return med, cpu, placement, times


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
            "sok_tier": None,
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
                r.describe_tier()
                if r.placement.tier:
                    print(f"TIER mode={mode} dist={dist} {r.placement.tier}")
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


# ---------------------------------------------------------------------------------------------
# --horovod: SOK's tables sharded over the ranks, each rank its own ids
# ---------------------------------------------------------------------------------------------
KEY_ROW_BYTES = 16  # [key, count], int64 each, per distinct key sent to its owner


def init_horovod():
    """Horovod, then SOK on it; before any TensorFlow op runs, so sok.init can pin each rank to
    its own GPU."""
    import horovod.tensorflow as hvd

    import sparse_operation_kit as sok

    # sok.init sets Horovod's stall shutdown only when it initialises Horovod itself; without it
    # a rank that died would leave the others waiting forever.
    os.environ.setdefault("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", "300")
    hvd.init()
    sok.init(use_horovod=True)
    return hvd


def collectives_kind():
    try:
        from sparse_operation_kit.runtime import collectives
    except ImportError:  # a package without NCCL collectives exchanges through Horovod
        return "horovod"
    return collectives.kind() or "none"


def allgather(hvd, array, name):
    """Every rank's numpy `array`, concatenated along dim 0 in rank order. In a throwaway graph and
    CPU session: works alike in graph and function mode and stays out of the timed steps."""
    with tf.Graph().as_default(), tf.device("/CPU:0"):
        out = hvd.allgather(tf.constant(array), name=name)
        config = tf.compat.v1.ConfigProto(device_count={"GPU": 0})
        with tf.compat.v1.Session(config=config) as sess:
            return sess.run(out)


def exchange_bytes(counts, dim, tables):
    """[ranks, batches]: bytes each rank sends the other ranks in a step, from counts[r, b, j]
    (rank r's distinct keys of batch b that rank j owns). Forward: keys to their owners, float32
    rows back to the requesters; backward: the rows' gradients to the owners. Plus the size
    matrix's row per destination (a count per table, signature, bad-id flag: int64 each)."""
    world = counts.shape[0]
    others = 1 - np.eye(world, dtype=np.int64)  # a rank's keys to itself stay local
    row = 4 * dim
    asked = np.einsum("rbj,rj->rb", counts, others)  # keys rank r sends other owners
    served = np.einsum("ibr,ir->rb", counts, others)  # keys other ranks ask rank r for
    return asked * (KEY_ROW_BYTES + row) + served * row + (world - 1) * (tables + 2) * 8


def horovod_line(args, mode, dist, world, times, sent, ran, mlp_in_sync="-"):
    """The summary a driver greps. times [ranks, steps] in s: a step ends on every rank when the
    slowest one's exchange completes, so the step time is the slowest rank's. mlp_in_sync: yes
    where every rank's MLP weights were bit-equal after the steps (- without --mlp)."""
    step_ms = float(np.median(times.max(axis=0))) * 1e3
    per_rank = ",".join(fmt_ms(float(np.median(t)) * 1e3) for t in times)
    scaling = "strong" if args.global_batch is not None else "weak"
    global_batch = world * args.batch
    return (f"HOROVOD mode={mode} dist={dist} ranks={world} scaling={scaling} "
            f"global_batch={global_batch} batch_per_rank={args.batch} mlp={mlp_label(args)} "
            f"step_ms={fmt_ms(step_ms)} samples_per_s={global_batch / step_ms * 1e3:.0f} "
            f"sent_MB_per_rank={sent / 1e6:.3f} "
            f"allreduce_MB={mlp_allreduce_bytes(args, world) / 1e6:.3f} "
            f"mlp_in_sync={mlp_in_sync} rank_step_ms={per_rank} "
            f"collectives={collectives_kind()} ran_on={ran} steps={times.shape[1]}")


def mlp_allreduce_bytes(args, world):
    """Bytes of the MLP's float32 gradients a rank all-reduces per step (0 without --mlp and on
    one rank, where sok.all_reduce returns them as they are)."""
    if not args.mlp or world == 1:
        return 0
    widths = [args.fields * args.dim] + list(args.mlp) + [1]
    return 4 * sum(a * b + b for a, b in zip(widths[:-1], widths[1:]))


def horovod_main(args, dists, modes):
    """--horovod: every rank times the same SOK steps on its own ids; rank 0 prints the
    slowest rank's median step, global samples/s and the bytes each rank sends per step."""
    device, device_label = select_device(args)  # before sok.init: --device cpu hides the GPUs
    hvd = init_horovod()
    rank, world = hvd.rank(), hvd.size()
    resolve_batch(args, world)
    if args.mode == "graph":
        tf.compat.v1.disable_eager_execution()
    if rank == 0:
        print(f"horovod: {world} ranks, config={args.config} fields={args.fields} "
              f"ids/sample/field={ids_label(args)} vocab/field={args.vocab} dim={args.dim} "
              f"batch/rank={args.batch} global batch={world * args.batch} mlp={mlp_label(args)} "
              f"inputs={args.inputs} steps={args.rounds}x{args.steps} "
              f"(after {args.warmup} warm-up), TF {tf.__version__}, device {device_label} per "
              f"rank, collectives {collectives_kind()}", flush=True)
    for dist in dists:
        batches = make_batches(args, dist, rank, world)
        counts = allgather(hvd, keys_per_owner(batches, world)[None], f"bench_keys_{dist}")
        # The steps cycle through the batches: the mean over batches is the mean per step.
        sent = float(exchange_bytes(counts, args.dim, args.fields).mean(axis=1).max())
        for mode in modes:
            digests = {}
            if args.profile:  # every rank traces the same steps and prints its own table
                bench(args, mode, batches, device, ["sok"])
                continue
            _, _, placement, times = bench(args, mode, batches, device, ["sok"], digests)
            gathered = allgather(hvd, np.asarray(times["sok"])[None], f"bench_times_{mode}_{dist}")
            # Data-parallel MLP: after the same steps every rank must hold the same weights.
            weights = allgather(hvd, digests["sok"][None], f"bench_mlp_{mode}_{dist}")
            in_sync = "-" if not args.mlp else "yes" if (weights == weights[0]).all() else "NO"
            if rank == 0:
                print(horovod_line(args, mode, dist, world, gathered, sent,
                                   placement["sok"].short(), in_sync), flush=True)
    return 0


def main(argv=None):
    args = parse_args(argv)
    impls = [i for i in args.impls.split(",") if i]
    dists = [d for d in args.dists.split(",") if d]
    modes = ("graph", "function") if args.mode == "both" else (args.mode,)
    if args.horovod:
        return horovod_main(args, dists, modes)
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
        f"dim={args.dim} batch={args.batch} mlp={mlp_label(args)} inputs={args.inputs} hash_table={args.hash_table} "
        f"steps={args.rounds}x{args.steps} (after {args.warmup} warm-up), TF {tf.__version__}, "
        f"{os.cpu_count()} CPUs, device {device_label}, mode {args.mode}"
    )
    if harness_device:
        print("harness device: " + " ".join(f"{k}={v}" for k, v in harness_device.items()))
    cols = list(impls) + (["harness"] if args.harness else [])
    ratios = [(o, "sok") for o in ("sok_tier", "tf", "hash") if o in impls and "sok" in impls]
    if args.harness and "sok" in impls:
        ratios.append(("sok", "harness"))
    header = (f"{'mode':<9} {'ids':<9} {'time':<6} {'distinct/ids':>12} "
              + " ".join(f"{c + ' ms':>11}" for c in cols)
              + "".join(f" {a + '/' + b:>12}" for a, b in ratios))
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
            med, cpu, placement, _ = res
            for kind, vals in (("wall", med), ("cpu", cpu)):
                vals = dict(vals)
                if kind == "wall" and h is not None:
                    vals["harness"] = h
                line = (
                    f"{mode:<9} {dist:<9} {kind:<6} {distinct:>12.3f} "
                    + " ".join(
                        f"{fmt_ms(vals[c]):>11}" if c in vals else f"{'-':>11}" for c in cols
                    )
                    + "".join(
                        f" {vals[a] / vals[b]:>11.2f}x"
                        if a in vals and b in vals
                        else f" {'-':>12}"
                        for a, b in ratios
                    )
                )
                print(line, flush=True)
            ran = {i: placement[i].short() for i in impls}
            if args.harness:
                ran["harness"] = "GPU" if h is not None else "-"
            print(
                f"{mode:<9} {dist:<9} {'ran on':<6} {'':>12} "
                + " ".join(f"{ran[c]:>11}" for c in cols),
                flush=True,
            )
            for impl in impls:
                details.append(f"  {mode:<8} {dist:<8} {impl:<8} {placement[impl].describe()}")
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
