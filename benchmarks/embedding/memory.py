"""Bytes per key of an Embedding Variable: memory the table adds per key, split into its values,
its optimizer slots and the rest (index, keys, counters, growth slack).

Each configuration runs in a fresh process: inserts --keys distinct keys (training reads), then
one Adagrad step on all of them (its accumulator slot), and reads the memory in use before and
after: on the CPU the process's resident memory (/proc/self/status VmRSS), on the GPU (--device
gpu, the table in GPU memory) what TensorFlow's GPU allocator holds, which SOK's GPU tables
allocate from (tf.config.experimental.get_memory_info). Before is read after two warm-up steps
on another table, so that TensorFlow's per-step buffers (a fixed cost) are not counted per key.
The multi-tier issue's target for the rest is 32 bytes on the CPU; the GPU's is reported.

    .venv/bin/python benchmarks/embedding/memory.py --keys 4000000 --dims 16,128 [--device gpu]
    .venv/bin/python benchmarks/embedding/memory.py --keys 4000000 --dims 16,128 --storage dram_ssd
prints one line per dim:
    MEMORY device=cpu dim=16 keys=4000000 bytes_per_key=... values=64 slots=64 overhead=...
"""
import argparse
import os
import sys

from proc_memory import run_child, status_bytes

TARGET_OVERHEAD = 32  # bytes per key beyond values and slots (the multi-tier issue's target)


def _rss_bytes():
    return status_bytes("VmRSS")


def _anon_bytes():
    """Resident anonymous memory: what a DRAM_SSDHASH table keeps in DRAM, without the SSD
    file's pages (page cache, and the read-only mapping its reads go through)."""
    return status_bytes("RssAnon")


def measure_ssd(keys, dim, chunk):
    """Runs in the child: DRAM bytes per key of a DRAM_SSDHASH table whose DRAM budget holds a
    few rows, and SSD file bytes per key. The first step on the table is left out: the DRAM tier
    holds each operation's keys while it runs (a working set of `chunk` rows, not a per-key cost)."""
    import tempfile

    import numpy as np
    import tensorflow as tf

    import sparse_operation_kit as sok

    opt = sok.OptimizerWrapper(tf.compat.v1.train.AdagradOptimizer(0.1))

    def step(ev, start, stop):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(ev.sparse_read(tf.constant(np.arange(start, stop, dtype=np.int64))))
        opt.apply_gradients([(tape.gradient(loss, ev), ev)])

    with tempfile.TemporaryDirectory() as path, tf.device("/CPU:0"):
        option = sok.StorageOption(sok.StorageType.DRAM_SSDHASH, path, [1 << 20])
        warm = sok.get_embedding_variable("memory_bench_warm", dim, initializer=tf.zeros_initializer(),
                                          ev_option=sok.EmbeddingVariableOption(storage_option=option))
        for w in range(2):
            step(warm, w * chunk, (w + 1) * chunk)
        ev = sok.get_embedding_variable("memory_bench", dim, initializer=tf.zeros_initializer(),
                                        ev_option=sok.EmbeddingVariableOption(storage_option=option))
        step(ev, 0, chunk)
        before = _anon_bytes()
        for start in range(chunk, keys, chunk):
            step(ev, start, min(keys, start + chunk))
        after = _anon_bytes()
        files = [os.path.join(path, d, "rows.log") for d in os.listdir(path)
                 if d.startswith("sok_ev_memory_bench.")]
        ssd = os.path.getsize(files[0]) / keys
    return (after - before) / (keys - chunk), ssd


def measure(keys, dim, chunk, device="cpu"):
    """Runs in the child: returns (total bytes per key, values, slots) per key."""
    import contextlib

    import numpy as np
    import tensorflow as tf

    import sparse_operation_kit as sok

    if device == "gpu":
        if not tf.config.list_physical_devices("GPU"):
            raise SystemExit("memory.py --device gpu: TensorFlow sees no GPU")
        place = tf.device("/GPU:0")

        def in_use():
            return tf.config.experimental.get_memory_info("GPU:0")["current"]
    else:
        place, in_use = contextlib.nullcontext(), _rss_bytes

    opt = sok.OptimizerWrapper(tf.compat.v1.train.AdagradOptimizer(0.1))

    def step(ev, ids):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(ev.sparse_read(tf.constant(ids)))
        opt.apply_gradients([(tape.gradient(loss, ev), ev)])

    # Warm-up on another table of the same dim: two steps of new keys, so that what the first
    # steps allocate once and keep is resident before `before` (TensorFlow keeps gradient
    # buffers of chunk x dim floats from the second step on: a fixed cost, not a per-key one).
    # The measured table starts empty, so that all its keys count.
    with place:
        warm = sok.get_embedding_variable("memory_bench_warm", dim, key_dtype=tf.int64,
                                          initializer=tf.zeros_initializer())
        for w in range(2):
            step(warm, np.arange(w * chunk, (w + 1) * chunk, dtype=np.int64))
        ev = sok.get_embedding_variable("memory_bench", dim, key_dtype=tf.int64,
                                        initializer=tf.zeros_initializer())
        before = in_use()
        for start in range(0, keys, chunk):
            step(ev, np.arange(start, min(keys, start + chunk), dtype=np.int64))
        after = in_use()
    return (after - before) / keys, 4 * dim, 4 * dim  # Adagrad: one slot of dim floats


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--keys", type=int, default=4_000_000)
    p.add_argument("--dims", default="16,128")
    p.add_argument("--chunk", type=int, default=262_144, help="keys per training step")
    p.add_argument("--device", choices=("cpu", "gpu"), default="cpu",
                   help="where the table lives (gpu: TensorFlow's GPU allocator is measured)")
    p.add_argument("--storage", choices=("dram", "dram_ssd"), default="dram",
                   help="dram_ssd: a DRAM_SSDHASH table (CPU) whose DRAM holds a few rows; "
                   "reports its DRAM bytes per key (all overhead: the rows are on SSD) and its "
                   "file's bytes per key")
    p.add_argument("--child-dim", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.storage == "dram_ssd" and args.device != "cpu":
        p.error("--storage dram_ssd is a CPU tier")
    if args.child_dim and args.storage == "dram_ssd":
        dram, ssd = measure_ssd(args.keys, args.child_dim, args.chunk)
        print(f"MEMORY device=cpu storage=dram_ssd dim={args.child_dim} keys={args.keys} "
              f"dram_bytes_per_key={dram:.1f} ssd_file_bytes_per_key={ssd:.1f} "
              f"overhead={dram:.1f} target_overhead={TARGET_OVERHEAD}", flush=True)
        return 0
    if args.child_dim:
        total, values, slots = measure(args.keys, args.child_dim, args.chunk, args.device)
        print(f"MEMORY device={args.device} dim={args.child_dim} keys={args.keys} bytes_per_key={total:.1f} "
              f"values={values} slots={slots} overhead={total - values - slots:.1f} "
              f"target_overhead={TARGET_OVERHEAD}", flush=True)
        return 0
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    if args.device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
    for dim in (int(d) for d in args.dims.split(",")):
        rc = run_child([sys.executable, __file__, "--keys", str(args.keys), "--chunk",
                        str(args.chunk), "--device", args.device, "--storage", args.storage,
                        "--child-dim", str(dim)], env, "MEMORY")
        if rc != 0:
            return rc
    return 0


if __name__ == "__main__":
    sys.exit(main())
