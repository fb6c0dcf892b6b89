"""DeepRec's feature columns backed by Embedding Variables (`sok.feature_column`).

Stock TensorFlow's `tf.compat.v1.feature_column.input_layer` accepts only its own column classes
(their base classes are not public API), so these columns go through
`sok.feature_column.input_layer(features, columns)`, which has its semantics: columns sorted by
name, each column's [batch, dim] output concatenated. Stock columns (numeric_column, ...) may
be mixed in: they are computed by TensorFlow's own input_layer. All embedding columns of one call
are looked up in one fused sok.lookup_sparse.

Tables: `embedding_column` creates its Embedding Variable on first use, in the current variable
scope: "<scope>/<key>_embedding/embedding_weights" (shared columns:
"<scope>/<shared_embedding_collection_name>/embedding_weights"), reused on later calls.
String ids become int64 keys with tf.strings.to_hash_bucket_fast(ids, 2**63 - 1) (a fingerprint
of the string); dense id tensors drop "" (strings) and -1 (integers) as missing, as TF does.
"""

import collections

import tensorflow as tf

from sparse_operation_kit.adapters.get_variable import get_embedding_variable
from sparse_operation_kit.lookup.lookup import lookup_rows, lookup_sparse
from sparse_operation_kit.tables.embedding_variable import EmbeddingVariableOption

_STRING_BUCKETS = 2**63 - 1
_COMBINERS = ("mean", "sum", "sqrtn")


class EmbeddingCategoricalColumn(
    collections.namedtuple(
        "EmbeddingCategoricalColumn", ["key", "dtype", "partition_num", "ev_option", "is_sequence"]
    )
):
    """Ids of feature `key` for an Embedding Variable (no vocabulary, no hash buckets)."""

    @property
    def name(self):
        return self.key

    def ids(self, features):
        """The feature as an int64 SparseTensor [batch, max_len] of keys."""
        if self.key not in features:
            raise ValueError(
                f"feature column '{self.key}': no feature '{self.key}' in the features "
                f"(have: {sorted(features)})"
            )
        return _keys(_as_sparse(features[self.key], self.dtype, self.key), self.dtype, self.key)


class WeightedEmbeddingCategoricalColumn(
    collections.namedtuple(
        "WeightedEmbeddingCategoricalColumn", ["categorical_column", "weight_feature_key", "dtype"]
    )
):
    """Ids of a categorical column, each weighted by the same position of `weight_feature_key`."""

    @property
    def name(self):
        return f"{self.categorical_column.name}_weighted_by_{self.weight_feature_key}"

    @property
    def key(self):
        return self.categorical_column.key

    @property
    def is_sequence(self):
        return self.categorical_column.is_sequence

    def ids(self, features):
        return self.categorical_column.ids(features)

    def weights(self, features):
        if self.weight_feature_key not in features:
            raise ValueError(
                f"feature column '{self.name}': no weight feature '{self.weight_feature_key}'"
            )
        w = _as_sparse(features[self.weight_feature_key], self.dtype, self.weight_feature_key)
        return tf.SparseTensor(w.indices, tf.cast(w.values, tf.float32), w.dense_shape)


def _as_sparse(x, dtype, key):
    if isinstance(x, tf.RaggedTensor):
        x = x.to_sparse()
    if isinstance(x, tf.SparseTensor):
        sp = x
    else:
        x = tf.convert_to_tensor(x)
        if x.shape.rank == 1:
            x = tf.expand_dims(x, -1)
        missing = "" if x.dtype == tf.string else tf.cast(-1, x.dtype)
        indices = tf.where(tf.not_equal(x, missing))
        sp = tf.SparseTensor(indices, tf.gather_nd(x, indices), tf.shape(x, out_type=tf.int64))
    if sp.shape.rank is not None and sp.shape.rank != 2:
        raise ValueError(
            f"feature '{key}' must have rank 2 ([batch, ids]), got rank {sp.shape.rank}"
        )
    if dtype == tf.string and sp.dtype != tf.string:
        raise TypeError(
            f"feature '{key}': the column has dtype string, the feature {sp.dtype.name}"
        )
    if dtype != tf.string and not (sp.dtype.is_integer or sp.dtype.is_floating):
        raise TypeError(
            f"feature '{key}': the column has dtype {tf.as_dtype(dtype).name}, the feature "
            f"{sp.dtype.name}"
        )
    return sp


def _keys(sp, dtype, key):
    if sp.dtype == tf.string:
        values = tf.strings.to_hash_bucket_fast(sp.values, _STRING_BUCKETS)
    elif sp.dtype.is_floating:
        raise TypeError(f"feature '{key}': ids must be integers or strings, got {sp.dtype.name}")
    else:
        values = tf.cast(sp.values, tf.int64)
    return tf.SparseTensor(sp.indices, values, sp.dense_shape)


def categorical_column_with_embedding(key, dtype=tf.string, partition_num=None, ev_option=None):
    """DeepRec's tf.feature_column.categorical_column_with_embedding: ids of `key` (strings or
    integers) for an Embedding Variable with `ev_option`, of `partition_num` parts if given."""
    dtype = tf.as_dtype(dtype)
    if not (dtype == tf.string or dtype.is_integer):
        raise TypeError(
            f"categorical_column_with_embedding '{key}': dtype must be string or an integer type, "
            f"got {dtype.name}"
        )
    if partition_num is not None and (not isinstance(partition_num, int) or partition_num < 1):
        raise ValueError(
            f"categorical_column_with_embedding '{key}': partition_num must be a positive integer, "
            f"got {partition_num!r}"
        )
    return EmbeddingCategoricalColumn(
        key, dtype, partition_num, ev_option or EmbeddingVariableOption(), False
    )


def sequence_categorical_column_with_embedding(
    key, dtype=tf.string, partition_num=None, ev_option=None
):
    """The sequence variant (for sequence_input_layer): every id keeps its position."""
    return categorical_column_with_embedding(key, dtype, partition_num, ev_option)._replace(
        is_sequence=True
    )


def weighted_categorical_column(categorical_column, weight_feature_key, dtype=tf.float32):
    """tf.feature_column.weighted_categorical_column for an Embedding Variable column."""
    if not isinstance(categorical_column, EmbeddingCategoricalColumn):
        raise TypeError(
            "weighted_categorical_column: categorical_column must come from "
            "sok.feature_column.categorical_column_with_embedding"
        )
    return WeightedEmbeddingCategoricalColumn(
        categorical_column, weight_feature_key, tf.as_dtype(dtype)
    )


class EmbeddingColumn(
    collections.namedtuple(
        "EmbeddingColumn",
        [
            "categorical_column",
            "dimension",
            "combiner",
            "initializer",
            "max_norm",
            "trainable",
            "shared_name",
        ],
    )
):
    """A [batch, dimension] dense column from an Embedding Variable column."""

    @property
    def name(self):
        suffix = "_shared_embedding" if self.shared_name else "_embedding"
        return f"{self.categorical_column.name}{suffix}"

    @property
    def variable_scope_name(self):
        return self.shared_name or f"{self.categorical_column.key}_embedding"

    def table(self):
        """The column's Embedding Variable (created in the current variable scope on first use)."""
        cat = self.categorical_column
        if isinstance(cat, WeightedEmbeddingCategoricalColumn):
            cat = cat.categorical_column
        partitioner = None
        if cat.partition_num:
            partitioner = tf.compat.v1.fixed_size_partitioner(cat.partition_num)
        with tf.compat.v1.variable_scope(self.variable_scope_name, reuse=tf.compat.v1.AUTO_REUSE):
            return get_embedding_variable(
                "embedding_weights",
                self.dimension,
                key_dtype=tf.int64,
                initializer=self.initializer,
                trainable=self.trainable,
                partitioner=partitioner,
                ev_option=cat.ev_option,
            )


def _check_embedding_args(what, dimension, combiner):
    if isinstance(dimension, bool) or not isinstance(dimension, int) or dimension < 1:
        raise ValueError(f"{what}: dimension must be a positive integer, got {dimension!r}")
    if combiner not in _COMBINERS:
        raise ValueError(
            f"{what}: combiner must be one of {', '.join(_COMBINERS)}, got {combiner!r}"
        )


def _check_unsupported(what, ckpt_to_load_from, tensor_name_in_ckpt, max_norm):
    if ckpt_to_load_from is not None or tensor_name_in_ckpt is not None:
        raise ValueError(
            f"{what}: ckpt_to_load_from / tensor_name_in_ckpt are not supported; restore the "
            "table with tf.compat.v1.train.Saver"
        )
    if max_norm is not None:
        raise ValueError(f"{what}: max_norm is not supported for Embedding Variable columns")


def _check_categorical(what, column):
    if not isinstance(column, (EmbeddingCategoricalColumn, WeightedEmbeddingCategoricalColumn)):
        raise TypeError(
            f"{what}: the categorical column must come from "
            f"sok.feature_column.categorical_column_with_embedding, got {type(column).__name__}"
        )


def embedding_column(
    categorical_column,
    dimension,
    combiner="mean",
    initializer=None,
    ckpt_to_load_from=None,
    tensor_name_in_ckpt=None,
    max_norm=None,
    trainable=True,
    use_safe_embedding_lookup=True,
):
    """tf.feature_column.embedding_column over an Embedding Variable column. initializer: the
    table's (default truncated normal with stddev 1/sqrt(dimension), as TF's). Empty samples get
    zeros, as with use_safe_embedding_lookup."""
    _check_categorical(
        f"embedding_column '{getattr(categorical_column, 'name', '?')}'", categorical_column
    )
    _check_embedding_args(f"embedding_column '{categorical_column.name}'", dimension, combiner)
    _check_unsupported(
        f"embedding_column '{categorical_column.name}'",
        ckpt_to_load_from,
        tensor_name_in_ckpt,
        max_norm,
    )
    return EmbeddingColumn(
        categorical_column, dimension, combiner, initializer, max_norm, trainable, None
    )


def shared_embedding_columns(
    categorical_columns,
    dimension,
    combiner="mean",
    initializer=None,
    shared_embedding_collection_name=None,
    ckpt_to_load_from=None,
    tensor_name_in_ckpt=None,
    max_norm=None,
    trainable=True,
    use_safe_embedding_lookup=True,
):
    """Embedding columns of several categorical columns sharing one Embedding Variable (its
    options are those of the first column)."""
    categorical_columns = list(categorical_columns)
    if not categorical_columns:
        raise ValueError("shared_embedding_columns: no categorical columns given")
    for c in categorical_columns:
        _check_categorical("shared_embedding_columns", c)
    _check_embedding_args("shared_embedding_columns", dimension, combiner)
    _check_unsupported("shared_embedding_columns", ckpt_to_load_from, tensor_name_in_ckpt, max_norm)
    name = (
        shared_embedding_collection_name
        or "_".join(sorted(c.name for c in categorical_columns)) + "_shared_embedding"
    )
    first = categorical_columns[0]
    first = (
        first.categorical_column if isinstance(first, WeightedEmbeddingCategoricalColumn) else first
    )
    columns = []
    for c in categorical_columns:
        base = c.categorical_column if isinstance(c, WeightedEmbeddingCategoricalColumn) else c
        if base.is_sequence != first.is_sequence:
            raise ValueError(
                "shared_embedding_columns: sequence and non-sequence columns cannot share a table"
            )
        columns.append(
            EmbeddingColumn(c, dimension, combiner, initializer, max_norm, trainable, name)
        )
    return columns


shared_embeddings = shared_embedding_columns  # TF2's name


def _is_sok_column(c):
    return isinstance(c, EmbeddingColumn)


def _lookup_columns(features, columns, training):
    """{column name: [batch, dim]} of every SOK embedding column, in one fused lookup."""
    tables, ids, weights, combiners = [], [], [], []
    for c in columns:
        if c.categorical_column.is_sequence:
            raise ValueError(
                f"feature column '{c.name}' is a sequence column: use sequence_input_layer"
            )
        tables.append(c.table())
        ids.append(c.categorical_column.ids(features))
        weights.append(
            c.categorical_column.weights(features)
            if isinstance(c.categorical_column, WeightedEmbeddingCategoricalColumn)
            else None
        )
        combiners.append(c.combiner)
    if not tables:
        return {}
    outs = lookup_sparse(tables, ids, sp_weights=weights, combiners=combiners, training=training)
    return {c.name: out for c, out in zip(columns, outs)}


def _check_graph_mode(what):
    if tf.executing_eagerly():
        raise RuntimeError(
            f"sok.feature_column.{what} builds TF1 graphs, as DeepRec's feature columns do (the "
            "tables live in the graph's collections); in TF2 code use sok.lookup_sparse with "
            "sok.get_embedding_variable, or the Keras layers in sok.layers"
        )


def input_layer(
    features,
    feature_columns,
    weight_collections=None,
    trainable=True,
    cols_to_vars=None,
    training=True,
):
    """tf.compat.v1.feature_column.input_layer taking SOK embedding columns (and stock dense columns):
    [batch, sum of the columns' dimensions], the columns in name order. training=False reads the
    tables without inserting new ids (evaluation and serving)."""
    _check_graph_mode("input_layer")
    feature_columns = list(feature_columns)
    if not feature_columns:
        raise ValueError("input_layer: no feature columns given")
    features = dict(features)
    ordered = sorted(feature_columns, key=lambda c: c.name)
    with tf.compat.v1.variable_scope(None, default_name="input_layer"):
        pooled = _lookup_columns(features, [c for c in ordered if _is_sok_column(c)], training)
        outputs = []
        for c in ordered:
            if _is_sok_column(c):
                outputs.append(pooled[c.name])
                if cols_to_vars is not None:
                    table = c.table()
                    cols_to_vars[c] = list(table) if hasattr(table, "parts") else [table]
            else:
                outputs.append(
                    tf.compat.v1.feature_column.input_layer(
                        features, [c], weight_collections=weight_collections, trainable=trainable
                    )
                )
        return tf.concat(outputs, axis=1)


def sequence_input_layer(features, feature_columns, training=True):
    """DeepRec's tf.contrib.feature_column.sequence_input_layer for sequence embedding columns:
    ([batch, max_len, sum of dimensions], sequence length of each sample [batch] int64), the
    columns in name order; each id's row (times its weight) at its position, zeros after a
    sample's last id."""
    _check_graph_mode("sequence_input_layer")
    feature_columns = sorted(feature_columns, key=lambda c: c.name)
    if not feature_columns:
        raise ValueError("sequence_input_layer: no feature columns given")
    outputs, lengths = [], []
    with tf.compat.v1.variable_scope(None, default_name="sequence_input_layer"):
        for c in feature_columns:
            if not _is_sok_column(c) or not c.categorical_column.is_sequence:
                raise TypeError(
                    f"sequence_input_layer: column '{c.name}' must be an embedding column of a "
                    "sequence_categorical_column_with_embedding"
                )
            ids = c.categorical_column.ids(features)
            rows = lookup_rows(c.table(), ids.values, training)
            if isinstance(c.categorical_column, WeightedEmbeddingCategoricalColumn):
                rows = rows * tf.expand_dims(c.categorical_column.weights(features).values, -1)
            shape = tf.stack([ids.dense_shape[0], ids.dense_shape[1], c.dimension])
            outputs.append(tf.scatter_nd(ids.indices, rows, shape))
            # A sample's length: one past its last id's position.
            last = tf.math.unsorted_segment_max(
                ids.indices[:, 1] + 1, ids.indices[:, 0], tf.cast(ids.dense_shape[0], tf.int64)
            )
            lengths.append(tf.maximum(last, 0))
        length = lengths[0]
        if len(lengths) > 1:
            check = tf.debugging.assert_equal(
                tf.stack(lengths),
                tf.tile(length[None], [len(lengths), 1]),
                message="sequence_input_layer: columns differ in sequence length",
            )
            with tf.control_dependencies([check]):
                length = tf.identity(length)
        return tf.concat(outputs, axis=2), length
