"""A TF1 training step of two Embedding Variables (one spread over the ranks, one whole on rank 1)
under horovodrun with a GPU per rank: its partition graphs hold no copy from a GPU to the host
(a _Send on the GPU that a _HostRecv takes), and the exchange's kernels ran on the GPU. The sizes
the all-to-alls need reach the host inside SokAllToAll (one bounded wait), not as copies."""
import numpy as np
import tensorflow as tf
from mp_common import log, setup

import sparse_operation_kit as sok

EXCHANGE_OPS = ("SokExchangePlan", "SokExchangeOwnerKeys", "SokExchangeRowsToBlocks",
                "SokPooledCombineFlat", "SokPooledCombineFlatGrad", "SokExchangeRowsFromBlocks")


def main():
    _, rank, world = setup()
    config = tf.compat.v1.ConfigProto()
    # A Session's own ConfigProto replaces tf.config's visible devices (sok.init pinned the GPU).
    config.gpu_options.visible_device_list = ",".join(
        d.name.rsplit(":", 1)[1] for d in tf.config.get_visible_devices("GPU"))
    with tf.Graph().as_default(), tf.compat.v1.Session(config=config) as sess:
        ids = tf.compat.v1.placeholder(tf.int64, [None, 2])
        evs = [sok.get_embedding_variable("spread", 4),
               sok.get_embedding_variable("on_rank1", 8)]
        evs[1].target_gpu = 1  # whole on rank 1 (SOK 2.x's attribute)
        embs = sok.lookup_sparse(evs, [ids, ids + 100], combiners=["sum", "mean"])
        loss = tf.add_n([tf.reduce_sum(e) for e in embs])
        train = sok.OptimizerWrapper(tf.compat.v1.train.AdagradOptimizer(0.1)).minimize(loss)
        sess.run(tf.compat.v1.global_variables_initializer())
        feed = {ids: np.arange(8 * (rank + 1)).reshape(-1, 2) % 11}
        meta = tf.compat.v1.RunMetadata()
        for _ in range(2):
            sess.run(train, feed, options=tf.compat.v1.RunOptions(output_partition_graphs=True),
                     run_metadata=meta)
    nodes = [n for g in meta.partition_graphs for n in g.node]
    on_gpu = [n for n in nodes if "GPU" in n.device]
    sent = {n.attr["tensor_name"].s for n in on_gpu if n.op == "_Send"}
    copies = sorted(n.attr["tensor_name"].s.decode() for n in nodes
                    if n.op == "_HostRecv" and n.attr["tensor_name"].s in sent)
    counts = sok.kernel_run_counts(by_op=True)
    missing = [op for op in EXCHANGE_OPS if not counts.get(op, {}).get("GPU")]
    on_cpu = [op for op in EXCHANGE_OPS if counts.get(op, {}).get("CPU")]
    if not on_gpu or copies or missing or on_cpu:
        raise SystemExit(f"[rank {rank}] FAILED: GPU nodes {len(on_gpu)}; copies to the host "
                         f"{copies}; exchange ops not on the GPU {missing}; on the CPU {on_cpu}")
    log(f"OK step copies: {len(on_gpu)} GPU nodes, no copy to the host, world {world}")


if __name__ == "__main__":
    main()
