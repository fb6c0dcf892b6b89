"""Timing and tracing the embedding benchmark's step (benchmarks/embedding/run.py): where the
step's ops and tables ran, and a runner per mode (graph: TF1 Session; function: tf.function)."""
import collections
import contextlib
import json
import os
import re
import sys
import tempfile
import time

import numpy as np
import tensorflow as tf
from impls import BUILDERS, dense_part
from inputs import INPUT_SCOPE, id_inputs

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
import step_trace  # noqa: E402
import xplane_trace  # noqa: E402

# ---------------------------------------------------------------------------------------------
# Where things ran
# ---------------------------------------------------------------------------------------------
# Nodes that move or name data rather than compute (left out of the per-device op counts).
BOOKKEEPING_OPS = {
    "_Send",
    "_Recv",
    "_HostSend",
    "_HostRecv",
    "_Arg",
    "_Retval",
    "_DeviceArg",
    "_DeviceRetval",
    "NoOp",
    "Const",
    "HostConst",
    "Placeholder",
    "Identity",
    "VarHandleOp",
}
TABLE_RESOURCE_OPS = {
    "VarHandleOp": "variables",
    "SokEmbeddingVariableHandle": "embedding variables",
    "MutableHashTableV2": "hash tables",
    "MutableDenseHashTable": "hash tables",
}
TABLE_NAME = re.compile(r"(^|/)(sok_emb|tf_emb|hash_emb|hash)_\d+$")


def short_device(name):
    m = re.search(r"device:([A-Za-z_]+:\d+)", name or "")
    return m.group(1) if m else (name or "?")


class Placement:
    """Ops per device of one step's partitioned graph, devices of the tables, SOK kernel runs."""

    def __init__(self):
        self.ops = collections.Counter()
        self.cpu_op_types = collections.Counter()
        self.tables = collections.defaultdict(set)
        self.sok_kernels = None  # {"CPU": n, "GPU": m} during the timed steps (sok only)
        self.tier = None  # sok_tier: its tiers and file traffic (Tier.describe)

    def add_nodes(self, nodes, tables_from_graph=True):
        for node in nodes:
            if node.name.startswith(INPUT_SCOPE + "/"):
                continue  # selecting the batch: the same for every implementation
            dev = short_device(node.device)
            kind = TABLE_RESOURCE_OPS.get(node.op)
            if tables_from_graph and kind and TABLE_NAME.search(node.name):
                self.tables[kind].add(dev)
            if node.op in BOOKKEEPING_OPS:
                continue
            self.ops[dev] += 1
            if dev.startswith("CPU"):
                self.cpu_op_types[node.op] += 1

    def add_kernels(self, before, after):
        delta = {d: after[d] - before[d] for d in ("CPU", "GPU")}
        if self.sok_kernels is None:
            self.sok_kernels = {"CPU": 0, "GPU": 0}
        for d in delta:
            self.sok_kernels[d] += delta[d]

    def short(self):
        """What ran where, in a word: GPU, CPU, or GPU+CPU (SOK: where its kernels ran)."""
        if self.sok_kernels is not None:
            kinds = [d for d in ("GPU", "CPU") if self.sok_kernels[d] > 0]
        else:
            kinds = [
                d for d in ("GPU", "CPU") if any(k.startswith(d) and v for k, v in self.ops.items())
            ]
        return "+".join(kinds) or "?"

    def describe(self):
        parts = []
        if self.tables:
            parts.append("tables: " + ", ".join(f"{k} on {'/'.join(sorted(v))}"
                                                for k, v in sorted(self.tables.items())))
        ops = ", ".join(f"{d} {n}" for d, n in sorted(self.ops.items()))
        text = f"step ops per device: {ops or '?'}"
        gpu_ops = sum(v for k, v in self.ops.items() if k.startswith("GPU"))
        if gpu_ops and self.cpu_op_types:
            text += " (on the CPU: " + ", ".join(
                f"{t} x{n}" for t, n in self.cpu_op_types.most_common(8)
            )
            text += ", ..." if len(self.cpu_op_types) > 8 else ""
            text += ")"
        parts.append(text)
        if self.sok_kernels is not None:
            k = self.sok_kernels
            parts.append(f"SOK kernels run in the timed steps: GPU {k['GPU']}, CPU {k['CPU']}")
        if self.tier:
            parts.append(self.tier)
        return "; ".join(parts)


# ---------------------------------------------------------------------------------------------
# Runners: one implementation, its state, one step; timing is shared
# ---------------------------------------------------------------------------------------------
def device_scope(device):
    return tf.device(device) if device else contextlib.nullcontext()


def process_io():
    """The process's read/write syscall counters (/proc/self/io: rchar, wchar, syscr, ...)."""
    try:
        with open("/proc/self/io") as fh:
            return {k: int(v) for k, v in (line.split(":") for line in fh)}
    except OSError:
        return {}


class _Timed:
    device = None  # entered around the steps (eager: where the tf.function runs)

    def run(self, steps, record):
        before = self.kernel_counts() if record and self.impl.startswith("sok") else None
        io = process_io() if record and getattr(self.model, "tier", None) else None
        with device_scope(self.device):
            for _ in range(steps):
                c0, t0 = time.process_time(), time.perf_counter()
                self.one_step()
                dt, dc = time.perf_counter() - t0, time.process_time() - c0
                self.step += 1
                if record:
                    self.times.append(dt)
                    self.cpu_times.append(dc)  # CPU time of all threads of this process
        if before is not None:
            self.placement.add_kernels(before, self.kernel_counts())
        if io is not None:  # file traffic of the timed steps (nothing else reads meanwhile)
            after = process_io()
            self.io["steps"] = self.io.get("steps", 0) + steps
            for k in ("rchar", "wchar", "syscr"):
                self.io[k] = self.io.get(k, 0) + after.get(k, 0) - io.get(k, 0)

    def dense_digest(self):
        """float64 [2 per MLP variable]: each one's sum and sum of squares now (equal on every
        rank where the data-parallel MLP stayed in sync); empty without --mlp."""
        values = self.dense_values()
        return np.array([f(v.astype(np.float64)) for v in values
                         for f in (np.sum, lambda x: np.sum(x * x))], np.float64)

    def describe_tier(self):
        if getattr(self.model, "tier", None):
            self.placement.tier = self.model.tier.describe(self.io)

    def close_tier(self, model):
        if getattr(model, "tier", None):
            model.tier.close()


def average_dense(args, grads):
    """--mlp under --horovod: the MLP is data-parallel, so each rank's dense gradients are averaged
    over the ranks (sok.all_reduce) before the update and every rank's weights stay equal. The
    tables need none: the exchange's backward already sums their row gradients at the owner."""
    if not grads or not args.horovod:
        return list(grads)
    import sparse_operation_kit as sok
    return sok.all_reduce(list(grads), op="mean")


def print_profile(impl, wall, recs, top, landmarks=""):
    """One traced step's summary: per op type, the time its kernels held the executor (host:
    compute or enqueue) and the time of its GPU kernels, the GPU's busy time and the launches."""
    busy, span = step_trace.gpu_busy_ms(recs)
    by_op = step_trace.totals(recs, key=lambda r: r[2])
    host_ms = sum(t[0] for t in by_op.values())
    print(f"[{impl}] traced step {wall:.2f} ms wall; GPU: "
          f"{sum(t[3] for t in by_op.values())} kernels and copies, busy {busy:.2f} ms of a "
          f"{span:.2f} ms span; host op time {host_ms:.2f} ms over "
          f"{sum(t[1] for t in by_op.values())} ops (summed over executor threads){landmarks}")
    print(f"    {'op type':<36} {'host ms':>8} {'ops':>5} {'GPU ms':>8} {'kernels':>8}")
    for op, t in sorted(by_op.items(), key=lambda kv: -max(kv[1][0], kv[1][2]))[:top]:
        print(f"    {op[:36]:<36} {t[0]:8.3f} {t[1]:5d} {t[2]:8.3f} {t[3]:8d}")


def write_trace(args, impl, wall, recs):
    if args.trace_out:  # every record, for a timeline read elsewhere
        with open(args.trace_out, "a") as fh:
            fh.write(json.dumps({"impl": impl, "wall_ms": wall, "records": recs}) + "\n")


class GraphRunner(_Timed):
    """One implementation in its own graph and session (TF1)."""

    def __init__(self, impl, args, batches, device, init_values=None, for_check=False):
        self.impl, self.args, self.nb = impl, args, len(batches)
        self.placement = Placement()
        self.graph = tf.Graph()
        with self.graph.as_default(), device_scope(device):
            tf.compat.v1.set_random_seed(args.seed)
            inputs = id_inputs(args, batches)
            self.model = BUILDERS[impl](args, batches)
            loss_fn, self.dense_vars = dense_part(args)
            if getattr(inputs, "per_batch", False):  # a step graph per batch, nothing fed
                self.which, which = None, range(self.nb)
            else:
                with tf.device("/CPU:0"):
                    self.which = tf.compat.v1.placeholder(tf.int32, [], name="batch_index")
                which = [self.which]
            # Each step's train op right after its loss: SOK chains a TF1 graph's collectives,
            # and a step built after another's gradients runs none of the other's.
            self.losses, self.train_ops = [], []
            for w in which:
                self.losses.append(loss_fn(self.model.embed(inputs.sparse(w))))
                self.train_ops.append(self._train_op(self.losses[-1]))
            init = [tf.compat.v1.global_variables_initializer()]
            init += [
                op for op in self.graph.get_collection(tf.compat.v1.GraphKeys.TABLE_INITIALIZERS)
            ]
            assign = []
            if init_values is not None:
                for var, value in zip(self.model.tables, init_values):
                    ph = tf.compat.v1.placeholder(tf.float32, value.shape)
                    assign.append((var.assign(ph, read_value=False), ph, value))
            if for_check:
                self.keys = tf.compat.v1.placeholder(tf.int64, [None])
                self.read_ops = [self.model.read_rows(f, self.keys) for f in range(args.fields)]
            self.counts_op = None
            if impl.startswith("sok"):
                from sparse_operation_kit.runtime._ops import ops as sok_ops
                with tf.device("/CPU:0"):
                    self.counts_op = sok_ops.sok_kernel_run_counts()
            config = tf.compat.v1.ConfigProto(allow_soft_placement=True) if device else None
            if config is not None:  # its own ConfigProto replaces tf.config's (sok.init's) GPUs
                config.gpu_options.visible_device_list = ",".join(
                    d.name.rsplit(":", 1)[1] for d in tf.config.get_visible_devices("GPU"))
            self.sess = tf.compat.v1.Session(graph=self.graph, config=config)
            self.sess.run(init, feed_dict=inputs.init_feed or None)
            for op, ph, value in assign:
                self.sess.run(op, feed_dict={ph: value})
            self.graph.finalize()
        self.step, self.times, self.cpu_times, self.io = 0, [], [], {}

    def _train_op(self, loss):
        """The update of the tables (and, with --mlp, of the MLP: one backward pass for both, the
        MLP's gradients averaged over the ranks under --horovod) by the implementation's
        optimizer."""
        tables = self.model.tables
        if not self.dense_vars:  # the stand-in loss: the step as it always was
            return self.model.opt.minimize(loss, var_list=tables)
        grads = tf.gradients(loss, tables + self.dense_vars)
        grads = grads[:len(tables)] + average_dense(self.args, grads[len(tables):])
        return self.model.opt.apply_gradients(zip(grads, tables + self.dense_vars))

    def dense_values(self):
        return self.sess.run(self.dense_vars) if self.dense_vars else []

    def kernel_counts(self):
        _, counts = self.sess.run(self.counts_op)  # op types, [n, (CPU, GPU)] runs
        cpu, gpu = (int(x) for x in counts.sum(axis=0))
        return {"CPU": cpu, "GPU": gpu}

    def _step_of(self, step):
        """(loss, train op, feed) of step `step`."""
        b = step % self.nb
        if self.which is None:
            return self.losses[b], self.train_ops[b], None
        return self.losses[0], self.train_ops[0], {self.which: b}

    def one_step(self):
        _, train_op, feed = self._step_of(self.step)
        self.sess.run(train_op, feed_dict=feed)

    def loss_step(self):
        loss, train_op, feed = self._step_of(self.step)
        loss, _ = self.sess.run([loss, train_op], feed_dict=feed)
        self.step += 1
        return float(loss)

    def read_rows(self, f, keys):
        return self.sess.run(self.read_ops[f], feed_dict={self.keys: keys})

    def find_placement(self):
        """One (untimed) step that returns the partitioned graphs: the device of every node."""
        opts = tf.compat.v1.RunOptions(output_partition_graphs=True)
        meta = tf.compat.v1.RunMetadata()
        _, train_op, feed = self._step_of(self.step)
        self.sess.run(train_op, feed_dict=feed, options=opts, run_metadata=meta)
        self.step += 1
        for g in meta.partition_graphs:
            self.placement.add_nodes(g.node)

    def profile(self, top):
        """One traced step (after an untraced one): per op type, the time its kernels held the
        executor (host: compute or enqueue) and the time of its GPU kernels, the GPU's busy time
        and the number of launches: whether the step waits on the host or on the GPU."""
        self.one_step()
        self.step += 1
        _, train_op, feed = self._step_of(self.step)
        stats, wall = step_trace.trace(self.sess, train_op, feed)
        self.step += 1
        recs = step_trace.records(stats, self.graph)
        write_trace(self.args, self.impl, wall, recs)
        print_profile(self.impl, wall, recs, top)

    def close(self):
        self.sess.close()
        self.close_tier(self.model)


STEP_FUNCTION = "train_step"  # the step's tf.function: the profiler's host event of each call


class FunctionRunner(_Timed):
    """One implementation in TF2 style: eager variables, its step a tf.function (GradientTape +
    the same optimizer), timed around the call plus .numpy() of the returned loss (a sync)."""

    def __init__(self, impl, args, batches, device, init_values=None, for_check=False):
        self.impl, self.args, self.nb, self.device = impl, args, len(batches), device
        self.placement = Placement()
        with device_scope(device):
            inputs = id_inputs(args, batches, eager=True)
            model = BUILDERS[impl](args, batches)
            loss_fn, dense_vars = dense_part(args)
        self.dense_vars = dense_vars
        if init_values is not None:
            for var, value in zip(model.tables, init_values):
                var.assign(value)
        self.model, self.inputs = model, inputs
        table_kind = "embedding variables" if impl.startswith("sok") else "variables"
        for kind, objs in ((table_kind, model.tables), ("hash tables", model.hash_tables)):
            for obj in objs:
                handle = getattr(obj, "handle", None)
                if handle is None:
                    handle = obj.resource_handle
                self.placement.tables[kind].add(short_device(handle.device))

        @tf.function
        def train_step(which):
            sp = inputs.sparse(which)
            with tf.GradientTape() as tape:
                loss = loss_fn(model.embed(sp))
            variables = model.tables + dense_vars
            grads = tape.gradient(loss, variables)
            n = len(model.tables)
            grads = grads[:n] + average_dense(args, grads[n:])
            model.opt.apply_gradients(zip(grads, variables))
            return loss

        self.fn = train_step
        if getattr(inputs, "per_batch", False):  # Python ints: a trace per batch
            whiches = list(range(self.nb))
        else:
            with tf.device("/CPU:0"):
                whiches = [tf.constant(b, tf.int32) for b in range(self.nb)]
        # A step calls its batch's concrete function, as a loop that keeps them would: calling
        # train_step binds its arguments and looks up the trace in Python first (about 0.45 ms
        # per call on an H200: a quarter of SOK's step).
        self.calls = [train_step.get_concrete_function(w) for w in whiches]
        self.per_batch, self.whiches = getattr(inputs, "per_batch", False), whiches
        self.step, self.times, self.cpu_times, self.io = 0, [], [], {}
        # The first call traces and instantiates the function: record its partitioned graphs.
        from tensorflow.python.eager import context  # no public API returns a function's placement
        ctx = context.context()
        ctx.enable_run_metadata()
        ctx.export_run_metadata()  # drops what earlier runners' functions left in the context
        try:
            self.first_loss = self.loss_step()  # a warm-up step (--check compares its loss)
            meta = ctx.export_run_metadata()
        finally:
            ctx.disable_run_metadata()
        # The step is the largest function (the others initialise slots and the step counter).
        by_function = [
            [n for pg in fg.partition_graphs for n in pg.node] for fg in meta.function_graphs
        ]
        if by_function:
            self.placement.add_nodes(max(by_function, key=len), tables_from_graph=False)

    def dense_values(self):
        return [v.numpy() for v in self.dense_vars]

    def kernel_counts(self):
        return self.model.sok.kernel_run_counts()

    def _call(self):
        b = self.step % self.nb
        # The profiler's host event of the step (a concrete function's call makes none).
        with tf.profiler.experimental.Trace(STEP_FUNCTION):
            return self.calls[b]() if self.per_batch else self.calls[b](self.whiches[b])

    def one_step(self):
        self._call().numpy()

    def loss_step(self):
        with device_scope(self.device):
            loss = float(self._call().numpy())
        self.step += 1
        return loss

    def read_rows(self, f, keys):
        with device_scope(self.device):
            return self.model.read_rows(f, tf.constant(keys)).numpy()

    def find_placement(self):
        pass  # recorded at the first call

    def profile(self, top):
        """One step traced by TensorFlow's profiler (after an untraced one): the graph-mode table
        (host time of CPU ops and SOK's ops: TensorFlow traces no other GPU op on the host) and
        when, after the Python call began, the runtime started the function and the GPU first
        and last worked."""
        with device_scope(self.device):
            self.one_step()
            self.step += 1
            walls = []

            def timed_step():
                t0 = time.perf_counter()
                self.one_step()
                walls.append((time.perf_counter() - t0) * 1e3)

            with tempfile.TemporaryDirectory() as logdir:
                path = xplane_trace.trace(timed_step, 1, logdir)
                steps = xplane_trace.step_records(path, STEP_FUNCTION)
            wall = walls[-1]
            self.step += 1
        if not steps:
            print(f"[{self.impl}] the trace holds no '{STEP_FUNCTION}' step")
            return
        s = steps[-1]
        ms = {k: (v / 1e3 if v is not None else float("nan")) for k, v in s.items()
              if k.endswith("_us")}
        landmarks = f"; from the call: the runtime starts the function at {ms['runtime_start_us']:.2f} ms"
        if s["first_gpu_us"] is not None:
            landmarks += (f", the GPU works from {ms['first_gpu_us']:.2f} to "
                          f"{ms['last_gpu_us']:.2f} ms")
        write_trace(self.args, self.impl, wall, s["records"])
        print_profile(self.impl, wall, s["records"], top, landmarks)

    def close(self):
        model, self.fn, self.model, self.inputs, self.calls = self.model, None, None, None, None
        self.close_tier(model)


RUNNERS = {"graph": GraphRunner, "function": FunctionRunner}
