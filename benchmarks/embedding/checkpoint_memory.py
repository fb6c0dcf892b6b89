"""Host memory of sok.dump and sok.load: how much resident memory each adds at its peak, against
the table's rows and slots.

One table of --keys keys of --dim floats trained by Adagrad (one slot of dim floats), dumped in
one process and loaded into a fresh table in another. Each phase reports the process's resident
memory before it and its peak during it (VmHWM, reset before the phase through
/proc/self/clear_refs), so the figure is what the phase itself adds. With --device gpu the table
lives on the GPU (--storage hbm_dram: every row but a 10% cache in pinned host memory) and the
figures are still host memory: what a checkpoint of a table larger than the GPU needs. With
--storage dram_ssdhash (CPU) 10% of the rows stay in memory and the rest in files under the
dump's temporary directory: the added memory is then against the memory tier, not the table.

    .venv/bin/python benchmarks/embedding/checkpoint_memory.py --keys 2000000 --dim 128
    python3 benchmarks/embedding/checkpoint_memory.py --keys 2000000 --dim 128 --device gpu \
        --storage hbm_dram
    .venv/bin/python benchmarks/embedding/checkpoint_memory.py --keys 2000000 --dim 128 \
        --storage dram_ssdhash
prints one line per phase:
    CHECKPOINT phase=dump device=cpu storage=dram keys=... table_gb=... before_gb=... peak_gb=...
        added_gb=... added_per_table=... file_pages_gb=... seconds=...
"""
import argparse
import os
import sys
import tempfile
import time

from proc_memory import run_child, status_bytes

GB = 1 << 30


def _status_gb(field):
    return status_bytes(field) / GB


def _reset_peak():
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current resident set


def _table(args, name):
    import tensorflow as tf

    import sparse_operation_kit as sok

    option = None
    row = 4 * args.dim * 2 + 32  # values, Adagrad's slot, metadata (a tier's row cost)
    if args.storage == "hbm_dram":
        option = sok.EmbeddingVariableOption(storage_option=sok.StorageOption(
            storage_type=sok.StorageType.HBM_DRAM, storage_size=[args.keys * row // 10]))
    elif args.storage == "dram_ssdhash":  # each phase's table has its own files
        path = os.path.join(os.path.dirname(args.dump), f"ssd_{args.phase}")
        os.makedirs(path, exist_ok=True)
        option = sok.EmbeddingVariableOption(storage_option=sok.StorageOption(
            storage_type=sok.StorageType.DRAM_SSDHASH, storage_path=path,
            storage_size=[args.keys * row // 10]))
    with tf.device("/GPU:0" if args.device == "gpu" else "/CPU:0"):
        return sok.get_embedding_variable(name, args.dim, key_dtype=tf.int64,
                                          initializer=tf.zeros_initializer(), ev_option=option)


def _phase(args):
    """Runs in the child: trains and dumps (phase dump), or loads (phase load)."""
    import numpy as np
    import tensorflow as tf

    import sparse_operation_kit as sok

    ev = _table(args, "checkpoint_memory")
    if args.phase == "dump":
        opt = sok.OptimizerWrapper(tf.compat.v1.train.AdagradOptimizer(0.1))

        @tf.function
        def step(ids):
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(ev.sparse_read(ids))
            opt.apply_gradients([(tape.gradient(loss, ev), ev)])

        for start in range(0, args.keys, args.chunk):
            step(tf.constant(np.arange(start, min(args.keys, start + args.chunk), dtype=np.int64)))
        run = lambda: sok.dump(args.dump, [ev])  # noqa: E731
    else:
        run = lambda: sok.load(args.dump, [ev])  # noqa: E731
    before = _status_gb("VmRSS")
    file_before = _status_gb("RssFile")
    _reset_peak()
    t0 = time.time()
    run()
    seconds = time.time() - t0
    peak = _status_gb("VmHWM")
    # Mapped file pages count as resident too (a DRAM_SSDHASH table reads its file through a
    # shared mapping): the kernel drops them under pressure, unlike the rest.
    file_added = _status_gb("RssFile") - file_before
    size = int(ev.size())
    if size != args.keys:
        raise SystemExit(f"checkpoint_memory.py: the table holds {size} keys after the "
                         f"{args.phase}, want {args.keys}")
    table = args.keys * 4 * args.dim * 2 / GB
    print(f"CHECKPOINT phase={args.phase} device={args.device} storage={args.storage} "
          f"keys={args.keys} dim={args.dim} table_gb={table:.2f} before_gb={before:.2f} "
          f"peak_gb={peak:.2f} added_gb={peak - before:.2f} "
          f"added_per_table={(peak - before) / table:.2f} file_pages_gb={file_added:.2f} "
          f"seconds={seconds:.1f}", flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--keys", type=int, default=2_000_000)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--chunk", type=int, default=200_000, help="keys per training step")
    p.add_argument("--device", choices=("cpu", "gpu"), default="cpu")
    p.add_argument("--storage", choices=("dram", "hbm_dram", "dram_ssdhash"), default="dram",
                   help="hbm_dram: an HBM_DRAM table (GPU) caching 10%% of its rows in GPU "
                        "memory; dram_ssdhash: a DRAM_SSDHASH table (CPU) keeping 10%% of its "
                        "rows in memory, the rest in files")
    p.add_argument("--dir", default=None, help="where the dump's temporary directory goes")
    p.add_argument("--phase", choices=("dump", "load"), help=argparse.SUPPRESS)
    p.add_argument("--dump", default="", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.storage == "hbm_dram" and args.device != "gpu":
        p.error("--storage hbm_dram is a GPU tier")
    if args.storage == "dram_ssdhash" and args.device != "cpu":
        p.error("--storage dram_ssdhash is a CPU tier")
    if args.phase:
        _phase(args)
        return 0
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    if args.device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
    with tempfile.TemporaryDirectory(dir=args.dir) as d:
        for phase in ("dump", "load"):
            cmd = [sys.executable, __file__, "--keys", str(args.keys), "--dim", str(args.dim),
                   "--chunk", str(args.chunk), "--device", args.device, "--storage",
                   args.storage, "--dump", os.path.join(d, "dump"), "--phase", phase]
            rc = run_child(cmd, env, "CHECKPOINT")
            if rc != 0:
                return rc
    return 0


if __name__ == "__main__":
    sys.exit(main())
