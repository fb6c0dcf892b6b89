"""Steps traced with TensorFlow's profiler (tf.profiler.experimental), for TF2 functions: the
benchmarks' --profile in function mode (step_trace.py traces TF1 sessions).

The profiler writes an XSpace (.xplane.pb): host threads with TraceMe events (the Python call,
the eager runtime, the executor, CPU ops as "name:Type") and the GPU's streams (kernels and copies,
each tagged with its TensorFlow op "name:Type"). step_records cuts it into steps at the host event
that wraps each step (a tf.function's name) and returns step_trace-style records:
(where, node, op, start_us, duration_us), where "host" is a CPU op's run and "gpu" a kernel or copy,
plus the step's landmarks (when the runtime started it, when the GPU first and last worked).
"""
import glob
import os

import tensorflow as tf

try:  # the XSpace proto ships inside TensorFlow's wheel (no public Python name)
    from tensorflow.tsl.profiler.protobuf import xplane_pb2
except ImportError:  # pragma: no cover - layouts of other TensorFlow versions
    xplane_pb2 = None


def trace(run_step, steps, logdir):
    """Runs run_step() `steps` times under the profiler; returns the .xplane.pb written."""
    if xplane_pb2 is None:
        raise RuntimeError("this TensorFlow has no tensorflow.tsl xplane proto to read traces with")
    options = tf.profiler.experimental.ProfilerOptions(host_tracer_level=3, device_tracer_level=1)
    tf.profiler.experimental.start(logdir, options=options)
    try:
        for _ in range(steps):
            run_step()
    finally:
        tf.profiler.experimental.stop()
    found = sorted(glob.glob(os.path.join(logdir, "plugins", "profile", "*", "*.xplane.pb")))
    if not found:
        raise RuntimeError(f"the profiler wrote no .xplane.pb under {logdir}")
    return found[-1]


def _events(space):
    """(plane name, line name, event name, start_us, duration_us, tf_op or "") of every event."""
    for plane in space.planes:
        names, stats = plane.event_metadata, plane.stat_metadata
        tf_op_id = next((k for k, v in stats.items() if v.name == "tf_op"), None)
        for line in plane.lines:
            base_ps = line.timestamp_ns * 1000
            for e in line.events:
                op = ""
                for s in e.stats:
                    if s.metadata_id == tf_op_id:
                        op = stats[s.ref_value].name if s.ref_value else s.str_value
                yield (plane.name, line.name, names[e.metadata_id].name,
                       (base_ps + e.offset_ps) / 1e6, e.duration_ps / 1e6, op)


def _split_op(label):
    node, _, op = label.rpartition(":")
    return (node, op) if node else (label, label)


def step_records(path, step_event):
    """Per traced step (host event `step_event`, in time order): a dict with wall_us, records
    [(where, node, op, start_us, duration_us)], runtime_start_us (the eager runtime's start of the
    function, relative to the step), first_gpu_us and last_gpu_us (relative to the step)."""
    space = xplane_pb2.XSpace()
    with open(path, "rb") as fh:
        space.ParseFromString(fh.read())
    events = list(_events(space))
    steps = sorted((e[3], e[4]) for e in events if e[2] == step_event and e[0].startswith("/host"))
    out = []
    for i, (t0, dur) in enumerate(steps):
        end = steps[i + 1][0] if i + 1 < len(steps) else float("inf")
        recs, runtime = [], None
        for plane, _, name, start, d, op in events:
            if not t0 <= start < end:
                continue
            if plane.startswith("/device:GPU"):
                node, typ = _split_op(op) if op else (name, name)
                recs.append(("gpu", node, typ, start, d))
            elif ":" in name and "::" not in name and " " not in name.split(":")[-1]:
                node, typ = _split_op(name)
                recs.append(("host", node, typ, start, d))
            elif name == "KernelAndDeviceFunc::Run" and runtime is None:
                runtime = start - t0
        gpu = [r for r in recs if r[0] == "gpu"]
        out.append({
            "wall_us": dur,
            "records": recs,
            "runtime_start_us": runtime,
            "first_gpu_us": min(r[3] for r in gpu) - t0 if gpu else None,
            "last_gpu_us": max(r[3] + r[4] for r in gpu) - t0 if gpu else None,
        })
    return out
