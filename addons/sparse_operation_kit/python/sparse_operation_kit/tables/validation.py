"""Input checks shared by sok.lookup_sparse and the Keras layers: every error names the table and
the problem, so that nothing is silently dropped, truncated or applied to the wrong id.

Eager inputs are checked at once (a Python ValueError); graph inputs (tf.function, TF1) get
tf.debugging assertions that run before the lookup (tf.errors.InvalidArgumentError).
"""
import numpy as np
import tensorflow as tf

_INT32_MIN, _INT32_MAX = -2 ** 31, 2 ** 31 - 1


def _is_eager(*tensors):
    return all(not isinstance(t, tf.Tensor) or hasattr(t, "numpy") for t in tensors)


def check_training_flag(training, where):
    """`training` must be a Python bool or None (or a constant boolean tensor, which Keras passes
    in some traces). Strings such as "no" or numbers other than 0/1 are refused: bool("no") is
    True and would insert keys during evaluation."""
    if training is None or isinstance(training, (bool, np.bool_)):
        return None if training is None else bool(training)
    if isinstance(training, (int, np.integer)) and int(training) in (0, 1):
        return bool(training)
    if isinstance(training, (tf.Tensor, tf.Variable)):
        if training.dtype != tf.bool:
            raise TypeError(
                f"{where}: `training` must be a bool, got a {training.dtype.name} tensor"
            )
        value = tf.get_static_value(training)
        if value is None:
            raise ValueError(
                f"{where}: `training` must be a Python bool or a constant, because training and "
                "inference lookups are different ops"
            )
        return bool(value)
    raise TypeError(f"{where}: `training` must be True, False or None, got {training!r} "
                    f"({type(training).__name__})")


ID_DTYPES = (tf.int32, tf.int64)


def check_id_dtype(dtype, table):
    """Ids must be int32 or int64, as the tables' keys. A cast of any other dtype would change
    ids silently: floats truncate (1.7 -> key 1), bools become keys 0 and 1, uint64 ids beyond
    int64 wrap. String ids are hashed to int64 keys by their caller (the feature columns)."""
    dtype = tf.as_dtype(dtype)
    if dtype not in ID_DTYPES:
        raise TypeError(
            f"table '{table}': ids must be int32 or int64, got {dtype.name} ids (a cast would "
            "change them silently); give integer ids, e.g. keras.Input(..., dtype=\"int64\")"
        )


def cast_keys(ids, key_dtype, table):
    """Ids (a Tensor, SparseTensor or RaggedTensor; int32 or int64) as `key_dtype`; int64 ids given
    to an int32 table must fit in int32, or the cast would fold distinct ids onto one key
    (2**32+5 -> 5). `key_dtype` None (a static table) keeps their dtype."""
    values = ids.values if isinstance(ids, (tf.SparseTensor, tf.RaggedTensor)) else ids
    if isinstance(ids, tf.RaggedTensor):
        values = ids.flat_values
    values = tf.convert_to_tensor(values) if not isinstance(values, tf.Tensor) else values
    check_id_dtype(values.dtype, table)
    if key_dtype is None or values.dtype == key_dtype:
        return ids
    key_dtype = tf.as_dtype(key_dtype)
    if key_dtype == tf.int32 and values.dtype == tf.int64:
        message = (
            f"table '{table}' has key dtype int32, but an id given as {values.dtype.name} does not "
            "fit in int32 (it would be truncated onto another id); create the table with "
            "key_dtype=tf.int64"
        )
        if _is_eager(values):
            v = values.numpy()
            if v.size and (v.min() < _INT32_MIN or v.max() > _INT32_MAX):
                bad = v[(v < _INT32_MIN) | (v > _INT32_MAX)].reshape(-1)[0]
                raise ValueError(f"{message} (id {int(bad)})")
            checks = []
        else:
            checks = [
                tf.debugging.assert_less_equal(
                    values, tf.cast(_INT32_MAX, values.dtype), message=message
                ),
                tf.debugging.assert_greater_equal(
                    values, tf.cast(_INT32_MIN, values.dtype), message=message
                ),
            ]
        with tf.control_dependencies(checks):
            cast = tf.cast(values, key_dtype)
    else:
        cast = tf.cast(values, key_dtype)
    if isinstance(ids, tf.SparseTensor):
        return tf.SparseTensor(ids.indices, cast, ids.dense_shape)
    if isinstance(ids, tf.RaggedTensor):
        return ids.with_flat_values(cast)
    return cast


def check_key_dtype_fits(keys, key_dtype, table, where):
    """Keys read from a checkpoint or dump (numpy or tensor) for a table of `key_dtype`: int64 keys
    beyond int32 cannot go into an int32 table."""
    key_dtype = tf.as_dtype(key_dtype)
    if key_dtype != tf.int32:
        return
    if isinstance(keys, (tf.Tensor, tf.Variable)):
        if keys.dtype == tf.int32:
            return
        if not _is_eager(keys):
            return tf.debugging.assert_less_equal(
                tf.reduce_max(tf.abs(tf.concat([tf.cast(keys, tf.int64), [0]], 0))),
                tf.constant(_INT32_MAX, tf.int64),
                message=f"{where}: table '{table}' has key dtype int32, but the saved keys do not "
                        "fit in int32",
            )
        keys = keys.numpy()
    keys = np.asarray(keys)
    if keys.size and (keys.min() < _INT32_MIN or keys.max() > _INT32_MAX):
        bad = keys[(keys < _INT32_MIN) | (keys > _INT32_MAX)].reshape(-1)[0]
        raise ValueError(
            f"{where}: table '{table}' has key dtype int32, but the saved keys include {int(bad)}, "
            "which does not fit in int32 (it would be truncated onto another key); load into a "
            "table with key_dtype=tf.int64"
        )
    return None


def _positions(x):
    """[n, 2] (sample, column) of every id of a SparseTensor or ragged-rank-1 RaggedTensor."""
    if isinstance(x, tf.SparseTensor):
        return x.indices
    if x.ragged_rank != 1:
        x = x.merge_dims(1, -1)
    rows = tf.cast(x.value_rowids(), tf.int64)
    starts = tf.gather(x.row_splits, rows)
    cols = tf.range(tf.shape(x.values, out_type=tf.int64)[0], dtype=tf.int64) - tf.cast(
        starts, tf.int64
    )
    return tf.stack([rows, cols], 1)


def check_lookup_inputs(params, sp_ids, sp_weights, names, ids_within_dense_shape=False):
    """lookup_sparse's input checks; returns (sp_ids, sp_weights) to use (with the assertions of
    graph-mode inputs attached).

    - at least one table;
    - SparseTensor weights: indices within dense_shape (a column index beyond it would be pooled
      anyway, which TensorFlow's own sparse ops refuse). The ids' indices are checked by the
      lookup itself (SokUniqueKeys, all tables at once, in eager and graph mode alike); only
      `ids_within_dense_shape` (the stock-op graph of save_stock_saved_model) checks them here;
    - weights shaped like their ids: the same positions (sample, column), not just the same count
      (weights are applied by position: different indices would weight the wrong id).
    """
    if not params:
        raise ValueError(
            "lookup_sparse: no tables given (params is empty); pass one or more tables and one id "
            "tensor per table"
        )
    sp_weights = [None] * len(params) if sp_weights is None else list(sp_weights)
    # Graph-mode checks: (condition, message) of every table, asserted once per call (one host
    # round trip for the whole lookup, not one per check). Eager inputs are checked at once.
    conditions = []
    for ids, w, name in zip(sp_ids, sp_weights, names):
        if ids_within_dense_shape and isinstance(ids, tf.SparseTensor):
            conditions += _within_dense_shape(ids, f"lookup_sparse: ids of table '{name}'")
        if isinstance(w, tf.SparseTensor):
            conditions += _within_dense_shape(w, f"lookup_sparse: weights of table '{name}'")
        if w is not None and isinstance(ids, (tf.SparseTensor, tf.RaggedTensor)) and \
                isinstance(w, (tf.SparseTensor, tf.RaggedTensor)):
            conditions += _same_positions(ids, w, name)
    if not conditions:
        return list(sp_ids), sp_weights
    oks = tf.stack([ok for ok, _ in conditions])
    failed = tf.boolean_mask(tf.constant([m for _, m in conditions]), tf.logical_not(oks))
    check = tf.debugging.Assert(tf.reduce_all(oks), [failed], summarize=3)
    out_ids = []
    with tf.control_dependencies([check]):
        for (
            ids
        ) in sp_ids:  # the ids' values wait for the check: nothing is inserted before it passed
            if isinstance(ids, tf.SparseTensor):
                ids = tf.SparseTensor(
                    tf.identity(ids.indices), tf.identity(ids.values), ids.dense_shape
                )
            elif isinstance(ids, tf.RaggedTensor):
                ids = ids.with_flat_values(tf.identity(ids.flat_values))
            out_ids.append(ids)
    return out_ids, sp_weights


def _within_dense_shape(sp, what):
    indices, shape = sp.indices, sp.dense_shape
    message = f"{what}: an index is negative or beyond dense_shape"
    if _is_eager(indices, shape):
        idx, dense = indices.numpy(), shape.numpy()
        if idx.size:
            bad = np.nonzero(((idx < 0) | (idx >= dense[None, :])).any(axis=1))[0]
            if bad.size:
                raise ValueError(
                    f"{message}: index {idx[bad[0]].tolist()} for dense_shape {dense.tolist()}"
                )
        return []
    ok = tf.reduce_all(
        tf.logical_and(indices >= 0, indices < tf.cast(shape[None, :], indices.dtype))
    )
    return [(ok, message)]


def _same_positions(ids, weights, name):
    a, b = _positions(ids), _positions(weights)
    message = (
        f"lookup_sparse: weights of table '{name}' are at other positions (indices) than its ids; "
        "weights are applied to the id at the same position"
    )
    if _is_eager(a, b):
        a, b = a.numpy(), b.numpy()
        if a.shape == b.shape and not np.array_equal(a, b):
            i = int(np.nonzero((a != b).any(axis=1))[0][0])
            raise ValueError(f"{message} (id at {a[i].tolist()}, weight at {b[i].tolist()})")
        return []  # different counts: the lookup op itself reports "N weights for M ids"
    same_count = tf.equal(tf.shape(a)[0], tf.shape(b)[0])
    equal = tf.cond(same_count, lambda: tf.reduce_all(tf.equal(a, b)), lambda: tf.constant(True))
    return [(equal, message)]
