"""The exchange's fused index ops (core/exchange.h) against a NumPy model of the exchange: every
rank's plan, the all-to-alls played in this process, the owners' distinct keys and rows, the requesters'
rows, and the gradient's way back. On a GPU machine the ops run on the GPU."""
import numpy as np
import pytest
import tensorflow as tf

from sparse_operation_kit.runtime._ops import ops
from sparse_operation_kit.tables import tables as sok_tables


def _value(t, owner, local, dim):
    """The row an owner holds for a local key of table t (distinct per table, owner and key)."""
    return (np.float32(local) * 10 + np.arange(dim, dtype=np.float32) + 1000 * t + 100000 * owner)


def _local(key, target, rows, world):
    return key // world if rows >= 0 and target < 0 else key


def _run(world, specs, keys_by_rank, seed=0, padded=False):
    """Plays one exchange; checks every step against NumPy; returns the requesters' rows.
    padded: the owners' keys padded to what they received (core/exchange.h)."""
    n = len(specs)
    targets = [s[0] for s in specs]
    rows = [s[1] for s in specs]
    dims = [s[2] for s in specs]
    rng = np.random.default_rng(seed)
    plans = []
    for r in range(world):
        keys = [tf.constant(k, tf.int64) for k in keys_by_rank[r]]
        counts = [tf.constant(rng.integers(1, 5, len(k)), tf.int64) for k in keys_by_rank[r]]
        out = ops.sok_exchange_plan(keys, counts, tf.zeros([0], tf.int64), world=world,
                                    targets=targets, rows=rows, dims=dims, signature=7)
        plans.append((counts, [x.numpy() for x in out]))
    # The request and matrix of each rank, against NumPy.
    for r, (counts, (request, matrix, _, sizes)) in enumerate(plans):
        assert list(sizes) == [len(k) for k in keys_by_rank[r]]
        expect, per_block = [], np.zeros([world, n], np.int64)
        for q in range(world):
            for t in range(n):
                k = np.asarray(keys_by_rank[r][t], np.int64)
                mine = sok_tables.owner(k, targets[t], world) == q
                per_block[q, t] = mine.sum()
                expect += [[a, c] for a, c in zip(k[mine], counts[t].numpy()[mine])]
        np.testing.assert_array_equal(request.reshape(-1, 2), np.asarray(expect).reshape(-1, 2))
        np.testing.assert_array_equal(matrix[:, :n], per_block)
        assert (matrix[:, n] == 7).all()
        bad = [t + 1 for t in range(n) if rows[t] >= 0 and any(
            k < 0 or k >= rows[t] for k in keys_by_rank[r][t])]
        assert (matrix[:, n + 1] == max(bad, default=0)).all()
    # The keys' all-to-all: owner q receives every requester's block q, in rank order.
    returned = [[] for _ in range(world)]
    for q in range(world):
        starts = [np.concatenate([[0], np.cumsum(p[1][1][:, :n].sum(1))]) for p in plans]
        received = np.concatenate(
            [plans[r][1][0][starts[r][q]:starts[r][q + 1]] for r in range(world)]).reshape(-1, 2)
        recv_counts = np.stack([plans[r][1][1][q] for r in range(world)])
        keys_q, counts_q, row_pos, distinct, valid = ops.sok_exchange_owner_keys(
            tf.constant(received, tf.int64), tf.constant(recv_counts), N=n, targets=targets,
            rows=rows, dims=dims, padded=padded)
        keys_q, counts_q = [k.numpy() for k in keys_q], [c.numpy() for c in counts_q]
        valid = valid.numpy()
        entries = recv_counts[:, :n].sum(0) if padded else valid
        np.testing.assert_array_equal(distinct.numpy(), entries)
        for t in range(n):  # the padding: copies of the first key, count 0
            assert len(keys_q[t]) == entries[t]
            assert (keys_q[t][valid[t]:] == keys_q[t][:1]).all()
            assert (counts_q[t][valid[t]:] == 0).all()
        all_keys = keys_q
        keys_q = [k[:v] for k, v in zip(keys_q, valid)]
        counts_q = [c[:v] for c, v in zip(counts_q, valid)]
        asked = []  # per table: how many requesters asked for each distinct key
        for t in range(n):
            order, total = {}, {}
            for r in range(world):  # requesters in rank order: order of first appearance
                k = np.asarray(keys_by_rank[r][t], np.int64)
                mine = sok_tables.owner(k, targets[t], world) == q
                for a, c in zip(k[mine], plans[r][0][t].numpy()[mine]):
                    local = _local(a, targets[t], rows[t], world)
                    order.setdefault(local, len(order))
                    total[local] = total.get(local, 0) + c
            want = sorted(order, key=order.get)
            np.testing.assert_array_equal(keys_q[t], np.asarray(want, np.int64).reshape(-1))
            np.testing.assert_array_equal(counts_q[t], [total[k] for k in want])
            asked.append(np.asarray([sum(int(k in set(_local(a, targets[t], rows[t], world)
                                                          for a in keys_by_rank[r][t]
                                                          if sok_tables.owner(a, targets[t],
                                                                              world) == q))
                                         for r in range(world)) for k in want], np.float32))
        # The owner's rows of every entry: a padded entry reads its key's row, which goes nowhere.
        owner_rows = [np.stack([_value(t, q, k, dims[t]) for k in all_keys[t]]).astype(np.float32)
                      if len(all_keys[t]) else np.zeros([0, dims[t]], np.float32)
                      for t in range(n)]
        flat = ops.sok_exchange_rows_to_blocks(
            [tf.constant(x) for x in owner_rows], row_pos, tf.constant(recv_counts),
            dims=dims).numpy()
        back = ops.sok_exchange_rows_from_blocks(tf.constant(flat), row_pos, distinct, N=n,
                                                 dims=dims)
        for t in range(n):  # each row's copies summed: the row times the ranks that asked
            v = valid[t]
            np.testing.assert_allclose(back[t].numpy()[:v], owner_rows[t][:v] * asked[t][:, None])
            assert (back[t].numpy()[v:] == 0).all()  # the padding's gradient
        # The rows' all-to-all: requester r's part of each owner's flat rows.
        per_requester = (recv_counts[:, :n] * np.asarray(dims)).sum(1)
        cuts = np.concatenate([[0], np.cumsum(per_requester)])
        for r in range(world):
            returned[r].append(flat[cuts[r]:cuts[r + 1]])
    outs = []
    for r in range(world):
        _, (_, _, row_at, sizes) = plans[r]
        got = ops.sok_exchange_gather_rows(tf.constant(np.concatenate(returned[r])),
                                           tf.constant(row_at), tf.constant(sizes), N=n,
                                           dims=dims)
        for t in range(n):
            k = np.asarray(keys_by_rank[r][t], np.int64)
            want = np.zeros([len(k), dims[t]], np.float32)
            for i, key in enumerate(k):
                q = int(sok_tables.owner(key, targets[t], world))
                want[i] = _value(t, q, _local(key, targets[t], rows[t], world), dims[t])
            np.testing.assert_array_equal(got[t].numpy(), want)
        # The gradient's first step is the gather's inverse (row_at is a permutation).
        scattered = ops.sok_exchange_scatter_rows(
            got, tf.constant(row_at), tf.constant(sizes),
            tf.constant([len(np.concatenate(returned[r]))], tf.int64), dims=dims)
        np.testing.assert_array_equal(scattered.numpy(), np.concatenate(returned[r]))
        outs.append(got)
    return outs


def _keys(rng, world, sizes, low=-50, high=200):
    """Distinct keys per (rank, table), as lookup_sparse deduplicates them before the exchange."""
    return [[rng.choice(np.arange(low, high), s, replace=False) for s in sizes]
            for _ in range(world)]


@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("world", [2, 3])
def test_embedding_variables_spread_and_placed(world, padded):
    rng = np.random.default_rng(world)
    specs = [(-1, -1, 4), (world - 1, -1, 8), (-1, -1, 1)]
    # Keys from a small range: ranks ask for the same keys, so the owners' padding is not empty.
    _run(world, specs, _keys(rng, world, [30, 17, 5], low=0, high=60), padded=padded)


def test_static_tables_become_local_rows_and_flag_bad_ids():
    world = 2
    specs = [(-1, 300, 3), (1, 300, 2)]
    keys = [[np.array([0, 5, 8, 299]), np.array([4, 1])],
            [np.array([7, 300, 2]), np.array([-1, 3])]]  # rank 1: ids out of both tables
    _run(world, specs, keys)


@pytest.mark.parametrize("padded", [False, True])
def test_empty_tables_and_ranks_without_keys(padded):
    specs = [(-1, -1, 4), (-1, -1, 2)]
    _run(2, specs, [[np.array([], np.int64), np.array([3, 4])],
                    [np.array([], np.int64), np.array([], np.int64)]], padded=padded)


def test_more_tables_than_one_launch_takes():
    """20 tables over 8 ranks: several launches of 16 tables, blocks of 8 ranks each."""
    rng = np.random.default_rng(3)
    world = 8
    specs = [(-1 if t % 3 else t % world, -1, 1 + t % 5) for t in range(20)]
    _run(world, specs, _keys(rng, world, [int(rng.integers(0, 40)) for _ in range(20)]))
    _run(world, specs, _keys(rng, world, [int(rng.integers(0, 40)) for _ in range(20)], 0, 50),
         padded=True)


def test_plan_of_padded_keys_equals_the_plan_of_the_valid_ones():
    """A padded dedup's keys (the distinct ones, then anything): the plan requests the valid
    keys as the exact plan does, marks the padding's rows -1, and the requester's rows of the
    padding are zeros (their gradients go nowhere)."""
    rng = np.random.default_rng(5)
    world, specs = 3, [(-1, -1, 4), (1, -1, 2), (-1, 400, 1)]
    targets, rows, dims = ([s[i] for s in specs] for i in range(3))
    exact_keys = [rng.choice(400, s, replace=False) for s in (30, 0, 12)]
    pads = [rng.integers(-(2**40), 2**40, s) for s in (5, 3, 0)]  # padding: any values
    valid = tf.constant([len(k) for k in exact_keys], tf.int64)
    counts = [tf.constant(rng.integers(1, 4, len(k) + len(p)), tf.int64)
              for k, p in zip(exact_keys, pads)]
    spec = dict(world=world, targets=targets, rows=rows, dims=dims, signature=3)
    want = ops.sok_exchange_plan([tf.constant(k, tf.int64) for k in exact_keys],
                                 [c[:len(k)] for c, k in zip(counts, exact_keys)],
                                 tf.zeros([0], tf.int64), **spec)
    got = ops.sok_exchange_plan([tf.constant(np.concatenate([k, p]), tf.int64)
                                 for k, p in zip(exact_keys, pads)], counts, valid, **spec)
    total = sum(len(k) for k in exact_keys)
    np.testing.assert_array_equal(got[1].numpy(), want[1].numpy())  # the matrix
    np.testing.assert_array_equal(got[0].numpy()[:total], want[0].numpy())
    assert (got[0].numpy()[total:] == 0).all()
    assert list(got[3].numpy()) == [len(k) + len(p) for k, p in zip(exact_keys, pads)]
    row_at = got[2].numpy()
    want_at = np.concatenate([np.concatenate([want[2].numpy()[a:a + len(k)], -np.ones(len(p))])
                              for a, k, p in zip(np.cumsum([0] + [len(k) for k in exact_keys]),
                                                 exact_keys, pads)])
    np.testing.assert_array_equal(row_at, want_at)
    returned = tf.constant(rng.standard_normal(int(sum(len(k) * d
                                                       for k, d in zip(exact_keys, dims)))),
                           tf.float32)
    mine = ops.sok_exchange_gather_rows(returned, got[2], got[3], N=3, dims=dims)
    exact = ops.sok_exchange_gather_rows(returned, want[2], want[3], N=3, dims=dims)
    for t, k in enumerate(exact_keys):
        np.testing.assert_array_equal(mine[t].numpy()[:len(k)], exact[t].numpy())
        assert (mine[t].numpy()[len(k):] == 0).all()
    back = ops.sok_exchange_scatter_rows(list(mine), got[2], got[3],
                                         tf.constant([returned.shape[0]], tf.int64), dims=dims)
    np.testing.assert_array_equal(back.numpy(), returned.numpy())


def test_owner_rule_matches_tables_owner_for_negative_keys():
    """The core's owner rule (floor modulo) and tables.owner (dumps) agree."""
    keys = np.array([-9, -8, -1, 0, 1, 7, 2**40 + 3, -(2**40) - 3], np.int64)
    for world in (2, 3, 5):
        _, matrix, _, _ = ops.sok_exchange_plan([tf.constant(keys)], [tf.zeros([0], tf.int64)],
                                                tf.zeros([0], tf.int64), world=world,
                                                targets=[-1], rows=[-1], dims=[1], signature=0)
        want = np.bincount(sok_tables.owner(keys, -1, world), minlength=world)
        np.testing.assert_array_equal(matrix.numpy()[:, 0], want)


def test_plan_of_bad_positions_requests_nothing_and_flags_the_table():
    """valid[t] < 0 (a padded dedup found ids outside their dense shape): nothing of table t is
    requested, its row_at is -1, and the header's bad flag is n + 1 + t (core/exchange.h), above
    a static table's bad-id flag on the same rank."""
    keys = [tf.constant([4, 1, 9], tf.int64), tf.constant([2, 3], tf.int64)]
    counts = [tf.ones([3], tf.int64), tf.ones([2], tf.int64)]
    request, matrix, row_at, _ = ops.sok_exchange_plan(
        keys, counts, tf.constant([3, -1], tf.int64), world=2, targets=[-1, -1], rows=[5, -1],
        dims=[4, 4], signature=7)
    matrix = matrix.numpy()
    np.testing.assert_array_equal(matrix[:, 1], [0, 0])  # table 1 requests nothing
    np.testing.assert_array_equal(matrix[:, 3], [2 + 1 + 1] * 2)  # over table 0's flag (1)
    assert (row_at.numpy()[3:] == -1).all() and (row_at.numpy()[:3] >= 0).all()
    assert matrix[:, 0].sum() == 3 and (request.numpy()[3:] == 0).all()


def test_sizes_name_the_table_and_rank_of_bad_positions():
    ok = _matrix([[1, 0], [1, 0]], [7, 7], [0, 0])
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"ids of table 'clicks' on rank 1: an index is negative or beyond "
                             r"dense_shape"):
        ops.sok_exchange_sizes(_matrix([[1, 0], [1, 0]], [7, 7], [0, 2 + 1 + 1]), ok,
                               dims=[4, 4], signature=7, mismatch="m", bad_ids="b",
                               table_names=["views", "clicks"])


def test_bad_shapes_are_named():
    counts = tf.constant([[2, 1, 0, 0], [1, 0, 0, 0]], tf.int64)
    row_pos = tf.fill([4, 2], tf.constant(-1, tf.int64))
    with pytest.raises(tf.errors.InvalidArgumentError, match="row_pos must be \\[5, world\\]"):
        ops.sok_exchange_rows_to_blocks([tf.zeros([3, 4]), tf.zeros([2, 2])], row_pos, counts,
                                        dims=[4, 2])
    with pytest.raises(tf.errors.InvalidArgumentError, match="must be \\[n, 2\\]"):
        ops.sok_exchange_rows_to_blocks([tf.zeros([3, 4]), tf.zeros([1, 3])], row_pos, counts,
                                        dims=[4, 2])
    with pytest.raises(tf.errors.InvalidArgumentError, match="received must be \\[4, 2\\]"):
        ops.sok_exchange_owner_keys(tf.zeros([3, 2], tf.int64), counts, N=2, targets=[-1, -1],
                                    rows=[-1, -1], dims=[4, 2])
    with pytest.raises(tf.errors.InvalidArgumentError, match="sizes add up to 3"):
        ops.sok_exchange_gather_rows(tf.zeros([12]), tf.zeros([4], tf.int64),
                                     tf.constant([2, 1], tf.int64), N=2, dims=[4, 4])


def _matrix(counts, sig, bad):
    """A [world, n + 2] size matrix: per rank its counts, then [signature, bad]."""
    return tf.constant([list(c) + [s, b] for c, s, b in zip(counts, sig, bad)], tf.int64)


# SokExchangeSizes reads the size matrix the keys' exchange left in host memory; its GPU kernel
# keeps every tensor there too.
def test_sizes_are_floats_per_rank():
    received = _matrix([[2, 1], [0, 3]], [7, 7], [0, 0])
    sent = _matrix([[1, 0], [4, 2]], [7, 7], [0, 0])
    owed, due = ops.sok_exchange_sizes(received, sent, dims=[4, 2], signature=7,
                                       mismatch="tables differ.", bad_ids="bad ids:")
    np.testing.assert_array_equal(owed.numpy(), [2 * 4 + 1 * 2, 3 * 2])
    np.testing.assert_array_equal(due.numpy(), [1 * 4, 4 * 4 + 2 * 2])


def test_sizes_fail_on_any_rank_s_signature_or_bad_id():
    ok = _matrix([[1], [1]], [7, 7], [0, 0])
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"tables differ\. Table-list signatures of ranks 0\.\.1: \[7 9\]"):
        ops.sok_exchange_sizes(_matrix([[1], [1]], [7, 9], [0, 0]), ok, dims=[4], signature=7,
                               mismatch="tables differ.", bad_ids="bad ids:")
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"bad ids: \[0 1\]"):
        ops.sok_exchange_sizes(_matrix([[1], [1]], [7, 7], [0, 1]), ok, dims=[4], signature=7,
                               mismatch="tables differ.", bad_ids="bad ids:")
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"must be \[world, 4\], got \[2,3\]"):
        ops.sok_exchange_sizes(ok, ok, dims=[4, 4], signature=7, mismatch="m", bad_ids="b")
