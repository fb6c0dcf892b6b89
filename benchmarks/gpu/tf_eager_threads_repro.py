"""TensorFlow's eager GPU thread bug, with stock ops or with SOK's.

Python threads run eager ops on one GPU at once, each step ending in a host synchronisation; now
and then a TensorFlow op misreads a small shape tensor ("Input to reshape is a tensor with 50
values, but the requested shape has 1"; StridedSlice "slice index 1 of dimension 0 out of
bounds"). Upstream: tensorflow/tensorflow#123980 (tf.boolean_mask from threads on a GPU).

    python benchmarks/gpu/tf_eager_threads_repro.py tf 10             # stock ops only
    python benchmarks/gpu/tf_eager_threads_repro.py sok 10 unique 4   # SokUniqueKeys syncs

Measured on an H100 (TF 2.21, 10 repeats of 4 threads x 20 steps): stock ops 0 of 10
without a sync, 3 of 10 with `.numpy()` each step; with SOK's ops (which synchronise to size their
outputs) 1-3 of 10; one thread 0 of 10. tests/python/tables/test_concurrency.py reports such an
error as an expected failure on the GPU.
"""
import sys
import threading

import numpy as np
import tensorflow as tf

THREADS_DEFAULT, STEPS, SPAN, STRIDE = 4, 20, 50, 25


def keys_of(t, base):
    return np.arange(base + t * STRIDE, base + t * STRIDE + SPAN, dtype=np.int64)


def ragged_rows(keys):
    rag = tf.RaggedTensor.from_row_lengths(keys, [SPAN])
    return tf.reshape(rag.value_rowids(), [-1, 1])


def stock_step(var):
    def step(keys):
        tf.gather(var, keys)
        var.scatter_add(tf.IndexedSlices(tf.ones([SPAN, 3]), keys))
        rows = ragged_rows(keys)
        tf.unique(keys)
        tf.reduce_sum(rows).numpy()  # the host synchronisation

    return step


def sok_step(sok, ev, parts):
    opt = sok.SGD(lr=1.0)

    def step(keys):
        if "read" in parts:
            ev.sparse_read(keys)
        if "apply" in parts:
            opt.apply_gradients([(tf.IndexedSlices(tf.ones([SPAN, 3]), keys), ev)])
        if "unique" in parts:
            sok.lookup_sparse([ev], [tf.RaggedTensor.from_row_lengths(keys, [SPAN])],
                              training=True)
        ragged_rows(keys)

    return step


def run_once(step, threads):
    """One repeat: the first error of any thread, or None."""
    barrier = threading.Barrier(threads)
    errors = []

    def worker(t):
        try:
            for s in range(STEPS):
                keys = tf.constant(keys_of(t, s * 1000))
                barrier.wait(timeout=60)
                step(keys)
        except threading.BrokenBarrierError:
            pass
        except Exception as e:  # reported by the main thread
            errors.append(e)
            barrier.abort()

    pool = [threading.Thread(target=worker, args=(t,)) for t in range(threads)]
    for th in pool:
        th.start()
    for th in pool:
        th.join()
    return errors[0] if errors else None


def main(argv):
    which, repeats = argv[1], int(argv[2])
    parts = argv[3].split(",") if len(argv) > 3 else ["read", "apply", "unique"]
    threads = int(argv[4]) if len(argv) > 4 else THREADS_DEFAULT
    failed = 0
    for r in range(repeats):
        if which == "sok":
            import sparse_operation_kit as sok

            ev = sok.get_embedding_variable(f"repro_{r}", 3,
                                            initializer=tf.constant_initializer(0.5))
            step = sok_step(sok, ev, parts)
        else:
            step = stock_step(tf.Variable(tf.zeros([100000, 3])))
        err = run_once(step, threads)
        if err is not None:
            failed += 1
            print(f"repeat {r}: {type(err).__name__}: {str(err)[:300]}", flush=True)
    print(f"{which} {','.join(parts) if which == 'sok' else 'stock ops'} threads={threads}: "
          f"{failed} of {repeats} repeats failed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
