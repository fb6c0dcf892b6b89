"""Keras layers over SOK tables (`tf.keras`: Keras 3, or tf_keras).

Training with `fit`: compile with the optimizer wrapped,

    model.compile(optimizer=sok.OptimizerWrapper(keras.optimizers.Adam(1e-3)), loss=...)
    model.fit(dataset)

trains the layers' tables with SOK's fused sparse update of the same optimizer (the Keras
optimizer trains everything else). A plain Keras optimizer raises an error at the first `fit`
step naming the layer, the table and this fix (see sparse_operation_kit.optimizers.keras_support:
each table has a zero "gradient carrier" variable that Keras lists among the trainable weights).
Custom loops can keep giving `layer.embedding_variables` (or
`sok.layers.embedding_variables(model)`) to the tape and to `sok.OptimizerWrapper` next to the
model's variables.

Keras's `training` flag reaches the lookup: training=True inserts unseen ids into Embedding
Variables, counts their frequencies and routes the tables' gradients to `fit`; training=False
(evaluate, predict, serving) reads unseen ids as their initial value and inserts nothing. Anything
else (e.g. "no") is an error.

training=None is what Keras 3 gives the layers of a model whose `call(self, x)` takes no
`training` argument: its `fit`, `evaluate` and `predict` then all call `model(x)` and the phase
never reaches the layers. A None lookup therefore trains when a tf.GradientTape records it (fit's
step, or a custom loop's tape) and is an inference lookup otherwise (evaluate, predict, a plain
`model(x)`), so that such a model trains its tables under `fit` like one that forwards
`training`. Pass training=False explicitly for a lookup under a tape that must insert nothing.

Saving: the layers are registered Keras serializables ("sok>Embedding", "sok>SparseEmbedding"):
`keras.models.load_model` needs no custom_objects, and `.keras` files and `save_weights` /
`load_weights` hold every row of every table (keys, values, optimizer slots, frequencies and
last-update steps). Each table is also an attribute of the layer, which makes it a dependency
for tf.train.Checkpoint and tf.saved_model.save. tf_keras's legacy HDF5 format (`save_weights(
"w.h5")`, `save("m.h5")`) stores Keras variables only, so it holds no SOK rows: use `.keras`,
`.weights.h5` or the TensorFlow checkpoint format there.

Dense ids padded to a fixed length: give `padding_id` (e.g. -1) so that the padding is neither
looked up nor pooled; without it every entry of a dense [batch, n] tensor is an id.
"""
import re

import numpy as np
import tensorflow as tf

from sparse_operation_kit.lookup.lookup import COMBINERS, lookup_rows, lookup_sparse
from sparse_operation_kit.optimizers import keras_support
from sparse_operation_kit.runtime import compat, keras_version
from sparse_operation_kit.tables import keras_weights, storage, validation
from sparse_operation_kit.tables.embedding_variable import (
    CounterFilter,
    EmbeddingVariable,
    EmbeddingVariableOption,
    GlobalStepEvict,
    InitializerOption,
    L2WeightEvict,
    is_embedding_variable,
)
from sparse_operation_kit.tables.tables import StaticTable, table_name

_register = keras_version.keras_module().saving.register_keras_serializable


def embedding_variables(obj):
    """Every SOK Embedding Variable reachable from a layer, model or tf.Module (in checkpoint
    order)."""
    return [t for t in tf.train.TrackableView(obj).descendants() if is_embedding_variable(t)]


def _training_flag(training, layer_name):
    """Keras's `training` (None, a bool or a constant tensor) as the bool the lookup needs. None
    means "unknown" (Keras 3's fit calls a model whose call() has no `training` argument without
    one, and its layers get None): a recording GradientTape tells fit's step from evaluate and
    predict, which record none; treating None as inference there would drop the tables' gradients."""
    flag = validation.check_training_flag(training, f"layer '{layer_name}'")
    if flag is None:
        return compat.gradient_tape_recording()
    return flag


def _as_list(x):
    return list(x) if isinstance(x, (list, tuple)) else [x]


def _cast_ids(ids, dtype, table="table"):
    """Keras inputs are often int32: ids take the key dtype of their Embedding Variable (int64 ids
    for an int32 table must fit in int32: an error names the table otherwise)."""
    return validation.cast_keys(_whole_float_ids(ids, table), dtype, table)


def _whole_float_ids(ids, table):
    """Float ids as int64, as Keras's Embedding takes them (keras.Input defaults to float32, and
    Keras traces a model's serving signature with float inputs), but only whole numbers: a
    fractional id is an error naming the table, not a truncated key."""
    values = _values_of(ids)
    if not values.dtype.is_floating:
        return ids
    whole = tf.debugging.assert_equal(
        tf.math.floor(values), values,
        message=f"table '{table}': float ids must be whole numbers (give int64 ids, e.g. "
                "keras.Input(..., dtype=\"int64\"))")
    with tf.control_dependencies([whole] if not tf.executing_eagerly() else []):
        keys = tf.cast(values, tf.int64)
    if isinstance(ids, tf.SparseTensor):
        return tf.SparseTensor(ids.indices, keys, ids.dense_shape)
    if isinstance(ids, tf.RaggedTensor):
        return ids.with_flat_values(keys)
    return keys


def _values_of(ids):
    if isinstance(ids, tf.SparseTensor):
        return ids.values
    if isinstance(ids, tf.RaggedTensor):
        return ids.flat_values
    return tf.convert_to_tensor(ids)


def _check_pooled_dense_ids(ids, table, layer):
    """Pooling needs the ids of each sample: a dense tensor must be [batch, n] (from_tensor would
    fail on [batch] with a RaggedTensor error naming no table, and pool [batch, a, b] by a)."""
    if ids.shape.rank is not None and ids.shape.rank != 2:
        raise ValueError(
            f"layer '{layer}': table '{table}': dense ids to pool must be [batch, n] (n ids per "
            f"sample; [batch, 1] for one), or a RaggedTensor / SparseTensor [batch, None]; got "
            f"shape {tuple(ids.shape.as_list())}"
        )


def _id_lists(ids, dtype, table="table", padding_id=None, layer="?"):
    """Ids per sample: a SparseTensor / RaggedTensor as given, a dense [batch, n] tensor as n ids
    per sample, less those equal to `padding_id`; int32 or int64 ids, as `dtype` (None: their
    own)."""
    if not isinstance(ids, (tf.SparseTensor, tf.RaggedTensor)):
        ids = tf.convert_to_tensor(ids)
    ids = _cast_ids(ids, dtype, table)  # refuses other dtypes before any op reads them
    if not isinstance(ids, (tf.SparseTensor, tf.RaggedTensor)):
        _check_pooled_dense_ids(ids, table, layer)
        if padding_id is None:
            ids = tf.RaggedTensor.from_tensor(ids)
        else:
            ids = tf.ragged.boolean_mask(ids, tf.not_equal(ids, tf.cast(padding_id, ids.dtype)))
    return ids


def _padding_id(value, layer_name):
    if value is None:
        return None
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(
            f"layer '{layer_name}': padding_id must be an integer id or None, got {value!r}"
        )
    return int(value)


def _new_table(name, dim, initializer, key_dtype, ev_option):
    return EmbeddingVariable(
        name, dim, key_dtype=key_dtype, initializer=initializer, ev_option=ev_option
    )


# ---------------------------------------------------------------------------------------------
# Serialization: a table as a config, and its rows in a Keras weights store
# ---------------------------------------------------------------------------------------------
def _initializer_config(init, table):
    if init is None or isinstance(init, (str, bool, int, float)):
        return init
    if isinstance(init, (np.integer, np.floating)):
        return init.item()
    get_config = getattr(init, "get_config", None)
    if get_config is not None:
        config = {"class_name": type(init).__name__, "config": get_config()}
        if compat.is_tf1_initializer(init):  # Keras's own classes take other arguments
            config["module"] = "tf.compat.v1.initializers"
            config["config"].pop("dtype", None)  # float32; deprecated as an argument
        return config
    raise ValueError(
        f"table '{table}': its initializer {init!r} cannot be saved in a Keras config; use a "
        "Keras/TensorFlow initializer, a number or 'random'/'zeros'/'ones'"
    )


def _initializer_from_config(config):
    if isinstance(config, dict) and config.get("module") == "tf.compat.v1.initializers":
        name = re.sub(r"(?<!^)(?=[A-Z])", "_", config["class_name"]).lower()  # TruncatedNormal ->
        return getattr(tf.compat.v1.initializers, name).from_config(config["config"])
    if isinstance(config, dict):
        return keras_version.keras_module().initializers.get(
            {"class_name": config["class_name"], "config": config["config"]})
    return config


def table_config(t):
    """A JSON-able description from which `table_from_config` makes an equal, empty table."""
    if isinstance(t, EmbeddingVariable):
        return {"kind": "embedding_variable", "name": t.name, "embedding_dim": t.embedding_dim,
                "key_dtype": t.key_dtype.name, "trainable": bool(t.trainable),
                "initializer": _initializer_config(getattr(t, "_initializer_arg", None), t.name),
                "default_value_dim": int(t._default_value_dim),
                "default_value_no_permission": float(t._no_permission),
                "filter_freq": int(t._filter_freq), "steps_to_live": int(t._steps_to_live),
                "l2_weight_threshold": float(t._l2_threshold),
                "storage": t._storage.to_config()}
    return {"kind": "static", "name": table_name(t), "shape": [int(d) for d in t.shape],
            "dtype": tf.as_dtype(t.dtype).name}


def table_from_config(c):
    if c["kind"] == "static":
        return StaticTable(initial_value=tf.zeros(c["shape"], c["dtype"]), name=c["name"])
    evict = None
    if c["steps_to_live"] > 0:
        evict = GlobalStepEvict(c["steps_to_live"])
    elif c["l2_weight_threshold"] >= 0:
        evict = L2WeightEvict(c["l2_weight_threshold"])
    option = EmbeddingVariableOption(
        filter_option=CounterFilter(c["filter_freq"]) if c["filter_freq"] else None,
        storage_option=storage.option_from_config(c.get("storage")),
        evict_option=evict,
        init_option=InitializerOption(
            _initializer_from_config(c["initializer"]),
            c["default_value_dim"],
            c["default_value_no_permission"],
        ),
    )
    return EmbeddingVariable(
        c["name"],
        c["embedding_dim"],
        key_dtype=c["key_dtype"],
        trainable=c["trainable"],
        ev_option=option,
    )


class _TablesLayer(tf.keras.layers.Layer):
    """Owns the tables: new Embedding Variables, or existing SOK variables handed in."""

    def _set_tables(self, tables):
        self.supports_jit = (
            False  # SOK's ops have no XLA kernels (Keras 3 would compile fit's step)
        )
        self._tables = tuple(tables)
        carriers = []
        for i, table in enumerate(self._tables):
            # One attribute per table: Keras wraps lists in containers that TensorFlow's
            # checkpointing does not follow.
            setattr(self, f"table_{i}", table)
            # tf_keras trains a static tf.Variable table itself (it tracks tf.Variables); Keras 3
            # does not, so such tables get a carrier there too (its gradient raises an error).
            if table.trainable and (is_embedding_variable(table) or keras_version.keras_is_v3()):
                carrier = keras_support.make_carrier(self.name, i, table)
                setattr(self, f"sok_gradient_carrier_{i}", carrier)
                carriers.append(carrier)
            else:
                carriers.append(None)
        self._carriers = tuple(carriers)

    def _lookup(self, compute, training):
        """compute() -> one output per table; with training, the tables' gradients also reach their
        carriers, through which Keras's fit trains them."""
        if not training:
            return compute()
        return keras_support.lookup_with_carriers(compute, self._tables, self._carriers)

    def _tables_config(self):
        return [table_config(t) for t in self._tables]

    # --- Keras weights files (.keras, save_weights): the tables' every row ----------------------
    def _keras_variables(self):
        return list(self._trainable_variables) + list(self._non_trainable_variables) \
            if hasattr(self, "_trainable_variables") else list(self.weights)

    # Each table's entries are "sok_table_<i>_<field>" (tables.keras_weights).
    def save_own_variables(self, store):
        for i, v in enumerate(self._keras_variables()):
            store[f"{i}"] = np.asarray(v.numpy() if hasattr(v, "numpy") else v)
        for i, t in enumerate(self._tables):
            prefix = f"sok_table_{i}"
            if is_embedding_variable(t):
                keras_weights.save_rows(store, prefix, t)
            elif not any(t is v for v in self._keras_variables()):
                store[f"{prefix}_values"] = np.asarray(t.numpy())
                keras_weights.mark_shard(store, prefix)

    def load_own_variables(self, store):
        own = self._keras_variables()
        keys = set(store.keys())
        expected = len([k for k in keys if not k.startswith("sok_table_")])
        if expected != len(own):
            raise ValueError(
                f"layer '{self.name}': the weights file holds {expected} Keras variables, the "
                "layer "
                f"has {len(own)}"
            )
        for i, v in enumerate(own):
            if keras_support.is_carrier(v):
                continue  # always zero
            v.assign(np.asarray(store[f"{i}"]))
        where = f"layer '{self.name}'"
        for i, t in enumerate(self._tables):
            prefix = f"sok_table_{i}"
            if is_embedding_variable(t):
                keras_weights.load_rows(store, keys, prefix, t, where)
            elif f"{prefix}_values" in keys:
                t.assign(keras_weights.owned_part(store, keys, prefix, t, ["values"], where)[0])

    @property
    def embedding_variables(self):
        """The layer's tables, in order (Embedding Variables and any static tables handed in)."""
        return list(self._tables)

    def _key_dtype(self, i):
        table = self._tables[i]
        return table.key_dtype if is_embedding_variable(table) else None


@_register(package="sok")
class Embedding(_TablesLayer):
    """One Embedding Variable as a Keras layer (like keras.layers.Embedding, with no vocabulary
    size).

    call(ids, training=None):
      - ids a dense tensor of any shape -> [*ids.shape, dim];
      - ids a RaggedTensor -> its rows as a RaggedTensor [..., (n), dim];
      - with `combiner` ("sum", "mean", "sqrtn"): ids a SparseTensor / RaggedTensor [batch, None]
        or a dense [batch, n] tensor -> pooled per sample, [batch, dim] (`sok.lookup_sparse`).
      - training: True trains (inserts unseen ids), False never inserts; None (a model whose
        call() takes no `training`) trains only under a recording tf.GradientTape, as in fit.

    embedding_dim, initializer, key_dtype, ev_option: those of the new Embedding Variable (see
    sok.get_embedding_variable). embedding_variable: use this existing sok.EmbeddingVariable /
    sok.DynamicVariable instead. padding_id: in dense ids, this value marks padding (e.g. -1 for
    [batch, n] ids padded to a fixed n): it is never looked up nor inserted; pooled, it does not
    count; without a combiner, its output rows are zeros.
    """

    def __init__(self, embedding_dim=None, combiner=None, initializer=None, key_dtype=tf.int64,
                 ev_option=None, embedding_variable=None, tables=None, padding_id=None, **kwargs):
        super().__init__(**kwargs)
        self.padding_id = _padding_id(padding_id, self.name)
        if tables is not None and embedding_variable is None:  # from_config
            embedding_variable = table_from_config(tables[0])
        if combiner is not None and combiner not in COMBINERS:
            raise ValueError(f"layer '{self.name}': unknown combiner '{combiner}' (expected one of "
                             f"{', '.join(COMBINERS)})")
        if embedding_variable is None:
            if embedding_dim is None:
                raise ValueError(f"layer '{self.name}': give embedding_dim or embedding_variable")
            embedding_variable = _new_table(f"{self.name}/embeddings", embedding_dim, initializer,
                                            key_dtype, ev_option)
        elif not is_embedding_variable(embedding_variable):
            raise TypeError(
                f"layer '{self.name}': embedding_variable must be a sok.EmbeddingVariable, got "
                f"{type(embedding_variable).__name__}"
            )
        elif embedding_dim is not None and embedding_dim != embedding_variable.embedding_dim:
            # The table decides the output's dimension: a different embedding_dim is a mistake.
            raise ValueError(
                f"layer '{self.name}': embedding_dim={embedding_dim} but its table "
                f"'{embedding_variable.name}' has dimension {embedding_variable.embedding_dim}"
            )
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
        if not isinstance(ids, (tf.SparseTensor, tf.RaggedTensor)):
            ids = tf.convert_to_tensor(ids)
        ids = _cast_ids(ids, table.key_dtype, table.name)
        if self.combiner is not None:
            ids = _id_lists(ids, table.key_dtype, table.name, self.padding_id, self.name)
            ids = validation.check_lookup_inputs([table], [ids], None, [table.name])[0][0]
            return self._lookup(
                lambda: [lookup_sparse(table, ids, combiners=self.combiner, training=training)],
                training,
            )[0]
        if isinstance(ids, tf.SparseTensor):
            raise TypeError(f"layer '{self.name}': SparseTensor ids need a combiner")
        if isinstance(ids, tf.RaggedTensor):
            return self._lookup(lambda: [tf.ragged.map_flat_values(
                lambda flat: lookup_rows(table, flat, training), ids)], training)[0]
        if self.padding_id is not None:
            positions = tf.where(tf.not_equal(ids, tf.cast(self.padding_id, ids.dtype)))
            shape = tf.concat([tf.shape(ids, out_type=tf.int64), [self.embedding_dim]], 0)
            return self._lookup(
                lambda: [
                    tf.scatter_nd(
                        positions,
                        lookup_rows(table, tf.gather_nd(ids, positions), training),
                        shape,
                    )
                ],
                training,
            )[0]
        return self._lookup(lambda: [lookup_rows(table, ids, training)], training)[0]

    def compute_output_shape(self, input_shape):
        if self.combiner is not None:
            return (input_shape[0], self.embedding_dim)
        return tuple(input_shape) + (self.embedding_dim,)

    def get_config(self):
        config = super().get_config()
        config.update(embedding_dim=self.embedding_dim, combiner=self.combiner,
                      key_dtype=self._tables[0].key_dtype.name, tables=self._tables_config(),
                      padding_id=self.padding_id)
        return config


@_register(package="sok")
class SparseEmbedding(_TablesLayer):
    """Pooled lookups of one or many tables in one fused `sok.lookup_sparse` call.

    New tables: `embedding_dims` (an int, or a list with one entry per table) with optional
    `initializers`, `key_dtype`, `ev_options` (one, or one per table). Existing tables:
    `embedding_variables`, a list of SOK variables (sok.EmbeddingVariable / DynamicVariable,
    sok.Variable / tf.Variable). `combiners`: "sum", "mean" or "sqrtn", one, or one per table.

    call(ids, weights=None, training=None): ids (and weights, if given) a tf.SparseTensor /
    tf.RaggedTensor [batch, None] per table (dense [batch, n] ids: n ids per sample, less those
    equal to `padding_id` if given) -> a [batch, dim] tensor per table (a list when ids is a list,
    else one tensor). training: as for sok.Embedding (None trains only under a recording
    tf.GradientTape, as in fit of a model whose call() takes no `training`).
    """

    def __init__(self, embedding_dims=None, combiners="sum", initializers=None, key_dtype=tf.int64,
                 ev_options=None, embedding_variables=None, tables=None, padding_id=None, **kwargs):
        super().__init__(**kwargs)
        self.padding_id = _padding_id(padding_id, self.name)
        if tables is not None and embedding_variables is None:  # from_config
            embedding_variables = [table_from_config(c) for c in tables]
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
        names = [getattr(t, "name", f"table_{i}") for i, t in enumerate(self._tables)]
        ids = [
            _id_lists(x, self._key_dtype(i), names[i], self.padding_id, self.name)
            for i, x in enumerate(ids)
        ]
        weights = None if weights is None else _as_list(weights)
        if weights is not None and len(weights) != n:
            raise ValueError(f"layer '{self.name}': {n} tables but {len(weights)} weight tensors")
        ids, weights = validation.check_lookup_inputs(list(self._tables), ids, weights, names)
        outs = self._lookup(
            lambda: lookup_sparse(
                list(self._tables),
                ids,
                sp_weights=weights,
                combiners=self.combiners,
                training=training,
                name=self.name,
            ),
            training,
        )
        return outs[0] if single else list(outs)

    def compute_output_shape(self, input_shape):
        shapes = input_shape if isinstance(input_shape, list) else [input_shape]
        outs = [(s[0], t.shape[-1]) for s, t in zip(shapes, self._tables)]
        return outs if isinstance(input_shape, list) else outs[0]

    def get_config(self):
        config = super().get_config()
        config.update(
            embedding_dims=[int(t.shape[-1]) for t in self._tables],
            combiners=list(self.combiners),
            tables=self._tables_config(),
            padding_id=self.padding_id,
        )
        return config
