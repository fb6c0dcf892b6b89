"""--profile: where one training step of the Criteo job spends its time, by stage.

Traces steps with TensorFlow's full trace (benchmarks/common/step_trace.py) and sums, per stage,
the GPU kernel time and the executor (host) time of its ops. Stages come from op types and name
scopes: input (the tf.data iterator), embedding forward (sok.lookup_sparse: dedup, table lookup,
pooling), embedding backward (its gradient), embedding update (SOK's fused optimizer on the
tables), dense forward / backward / update (everything else: MLPs, interaction, loss, dense
optimizer).
"""
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
import step_trace  # noqa: E402

STAGES = ("input", "embedding forward", "embedding backward", "embedding update",
          "dense forward", "dense backward", "dense update")


def stage_of(record):
    _, node, op = record[:3]
    if op.startswith("IteratorGetNext") or op.startswith("MultiDeviceIterator"):
        return "input"
    if op.startswith("SokEmbeddingVariableSparseApply") or op == "SokGenericScatter":
        return "embedding update"
    if "sok_lookup_sparse" in node:
        return "embedding backward" if node.startswith("gradients") else "embedding forward"
    if node.startswith("gradients"):
        return "dense backward"
    if op.startswith(("ResourceApply", "ApplyAdagrad", "ApplyAdam", "AssignAdd")) or \
            "/update_" in node or node.startswith("update_"):
        return "dense update"
    return "dense forward"


def profile_steps(sess, fetches, graph, steps=3):
    """Median per stage over `steps` traced steps: {stage: (gpu_ms, gpu_records, host_ms, ops)},
    plus the step's wall time and GPU busy time (traced: tracing adds host time)."""
    per_stage = {s: [] for s in STAGES}
    walls, busys = [], []
    for _ in range(steps):
        stats, wall = step_trace.trace(sess, fetches)
        recs = step_trace.records(stats, graph)
        walls.append(wall)
        busys.append(step_trace.gpu_busy_ms(recs)[0])
        t = step_trace.totals(recs, stage_of)
        for s in STAGES:
            per_stage[s].append(t.get(s, [0.0, 0, 0.0, 0]))
    out = {s: tuple(statistics.median(v[i] for v in vals) for i in (2, 3, 0, 1))
           for s, vals in per_stage.items()}
    return out, statistics.median(walls), statistics.median(busys), recs


def top_ops(recs, count=25):
    """Lines of the op types that took the most host and GPU time in the last traced step, and
    every host<->device copy (what a step waits for)."""
    by_op = step_trace.totals(recs, lambda r: (stage_of(r), r[2]))
    lines = [f"  {'stage':<20} {'op':<40} {'host ms':>8} {'ops':>5} {'GPU ms':>8} {'recs':>5}"]
    for (stage, op), (h, n, g, k) in sorted(by_op.items(), key=lambda kv: -max(kv[1][0],
                                                                              kv[1][2]))[:count]:
        lines.append(f"  {stage:<20} {op[:40]:<40} {h:8.3f} {n:5d} {g:8.3f} {k:5d}")
    copies = [r for r in recs if r[0] == "gpu" and "MEMCPY" in r[2].upper()]
    for r in copies:
        lines.append(f"  copy {r[2]} {r[1]} {r[4] / 1e3:.3f} ms")
    return lines


def format_profile(stages, wall_ms, busy_ms):
    lines = [f"profile:    traced step {wall_ms:.2f} ms wall, GPU busy {busy_ms:.2f} ms "
             "(medians; tracing slows the host)",
             f"  {'stage':<20} {'GPU ms':>8} {'kernels':>8} {'host ms':>8} {'ops':>6}"]
    for s in STAGES:
        g, k, h, n = stages[s]
        lines.append(f"  {s:<20} {g:8.3f} {k:8.0f} {h:8.3f} {n:6.0f}")
    return lines
