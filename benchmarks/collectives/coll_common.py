"""What run.py (TensorFlow: SOK, Horovod) and torch_nccl.py (PyTorch: NCCL) share: the sizes, the
row layout, the statistics and the `COLL ` result lines, so that both print comparable numbers."""
import re
import statistics

ROW_FLOATS = 64  # a float32 row of 64 values, as an embedding row of dimension 64
ROW_BYTES = ROW_FLOATS * 4
DEFAULT_SIZES = "1MiB,16MiB,64MiB"

_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
          "kib": 2**10, "mib": 2**20, "gib": 2**30}


def parse_size(text):
    """'64KiB' -> 65536, '1MB' -> 1000000, '4096' -> 4096."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(f"bad size {text!r}: use e.g. 4096, 64KiB, 16MiB, 1GiB or 1MB")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def parse_sizes(text):
    return [parse_size(s) for s in text.split(",") if s.strip()]


def size_label(nbytes):
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale}{unit}"
    return f"{nbytes}B"


def rows_per_rank(total_bytes, ranks):
    """Rows a rank sends to each rank (itself included) when it sends about `total_bytes` in all,
    split evenly; at least one row."""
    return max(1, total_bytes // (ranks * ROW_BYTES))


def workload(size, ranks):
    """(rows a rank sends to each rank in the all_to_all, float32 values of the all_reduce) for
    `size` bytes a rank sends."""
    return rows_per_rank(size, ranks), max(1, size // 4)


def bus_factor(op, ranks):
    """nccl-tests' busbw / algbw: the share of the data that crosses links, so busbw can be held
    against the hardware's bandwidth whatever the number of ranks."""
    if op == "all_to_all":
        return (ranks - 1) / ranks
    if op == "all_reduce":
        return 2 * (ranks - 1) / ranks
    raise ValueError(op)


def slowest_rank_median(times_by_rank):
    """times_by_rank[r][k]: rank r's seconds per call in repetition k. A collective is as fast as
    its slowest rank, so take the maximum over ranks per repetition, then the median."""
    per_rep = [max(column) for column in zip(*times_by_rank)]
    return statistics.median(per_rep), min(per_rep), max(per_rep)


def coll_line(impl, op, backend, device, ranks, nbytes, seconds, fastest_s, slowest_s, iters,
              reps):
    """One result line. bytes: what one rank sends (all_to_all, its own share included) or
    reduces (all_reduce); algbw = bytes / time; busbw = algbw * bus_factor (GB = 1e9 bytes)."""
    algbw = nbytes / seconds / 1e9
    busbw = algbw * bus_factor(op, ranks)
    return (f"COLL impl={impl} op={op} backend={backend} device={device} ranks={ranks} "
            f"size={size_label(nbytes)} bytes={nbytes} ms={seconds * 1e3:.4f} "
            f"ms_min={fastest_s * 1e3:.4f} ms_max={slowest_s * 1e3:.4f} "
            f"algbw_GBps={algbw:.3f} busbw_GBps={busbw:.3f} iters={iters} reps={reps}")


def result_line(impl, op, backend, device, ranks, nbytes, times_by_rank, iters, reps):
    """The `COLL ` line of the times gathered from every rank (see slowest_rank_median)."""
    median_s, fastest_s, slowest_s = slowest_rank_median(times_by_rank)
    return coll_line(impl, op, backend, device, ranks, nbytes, median_s, fastest_s, slowest_s,
                     iters, reps)


def settings(args):
    """The header line's fields of the flags both scripts take."""
    return (f"sizes={','.join(size_label(s) for s in args.sizes)} iters={args.iters} "
            f"warmup={args.warmup} reps={args.reps}")


# ------------------------------------------------------------------------------ flags


def add_args(p, ops, warmup_help):
    """The flags both scripts take; finish_args checks and converts them."""
    p.add_argument("--sizes", default=DEFAULT_SIZES,
                   help="comma list of bytes each rank sends (e.g. 64KiB,1MiB,16MiB,64MiB)")
    p.add_argument("--iters", type=int, default=20, help="collectives per timed repetition")
    p.add_argument("--warmup", type=int, default=5, help=warmup_help)
    p.add_argument("--reps", type=int, default=5, help="timed repetitions (median reported)")
    p.add_argument("--ops", default=",".join(ops), help="comma list of " + ", ".join(ops))


def name_list(p, flag, text, known):
    """The names in the comma list `text`; p.error() when it is empty or names one not in `known`."""
    given = [s.strip() for s in text.split(",") if s.strip()]
    unknown = sorted(set(given) - set(known))
    if unknown or not given:
        p.error(f"--{flag}: unknown or empty {unknown}; choose from {', '.join(known)}")
    return given


def finish_args(p, args, ops):
    """args of add_args's flags as the scripts use them: sizes in bytes, ops a list."""
    args.sizes = parse_sizes(args.sizes)
    args.ops = name_list(p, "ops", args.ops, ops)
    if min(args.iters, args.reps) < 1 or args.warmup < 0 or not args.sizes:
        p.error("--iters and --reps must be >= 1, --warmup >= 0, --sizes not empty")
    return args
