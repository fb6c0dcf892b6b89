"""Keras layers over SOK tables (`tf.keras`: Keras 3, or tf_keras).

Keras tracks its own variables only, so a layer's tables are not in `layer.trainable_variables`:
take them from `layer.embedding_variables` (or `sok.layers.embedding_variables(model)`) and give
them to the GradientTape and to `sok.OptimizerWrapper` next to the model's variables. Each table
is also an attribute of the layer, which makes it a dependency for tf.train.Checkpoint and
tf.saved_model.save.

Keras's `training` flag reaches the lookup: training=True inserts unseen ids into Embedding
Variables and counts their frequencies; training=False or None (inference, as for Keras's own
layers) reads unseen ids as their initial value and inserts nothing.
"""
import tensorflow as tf

from sparse_operation_kit.embedding_variable import EmbeddingVariable, is_embedding_variable
from sparse_operation_kit.lookup import COMBINERS, lookup_sparse


def embedding_variables(obj):
    """Every SOK Embedding Variable reachable from a layer, model or tf.Module (checkpoint order)."""
    return [t for t in tf.train.TrackableView(obj).descendants() if is_embedding_variable(t)]


def _training_flag(training, layer_name):
    """Keras's `training` (None, a bool or a constant tensor) as the Python bool the lookup needs."""
    if training is None:
        return False
    if isinstance(training, (tf.Tensor, tf.Variable)):
        value = tf.get_static_value(training)
        if value is None:
            raise ValueError(f"layer '{layer_name}': `training` must be a Python bool or a constant, "
                             "because training and inference lookups are different ops")
        return bool(value)
    return bool(training)


def _as_list(x):
    return list(x) if isinstance(x, (list, tuple)) else [x]


def _cast_ids(ids, dtype):
    """Keras inputs are often int32: ids take the key dtype of their Embedding Variable."""
    if dtype is None or ids.dtype == dtype:
        return ids
    if isinstance(ids, tf.SparseTensor):
        return tf.SparseTensor(ids.indices, tf.cast(ids.values, dtype), ids.dense_shape)
    return tf.cast(ids, dtype)


def _id_lists(ids, dtype):
    """Ids per sample: a SparseTensor / RaggedTensor as given, a dense [batch, n] tensor as n ids
    per sample (Keras also traces models with dense float inputs, e.g. for tf.saved_model.save)."""
    if not isinstance(ids, (tf.SparseTensor, tf.RaggedTensor)):
        ids = tf.RaggedTensor.from_tensor(tf.convert_to_tensor(ids))
    if dtype is None and not ids.dtype.is_integer:
        dtype = tf.int64
    return _cast_ids(ids, dtype)


def _new_table(name, dim, initializer, key_dtype, ev_option):
    return EmbeddingVariable(name, dim, key_dtype=key_dtype, initializer=initializer, ev_option=ev_option)


class _TablesLayer(tf.keras.layers.Layer):
    """Owns the tables: new Embedding Variables, or existing SOK variables handed in."""

    def _set_tables(self, tables):
        self._tables = tuple(tables)
        for i, table in enumerate(self._tables):
            # One attribute per table: Keras wraps lists in containers that TensorFlow's
            # checkpointing does not follow.
            setattr(self, f"table_{i}", table)

    @property
    def embedding_variables(self):
        """The layer's tables, in order (Embedding Variables and any static tables handed in)."""
        return list(self._tables)

    def _key_dtype(self, i):
        table = self._tables[i]
        return table.key_dtype if is_embedding_variable(table) else None


class Embedding(_TablesLayer):
    """One Embedding Variable as a Keras layer (like keras.layers.Embedding, with no vocabulary size).

    call(ids, training=None):
      - ids a dense tensor of any shape -> [*ids.shape, dim];
      - ids a RaggedTensor -> its rows as a RaggedTensor [..., (n), dim];
      - with `combiner` ("sum", "mean", "sqrtn"): ids a SparseTensor / RaggedTensor [batch, None]
        or a dense [batch, n] tensor -> pooled per sample, [batch, dim] (`sok.lookup_sparse`).

    embedding_dim, initializer, key_dtype, ev_option: those of the new Embedding Variable (see
    sok.get_embedding_variable). embedding_variable: use this existing sok.EmbeddingVariable /
    sok.DynamicVariable instead.
    """

    def __init__(self, embedding_dim=None, combiner=None, initializer=None, key_dtype=tf.int64,
                 ev_option=None, embedding_variable=None, **kwargs):
        super().__init__(**kwargs)
        if combiner is not None and combiner not in COMBINERS:
            raise ValueError(f"layer '{self.name}': unknown combiner '{combiner}' (expected one of "
                             f"{', '.join(COMBINERS)})")
        if embedding_variable is None:
            if embedding_dim is None:
                raise ValueError(f"layer '{self.name}': give embedding_dim or embedding_variable")
            embedding_variable = _new_table(f"{self.name}/embeddings", embedding_dim, initializer,
                                            key_dtype, ev_option)
        elif not is_embedding_variable(embedding_variable):
            raise TypeError(f"layer '{self.name}': embedding_variable must be a sok.EmbeddingVariable, got "
                            f"{type(embedding_variable).__name__}")
        self.combiner = combiner
        self._set_tables([embedding_variable])

    @property
    def embedding_variable(self):
        return self._tables[0]

    @property
    def embedding_dim(self):
        return self._tables[0].embedding_dim

    def call(self, ids, training=None):
        training = _training_flag(training, self.name)
        table = self._tables[0]
        ids = _cast_ids(ids, table.key_dtype)
        if self.combiner is not None:
            return lookup_sparse(table, _id_lists(ids, table.key_dtype), combiners=self.combiner,
                                 training=training)
        if isinstance(ids, tf.SparseTensor):
            raise TypeError(f"layer '{self.name}': SparseTensor ids need a combiner")
        if isinstance(ids, tf.RaggedTensor):
            return tf.ragged.map_flat_values(lambda flat: table.sparse_read(flat, training=training), ids)
        return table.sparse_read(ids, training=training)

    def compute_output_shape(self, input_shape):
        if self.combiner is not None:
            return (input_shape[0], self.embedding_dim)
        return tuple(input_shape) + (self.embedding_dim,)

    def get_config(self):
        config = super().get_config()
        config.update(embedding_dim=self.embedding_dim, combiner=self.combiner,
                      key_dtype=self._tables[0].key_dtype.name)
        return config


class SparseEmbedding(_TablesLayer):
    """Pooled lookups of one or many tables in one fused `sok.lookup_sparse` call.

    New tables: `embedding_dims` (an int, or a list with one entry per table) with optional
    `initializers`, `key_dtype`, `ev_options` (one, or one per table). Existing tables:
    `embedding_variables`, a list of SOK variables (sok.EmbeddingVariable / DynamicVariable,
    sok.Variable / tf.Variable). `combiners`: "sum", "mean" or "sqrtn", one, or one per table.

    call(ids, weights=None, training=None): ids (and weights, if given) a tf.SparseTensor /
    tf.RaggedTensor [batch, None] per table (dense [batch, n] ids: n ids per sample) -> a
    [batch, dim] tensor per table (a list when ids is a list, else one tensor).
    """

    def __init__(self, embedding_dims=None, combiners="sum", initializers=None, key_dtype=tf.int64,
                 ev_options=None, embedding_variables=None, **kwargs):
        super().__init__(**kwargs)
        if embedding_variables is None:
            if embedding_dims is None:
                raise ValueError(f"layer '{self.name}': give embedding_dims or embedding_variables")
            dims = _as_list(embedding_dims)
            n = len(dims)
            inits = self._per_table(initializers, n, "initializers")
            options = self._per_table(ev_options, n, "ev_options")
            tables = [_new_table(f"{self.name}/table_{i}", d, inits[i], key_dtype, options[i])
                      for i, d in enumerate(dims)]
        else:
            tables = _as_list(embedding_variables)
        self.combiners = tuple(self._per_table(combiners, len(tables), "combiners"))
        for c in self.combiners:
            if c not in COMBINERS:
                raise ValueError(f"layer '{self.name}': unknown combiner '{c}' (expected one of "
                                 f"{', '.join(COMBINERS)})")
        self._set_tables(tables)

    def _per_table(self, value, n, what):
        values = _as_list(value) if isinstance(value, (list, tuple)) else [value] * n
        if len(values) != n:
            raise ValueError(f"layer '{self.name}': {n} tables but {len(values)} {what}")
        return values

    def call(self, ids, weights=None, training=None):
        training = _training_flag(training, self.name)
        single = not isinstance(ids, (list, tuple))
        ids = _as_list(ids)
        n = len(self._tables)
        if len(ids) != n:
            raise ValueError(f"layer '{self.name}': {n} tables but {len(ids)} id tensors")
        ids = [_id_lists(x, self._key_dtype(i)) for i, x in enumerate(ids)]
        weights = None if weights is None else _as_list(weights)
        outs = lookup_sparse(list(self._tables), ids, sp_weights=weights, combiners=self.combiners,
                             training=training, name=self.name)
        return outs[0] if single else outs

    def compute_output_shape(self, input_shape):
        shapes = input_shape if isinstance(input_shape, list) else [input_shape]
        outs = [(s[0], t.shape[-1]) for s, t in zip(shapes, self._tables)]
        return outs if isinstance(input_shape, list) else outs[0]

    def get_config(self):
        config = super().get_config()
        config.update(embedding_dims=[int(t.shape[-1]) for t in self._tables], combiners=self.combiners)
        return config
