"""NCCL's own all-to-all and all-reduce through PyTorch, the reference (the physical limit of the
machine) for benchmarks/collectives/run.py, with the same sizes, rows and `COLL` lines:

    torchrun --nproc_per_node=N benchmarks/collectives/torch_nccl.py \\
        [--sizes 1MiB,16MiB,64MiB] [--iters 20] [--warmup 5] [--reps 5]

Each rank runs on cuda:LOCAL_RANK with the NCCL backend. all_to_all: all_to_all_single of
[N * rows, 64] float32 (rows to each rank, S bytes a rank sends in all); all_reduce: a float32
tensor of S bytes, in place, op SUM. First the same correctness check as run.py, then per
repetition (after a barrier) CUDA events around `iters` back-to-back calls; the time per call is
the median over repetitions of the slowest rank. NCCL_NVLS_ENABLE=0 unless set: NVLink multicast
stays off on these machines.
"""
import argparse
import os
import sys

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # read by NCCL when the communicator is made

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.append(_HERE)
from coll_common import (  # noqa: E402
    ROW_BYTES,
    ROW_FLOATS,
    add_args,
    finish_args,
    result_line,
    settings,
    workload,
)

OPS = ("all_to_all", "all_reduce")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_args(p, OPS, warmup_help="untimed collectives first")
    return finish_args(p, p.parse_args(argv), OPS)


def check(rank, ranks, rows, reduce_elems, device):
    """As run.py: rank r's rows for rank p hold r*1000 + p; all_reduce of rank+1 is N(N+1)/2.
    The verdict is agreed by every rank, so that all of them stop together on a failure."""
    dest = torch.arange(ranks, device=device).repeat_interleave(rows)
    x = (rank * 1000 + dest).float()[:, None].expand(-1, ROW_FLOATS).contiguous()
    out = torch.empty_like(x)
    dist.all_to_all_single(out, x)
    want = (torch.arange(ranks, device=device) * 1000 + rank).repeat_interleave(rows).float()
    ok = bool(torch.equal(out, want[:, None].expand(-1, ROW_FLOATS)))
    summed = torch.full((reduce_elems,), float(rank + 1), device=device)
    dist.all_reduce(summed)
    ok = ok and bool(torch.all(summed == ranks * (ranks + 1) / 2))
    flag = torch.tensor([1 if ok else 0], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    if not flag.item():
        raise SystemExit(f"rank {rank}: NCCL returned wrong data (this rank's own check: {ok})")


def time_calls(call, args, local_rank):
    """This rank's seconds per call in each repetition: CUDA events around `iters` calls."""
    for _ in range(args.warmup):
        call()
    torch.cuda.synchronize()
    times = []
    for _ in range(args.reps):
        dist.barrier(device_ids=[local_rank])  # every rank starts together
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(args.iters):
            call()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / args.iters)
    return times


def gather_times(times, ranks, device):
    """[ranks][reps] seconds per call."""
    mine = torch.tensor(times, dtype=torch.float64, device=device)
    every = torch.empty(ranks * len(times), dtype=torch.float64, device=device)
    dist.all_gather_into_tensor(every, mine)
    return every.view(ranks, len(times)).tolist()


def op_call(op, rows, ranks, reduce_elems, device):
    """The call to time for `op` on its own buffers, and the bytes it moves per rank."""
    if op == "all_to_all":
        send = torch.ones(rows * ranks, ROW_FLOATS, device=device)
        recv = torch.empty_like(send)
        return (lambda: dist.all_to_all_single(recv, send)), rows * ranks * ROW_BYTES
    # 1/N from every rank sums to 1: the values stay finite over any number of calls
    buf = torch.full((reduce_elems,), 1.0 / ranks, device=device)
    return (lambda: dist.all_reduce(buf)), reduce_elems * 4


def bench_size(size, args, rank, ranks, local_rank, device):
    rows, reduce_elems = workload(size, ranks)
    check(rank, ranks, rows, reduce_elems, device)
    lines = []
    for op in args.ops:
        call, nbytes = op_call(op, rows, ranks, reduce_elems, device)
        times = gather_times(time_calls(call, args, local_rank), ranks, device)
        lines.append(result_line("nccl", op, "nccl", "GPU", ranks, nbytes, times, args.iters,
                                 args.reps))
    return lines


def main(argv=None):
    args = parse_args(argv)
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device)
    rank, ranks = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        nccl = ".".join(str(v) for v in torch.cuda.nccl.version())
        print(f"# ranks={ranks} gpu={torch.cuda.get_device_name(device)} torch={torch.__version__} "
              f"nccl={nccl} NCCL_NVLS_ENABLE={os.environ['NCCL_NVLS_ENABLE']} {settings(args)}",
              flush=True)
    try:
        for size in args.sizes:
            for line in bench_size(size, args, rank, ranks, local_rank, device):
                if rank == 0:
                    print(line, flush=True)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
