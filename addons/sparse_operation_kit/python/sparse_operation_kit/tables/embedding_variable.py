"""The Embedding Variable: a hash-table-backed embedding that grows as new ids arrive.

API of DeepRec's `tf.get_embedding_variable` and its options, on stock TensorFlow. The table
lives in a TensorFlow resource (a core EmbeddingTable); optimizer slots, frequencies and
last-update steps are stored beside each row.
"""
import itertools
import numbers
import weakref

import numpy as np
import tensorflow as tf

from sparse_operation_kit.runtime import compat, initializers
from sparse_operation_kit.runtime._ops import ops
from sparse_operation_kit.runtime.schema import EXPORT_FIELDS, InitKind
from sparse_operation_kit.serving import serving
from sparse_operation_kit.tables import storage, uniqueness, validation
from sparse_operation_kit.tables.storage import CacheStrategy, StorageOption, StorageType  # noqa: F401

SOK_VARIABLES = "sok_embedding_variables"
_uid = itertools.count()
# Live tables by `_unique_id`: SOK 2.x programs look a table's slots up by it (wrapper `_slots`).
_BY_UNIQUE_ID = weakref.WeakValueDictionary()


# ---------------------------------------------------------------------------------------------
# Options (DeepRec's names and meanings)
# ---------------------------------------------------------------------------------------------
def _integral(value, what, minimum=None):
    """`value` as an int; refuses non-integral values (4.7), bools and values below `minimum`."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(
        value, (numbers.Integral, numbers.Real)
    ):
        raise TypeError(f"{what} must be an integer, got {value!r}")
    if isinstance(value, numbers.Real) and not isinstance(value, numbers.Integral):
        if not float(value).is_integer():
            raise ValueError(f"{what} must be an integer, got {value!r}")
    value = int(value)
    if minimum is not None and value < minimum:
        raise ValueError(f"{what} must be >= {minimum}, got {value}")
    return value


class InitializerOption:
    """Initial values of new keys: key k starts from row k mod default_value_dim of the
    initializer's [default_value_dim, dim] default-value matrix (deterministic per seed and key)."""

    def __init__(self, initializer=None, default_value_dim=4096, default_value_no_permission=0.0):
        if default_value_dim is None:
            raise ValueError(f"default_value_dim must be >= 0, got {default_value_dim}")
        self.initializer = initializer
        self.default_value_dim = _integral(
            default_value_dim, "InitializerOption: default_value_dim", 0
        )
        self.default_value_no_permission = float(default_value_no_permission)


class CounterFilter:
    """Admits a key once it was looked up in training `filter_freq` times."""

    def __init__(self, filter_freq=0):
        self.filter_freq = _integral(filter_freq, "CounterFilter: filter_freq", 0)


class CBFFilter(CounterFilter):
    """DeepRec's counting-Bloom-filter admission, with its arguments. It is carried out by the exact
    counter filter: a key is admitted after exactly `filter_freq` training lookups. DeepRec's
    Bloom filter may admit a key early (false positives, at most `false_positive_probability` for
    `max_element_size` keys) and saves memory for never-admitted keys; here admission is exact and
    every counted key keeps its counter. `counter_type` bounds the count: a `filter_freq` above its
    largest value could never be reached and is refused."""

    def __init__(self, filter_freq=0, max_element_size=0, false_positive_probability=-1.0,
                 counter_type=tf.uint64):
        super().__init__(_integral(filter_freq, "CBFFilter: filter_freq", 0))
        self.max_element_size = _integral(max_element_size, "CBFFilter: max_element_size", 0)
        p = false_positive_probability
        if isinstance(p, (bool, np.bool_)) or not isinstance(p, numbers.Real):
            raise TypeError(f"CBFFilter: false_positive_probability must be a number, got {p!r}")
        if not (float(p) == -1.0 or 0.0 < float(p) < 1.0):
            raise ValueError("CBFFilter: false_positive_probability must be in (0, 1) (or -1 for DeepRec's "
                             f"default), got {p}")
        self.false_positive_probability = float(p)
        counter_type = tf.as_dtype(counter_type)
        if not counter_type.is_integer:
            raise TypeError(f"CBFFilter: counter_type must be an integer dtype, got {counter_type.name}")
        if self.filter_freq > counter_type.max:
            raise ValueError(f"CBFFilter: filter_freq {self.filter_freq} exceeds the largest "
                             f"{counter_type.name} counter ({counter_type.max}): no key could be admitted")
        self.counter_type = counter_type


class EvictOption:
    """Common base of the eviction options (GlobalStepEvict, L2WeightEvict), which DeepRec's
    `EmbeddingVariableOption(evict_option=...)` takes."""


class GlobalStepEvict(EvictOption):
    """Evicts keys not updated for more than `steps_to_live` steps, at `var.shrink(global_step)`
    (DeepRec evicts when it saves; here saving never changes the table: shrink, then save). A row
    records the `global_step` given to the optimizer's `minimize` / `apply_gradients`, else the
    optimizer wrapper's own step."""

    def __init__(self, steps_to_live=None):
        self.steps_to_live = _integral(steps_to_live or 0, "GlobalStepEvict: steps_to_live", 0)


class L2WeightEvict(EvictOption):
    """Evicts keys whose embedding's L2 weight, half its squared L2 norm as in DeepRec, is below
    `l2_weight_threshold`, at `var.shrink(...)` (saving never evicts: shrink, then save). The
    threshold must be >= 0 (DeepRec's default -1 means "no eviction" and is accepted as exactly
    that)."""

    def __init__(self, l2_weight_threshold=-1.0):
        if isinstance(l2_weight_threshold, (bool, np.bool_)) or not isinstance(
            l2_weight_threshold, numbers.Real
        ):
            raise TypeError(
                f"L2WeightEvict: l2_weight_threshold must be a number, got {l2_weight_threshold!r}"
            )
        value = float(l2_weight_threshold)
        if not np.isfinite(value) or (value < 0 and value != -1.0):
            raise ValueError(
                f"L2WeightEvict: l2_weight_threshold must be >= 0 (or -1 for no eviction), got "
                f"{l2_weight_threshold}"
            )
        self.l2_weight_threshold = value



# Eager ops on a GPU run as one-op functions, and TensorFlow copies such a function's results
# into GPU memory even where the kernel writes them to host memory (the export's snapshot): a
# table larger than the GPU's free memory could not be dumped. These functions hand the
# snapshot over on the CPU, so it never enters GPU memory.
tf.no_gradient("SokEmbeddingVariableExport")  # a snapshot: rows, not a function of them


@tf.function(autograph=False)
def _export_on_host(handle, key_dtype):
    rows = ops.sok_embedding_variable_export(handle, key_dtype=key_dtype)
    with tf.device("/device:CPU:0"):
        return [tf.identity(t) for t in rows]


def host_snapshot(arrays):
    """{field: tensor} from {field: array} for import_snapshot, in host memory: eager constants
    would go to the default device, a GPU, which a table larger than its memory cannot pass.
    Takes each array out of `arrays` as its tensor is made, so the array can be freed then.
    An op's numpy input is copied once; tf.constant and tf.identity hold a second copy of a
    large array for a while (a table's size more at a load's peak)."""
    with tf.device("/device:CPU:0"):
        return {f: tf.raw_ops.Identity(input=arrays.pop(f)) for f in list(arrays)}


@tf.function(autograph=False)
def _import_from_host(handle, append, reserve_rows, *snapshot):
    with tf.device("/device:CPU:0"):
        snapshot = [tf.identity(t) for t in snapshot]
    ops.sok_embedding_variable_import(handle, *snapshot, append=append, reserve_rows=reserve_rows)


class EmbeddingVariableOption:
    def __init__(self, ht_type=None, ht_partition_num=None, evict_option=None, ckpt=None,
                 filter_option=None, storage_option=None, init_option=None):
        if filter_option is not None and not isinstance(filter_option, CounterFilter):
            raise TypeError(
                "filter_option must be sok.CounterFilter or sok.CBFFilter, got "
                f"{type(filter_option).__name__}"
            )
        if evict_option is not None and not isinstance(
            evict_option, (GlobalStepEvict, L2WeightEvict)
        ):
            raise TypeError(
                "evict_option must be sok.GlobalStepEvict or sok.L2WeightEvict, got "
                f"{type(evict_option).__name__}"
            )
        self.filter_option = filter_option
        self.evict_option = evict_option
        self.storage_option = storage_option
        self.init_option = init_option
        self.ckpt = ckpt


# ---------------------------------------------------------------------------------------------
# The variable
# ---------------------------------------------------------------------------------------------
class EmbeddingVariable(compat.TableResource):
    """A [?, embedding_dim] table keyed by int32/int64 ids; rows appear on first training lookup.

    Names: as with tf.Variable in eager execution, two eager tables may share a name; they are two
    separate tables (each gets its own resource). A name still matters: it seeds the initial
    values of new keys, and it is the key of the table in tf.compat.v1.train.Saver checkpoints and
    sok.dump directories (which refuse two tables of one name). In TF1 graphs
    sok.get_embedding_variable refuses a second table of the same name unless the variable scope
    reuses it.

    It reads like a resource variable where TensorFlow allows it: `tf.nn.embedding_lookup(var,
    ids)`, `var.sparse_read(ids)`, and `tf.gradients` / `tf.GradientTape` give `tf.IndexedSlices`
    keyed by id. Train it through `sok.OptimizerWrapper(opt)` or `sok.SGD`.
    """

    def __init__(self, name, embedding_dim, key_dtype=tf.int64, value_dtype=tf.float32,
                 initializer=None, trainable=True, ev_option=None, steps_to_live=None,
                 collections=None, default_value_dim=None):
        key_dtype = tf.as_dtype(key_dtype)
        if key_dtype not in (tf.int32, tf.int64):
            raise TypeError(
                f"Embedding Variable '{name}': key_dtype must be int32 or int64, got "
                f"{key_dtype.name}"
            )
        if tf.as_dtype(value_dtype) != tf.float32:
            raise TypeError(
                f"Embedding Variable '{name}': value_dtype must be float32, got "
                f"{tf.as_dtype(value_dtype).name}"
            )
        if (
            isinstance(embedding_dim, (bool, np.bool_))
            or not isinstance(embedding_dim, (numbers.Real, np.ndarray))
            or (isinstance(embedding_dim, np.ndarray) and embedding_dim.ndim != 0)
        ):
            raise TypeError(
                f"Embedding Variable '{name}': embedding_dim must be a positive integer, got "
                f"{embedding_dim!r}"
            )
        if float(embedding_dim) != int(embedding_dim):
            raise ValueError(
                f"Embedding Variable '{name}': embedding_dim must be an integer, got "
                f"{embedding_dim!r}"
            )
        embedding_dim = int(embedding_dim)
        if embedding_dim <= 0:
            raise ValueError(
                f"Embedding Variable '{name}': embedding_dim must be positive, got {embedding_dim}"
            )
        if steps_to_live is not None:
            steps_to_live = _integral(
                steps_to_live, f"Embedding Variable '{name}': steps_to_live", 0
            )
        ev_option = ev_option or EmbeddingVariableOption()
        init_option = ev_option.init_option or InitializerOption(
            initializer, 4096 if default_value_dim is None else default_value_dim)
        # The option's initializer first, as DeepRec; the option may be shared: never written.
        init_arg = init_option.initializer if init_option.initializer is not None else initializer
        self._name = name
        self._dim = embedding_dim
        self._key_dtype = key_dtype
        self._trainable = trainable
        self.target_gpu = -1
        self._default_value_dim = init_option.default_value_dim
        spec = initializers.resolve(init_arg, name, embedding_dim, self._default_value_dim)
        if spec.kind == InitKind.MATRIX and self._default_value_dim == 0:
            self._default_value_dim = int(spec.matrix.shape[0])
        self._init_spec = spec
        self._initializer_arg = init_arg  # for Keras configs (sok.layers)
        self._no_permission = init_option.default_value_no_permission
        self._filter_freq = ev_option.filter_option.filter_freq if ev_option.filter_option else 0
        self._storage = storage.resolve(ev_option.storage_option, name, embedding_dim)
        evict = ev_option.evict_option
        self._steps_to_live = int(steps_to_live or 0)
        if isinstance(evict, GlobalStepEvict):
            self._steps_to_live = evict.steps_to_live
        self._l2_threshold = evict.l2_weight_threshold if isinstance(evict, L2WeightEvict) else -1.0
        # Eager tables get a process-unique resource name, graph tables their (unique) op name.
        self._shared_name = f"{name}_{next(_uid)}" if tf.executing_eagerly() else None
        super().__init__()
        with tf.init_scope():
            self._resource_handle = self._create_resource()
            self._init_op = self._initialize()
            if tf.executing_eagerly():
                self._init_op = None
        if not tf.executing_eagerly():
            graph = tf.compat.v1.get_default_graph()
            default = [tf.compat.v1.GraphKeys.GLOBAL_VARIABLES]
            if trainable:
                default.append(tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES)
            for c in set(list(collections or default) + [SOK_VARIABLES]):
                graph.add_to_collection(c, self)
        _BY_UNIQUE_ID[self._unique_id] = self

    # --- resource lifecycle (TrackableResource) -----------------------------------------------
    def _create_resource(self):
        shared_name = self._shared_name
        if shared_name is None:  # graph mode: unique within the graph
            shared_name = tf.compat.v1.get_default_graph().unique_name(
                self._name, mark_as_used=False
            )
            self._shared_name = shared_name
        return ops.sok_embedding_variable_handle(key_dtype=self._key_dtype, shared_name=shared_name,
                                                 name=self._name)

    def _initialize(self):
        spec = self._init_spec
        matrix = spec.matrix if spec.kind == InitKind.MATRIX else tf.zeros([0, self._dim])
        return ops.sok_embedding_variable_initialize(
            self.resource_handle, matrix, key_dtype=self._key_dtype, table_name=self._name,
            dim=self._dim, init_kind=spec.kind.value, init_a=spec.a, init_b=spec.b, seed=spec.seed,
            default_value_dim=self._default_value_dim, filter_freq=self._filter_freq,
            default_value_no_permission=self._no_permission, steps_to_live=self._steps_to_live,
            l2_weight_threshold=self._l2_threshold,
            storage_type=self._storage.storage_type.name, storage_path=self._storage.path,
            storage_size=self._storage.sizes, cache_strategy=self._storage.strategy.name)

    def _destroy_resource(self):
        tf.raw_ops.DestroyResourceOp(resource=self.resource_handle, ignore_lookup_error=True)

    # --- variable-like surface ------------------------------------------------------------------
    @property
    def handle(self):
        return self.resource_handle

    @property
    def name(self):
        return self._name

    @property
    def _unique_id(self):
        """A string unique per table, as tf.Variable's `_unique_id` (SOK 2.x programs key the
        optimizer's `_slots` by it); "#" keeps it apart from every tf.Variable's."""
        return f"sok#{self._shared_name}"

    @property
    def op(self):
        return self.resource_handle.op

    @property
    def graph(self):
        return self.resource_handle.graph

    @property
    def device(self):
        return self.resource_handle.device

    @property
    def dtype(self):
        return tf.float32

    @property
    def key_dtype(self):
        return self._key_dtype

    @property
    def embedding_dim(self):
        return self._dim

    @property
    def shape(self):
        return tf.TensorShape([None, self._dim])

    def get_shape(self):
        return self.shape

    @property
    def trainable(self):
        return self._trainable

    @property
    def initializer(self):
        """The op that creates the table (TF1 graphs; a no-op group in eager)."""
        if self._init_op is None:
            return tf.no_op()
        return self._init_op

    def is_initialized(self, name=None):
        return ops.sok_embedding_variable_is_initialized(
            self.resource_handle, key_dtype=self._key_dtype, name=name
        )

    def size(self, name=None):
        """Number of keys in the table."""
        return ops.sok_embedding_variable_size(
            self.resource_handle, key_dtype=self._key_dtype, name=name
        )

    def _check_keys(self, keys):
        keys = tf.convert_to_tensor(keys)
        if keys.dtype != self._key_dtype:
            raise TypeError(
                f"Embedding Variable '{self._name}' has key dtype {self._key_dtype.name}, "
                f"but ids of dtype {keys.dtype.name} were given"
            )
        return keys

    # tf.nn.embedding_lookup on this table reads this process's rows even under Horovod
    # (lookup/tf_api.py): SOK 2.x's DynamicVariable does, as in SOK 2.x.
    _tf_lookup_reads_shard = False

    def _read_keys(self, ids):
        """ids as keys for a read (sparse_read, lookup_rows); DynamicVariable widens int32."""
        return self._check_keys(ids)

    def sparse_read(self, indices, name=None, training=True):
        """Rows of `indices` (any shape) -> [*indices.shape, dim]; training reads insert keys.
        Reads this process's table: under Horovod, the rank's shard (lookup_sparse and
        tf.nn.embedding_lookup fetch rows from their owners)."""
        indices = self._read_keys(indices)
        if serving.active():  # save_stock_saved_model is tracing: a stock lookup on the frozen table
            return serving.active().table(self).lookup(indices)
        flat = tf.reshape(indices, [-1])
        compat.variable_accessed(self)
        if training and self.admits_by_count:
            rows = self._gather_distinct(flat, name)
        else:
            rows = self._gather(flat, tf.zeros([0], tf.int64), training, name)
        return tf.reshape(rows, tf.concat([tf.shape(indices), [self._dim]], 0))

    @property
    def admits_by_count(self):
        """Whether a training read admits new keys by their frequency (a filter of filter_freq
        > 1): then a key repeated in one read must be counted once with its count, or its
        occurrences would read different rows. Other tables read every occurrence as it comes:
        the same rows and gradient sums, without a dedup op per read (filter_freq 1 admits a key
        at its first occurrence)."""
        return self._filter_freq > 1

    def _gather(self, keys, counts, training, name=None):
        """The Gather op's rows of flat `keys`; counts: per key, or [0] for one each."""
        return ops.sok_embedding_variable_gather(
            [self.resource_handle], [keys], [counts], tf.zeros([0], tf.int64), dims=[self._dim],
            training=training, name=name,
        )[0]

    def _gather_distinct(self, flat, name):
        """A training read as DeepRec's: the distinct keys are gathered once with their counts
        (the filter admits a key when frequency + count reaches filter_freq), so every occurrence
        reads the same row; the gradient is keyed by the distinct keys."""
        keys, inverse, counts = distinct_with_counts(flat)
        # The gradient's keys are these distinct keys, which the read has inserted.
        uniqueness.declare_distinct([keys], inserted=True)
        return tf.gather(self._gather(keys, counts, True, name), inverse)

    def read_value(self):
        raise TypeError(
            f"Embedding Variable '{self._name}' has no dense value; use sparse_read(ids) "
            "or sok.export(var)"
        )

    def export(self):
        """(keys, values, slots, freqs, versions, slot_kind, slot_init) of every row."""
        if tf.executing_eagerly():
            with tf.device("/device:CPU:0"):  # the call's outputs land on its device
                return _export_on_host(self.resource_handle, self._key_dtype)
        return ops.sok_embedding_variable_export(self.resource_handle, key_dtype=self._key_dtype)

    def assign(self, keys, values):
        keys = self._check_keys(keys)
        values = tf.convert_to_tensor(values, tf.float32)
        if values.shape.rank is not None and (
            values.shape.rank == 0 or values.shape[-1] not in (None, self._dim)
        ):
            raise ValueError(
                f"Embedding Variable '{self._name}' has dimension {self._dim}, but the values have "
                f"shape {values.shape}"
            )
        # key_dtype is inferred from the keys' dtype (no explicit argument).
        return ops.sok_embedding_variable_assign(self.resource_handle, tf.reshape(keys, [-1]),
                                                 tf.reshape(values, [-1, self._dim]))

    def shrink(self, global_step):
        """Applies the eviction options now; returns how many keys were removed.

        `global_step` is the current step: GlobalStepEvict drops keys last updated more than
        steps_to_live steps before it. Call it before saving to leave stale rows out of the
        checkpoint (DeepRec does this inside its save).
        """
        return ops.sok_embedding_variable_shrink(
            self.resource_handle, tf.cast(global_step, tf.int64), key_dtype=self._key_dtype
        )

    # --- checkpoints --------------------------------------------------------------------------
    # A checkpoint holds every row with its optimizer slots, frequency and last-update step, so a
    # restored table trains on exactly as the saved one would have. Saving never evicts: with
    # GlobalStepEvict / L2WeightEvict options call `var.shrink(global_step)` (run its op in TF1)
    # before saving to drop stale rows, as DeepRec does when it saves.
    def snapshot(self):
        """{field: tensor} of every row, fields as schema.EXPORT_FIELDS names them."""
        return dict(zip(EXPORT_FIELDS, self.export(), strict=True))

    def import_snapshot(self, tensors, append=False, reserve_rows=0):
        """Replaces the table's rows with `tensors` ({field: tensor}, as `snapshot()` gives them);
        creates the table first if it does not exist yet. Returns the op (graphs). append: the
        rows join those of the import before (sok.load's later chunks); reserve_rows: room the
        table makes for that many rows (the whole checkpoint, with its first chunk)."""
        t = [tensors[f] for f in EXPORT_FIELDS]
        key_check = validation.check_key_dtype_fits(
            t[0], self._key_dtype, self._name, f"cannot restore Embedding Variable '{self._name}'"
        )
        if not tf.executing_eagerly() or tf.inside_function():
            deps = [
                tf.debugging.assert_equal(
                    tf.shape(t[1])[1],
                    self._dim,
                    message=f"cannot restore Embedding Variable '{self._name}': the checkpoint's "
                            "dimension "
                    f"differs from the variable's ({self._dim})",
                )
            ]
        else:
            if t[1].shape[1] != self._dim:
                raise ValueError(
                    f"cannot restore Embedding Variable '{self._name}': the checkpoint has "
                    f"dimension {t[1].shape[1]}, the variable {self._dim}"
                )
            deps = []
        if key_check is not None:
            deps.append(key_check)
        # Restoring replaces initialization (TF1 Saver.restore, SavedModel load): create the table
        # first if it does not exist yet; an existing one keeps its content until the import.
        deps.append(self._initialize())
        if tf.executing_eagerly():
            return _import_from_host(
                self.resource_handle, bool(append), int(reserve_rows),
                tf.cast(t[0], self._key_dtype), *t[1:]
            )
        with tf.control_dependencies(deps):
            return ops.sok_embedding_variable_import(
                self.resource_handle, tf.cast(t[0], self._key_dtype), *t[1:], append=bool(append),
                reserve_rows=int(reserve_rows)
            )

    # compat.TableResource's hooks (checkpoints, SavedModel, Saver).
    def checkpoint_tensors(self):
        deps = []
        if compat.in_saved_model_export():
            # A loaded SavedModel calls this (to learn the tensors' dtypes) before it initializes
            # its resources: the traced function creates the table if it is missing.
            deps = [self._initialize()]
        with tf.control_dependencies(deps):
            return self.snapshot()

    def restore_checkpoint_tensors(self, tensors):
        return self.import_snapshot(tensors)

    # --- meta graphs (tf.compat.v1.train.export_meta_graph / import_meta_graph) -----------------
    def to_proto(self, export_scope=None):
        """None: the table is left out of the VariableDef collections (GLOBAL_VARIABLES, ...), which
        cannot describe it; sparse_operation_kit.checkpoint.meta_graph writes it to its own
        collection."""

    @classmethod
    def from_graph_ops(cls, handle, init_op, trainable, target_gpu=-1):
        """The table whose handle and initializer ops are already in the graph (an imported meta
        graph): its settings are read back from the initializer op's attributes."""
        self = cls.__new__(cls)
        get = init_op.get_attr
        self._name = get("table_name").decode()
        self._dim = int(get("dim"))
        self._key_dtype = tf.as_dtype(get("key_dtype"))
        self._trainable = bool(trainable)
        self.target_gpu = int(target_gpu)
        self._default_value_dim = int(get("default_value_dim"))
        self._init_spec = initializers.InitSpec(
            InitKind(get("init_kind").decode()), get("init_a"), get("init_b"), get("seed"),
            matrix=init_op.inputs[1])
        self._initializer_arg = None
        self._no_permission = float(get("default_value_no_permission"))
        self._filter_freq = int(get("filter_freq"))
        self._steps_to_live = int(get("steps_to_live"))
        self._l2_threshold = float(get("l2_weight_threshold"))
        self._storage = storage.StoragePlan(
            storage.StorageType[get("storage_type").decode()], get("storage_path").decode(),
            get("storage_size"), storage.CacheStrategy[get("cache_strategy").decode()])
        self._shared_name = handle.op.get_attr("shared_name").decode()
        tf.saved_model.experimental.TrackableResource.__init__(self)
        self._resource_handle = handle
        self._init_op = init_op
        return self

    def __repr__(self):
        return (
            f"<sok.EmbeddingVariable '{self._name}' dim={self._dim} "
            f"key_dtype={self._key_dtype.name} "
            f"target_gpu={self.target_gpu}>"
        )


def distinct_with_counts(flat_keys):
    """(distinct keys, inverse int32 [n], counts int64) of flat keys, in one SokUniqueKeys."""
    unique, inverse, counts, _, _, _ = ops.sok_unique_keys([flat_keys], [], [], N=1)
    return unique[0], inverse[0], counts[0]


def fetch_rows(table):
    """What `sess.run(table)` returns: the [rows, dim] values of every row on this rank, in
    sok.export's order. SOK 2.x's DynamicVariable is a tf.Variable whose fetch reads a placeholder
    of one zero row (not the table); here a fetch gives the table's content, as a tf.Variable
    fetch gives its value. It copies the whole table: fetch it to inspect, not every step."""
    return tf.identity(table.export()[1], name="rows")


compat.fetch_as(EmbeddingVariable, fetch_rows)


def is_embedding_variable(v):
    return isinstance(v, EmbeddingVariable)
