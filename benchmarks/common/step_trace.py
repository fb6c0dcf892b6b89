"""One traced TF1 step (RunOptions.FULL_TRACE) as records, shared by the benchmarks' --profile.

A record is (where, node, op, start_us, duration_us): where is "host" for the executor's run of
an op (its kernel's Compute: the work on the CPU, or the enqueueing of GPU work) and "gpu" for a
kernel or copy on the GPU's streams (TensorFlow's "stream:all" trace). Summed host time counts every
executor thread; the union of GPU records is the time the GPU was busy.
"""
import time

import tensorflow as tf


def trace(sess, fetches, feed_dict=None):
    """Runs fetches once with a full trace; returns (step_stats, wall_ms)."""
    opts = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
    meta = tf.compat.v1.RunMetadata()
    t0 = time.perf_counter()
    sess.run(fetches, feed_dict=feed_dict, options=opts, run_metadata=meta)
    return meta.step_stats, (time.perf_counter() - t0) * 1e3


def records(step_stats, graph):
    """(where, node, op, start_us, duration_us) of every op run and GPU kernel of a traced step."""
    op_of = {n.name: n.op for n in graph.as_graph_def().node}
    out = []
    for dev in step_stats.dev_stats:
        on_gpu = "stream:all" in dev.device
        if "stream:" in dev.device and not on_gpu:
            continue  # the per-stream copies of stream:all
        for ns in dev.node_stats:
            node = ns.node_name.split(":")[0]
            op = op_of.get(node)
            if on_gpu and "MEMCPY" in ns.timeline_label.upper():  # "MEMCPYDtoH ..." etc.
                op = ns.timeline_label.split()[0]
            elif op is None:  # Grappler's nodes: "name = Op(inputs)"
                label = ns.timeline_label.split(" = ", 1)
                op = label[1].split("(", 1)[0] if len(label) == 2 else node
            out.append(("gpu" if on_gpu else "host", node, op, ns.all_start_micros,
                        ns.all_end_rel_micros))
    return out


def gpu_busy_ms(recs):
    """(busy, span) in ms: the union of the GPU records' intervals and first start to last end."""
    spans = sorted((r[3], r[3] + r[4]) for r in recs if r[0] == "gpu")
    busy, end = 0, None
    for a, b in spans:
        if end is None or a > end:
            busy, end = busy + (b - a), b
        elif b > end:
            busy, end = busy + (b - end), b
    span = (max(b for _, b in spans) - spans[0][0]) if spans else 0
    return busy / 1e3, span / 1e3


def totals(recs, key):
    """{group: [host_ms, host_ops, gpu_ms, gpu_records]} with group = key(record)."""
    out = {}
    for r in recs:
        t = out.setdefault(key(r), [0.0, 0, 0.0, 0])
        i = 0 if r[0] == "host" else 2
        t[i] += r[4] / 1e3
        t[i + 1] += 1
    return out
