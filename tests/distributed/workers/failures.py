"""Worker for the failure tests: a rank that dies, or one that never joins.

    python failures.py exit     the last rank leaves right after hvd.init(); the others then call
                                lookup_sparse and must get Horovod's error, not hang (the test
                                suite runs this as the `leave` phase of mp_checkpoint.py instead,
                                after a checkpoint load, to save a launch)
    python failures.py nojoin   the last rank never calls hvd.init(); the others' hvd.init() must
                                end with Horovod's rendezvous timeout (HOROVOD_GLOO_TIMEOUT_SECONDS)
    python failures.py diverge  sok.init() initialises Horovod with SOK_COLLECTIVE_TIMEOUT_SECONDS;
                                the last rank skips the second lookup_sparse call and goes on to
                                an allreduce: every rank must fail with an error within the
                                timeout (rank 0's names the lookup call and its table)
"""
import os
import sys
import time

mode = sys.argv[1]
rank = int(os.environ["HOROVOD_RANK"])
last = int(os.environ["HOROVOD_SIZE"]) - 1
if mode == "nojoin" and rank == last:
    print(f"[rank {rank}] never joins", flush=True)
    time.sleep(600)  # horovodrun ends it once another rank has failed
    sys.exit(0)

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import horovod.tensorflow as hvd  # noqa: E402
import tensorflow as tf  # noqa: E402
from mp_common import lookups_fail, report_failure  # noqa: E402

import sparse_operation_kit as sok  # noqa: E402
from sparse_operation_kit.runtime import context  # noqa: E402

start = time.time()
if mode == "diverge":
    sok.init()  # initialises Horovod, with the collective timeout
    assert hvd.is_initialized()
    print(f"[rank {rank}] collective timeout {context.context.collective_timeout_s:g} s", flush=True)
    ev = sok.get_embedding_variable("diverging_table", 4)
    ids = tf.ragged.constant([[1, 2, 3]], dtype=tf.int64)
    try:
        for call in range(3):
            if rank == last and call == 1:
                continue  # the skipped call
            sok.lookup_sparse([ev], [ids], name=f"features_call{call}")
        hvd.allreduce(tf.constant(1.0), name="after_the_lookups")
    except Exception as e:  # noqa: BLE001
        report_failure(f"[rank {rank}]", start, e, chars=600)
        sys.exit(2)
    print(f"[rank {rank}] did not fail", flush=True)
    sys.exit(0)
hvd.init()
sok.init()
if mode == "exit" and rank == last:
    print(f"[rank {rank}] leaves early", flush=True)
    sys.exit(0)
if lookups_fail(rank, "dies", 3, start):
    sys.exit(2)
print(f"[rank {rank}] lookup_sparse did not fail", flush=True)
sys.exit(0)
