"""Bandwidth of SOK's collectives (the exchange's all-to-all and sok.all_reduce) and of Horovod's,
one process per GPU (or CPU ranks over Gloo):

    horovodrun -np N -H localhost:N python benchmarks/collectives/run.py \\
        [--sizes 1MiB,16MiB,64MiB] [--iters 20] [--warmup 5] [--reps 5] [--impls sok,horovod]

For each size S (bytes one rank sends, split evenly over the N ranks as float32 rows of 64
values; all_reduce: a float32 tensor of S bytes) and implementation:
  sok     : sparse_operation_kit.runtime.collectives.all_to_all and sok.all_reduce(op="sum")
            (SOK's NCCL ops when every rank has its own GPU, else Horovod's: see backend=);
  sok_sized: collectives.all_to_all_sized, the exchange's all-to-all of rows and gradients,
            whose sizes both sides know (no size exchange, no wait on the host); all_reduce as sok;
  horovod : hvd.alltoall(x, splits=int32 counts) and hvd.allreduce(op=hvd.Sum).
First a correctness check (rank r's rows for rank p hold r*1000 + p; every rank checks what it
received; all_reduce of rank+1 must give N(N+1)/2), then the timing: a tf.function runs `iters`
collectives, each on the previous one's output; it is run untimed until at least `warmup`
collectives ran, then `reps` times after a barrier, each timed up to a fetched value of its
result. Rank 0 prints per (impl, op, size) one line `COLL key=value ...`: ms per call (median over
reps of the slowest rank), algbw_GBps (bytes / time) and busbw_GBps (nccl-tests' bus bandwidth).
benchmarks/collectives/torch_nccl.py prints the same lines for NCCL's own collectives.
"""
import argparse
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # NVLink multicast stays off on these machines

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.append(_HERE)
from coll_common import (  # noqa: E402
    ROW_BYTES,
    ROW_FLOATS,
    add_args,
    finish_args,
    name_list,
    result_line,
    settings,
    size_label,
    workload,
)

IMPLS = ("sok", "sok_sized", "horovod")
OPS = ("all_to_all", "all_reduce")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_args(p, OPS, warmup_help="untimed collectives first (at least)")
    p.add_argument("--impls", default=",".join(IMPLS), help="comma list of " + ", ".join(IMPLS))
    args = finish_args(p, p.parse_args(argv), OPS)
    args.impls = name_list(p, "impls", args.impls, IMPLS)
    return args


# ------------------------------------------------------------------------------ implementations


class SokImpl:
    """SOK's collectives: NCCL on GPUs, Horovod's otherwise (collectives.kind())."""

    name = "sok"
    counts_on_host = False

    def __init__(self, sok, collectives):
        self._sok, self._collectives = sok, collectives
        self.backend = collectives.kind() or "none"

    def all_to_all(self, x, counts):
        return self._collectives.all_to_all(x, counts)

    def all_reduce(self, t):
        return self._sok.all_reduce([t], op="sum")[0]


class SokSizedImpl(SokImpl):
    """SOK's all-to-all with the sizes given on the host (every rank sends and receives `rows`
    rows per rank), as the exchange moves rows and gradients."""

    name = "sok_sized"
    counts_on_host = True  # the sized op reads its sizes in host memory

    def all_to_all(self, x, counts):
        return self._collectives.all_to_all_sized(x, counts, counts), None  # sizes: given


class HorovodImpl:
    """Horovod's own collectives, as a model would call them without SOK."""

    name = "horovod"
    counts_on_host = False

    def __init__(self, hvd, on_gpu):
        self._hvd = hvd
        if on_gpu and hvd.nccl_built():
            self.backend = "horovod-nccl"
        else:
            self.backend = "horovod-gloo" if hvd.gloo_enabled() else "horovod-mpi"

    def all_to_all(self, x, counts):
        out, received = self._hvd.alltoall(x, splits=tf.cast(counts, tf.int32))
        return out, tf.cast(received, tf.int64)

    def all_reduce(self, t):
        return self._hvd.allreduce(t, op=self._hvd.Sum)


# ------------------------------------------------------------------------------ job helpers


class Job:
    """This rank's place in the job, and the host-side collectives of the benchmark itself (on
    the CPU, through Horovod: they never touch the timed GPU work)."""

    def __init__(self, hvd):
        self.hvd, self.rank, self.size = hvd, hvd.rank(), hvd.size()
        self.on_gpu = bool(tf.config.get_visible_devices("GPU"))
        self.device = "/GPU:0" if self.on_gpu else "/CPU:0"  # sok.init left this rank one GPU
        self._calls = 0

    def _name(self, what):
        self._calls += 1
        return f"collbench_{what}_{self._calls}"

    def barrier(self):
        with tf.device("/CPU:0"):
            self.hvd.allreduce(tf.zeros([1]), op=self.hvd.Sum, name=self._name("barrier")).numpy()

    def all_ok(self, ok):
        with tf.device("/CPU:0"):
            flag = tf.constant([1 if ok else 0], tf.int32)
            return bool(self.hvd.allreduce(flag, op=self.hvd.Min, name=self._name("ok")).numpy()[0])

    def gather_times(self, times):
        """[ranks][reps] seconds per call."""
        with tf.device("/CPU:0"):
            mine = tf.constant([times], tf.float64)
            return self.hvd.allgather(mine, name=self._name("times")).numpy().tolist()

    def say(self, line):
        if self.rank == 0:
            print(line, flush=True)


def make_impls(names, sok, collectives, job):
    made = {"sok": lambda: SokImpl(sok, collectives),
            "sok_sized": lambda: SokSizedImpl(sok, collectives),
            "horovod": lambda: HorovodImpl(job.hvd, job.on_gpu)}
    return [made[n]() for n in names]


# ------------------------------------------------------------------------------ check and timing


def exchange_inputs(job, impl, rows):
    """Rank r's rows, grouped by destination p, hold r*1000 + p; `rows` to every rank."""
    dest = np.repeat(np.arange(job.size), rows)
    x = np.repeat((job.rank * 1000 + dest).astype(np.float32)[:, None], ROW_FLOATS, axis=1)
    with tf.device(job.device):  # resident where the collective reads it: no copy is timed
        x = tf.identity(x)
    with tf.device("/CPU:0" if impl.counts_on_host else job.device):
        return x, tf.constant([rows] * job.size, tf.int64)


def check(job, impl, rows, reduce_elems):
    """One call of each collective against what a local computation expects; the same verdict
    on every rank (a rank that failed alone would leave the others waiting in a collective)."""
    problems = []
    x, counts = exchange_inputs(job, impl, rows)
    out, received = impl.all_to_all(x, counts)
    want = np.repeat(np.arange(job.size) * 1000 + job.rank, rows).astype(np.float32)
    if received is not None and not np.array_equal(received.numpy(), counts.numpy()):
        problems.append(f"all_to_all counts {received.numpy().tolist()}")
    elif not np.array_equal(out.numpy(), np.repeat(want[:, None], ROW_FLOATS, axis=1)):
        problems.append("all_to_all rows differ from rank*1000 + destination")
    summed = impl.all_reduce(tf.fill([reduce_elems], float(job.rank + 1)))
    if not np.all(summed.numpy() == job.size * (job.size + 1) / 2):
        problems.append("all_reduce sum differs from N(N+1)/2")
    for p in problems:
        print(f"CHECK FAILED rank={job.rank} impl={impl.name} {p}", flush=True)
    if not job.all_ok(not problems):
        raise SystemExit(f"rank {job.rank}: the {impl.name} collectives returned wrong data")


def make_chain(step, calls, x_shape):
    """A tf.function of `calls` collectives, each on the previous one's output (unrolled: no
    Python or per-call dispatch between them, as inside a training step). One per (impl, op),
    traced once for every size (the first dimension is left open)."""

    @tf.function(input_signature=[tf.TensorSpec(x_shape, tf.float32),
                                  tf.TensorSpec([None], tf.int64)])
    def chain(x, counts):
        for _ in range(calls):
            x = step(x, counts)
        return x

    return chain


def make_chains(impl, calls):
    return {"all_to_all": make_chain(lambda x, counts: impl.all_to_all(x, counts)[0], calls,
                                     [None, ROW_FLOATS]),
            "all_reduce": make_chain(lambda x, _: impl.all_reduce(x), calls, [None])}


def fetch(t):
    """Waits for `t` (and everything before it on the device) by fetching one value of it."""
    return tf.reshape(t, [-1])[0].numpy()


def time_chain(job, chain, inputs, args):
    """This rank's seconds per collective in each of args.reps repetitions."""
    for _ in range(max(1, -(-args.warmup // args.iters))):  # also traces and places the function
        fetch(chain(*inputs))
    times = []
    for _ in range(args.reps):
        job.barrier()  # every rank starts together: the slowest rank then bounds the time
        start = time.perf_counter()
        fetch(chain(*inputs))
        times.append((time.perf_counter() - start) / args.iters)
    return times


def op_inputs(op, job, impl, rows, reduce_elems):
    """The chain's inputs (tensor, counts) for `op`, and the bytes one call moves per rank."""
    if op == "all_to_all":
        return exchange_inputs(job, impl, rows), rows * job.size * ROW_BYTES
    # 1/N from every rank sums to 1: the values stay finite over any number of calls
    with tf.device(job.device):
        x = tf.fill([reduce_elems], 1.0 / job.size)
    counts = tf.constant([0] * job.size, tf.int64)  # unused by all_reduce
    return (x, counts), reduce_elems * 4


def bench_size(job, impl, chains, size, args):
    """The COLL lines of one implementation and size."""
    rows, reduce_elems = workload(size, job.size)
    check(job, impl, rows, reduce_elems)
    job.say(f"CHECK impl={impl.name} size={size_label(size)} rows_to_each_rank={rows} ok")
    lines = []
    for op in args.ops:
        inputs, nbytes = op_inputs(op, job, impl, rows, reduce_elems)
        times = job.gather_times(time_chain(job, chains[op], inputs, args))
        lines.append(result_line(impl.name, op, impl.backend, "GPU" if job.on_gpu else "CPU",
                                 job.size, nbytes, times, args.iters, args.reps))
    return lines


def main(argv=None):
    args = parse_args(argv)
    import sparse_operation_kit as sok

    # Under horovodrun this initialises Horovod (with a stall timeout), gives rank r GPU
    # local_rank when it sees several and picks the collectives: before any TensorFlow op runs.
    sok.init()
    import horovod.tensorflow as hvd

    from sparse_operation_kit.runtime import collectives

    if not hvd.is_initialized() or hvd.size() < 2:  # SOK sets up no collectives for one rank
        raise SystemExit("run.py needs 2 or more ranks: horovodrun -np N -H localhost:N python "
                         "benchmarks/collectives/run.py")
    job = Job(hvd)
    impls = make_impls(args.impls, sok, collectives, job)
    gpus = [d.name for d in tf.config.get_visible_devices("GPU")]
    job.say(f"# ranks={job.size} rank0_gpus={gpus or 'none'} sok_collectives={collectives.kind()} "
            f"tensorflow={tf.__version__} {settings(args)}")
    for impl in impls:
        chains = make_chains(impl, args.iters)
        for size in args.sizes:
            for line in bench_size(job, impl, chains, size, args):
                job.say(line)
    job.barrier()


if __name__ == "__main__":
    main()
