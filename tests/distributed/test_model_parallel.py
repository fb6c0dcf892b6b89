"""Model parallelism under real `horovodrun -np 2` and `-np 3` against one process: Gloo on CPUs;
NCCL with SOK_TEST_DEVICE=gpu on a machine with a GPU per rank.

Each horovodrun job runs tests/distributed/workers/model_parallel.py (or another worker there);
every rank checks its own results against a plain-TensorFlow reference it computes alone (whole
tables, whole global batch) and prints "OK <what>"; a failed check exits the rank non-zero, which
ends the job. The tests assert the exit code and that every rank reported every phase.

    2 ranks: exchange bytes, TF2 eager (Keras SGD/Adagrad/Adam), TF1 Session (v1 optimizers),
             SOK 2.x-style code, errors, sok.dump (2-rank checkpoint), a SOK 2.x program
    3 ranks (SOK_TEST_MORE_RANKS): the same, plus sok.load of the 2-rank checkpoint, sok.dump
    2 ranks: sok.load of the 3-rank checkpoint, then a rank leaves early; one process: sok.load
             of both checkpoints; a rank that never joins
    2 and MORE ranks: dense ids (the padded dedup and plan), eager and tf.function, Adam
    2 ranks: TF2 Adagrad and TF1 Adam with every rank's Embedding Variable shards in two tiers,
             a sok.dump of them; MORE ranks: sok.load of it into tiered tables
"""
import os
import re
import sys

import pytest
from launch import RANKS, TEST_DEVICE, WORKERS, _tail, gpu_count, horovodrun


def _assert_ok(np_, rc, out, phases):
    assert rc == 0, f"horovodrun -np {np_} failed (exit code {rc}):\n{_tail(out)}"
    for r in range(np_):
        assert f"[rank {r}/{np_}] WORKER-DONE" in out, f"rank {r} did not finish:\n{_tail(out)}"
        for phase in phases:
            assert re.search(rf"\[rank {r}/{np_}\] OK {re.escape(phase)}", out), \
                f"rank {r} did not report 'OK {phase}':\n{_tail(out)}"


# The second world size: 3 (odd) by default; on GPUs one rank per GPU, so at most the machine's
# GPUs (2 on a 2-GPU machine: the N -> M checkpoint tests then move 2 ranks' files to 2 ranks).
MORE = int(os.environ.get("SOK_TEST_MORE_RANKS", "3" if TEST_DEVICE != "gpu" else
                          str(min(3, max(2, gpu_count())))))

MAIN_PHASES = [
    "tf2 sgd", "tf2 adagrad", "tf2 adam", "tf1 sgd", "tf1 adagrad", "tf1 adam", "sok2x", "errors",
]


@pytest.fixture(scope="module")
def ckpt_root(tmp_path_factory):
    return tmp_path_factory.mktemp("sok_dumps")


@pytest.fixture(scope="module")
def run_two(ckpt_root):
    """-np 2: everything, and a 2-rank sok.dump."""
    dump = ckpt_root / "from2"
    rc, out, secs = horovodrun(
        2, "model_parallel.py", "bytes", "collectives", "chains", "tf2", "tf1", "sok2x", "errors", f"dump={dump}",
        f"sok2program={ckpt_root / 'sok2_program'}",
    )
    return rc, out, dump


@pytest.fixture(scope="module")
def run_more(ckpt_root, run_two):
    """-np MORE: everything, the 2-rank dump loaded into MORE ranks, and a MORE-rank sok.dump."""
    dump = ckpt_root / f"from{MORE}"
    rc, out, secs = horovodrun(
        MORE,
        "model_parallel.py",
        f"load={run_two[2]}",
        "tf2",
        "tf1",
        "sok2x",
        "errors",
        f"dump={dump}",
    )
    return rc, out, dump


def test_two_ranks_match_one_process(run_two):
    """Forward values, gradients and 20 SGD/Adagrad/Adam steps (TF2 eager and TF1 Session) on
    target_gpu=-1, target_gpu=k and both in one lookup_sparse call equal one process's; SOK
    2.x-style code runs unchanged; errors are the same, clear, on every rank."""
    rc, out, _ = run_two
    _assert_ok(2, rc, out, MAIN_PHASES + ["bytes",
                                          "collectives: sok.all_reduce sum/mean, sok.all_gather, "
                                          "eager and TF1",
                                          "chains: evaluation lookups run none of the training",
                                          "checkpoint: sok.dump from 2 ranks"])


def test_tiered_tables_on_two_ranks_match_one_process(tmp_path):
    """Each rank's shard of the Embedding Variables in two tiers (DRAM_SSDHASH with room for two
    rows in DRAM on CPUs, HBM_DRAM on GPUs): TF2 Adagrad and TF1 Adam steps equal the one-tier,
    one-process reference, as the main phases do for one tier; a 2-rank sok.dump of tiered tables
    loads into MORE ranks' tiered tables, which train on as the reference does."""
    dump = tmp_path / "dump"
    rc, out, _ = horovodrun(2, "model_parallel.py", f"tiered={tmp_path / 'np2'}", "tf2:adagrad",
                            "tf1:adam", f"dump={dump}")
    _assert_ok(2, rc, out, ["tf2 adagrad on two tiers", "tf1 adam on two tiers",
                            "checkpoint: sok.dump from 2 ranks"])
    rc, out, _ = horovodrun(MORE, "model_parallel.py", f"tiered={tmp_path / 'more'}",
                            f"load={dump}")
    _assert_ok(MORE, rc, out, [f"checkpoint: sok.load of a 2-rank dump into {MORE} ranks"])


def test_sok2_program_on_two_ranks(run_two):
    """A representative SOK 2.x program (DynamicVariable + sok.Variable tables, fused Adagrad and
    generic Momentum, incremental_model_dump, sok.dump/load with slots) equals one process's
    tf.Variables trained by the same optimizers (workers/sok2_program.py; in the -np 2 job)."""
    rc, out, _ = run_two
    _assert_ok(2, rc, out, ["sok2 program", "optimizer families on sharded tables"])


@pytest.mark.parametrize("np_", [2, MORE])
def test_dense_ids_match_one_process(np_):
    """Dense [batch, k] ids, whose lookups skip the requester's wait (padded dedup and plan),
    eager and in a tf.function, and with static tables beside the Embedding Variables, Adam:
    embeddings, rows, slots and static shards equal one process (workers/dense_ids.py)."""
    rc, out, _ = horovodrun(np_, "dense_ids.py")
    _assert_ok(np_, rc, out, ["dense ids eager:", "dense ids function:",
                              "dense ids eager with static tables:"])


@pytest.mark.parametrize("np_", [2, MORE])
def test_tensorflow_lookups_match_one_process(np_):
    """tf.nn.embedding_lookup, embedding_lookup_sparse, safe_embedding_lookup_sparse and Keras's
    sok.Embedding without a combiner on sharded and whole Embedding Variables fetch rows from
    their owners: SGD steps' embeddings and owned rows equal one process, eager, in a tf.function
    and in a TF1 Session (workers/tf_api.py)."""
    rc, out, _ = horovodrun(np_, "tf_api.py")
    _assert_ok(np_, rc, out, ["tf api eager:", "tf api function:", "tf api tf1:"])


@pytest.mark.parametrize("np_", [2, MORE])
def test_keras_fit_and_files_match_one_process(np_, tmp_path):
    """Keras 3's compile/fit with sok.OptimizerWrapper(..., average_over_ranks=True), each rank
    fitting its slice of the global batches: Dense weights and owned rows equal one process on
    the global batches. .keras files: each rank's shard reloads to the bit on its rank and is
    refused elsewhere; a one-process file loads onto N ranks, each keeping its rows
    (workers/keras_fit.py)."""
    one = {"SOK_TEST_KERAS_DIR": str(tmp_path)}
    rc, out, _ = horovodrun(1, "keras_fit.py", env=one)
    _assert_ok(1, rc, out, ["keras fit on 1 ranks:", "keras files:"])
    several = {**one, "SOK_TEST_KERAS_WHOLE": str(tmp_path / "rank0-of-1.keras")}
    rc, out, _ = horovodrun(np_, "keras_fit.py", env=several)
    _assert_ok(np_, rc, out, [f"keras fit on {np_} ranks:", "keras files: each rank's shard",
                              "keras one-process file:"])
    (tmp_path / "again").mkdir()
    shard = {"SOK_TEST_KERAS_DIR": str(tmp_path / "again"),
             "SOK_TEST_KERAS_SHARD": str(tmp_path / f"rank0-of-{np_}.keras")}
    rc, out, _ = horovodrun(1, "keras_fit.py", env=shard)
    _assert_ok(1, rc, out, ["keras files: a shard of another world is refused"])


def test_more_ranks_match_one_process(run_more):
    """The same with MORE ranks (3 on CPUs: an odd world, owners k mod 3, a table on rank 2)."""
    rc, out, _ = run_more
    _assert_ok(MORE, rc, out, MAIN_PHASES + [f"checkpoint: sok.dump from {MORE} ranks"])


def test_checkpoint_two_to_more_ranks(run_more):
    rc, out, _ = run_more
    _assert_ok(MORE, rc, out, [f"checkpoint: sok.load of a 2-rank dump into {MORE} ranks"])


@pytest.fixture(scope="module")
def run_more_to_two(run_more):
    """-np 2: the MORE-rank dump loaded into 2 ranks; then rank 1 leaves early (a launch saved)."""
    # The collective timeout bounds NCCL's wait for the rank that left (Gloo notices at once).
    return horovodrun(2, "mp_checkpoint.py", f"load={run_more[2]}", "leave", gloo_timeout=10,
                      env={"SOK_COLLECTIVE_TIMEOUT_SECONDS": "20"})


def test_checkpoint_more_to_two_ranks(run_more_to_two):
    rc, out, _ = run_more_to_two
    for r in range(2):
        assert re.search(
            rf"\[rank {r}/2\] OK checkpoint: sok.load of a {MORE}-rank dump into 2 ranks", out
        ), f"rank {r} (exit code {rc}):\n{_tail(out)}"


def test_checkpoint_into_one_process(run_two, run_more, capsys):
    """Both dumps load into one process without Horovod (in this process: no launch needed)."""
    sys.path.insert(0, WORKERS)
    try:
        import mp_checkpoint
        import mp_common
        _, rank, world = mp_common.setup(use_horovod=False)
        assert (rank, world) == (0, 1)
        for dump in (run_two[2], run_more[2]):
            assert dump.exists(), f"no dump at {dump} (see the multi-rank tests)"
            mp_checkpoint.load_and_continue(str(dump), None, 0, 1)
    finally:
        sys.path.remove(WORKERS)
    out = capsys.readouterr().out
    assert "OK checkpoint: sok.load of a 2-rank dump into 1 rank" in out
    assert f"OK checkpoint: sok.load of a {MORE}-rank dump into 1 rank" in out


def test_rank_that_leaves_early_is_an_error_not_a_hang(run_more_to_two):
    """After the checkpoint test, the last rank exits: the other's next lookup_sparse fails with
    Horovod's shutdown error (Gloo) or within the collective timeout (NCCL), and the job ends
    with a non-zero exit code (no hang: the job has a timeout; a lookup that kept working would
    fail the check too)."""
    rc, out, _ = run_more_to_two
    assert rc != 0, _tail(out)
    assert "[rank 1] leaves early" in out
    assert re.search(r"\[rank 0\] lookup_sparse failed after .*(Horovod has been shut down|"
                     r"NCCL communicator was aborted|NCCL failed)", out), _tail(out)


def test_ranks_that_diverge_end_with_an_error_within_the_timeout():
    """One rank skips a lookup_sparse call and goes on to another collective: with the collective
    timeout (sok.init(), here 8 s) every rank fails with an error, rank 0's naming the call and
    its table; no rank hangs (the job's own timeout would fail the test). Eager collectives have
    no per-call names, so Horovod pairs rank 1's third call with rank 0's second: rank 0's error
    names the first call that could not complete (the third)."""
    env_timeout = 8
    os.environ["SOK_COLLECTIVE_TIMEOUT_SECONDS"] = str(env_timeout)
    try:
        rc, out, secs = horovodrun(RANKS, "failures.py", "diverge", timeout=240)
    finally:
        del os.environ["SOK_COLLECTIVE_TIMEOUT_SECONDS"]
    assert rc != 0, _tail(out)
    assert "[rank 0] collective timeout 8 s" in out, _tail(out)
    m0 = re.search(r"\[rank 0\] failed after ([0-9.]+) s: RuntimeError: lookup_sparse 'features_call2' "
                   r"over tables \['diverging_table'\] on rank 0: its exchange did not complete on every "
                   r"rank within 8 s", out)
    assert m0, _tail(out)
    m1 = re.search(rf"\[rank {RANKS - 1}\] failed after ([0-9.]+) s: .*Horovod has been shut down",
                   out)
    assert m1, _tail(out)
    # Bounded: the timeout plus one stall check and start-up, not the job's 240 s.
    assert float(m0.group(1)) < 60 and float(m1.group(1)) < 60, (m0.group(0), m1.group(0))


def test_rank_that_never_joins_times_out():
    """The last rank never calls hvd.init(): the others' hvd.init() ends with Horovod's rendezvous
    timeout (HOROVOD_GLOO_TIMEOUT_SECONDS) and the job fails instead of hanging."""
    rc, out, secs = horovodrun(RANKS, "failures.py", "nojoin", gloo_timeout=5, timeout=240)
    assert rc != 0, _tail(out)
    assert f"[rank {RANKS - 1}] never joins" in out
    assert re.search(r"Wait timeout after 5 seconds|HOROVOD_GLOO_TIMEOUT_SECONDS", out), _tail(out)


def test_alltoall_moves_fewer_bytes_than_allgather(capsys):
    """Bytes per step of the two all-to-alls (and their gradients) for a Criteo-like batch, against
    an all-gather of all keys and rows; the model is checked against the bytes the all-to-alls
    really send in the 2-rank job ('bytes' phase)."""
    sys.path.insert(0, WORKERS)
    try:
        import exchange_bytes
        text, results = exchange_bytes.table(worlds=(2, 4, 8), global_batch=8192)
    finally:
        sys.path.remove(WORKERS)
    with capsys.disabled():
        print("\n" + text)
    for world, b in results.items():
        assert b["alltoall"] < b["allgather"], (world, b)
    assert (
        results[8]["alltoall"] / results[8]["allgather"]
        < results[2]["alltoall"] / results[2]["allgather"]
    )


def test_dump_load_edges_in_one_process(tmp_path):
    """sok.dump/load guards: variables of one name, shards of an older dump with another world
    size (removed by the next dump), a dump with missing ranks, a table placed on rank k (one
    process holds it whole)."""
    import numpy as np
    import tensorflow as tf

    import sparse_operation_kit as sok
    sok.init()
    a = sok.DynamicVariable(dimension=2, initializer="1", name="edge_dup")
    b = sok.DynamicVariable(dimension=2, initializer="2", name="edge_dup")
    with pytest.raises(ValueError, match="several variables are named"):
        sok.dump(str(tmp_path / "dup"), [a, b])

    ev = sok.get_embedding_variable("edge_ev", 3, initializer=tf.ones_initializer())
    ev.target_gpu = 1
    ev.assign(tf.constant([5, 8], tf.int64), tf.constant([[1.0, 2, 3], [4, 5, 6]]))
    static = sok.Variable(
        np.arange(8, dtype=np.float32).reshape(4, 2), mode="localized:1", name="edge_static"
    )
    path = tmp_path / "ckpt"
    (path / "edge_ev").mkdir(parents=True)
    np.savez(
        path / "edge_ev" / "rank1-of-2.npz", keys=np.array([99], np.int64)
    )  # an older 2-rank dump
    sok.dump(str(path), [ev, static])
    assert sorted(os.listdir(path / "edge_ev")) == ["rank0-of-1.npz"]

    ev2 = sok.get_embedding_variable("edge_ev", 3)
    ev2.target_gpu = 1
    static2 = sok.Variable(np.zeros([4, 2], np.float32), mode="localized:1", name="edge_static")
    sok.load(str(path), [ev2, static2])
    keys, values = sok.export(ev2)
    assert sorted(keys.numpy().tolist()) == [5, 8]
    np.testing.assert_array_equal(values.numpy()[np.argsort(keys.numpy())], [[1, 2, 3], [4, 5, 6]])
    np.testing.assert_array_equal(static2.numpy(), np.arange(8).reshape(4, 2))

    os.rename(path / "edge_ev" / "rank0-of-1.npz", path / "edge_ev" / "rank0-of-3.npz")
    with pytest.raises(
        FileNotFoundError, match=r"written by 3 ranks but the files of ranks \[1, 2\] are missing"
    ):
        sok.load(str(path), [ev2])
