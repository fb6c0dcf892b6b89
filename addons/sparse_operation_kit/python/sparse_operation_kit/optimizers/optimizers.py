"""Optimizers for SOK variables: fused sparse updates of the touched Embedding Variable rows and
their co-located slots, or the generic path (generic_optimizer) for optimizers without a fused
kernel; dense variables go to the wrapped TensorFlow/Keras optimizer."""

import numpy as np
import tensorflow as tf

from sparse_operation_kit.optimizers import (
    generic_optimizer,
    keras_support,
    slots,
    step_clock,
    wrapper_step,
)
from sparse_operation_kit.optimizers.keras_support import split_gradients
from sparse_operation_kit.optimizers.rank_average import average_over_ranks
from sparse_operation_kit.runtime import compat
from sparse_operation_kit.runtime._ops import ops
from sparse_operation_kit.runtime.devices import on_host
from sparse_operation_kit.runtime.keras_version import keras_optimizer_kind
from sparse_operation_kit.runtime.schema import Optimizer
from sparse_operation_kit.tables import uniqueness
from sparse_operation_kit.tables.tables import is_sok_table

SUPPORTED = tuple(o.value for o in Optimizer)


def is_sok_variable(v):
    """Embedding Variables and sok.Variable tables (StaticTable)."""
    return is_sok_table(v)


def filter_variables(variables) -> tuple[list, list]:
    """Splits variables into (SOK variables, other variables): under Horovod only the others are
    data-parallel and need their gradients averaged (sok.all_reduce, which SOK orders with its
    own collectives; README, several workers)."""
    sok_vars, other = [], []
    for v in variables:
        (sok_vars if is_sok_variable(v) else other).append(v)
    return sok_vars, other


def _keras_hyperparameters(opt):
    """(kind, hyperparameters) of SOK's fused kernel for a Keras optimizer; (None, None) when it
    has none (the generic path then runs the optimizer's own update)."""
    cfg = opt.get_config()
    name = type(opt).__name__.lower()

    def lr():  # read at every step: schedules and later assignments
        return opt.learning_rate

    clipping = ("clipnorm", "clipvalue", "global_clipnorm")
    if cfg.get("weight_decay") or any(cfg.get(c) for c in clipping):
        return None, None  # the fused kernels know no weight decay or clipping
    if name == "sgd" and not cfg.get("momentum", 0.0):
        return Optimizer.SGD, {"learning_rate": lr}
    if name == "adagrad":
        return Optimizer.ADAGRAD, {
            "learning_rate": lr,
            "initial_accumulator": cfg.get("initial_accumulator_value", 0.1),
            "epsilon": cfg.get("epsilon", 1e-7),
        }
    if name in ("adam", "lazyadam") and not cfg.get("amsgrad"):
        return Optimizer.ADAM, {
            "learning_rate": lr,
            "beta1": cfg.get("beta_1", 0.9),
            "beta2": cfg.get("beta_2", 0.999),
            "epsilon": cfg.get("epsilon", 1e-7),
        }
    if name == "ftrl" and not cfg.get("l2_shrinkage_regularization_strength"):
        return Optimizer.FTRL, {
            "learning_rate": lr,
            "initial_accumulator": cfg.get("initial_accumulator_value", 0.1),
            "lr_power": cfg.get("learning_rate_power", -0.5),
            "l1": cfg.get("l1_regularization_strength", 0.0),
            "l2": cfg.get("l2_regularization_strength", 0.0),
            "beta": cfg.get("beta", 0.0),
        }
    return None, None


def fused_kind(optimizer):
    """(kind, hyperparameters) of the fused kernel for `optimizer`, or (None, None)."""
    if generic_optimizer.optimizer_flavor(optimizer) == "v1":
        return compat.v1_optimizer_hyperparameters(optimizer)
    if hasattr(optimizer, "get_config"):
        return _keras_hyperparameters(optimizer)
    return None, None


def _refuse(optimizer):
    raise ValueError(
        f"sok.OptimizerWrapper: {type(optimizer).__name__} is not supported for SOK variables "
        "(expected a tf.compat.v1.train, Keras 3, tf_keras or tf_keras.optimizers.legacy "
        "optimizer)"
    )


def _value(x):
    """A learning rate given as number, tensor, variable or callable -> float32 tensor (a number
    becomes a constant on the CPU: see runtime.devices.on_host)."""
    if callable(x) and not isinstance(x, (tf.Variable, tf.Tensor)):
        x = x()
    if isinstance(x, (int, float, np.integer, np.floating)):
        with on_host():
            return tf.constant(float(x), tf.float32)
    return tf.cast(tf.convert_to_tensor(x), tf.float32)


def _valid_counts(indices):
    """The padded keys' valid counts for an update of `indices` (uniqueness.py), when every one
    comes from the same exchange: one int64 [len(indices)] tensor; else None (the update dedups,
    which sums the padding's zero gradients away)."""
    found = [uniqueness.valid_count(t) for t in indices]
    if any(f is None for f in found) or len({f[0].name for f in found}) != 1:
        return None
    valid = found[0][0]
    order = [i for _, i in found]
    if order == list(range(valid.shape[0])):
        return valid
    return tf.gather(valid, order)


class _SparseUpdater:
    """The fused update for Embedding Variables, shared by OptimizerWrapper and sok.SGD."""

    def __init__(self, kind, hyper, on_step_created=None):
        if kind not in SUPPORTED:
            raise ValueError(
                f"unsupported optimizer '{kind}' for SOK variables (supported: {SUPPORTED})"
            )
        self.kind = kind
        self.hyper = dict(hyper)
        self._step = None
        self._on_step_created = on_step_created
        self.clock = step_clock.StepClock()  # step -> time, for incremental dumps by time

    def _step_var(self):
        if self._step is None:
            self._step = wrapper_step.new_counter("sok_optimizer_step")
            if self._on_step_created is not None:
                # Before the first read: a pending tf.train.Checkpoint restore lands now.
                self._on_step_created(self._step)
        return self._step

    def step_variable(self):
        return self._step_var()

    def apply(self, grads_and_vars, step=None, version=None):
        """One update of every (IndexedSlices gradient, EmbeddingVariable) pair in one op.
        step: the optimizer's step (None: SOK's own counter, advanced here); version: the step the
        rows record (the caller's global step; None: the optimizer's)."""
        pairs = [(g, v) for g, v in grads_and_vars if g is not None]
        if not pairs:
            return tf.no_op()
        keys, grads = [], []
        for g, v in pairs:
            if not isinstance(g, tf.IndexedSlices):
                raise TypeError(
                    f"the gradient of Embedding Variable '{v.name}' must be tf.IndexedSlices, got "
                    f"{type(g).__name__}"
                )
            if g.values.shape.rank is not None and g.values.shape[-1] not in (
                None,
                v.embedding_dim,
            ):
                raise ValueError(
                    f"the gradient of Embedding Variable '{v.name}' has shape {g.values.shape}, "
                    "but "
                    f"the variable has dimension {v.embedding_dim}"
                )
            keys.append(tf.cast(g.indices, v.key_dtype))
            values = tf.cast(g.values, tf.float32)
            # [n, dim] already (lookup_sparse's gradients): no reshape op per table; the kernel
            # checks the shape against the keys and the table.
            if values.shape.rank != 2:
                values = tf.reshape(values, [-1, v.embedding_dim])
            grads.append(values)
        h = self.hyper
        lr = _value(h["learning_rate"])
        l2 = float(h.get("l2", 0.0))
        if h.get("beta", 0.0):  # FTRL (Keras and TF1) folds beta into l2 (an attribute of the op)
            lr_now = tf.get_static_value(lr)
            if lr_now is None:
                raise ValueError(
                    "FTRL with beta > 0 on SOK variables needs a learning rate known when the "
                    "update is built (eager execution, or a constant learning rate in a graph)"
                )
            l2 = l2 + float(h["beta"]) / (2.0 * float(lr_now))
        own_step = step is None
        step_var = self._step_var() if own_step else None
        if own_step:
            with on_host():  # its read too: TF1 would place the read's Identity on the GPU
                step_value = step_var.read_value()
        else:
            step_value = tf.cast(step, tf.int64)
        valid = _valid_counts([g.indices for g, _ in pairs])
        stamp = step_value if version is None else wrapper_step.read_step(version)
        update = ops.sok_embedding_variable_sparse_apply(
            [v.handle for _, v in pairs],
            keys,
            grads,
            lr,
            step_value,
            tf.zeros([0], tf.int64) if valid is None else valid,
            [] if version is None else [stamp],
            optimizer=self.kind,
            beta1=float(h.get("beta1", 0.9)),
            beta2=float(h.get("beta2", 0.999)),
            epsilon=float(h.get("epsilon", 0.0)),
            initial_accumulator=float(h.get("initial_accumulator", 0.1)),
            l1=float(h.get("l1", 0.0)),
            l2=l2,
            lr_power=float(h.get("lr_power", -0.5)),
            keys_unique=valid is not None
            or all(uniqueness.is_distinct(g.indices) for g, _ in pairs),
            keys_present=all(uniqueness.is_inserted(g.indices) for g, _ in pairs),
        )
        clock = self.clock.record(stamp, [v for _, v in pairs])
        if not own_step:
            return update if clock is None else tf.group(update, clock)
        # The increment follows the step's read, not the update: both live on the CPU, and a CPU
        # op that waits for a GPU op waits for the GPU to finish it (a sync at the end of every
        # step in a GPU trace). The update has the value it read.
        with tf.control_dependencies([step_value]):
            increment = step_var.assign_add(1, read_value=False)
        if tf.executing_eagerly():
            return None
        return tf.group(update, increment, clock)


def make_updater(optimizer, max_touched_rows=None, tracker=None):
    """SOK's update for a wrapped optimizer: the fused kernel of the same optimizer where there is
    one, else the generic path (generic_optimizer) running the optimizer's own update."""
    flavor = generic_optimizer.optimizer_flavor(optimizer)
    if flavor is None:
        _refuse(optimizer)
    kind, hyper = fused_kind(optimizer)
    if kind is not None:
        return _SparseUpdater(kind, hyper)
    return generic_optimizer.GenericSparseUpdater(optimizer, flavor, max_touched_rows, tracker)


class _WrapperType(type(compat.AutoTrackable)):
    """isinstance(x, sok.OptimizerWrapper) holds for the Keras optimizers it returns too."""

    def __instancecheck__(cls, obj):
        if cls is OptimizerWrapper and getattr(type(obj), "_sok_optimizer_wrapper", False):
            return True
        return super().__instancecheck__(obj)


class OptimizerWrapper(
    slots.HiddenFromCheckpointSlots, compat.AutoTrackable, metaclass=_WrapperType
):
    """Wraps a tf.compat.v1.train or Keras (3 or tf_keras) optimizer: SOK Embedding Variables get
    the fused sparse update of the same optimizer, other variables the wrapped optimizer.

    Fused kernels for Embedding Variables: SGD (no momentum), Adagrad, Adam (lazy: only touched
    rows move), FTRL. Every other optimizer runs its own update on the touched rows through a
    scratch variable of `max_touched_rows` rows (see generic_optimizer); its slots are Embedding
    Variables keyed like the table (`get_slot`).

    Wrapping a Keras 3 or tf_keras optimizer gives a Keras optimizer (a subclass of Keras's
    Optimizer, registered as "sok>OptimizerWrapper"), so `model.compile(optimizer=
    sok.OptimizerWrapper(keras.optimizers.Adam(1e-3)))` + `model.fit` train the tables of SOK
    layers (see sparse_operation_kit.optimizers.keras_support); its `apply_gradients` also takes
    SOK tables in custom loops.

    average_over_ranks: under Horovod, each step is one process's step on the global batch with
    the loss averaged over it (Horovod's DistributedOptimizer for the data-parallel variables;
    SOK tables' summed gradients divided by the ranks; see rank_average). What Keras's `fit`
    needs under horovodrun; custom loops that average (and scale) gradients themselves leave it
    off.
    """

    def __new__(cls, optimizer=None, *args, **kwargs):
        if cls is OptimizerWrapper:
            kind = keras_optimizer_kind(optimizer)
            if kind is not None:
                wrapper = keras_support.wrapper_class(kind, make_updater)
                return wrapper(optimizer, *args, **kwargs)
        return super().__new__(cls)

    def __init__(self, optimizer, max_touched_rows=None, average_over_ranks=False):
        self._opt = optimizer
        self._average_over_ranks = bool(average_over_ranks)
        self._flavor = generic_optimizer.optimizer_flavor(optimizer)
        self._is_v1 = self._flavor == "v1"
        self.sok_slots = generic_optimizer.SlotStores()
        self._updater = make_updater(optimizer, max_touched_rows, tracker=self.sok_slots)
        if isinstance(self._updater, _SparseUpdater):
            self._updater._on_step_created = self._track_step

    def _track_step(self, step):
        # An attribute of a trackable is a checkpoint dependency: tf.train.Checkpoint(optimizer=
        # wrapper) saves the wrapped optimizer ("_opt") and this step counter.
        self.sok_optimizer_step = step

    @property
    def iterations(self):
        """The wrapper's step (see wrapper_step): how many calls it ran, apart from
        `optimizer.iterations`. tf.compat.v1 optimizers have none."""
        if self._is_v1:
            raise AttributeError("iterations")  # a tf.compat.v1 optimizer counts no steps
        return self._updater.step_variable()

    @property
    def optimizer(self):
        return self._opt

    def __getattr__(self, item):  # the wrapped optimizer's other attributes (learning_rate, ...)
        if item.startswith("_"):
            raise AttributeError(item)
        return getattr(self._opt, item)

    # --- slots ----------------------------------------------------------------------------------
    def get_slot(self, var, name):
        """The slot `name` of `var`: for a SOK table an Embedding Variable keyed like the table
        (generic path) or a read-only view of the slots stored in its rows (fused kernels); for
        other variables the wrapped optimizer's slot."""
        return slots.get_slot(self._opt, self._flavor, self._updater, var, name)

    def get_slot_names(self):
        return slots.get_slot_names(self._opt, self._flavor, self._updater)

    @property
    def _slots(self):
        """SOK 2.x's `optimizer._slots.get(var._unique_id)`: {slot name: slot} or None (see
        slots.SlotsByUniqueId)."""
        return slots.SlotsByUniqueId(self)

    def sok_slot_names(self):
        """Every slot name a dump can hold for a table (see slots.dumped_slot_names)."""
        return slots.dumped_slot_names(self._opt, self._flavor, self._updater)

    def sok_slot_variables(self, variables, create=False):
        """[(slot, primary, slot name)] that sok.dump / sok.load store for `variables` (create:
        make missing slots first)."""
        if create:
            slots.prepare_slots(self._opt, self._flavor, self._updater, variables)
        return slots.slot_variables(self._opt, self._flavor, self._updater, variables)

    def variables(self):
        """The wrapped optimizer's variables (without the generic path's scratch slots) and the
        slot tables of SOK variables."""
        return slots.optimizer_variables(self._opt, self._flavor, self._updater)

    def compute_gradients(self, loss, var_list=None, **kwargs):
        """TF1: [(gradient, variable)] for SOK variables and the rest alike."""
        if var_list is None:
            var_list = tf.compat.v1.trainable_variables()
            var_list += tf.compat.v1.get_collection(
                tf.compat.v1.GraphKeys.TRAINABLE_RESOURCE_VARIABLES
            )
        var_list = list(dict.fromkeys(var_list))
        grads = tf.gradients(loss, var_list)
        return list(zip(grads, var_list))

    def apply_gradients(self, grads_and_vars, global_step=None, name=None, **kwargs):
        # Gradient carriers of SOK layers -> their tables.
        sparse, dense = split_gradients(grads_and_vars)
        dense = [(g, v) for g, v in dense if g is not None]
        if self._average_over_ranks:
            sparse, dense = average_over_ranks(sparse, dense)
        if self._is_v1:
            return self._apply_v1(sparse, dense, global_step, name)
        # Keras: the whole call runs at the wrapper's step (SOK 2.x), dense variables included.
        counter = self._updater.step_variable()
        with wrapper_step.counting_with(self._opt, counter):
            if isinstance(self._updater, generic_optimizer.GenericSparseUpdater):
                train_op = self._updater.apply(
                    sparse, dense, self._opt.apply_gradients, step=counter, version=global_step
                )
            else:
                train_op = self._apply_fused(sparse, dense, counter, name, global_step)
        if global_step is None:
            return train_op
        with tf.control_dependencies([train_op] if train_op is not None else []):
            increment = global_step.assign_add(1, read_value=False)
        return None if tf.executing_eagerly() else tf.group(train_op, increment, name=name)

    def _apply_fused(self, sparse, dense, counter, name, global_step):
        """A Keras optimizer with a fused kernel: the tables at the wrapper's step, then the dense
        variables (whose update advances the counter), or the counter alone."""
        update = self._updater.apply(sparse, step=counter, version=global_step)
        with tf.control_dependencies([update] if not tf.executing_eagerly() else []):
            if dense:
                last = self._opt.apply_gradients(dense)
            else:
                last = wrapper_step.advance(counter)
        if tf.executing_eagerly():
            return None
        # Keras's apply_gradients returns its step variable, which tf.group does not take.
        parts = [o for o in (update, last) if isinstance(o, (tf.Operation, tf.Tensor))]
        return tf.group(*parts, name=name)

    def _apply_v1(self, sparse, dense, global_step, name):
        """A tf.compat.v1 optimizer: SOK's own counter numbers the tables' updates (their rows
        record global_step when given); the dense pairs go to the optimizer itself."""
        if isinstance(self._updater, generic_optimizer.GenericSparseUpdater):
            applied = []  # the wrapped optimizer's own update op

            def apply_fn(pairs):
                applied.append(self._opt.apply_gradients(pairs, global_step=global_step, name=name))
                return applied[-1]

            train_op = self._updater.apply(sparse, dense, apply_fn, version=global_step)
            if train_op is not None:
                _register_train_op(applied, train_op)
            return train_op
        # The rows' stamp is read before the optimizer's own increment, which follows only the
        # dense updates.
        stamp = None if global_step is None or not sparse else wrapper_step.read_step(global_step)
        ops_ = [self._updater.apply(sparse, version=stamp)]
        if dense:
            graph = not tf.executing_eagerly()
            with tf.control_dependencies([stamp] if stamp is not None and graph else []):
                ops_.append(self._opt.apply_gradients(dense, global_step=global_step, name=name))
            global_step = None
        if global_step is not None:
            with tf.control_dependencies([o for o in ops_ if o is not None]):
                # read_value=False: an op (a read-back variable would be dropped by the group).
                ops_.append(global_step.assign_add(1, read_value=False))
        if tf.executing_eagerly():
            return None
        train_op = tf.group(*[o for o in ops_ if o is not None], name=name)
        _register_train_op(ops_, train_op)
        return train_op

    def minimize(self, loss, var_list=None, global_step=None, name=None, tape=None, **kwargs):
        if tf.executing_eagerly():
            if not callable(loss) and tape is None:
                raise ValueError("minimize in eager mode needs a callable loss or a tape")
            if tape is None:
                with tf.GradientTape() as tape:
                    loss_value = loss()
            else:
                loss_value = loss
            grads = tape.gradient(loss_value, var_list)
            return self.apply_gradients(zip(grads, var_list), global_step=global_step)
        return self.apply_gradients(
            self.compute_gradients(loss, var_list), global_step=global_step, name=name
        )


def _register_train_op(parts, train_op):
    """A TF1 optimizer lists its own (dense-only) update in the TRAIN_OP collection; the training
    step is the wrapper's group, which a graph restored by import_meta_graph must find there."""
    collection = tf.compat.v1.get_collection_ref(tf.compat.v1.GraphKeys.TRAIN_OP)
    collection[:] = [op for op in collection if op not in parts]
    collection.append(train_op)


class SGD(compat.AutoTrackable):
    """NVIDIA SOK 2.x's sok.SGD: plain SGD for SOK variables (and tf.Variables alike)."""

    def __init__(self, lr=0.01, learning_rate=None):
        self._lr = learning_rate if learning_rate is not None else lr
        self._updater = _SparseUpdater(
            Optimizer.SGD, {"learning_rate": self._lr}, on_step_created=self._track_step
        )

    def _track_step(self, step):
        self.sok_optimizer_step = (
            step  # a checkpoint dependency (Embedding Variables' update steps)
        )

    @property
    def learning_rate(self):
        return self._lr

    def apply_gradients(self, grads_and_vars, **kwargs):
        sparse, dense = split_gradients([(g, v) for g, v in grads_and_vars if g is not None])
        ops_ = [self._updater.apply(sparse)]
        lr = _value(self._lr)
        for g, v in dense:
            if isinstance(g, tf.IndexedSlices):
                ops_.append(
                    v.scatter_sub(tf.IndexedSlices(g.values * lr, g.indices, g.dense_shape))
                )
            else:
                ops_.append(v.assign_sub(g * lr))
        if tf.executing_eagerly():
            return None
        return tf.group(*ops_)
