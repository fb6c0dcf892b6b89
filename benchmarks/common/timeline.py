"""Where a step's time goes, from a TensorFlow profiler trace (the Criteo job's --trace_dir).

Host ops (the executor's "node:OpType" events) and GPU activity (kernels and copies, all
streams) share one clock there, so the GPU's idle gaps can be put next to what the host was
running meanwhile: a step bound by the host shows long gaps under chains of host ops or waits.

    python benchmarks/common/timeline.py TRACE_DIR [--gap_us 30] [--top 12] [--sequence A B]

TRACE_DIR holds rank_<r>/plugins/profile/<run>/<host>.xplane.pb (one file per rank); each
rank's steps (one SessionRun each) are summarised by medians, and the gaps of its median step
are listed. --sequence A B lists that step's host events (ops, launches, copies) and GPU activity
from A to B ms after its start, in time order.
"""
import argparse
import collections
import glob
import os
import statistics

_NOT_OPS = ("ThreadpoolListener", "ExecutorState", "MemoryAllocation", "MemoryDeallocation",
            "SessionRun", "Iterator", "ExecutorDoneCallback")


def _events(plane):
    """(line name, event name, start_ns, end_ns) of every event of an XPlane."""
    names = {k: v.name for k, v in plane.event_metadata.items()}
    for line in plane.lines:
        base = line.timestamp_ns
        for e in line.events:
            start = base + e.offset_ps / 1e3
            yield line.name, names.get(e.metadata_id, ""), start, start + e.duration_ps / 1e3


def load(path):
    """-> (steps [(start, end)], host ops [(name, start, end)], GPU activity [(name, start,
    end)], host calls [(name, start, end)]: every event of the TensorFlow threads, ops and the
    launches and copies they make) of one xplane.pb."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    space = xplane_pb2.XSpace()
    with open(path, "rb") as f:
        space.ParseFromString(f.read())
    steps, host, gpu, calls = [], [], [], []
    for plane in space.planes:
        if plane.name == "/host:CPU":
            for line, name, s, e in _events(plane):
                if name == "SessionRun":
                    steps.append((s, e))
                    continue
                if not line.startswith("tf_"):
                    continue
                if not name.startswith(("ThreadpoolListener", "Memory")):
                    calls.append((name, s, e))
                if ":" in name and not name.startswith(_NOT_OPS):
                    host.append((name, s, e))
        elif plane.name.startswith("/device:GPU:"):
            for line, name, s, e in _events(plane):
                if "Stream" in line and "Launch" not in line:
                    gpu.append((name, s, e))
    return sorted(steps), host, sorted(gpu, key=lambda r: r[1]), calls


def _union(intervals):
    """Merged [start, end) intervals, sorted."""
    out = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return out


def _within(records, start, end):
    return [r for r in records if r[1] < end and r[2] > start]


def step_summary(step, host, gpu, gap_us):
    """Wall, GPU busy and host-busy ms of one step, and its GPU gaps longer than gap_us with the
    host ops that overlap each most."""
    s0, s1 = step
    g = _union([(max(s, s0), min(e, s1)) for _, s, e in _within(gpu, s0, s1)])
    h = _union([(max(s, s0), min(e, s1)) for _, s, e in _within(host, s0, s1)])
    busy = sum(e - s for s, e in g)
    gaps, prev = [], s0
    for s, e in g + [[s1, s1]]:
        if s - prev > gap_us * 1e3:
            ops = sorted(_within(host, prev, s), key=lambda r: -(min(r[2], s) - max(r[1], prev)))
            gaps.append((prev - s0, s - prev, [o[0] for o in ops[:3]]))
        prev = max(prev, e)
    return dict(wall=(s1 - s0) / 1e6, gpu_busy=busy / 1e6,
                host_busy=sum(e - s for s, e in h) / 1e6, gaps=gaps)


def host_ops_by_type(step, host):
    """{op type: (ms, count)} of the host ops of one step."""
    out = collections.defaultdict(lambda: [0.0, 0])
    for name, s, e in _within(host, *step):
        t = out[name.rsplit(":", 1)[-1]]
        t[0] += (e - s) / 1e6
        t[1] += 1
    return out


def _short(kernel):
    """A kernel's name without return type, template arguments and parameters."""
    name = kernel.replace("(anonymous namespace)", "anon").split("(")[0]
    depth, out = 0, []
    for ch in name:
        depth += ch == "<"
        if depth == 0:
            out.append(ch)
        depth -= ch == ">"
    return "".join(out).replace("void ", "").strip().rsplit("::", 1)[-1] or kernel[:40]


def gpu_by_kernel(step, gpu):
    """{kernel (short name): (ms, count)} of the GPU activity of one step (all streams)."""
    out = collections.defaultdict(lambda: [0.0, 0])
    for name, s, e in _within(gpu, *step):
        k = out[_short(name)]
        k[0] += (min(e, step[1]) - max(s, step[0])) / 1e6
        k[1] += 1
    return out


def sequence(host_events, step, gpu, start_ms, end_ms):
    """Lines 'at_ms dur_ms host|gpu name' of one step's events from start_ms to end_ms."""
    s0 = step[0]
    rows = [(s, e, "host", n) for n, s, e in host_events]
    rows += [(s, e, "gpu", n) for n, s, e in gpu]
    out = []
    for s, e, where, name in sorted(rows):
        at = (s - s0) / 1e6
        if start_ms <= at <= end_ms:
            out.append(f"    {at:7.3f} {(e - s) / 1e6:6.3f} {where:4} {_short(name)}")
    return out


def report(path, gap_us=30, top=12, window=None):
    steps, host, gpu, calls = load(path)
    if not steps:
        return [f"{path}: no SessionRun"]
    sums = [step_summary(st, host, gpu, gap_us) for st in steps]
    med = lambda k: statistics.median(x[k] for x in sums)  # noqa: E731
    lines = [f"{path}: {len(steps)} steps; median wall {med('wall'):.2f} ms, GPU busy "
             f"{med('gpu_busy'):.2f} ms, host ops busy {med('host_busy'):.2f} ms"]
    i = min(range(len(sums)), key=lambda j: abs(sums[j]["wall"] - med("wall")))
    lines.append(f"  GPU gaps over {gap_us} us in the median step (at ms, length ms: host ops "
                 "overlapping most):")
    for at, length, ops in sums[i]["gaps"]:
        lines.append(f"    {at / 1e6:7.3f} {length / 1e6:6.3f}  {'; '.join(ops)}")
    lines.append("  host ops of that step by type (ms, count):")
    by_type = sorted(host_ops_by_type(steps[i], host).items(), key=lambda kv: -kv[1][0])
    for op, (ms, n) in by_type[:top]:
        lines.append(f"    {op:<40} {ms:7.3f} {n:5d}")
    lines.append("  GPU time of that step by kernel (ms, count; streams may overlap):")
    by_kernel = sorted(gpu_by_kernel(steps[i], gpu).items(), key=lambda kv: -kv[1][0])
    for k, (ms, n) in by_kernel[:2 * top]:
        lines.append(f"    {k:<40} {ms:7.3f} {n:5d}")
    if window is not None:
        lines.append(f"  that step from {window[0]:g} to {window[1]:g} ms (at ms, length ms):")
        lines += sequence(calls, steps[i], gpu, *window)
    return lines


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("trace_dir")
    p.add_argument("--gap_us", type=float, default=30)
    p.add_argument("--top", type=int, default=12)
    p.add_argument("--sequence", type=float, nargs=2, metavar=("FROM_MS", "TO_MS"))
    args = p.parse_args()
    files = sorted(glob.glob(os.path.join(args.trace_dir, "rank_*", "plugins", "profile", "*",
                                          "*.xplane.pb")))
    if not files:
        raise SystemExit(f"no rank_*/plugins/profile/*/*.xplane.pb below {args.trace_dir}")
    for f in files:
        print("\n".join(report(f, args.gap_us, args.top, args.sequence)))


if __name__ == "__main__":
    main()
