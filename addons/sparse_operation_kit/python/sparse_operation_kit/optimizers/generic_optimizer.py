"""Any TensorFlow / Keras optimizer on the touched rows of Embedding Variables.

Optimizers without a fused SOK kernel (Momentum, RMSProp, Adadelta, AdagradDA, ProximalAdagrad,
Keras's dense Adam, Lion, ...) run their own update on a *scratch* variable:

  1. each table gets a scratch tf.Variable of [max_touched_rows, dim] that the optimizer of
     scratch_optimizer (the wrapped tf.compat.v1 optimizer, or a private copy of a wrapped Keras
     one) knows like any other variable (it creates its own slots for it, once);
  2. a step sums the gradient of repeated ids (as tf.compat.v1 optimizers do), gathers the
     touched rows and their slots into the first n rows of the scratch and of its slots, and
     has that optimizer update them, the gradient as tf.IndexedSlices over rows 0..n-1, at the
     wrapper's step (wrapper_step); the wrapped optimizer updates every other variable, and the
     wrapper's step moves once per call;
  3. the first n rows of the scratch and its slots are written back to the table and its slots.

Slots live in a per-table *slot store*: one Embedding Variable per slot, keyed like the table
("<table>/<slot>"), whose new keys start at the slot's initial value (e.g. Adagrad's
initial_accumulator_value). `optimizer.get_slot(table, name)` returns it, as DeepRec does.

Semantics: touched rows only. tf.compat.v1 optimizers update sparse gradients lazily anyway, so
they match the same optimizer on a tf.Variable exactly. Keras optimizers update every row of a
tf.Variable (e.g. momentum decays rows without gradient); on a SOK table only the rows a step
touches move, with their slots (as SOK 2.x and DeepRec do). Rows n.. of the scratch are padding
that the optimizer may change and that is never written back.
"""

import itertools

import numpy as np
import tensorflow as tf

from sparse_operation_kit.optimizers import (
    scratch_optimizer,
    scratch_rows,
    slot_weights,
    static_staging,
    step_clock,
    wrapper_step,
)
from sparse_operation_kit.runtime import compat
from sparse_operation_kit.runtime._ops import ops
from sparse_operation_kit.runtime.keras_version import keras_optimizer_kind
from sparse_operation_kit.runtime.schema import Optimizer
from sparse_operation_kit.tables import storage
from sparse_operation_kit.tables.embedding_variable import (
    EmbeddingVariable,
    EmbeddingVariableOption,
    InitializerOption,
)

DEFAULT_MAX_TOUCHED_ROWS = 8192
_uid = itertools.count()


def optimizer_flavor(optimizer):
    """ "v1" (tf.compat.v1.train), "keras_legacy" (tf_keras.optimizers.legacy), "keras3",
    "tf_keras" or None."""
    if isinstance(optimizer, tf.compat.v1.train.Optimizer):
        return "v1"
    kind = keras_optimizer_kind(optimizer)
    if kind is not None:
        return kind
    try:
        import tf_keras

        if isinstance(optimizer, tf_keras.optimizers.legacy.Optimizer):
            return "keras_legacy"
    except ImportError:
        pass
    return None


def optimizer_built(optimizer):
    """True once a Keras 3 / tf_keras optimizer has created its variables (build)."""
    return bool(getattr(optimizer, "built", False) or getattr(optimizer, "_built", False))


def read(var):
    """A variable's value as a tensor (tf.Variable or Keras 3 variable)."""
    if isinstance(var, tf.Variable):
        return var.read_value()
    return tf.convert_to_tensor(var.value)


def assign(var, value):
    """var = value, as an op in graphs (a tf.Variable's assign returns a lazy read there)."""
    if isinstance(var, tf.Variable):
        return var.assign(value, read_value=False)
    return var.assign(value)


def assign_add(var, value):
    if isinstance(var, tf.Variable):
        return var.assign_add(value, read_value=False)
    return var.assign_add(value)


def _initial_rows(optimizer, flavor, scratch, slots):
    """{slot name: the row a slot starts from} (every known optimizer fills a slot with one
    constant; a row of them is kept as it is).

    Read where nothing restored can have overwritten it: in eager execution Keras optimizers
    build a fresh copy of themselves (from their config) on an untracked probe variable (their
    own scratch slots may already hold values restored from a checkpoint); tf.compat.v1 slots of
    the scratch are fresh (the scratch is no checkpoint dependency); TF1 graphs read the slots'
    constant initial values."""
    with tf.init_scope():
        if not tf.executing_eagerly():
            rows = {}
            for name, slot in slots.items():
                value = tf.get_static_value(slot.initial_value)
                if value is None:  # an initializer that is no folded constant: evaluate it alone
                    with tf.compat.v1.Session(graph=slot.initial_value.graph) as sess:
                        value = sess.run(slot.initial_value)
                rows[name] = value
        elif flavor == "v1":
            rows = {name: read(slot).numpy() for name, slot in slots.items()}
        else:
            fresh = type(optimizer).from_config(optimizer.get_config())
            probe = tf.Variable(
                tf.zeros([1, scratch.shape[-1]]), trainable=False, name=scratch.name.split(":")[0]
            )
            if flavor == "keras_legacy":
                compat.keras_legacy_create_slots(fresh, [probe])
            else:
                fresh.build([probe])
            rows = {
                name: read(slot).numpy()
                for name, slot in optimizer_slots(fresh, flavor, probe).items()
            }
    return {
        name: np.asarray(value, np.float32).reshape(-1, value.shape[-1])[0]
        for name, value in rows.items()
    }


def _forget_in_graph(variables):
    """Keeps the scratch variable and its slots out of TF1 Savers and initializers: their
    content is scratch (every step assigns it before use) and their names are per process."""
    with tf.init_scope():
        if tf.executing_eagerly():
            return
        graph = tf.compat.v1.get_default_graph()
        for key in (
            tf.compat.v1.GraphKeys.GLOBAL_VARIABLES,
            tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES,
        ):
            collection = graph.get_collection_ref(key)
            collection[:] = [v for v in collection if not any(v is x for x in variables)]


def _slot_table(table, slot_name, row):
    """The slot store of one slot: an Embedding Variable keyed like `table`."""
    name = f"{table.name}/{slot_name}"
    if np.all(row == row[0]):
        initializer = float(row[0])
    else:

        def initializer(shape, dtype=tf.float32):
            return tf.broadcast_to(tf.constant(row, dtype), shape)

    # A tiered table's slot store is tiered the same way, with the same budget: its rows cost as
    # much as the table's (no fused slots), and the same keys are read and updated in both, so
    # both tiers keep about the same rows. Results equal one-tier stores' whatever tier holds them.
    option = EmbeddingVariableOption(
        init_option=InitializerOption(initializer, default_value_dim=1),
        storage_option=storage.option_from_config(table._storage.to_config()),
    )
    # On the table's device: a tier type is built for one device (DRAM_SSDHASH on the CPU,
    # HBM_DRAM on a GPU), and a slot's rows are read and written beside the table's.
    with tf.init_scope(), tf.device(table.device or None):
        return EmbeddingVariable(
            name,
            table.embedding_dim,
            key_dtype=table.key_dtype,
            trainable=False,
            ev_option=option,
            collections=[tf.compat.v1.GraphKeys.GLOBAL_VARIABLES],
        )


class _Table:
    """A table's scratch variable and its slots: {slot name: (the optimizer's slot of the scratch,
    the slot store)}."""

    def __init__(self, table, scratch):
        self.table = table
        self.scratch = scratch
        self.slots = {}


class GenericSparseUpdater:
    """The scratch-variable update of SOK tables for one wrapped optimizer (see the module doc).

    `tracker` is a trackable object (the wrapper) that gets the slot stores as checkpoint
    dependencies.
    """

    def __init__(self, optimizer, flavor, max_touched_rows=None, tracker=None):
        self.optimizer = optimizer
        self.flavor = flavor
        self.capacity = int(max_touched_rows or DEFAULT_MAX_TOUCHED_ROWS)
        if self.capacity <= 0:
            raise ValueError(
                f"sok.OptimizerWrapper: max_touched_rows must be positive, got {max_touched_rows}"
            )
        self._tables = {}
        self._tracker = tracker
        self._step = None
        self.runner = scratch_optimizer.ScratchOptimizer(optimizer, flavor)
        self.clock = step_clock.StepClock()  # step -> time, for incremental dumps by time
        self.static = static_staging.StaticStager(optimizer, self.flavor, self.capacity)

    # --- creation ---------------------------------------------------------------------------
    def _check_table(self, table):
        if table._filter_freq > 0:
            raise ValueError(
                f"sok.OptimizerWrapper: table '{table.name}' has a CounterFilter, which only SOK's fused "
                "optimizers (SGD, Adagrad, Adam, FTRL) honour; the generic path for "
                f"{type(self.optimizer).__name__} would update keys the filter has not admitted"
            )

    def scratch_variables(self, tables):
        """Creates the scratch variables of tables new to this updater; returns them."""
        new = []
        for table in tables:
            if id(table) in self._tables:
                continue
            self._check_table(table)
            # tf.compat.v1 and tf_keras legacy optimizers update through TF kernels that exist
            # for the CPU only (ResourceSparseApplyMomentum, ...RMSProp, ...AdagradDA, ...): their
            # scratch (and so their update) lives on the CPU; Keras's own updates run anywhere.
            scratch = self._new_scratch(table)
            self._tables[id(table)] = _Table(table, scratch)
            new.append(scratch)
        return new

    def _new_scratch(self, table):
        # tf.compat.v1 and tf_keras legacy optimizers update through TF kernels that exist
        # for the CPU only (ResourceSparseApplyMomentum, ...RMSProp, ...AdagradDA, ...): their
        # scratch (and so their update) lives on the CPU; Keras's own updates run anywhere.
        device = "/CPU:0" if self.flavor in ("v1", "keras_legacy") else None
        with tf.init_scope(), tf.device(device):
            return tf.Variable(
                tf.zeros([self.capacity, table.embedding_dim]),
                trainable=False,
                name=f"sok_scratch_{next(_uid)}",
            )

    def fit_capacity(self, sparse):
        """Eager: a step touching more rows of a table than the scratch holds first gets larger
        scratch variables (as SOK 2.x, which has no such bound). They hold nothing between steps
        (the slot stores do), so they are rebuilt empty. In graphs the capacity is fixed when the
        step is built, and a larger step fails its capacity check."""
        if not tf.executing_eagerly() or not sparse:
            return
        # Distinct ids never outnumber ids: the dedup runs only for a step that might not fit.
        big = [g for g, _ in sparse if int(tf.size(g.indices)) > self.capacity]
        most = max((int(tf.size(tf.unique(tf.reshape(g.indices, [-1]))[0])) for g in big),
                   default=0)
        if most <= self.capacity:
            return
        self.capacity = 1 << (most - 1).bit_length()
        old = []
        for state in self._tables.values():
            old.append(state.scratch)
            state.scratch = self._new_scratch(state.table)
        self.runner.replace(old, [s.scratch for s in self._tables.values()])
        self.create_slots()

    def create_slots(self):
        """After the scratch optimizer created its slots for the scratch variables: a slot store
        for each of them (a rebuilt Keras copy: its new slots beside the existing stores)."""
        for state in self._tables.values():
            found = optimizer_slots(self.runner.optimizer, self.flavor, state.scratch)
            if state.slots:
                state.slots = {name: (found[name], store) for name, (_, store) in state.slots.items()}
                continue
            rows = _initial_rows(self.optimizer, self.flavor, state.scratch, found)
            for slot_name, slot in found.items():
                store = _slot_table(state.table, slot_name, rows[slot_name])
                state.slots[slot_name] = (slot, store)
                if self._tracker is not None:
                    self._tracker.track_slot(store, state.table)
            _forget_in_graph([state.scratch] + list(found.values()))
        _forget_in_graph(self.runner.own_variables())

    def ensure(self, tables):
        """Scratch variables and slots for `tables`."""
        new = self.scratch_variables(tables)
        if new:
            self.runner.prepare(new)
            self.create_slots()

    # --- access -----------------------------------------------------------------------------
    def slot(self, table, name):
        state = self._tables.get(id(table))
        if state is None or name not in state.slots:
            return None
        return state.slots[name][1]

    def has_table(self, table):
        return id(table) in self._tables

    def slot_names(self):
        return sorted({n for s in self._tables.values() for n in s.slots})

    def slot_tables(self, tables=None):
        ids = None if tables is None else {id(t) for t in tables}
        return [
            store
            for key, s in self._tables.items()
            if ids is None or key in ids
            for _, store in s.slots.values()
        ]

    def is_scratch_slot(self, var):
        return any(
            var is slot for s in self._tables.values() for slot, _ in s.slots.values()
        ) or any(var is s.scratch for s in self._tables.values())

    # --- the update -------------------------------------------------------------------------
    def step_variable(self):
        """The wrapper's step counter (see wrapper_step), made on first use; tracked at once, so a
        pending tf.train.Checkpoint restore lands before the first read."""
        if self._step is None:
            self._step = wrapper_step.new_counter("sok_generic_optimizer_step")
            if self._tracker is not None:
                self._tracker.track_step(self._step)
        return self._step

    def apply(self, sparse, dense, apply_fn, step=None, version=None):
        """One step. `apply_fn(pairs)` is the wrapped optimizer's apply_gradients: on the dense
        pairs, and for tf.compat.v1 optimizers (step None) on the scratch pairs in the same call.
        step: for Keras optimizers the wrapper's step counter (the optimizer's `iterations`
        during the call, see wrapper_step), which this call advances once. The touched rows and
        slots then go back to the tables, recording `version` (the caller's global step) or the
        step as their rows' version."""
        sparse = [(g, v) for g, v in sparse if g is not None]
        self.ensure([v for _, v in sparse])
        self.fit_capacity(sparse)
        # Read before anything else, as the optimizer reads its own step when a call starts
        # (a TF1 fetch of this and a direct apply_gradients reads the same step in both).
        own = self.step_variable() if step is None and sparse else None  # SOK's own step (v1)
        counter = step if step is not None else own
        step_now = None if counter is None else tf.cast(read(counter), tf.int64)
        stamp = step_now if version is None or not sparse else wrapper_step.read_step(version)
        staged, deps, finish = [], [], []
        for g, table in sparse:
            pair, dep, back = self._stage(g, self._tables[id(table)])
            staged.append(pair)
            deps.extend(dep)
            finish.append(back)
        dense, static_deps = self._stage_static(dense, finish)
        graph = not tf.executing_eagerly()
        if step is None:
            # After the stamp's read: a tf.compat.v1 optimizer advances global_step itself.
            first = deps + static_deps + ([stamp] if stamp is not step_now else [])
            with tf.control_dependencies(first if graph else []):
                results = [apply_fn(list(dense) + staged)]
        else:
            results = self._apply_keras(staged, deps, dense, static_deps, apply_fn, step, step_now)
        after = [r for r in results if isinstance(r, (tf.Operation, tf.Tensor)) and graph]
        writes = []
        with tf.control_dependencies(after):
            for back in finish:
                writes.extend(back(stamp))
        if sparse:
            writes.append(self.clock.record(stamp, [v for _, v in sparse]))
        if own is not None:
            with tf.control_dependencies([step_now]):  # after its read, as on the fused path
                writes.append(own.assign_add(1, read_value=False))
        if not graph:
            return None
        return tf.group(*[w for w in writes if w is not None], *after)

    def _stage_static(self, dense, finish):
        """Static tables whose sparse update has no GPU kernel go through a CPU scratch that the
        wrapped optimizer updates with the dense pairs: (dense pairs, their dependencies)."""
        staged, deps = [], []
        for g, var in dense:
            if not self.static.wants(g, var):
                staged.append((g, var))
                continue
            pair, dep, back = self.static.stage(g, var)
            staged.append(pair)
            deps.extend(dep)
            finish.append(lambda _step, back=back: back())
        return staged, deps

    def _apply_keras(self, staged, deps, dense, static_deps, apply_fn, step, step_now):
        """The scratch optimizer on the staged pairs at `step_now`, the wrapped optimizer on the
        dense ones; `step` advances once (by apply_fn, or here without dense pairs)."""
        graph = not tf.executing_eagerly()
        results = []
        if staged:
            with tf.control_dependencies(deps + [step_now] if graph else []):
                results.append(self.runner.apply(staged, step_now))
        with tf.control_dependencies(static_deps + [step_now] if graph else []):
            if dense:
                results.append(apply_fn(list(dense)))
            else:
                with tf.control_dependencies([r for r in results if r is not None] if graph else []):
                    results.append(assign_add(step, 1))
        return results

    def _stage(self, grad, state):
        table, dim, cap = state.table, state.table.embedding_dim, self.capacity
        if not isinstance(grad, tf.IndexedSlices):
            raise TypeError(
                f"the gradient of Embedding Variable '{table.name}' must be tf.IndexedSlices, got "
                f"{type(grad).__name__}"
            )
        touched = scratch_rows.TouchedRows(
            tf.cast(grad.indices, table.key_dtype), grad.values, dim, cap, table.name,
            f"scratch variable of the {type(self.optimizer).__name__} update")
        unique, n, summed, padding = touched.unique, touched.n, touched.summed, touched.padding
        with tf.control_dependencies([touched.check]):
            deps = [
                assign(state.scratch, tf.pad(table.sparse_read(unique, training=False), padding))
            ]
            for slot, store in state.slots.values():
                deps.append(assign(slot, tf.pad(store.sparse_read(unique), padding)))
        deps = [d for d in deps if isinstance(d, (tf.Operation, tf.Tensor))]
        if "GPU" in (state.scratch.device or "").upper():
            # TensorFlow has no GPU kernel for some sparse updates (Momentum's): the scratch rows
            # past n are never written back, so a dense update of the padded rows is the same step.
            gradient = tf.pad(summed, padding)
        else:
            gradient = tf.IndexedSlices(
                summed, tf.range(n), dense_shape=tf.constant([cap, dim], tf.int64)
            )

        def write_back(step):
            writes = [table.assign(unique, read(state.scratch)[:n])]
            for slot, store in state.slots.values():
                writes.append(store.assign(unique, read(slot)[:n]))
            # Every update records its step, as the fused path does: GlobalStepEvict and
            # sok.incremental_model_dump read it.
            writes.append(self._stamp(table, unique, dim, step, writes))
            return writes

        return (gradient, state.scratch), deps, write_back

    def _stamp(self, table, keys, dim, step, after):
        """Records the update step of the keys (`versions`: GlobalStepEvict and the incremental
        dump read it): a fused SGD step with learning rate 0, which leaves the values as they
        are."""
        with tf.control_dependencies(after if not tf.executing_eagerly() else []):
            return ops.sok_embedding_variable_sparse_apply(
                [table.handle],
                [keys],
                [tf.zeros([tf.size(keys), dim])],
                tf.constant(0.0),
                step,
                tf.zeros([0], tf.int64),
                [],  # the rows record `step`
                optimizer=Optimizer.SGD,
                beta1=0.9,
                beta2=0.999,
                epsilon=0.0,
                initial_accumulator=0.1,
                l1=0.0,
                l2=0.0,
                lr_power=-0.5,
                keys_unique=True,
            )


def optimizer_slots(optimizer, flavor, var):
    """{slot name: slot variable} the wrapped optimizer keeps for `var`."""
    if flavor in ("v1", "keras_legacy"):
        slots = {name: optimizer.get_slot(var, name) for name in optimizer.get_slot_names()}
        return {name: s for name, s in slots.items() if s is not None}
    # Keras 3 names a slot "<variable name with / and : as _>_<slot>", tf_keras
    # "<slot>/<variable's shared name>" from build() but "<optimizer>/<slot>/<shared name>" when
    # apply_gradients creates it (its name scope): the slot's name is the part before the
    # variable's, without that scope.
    base = (
        var.name.split(":")[0] if isinstance(var, tf.Variable) else getattr(var, "path", var.name)
    )
    found = {}
    for v in optimizer.variables:
        name = v.name.split(":")[0]
        if flavor == "keras3":
            prefix = (
                var.name.replace("/", "_").replace(":", "_") + "_"
                if isinstance(var, tf.Variable)
                else base.replace("/", "_") + "_"
            )
            if name.startswith(prefix):
                found[name[len(prefix) :]] = v
        elif name.endswith("/" + base):
            found[name[: -len(base) - 1].rsplit("/", 1)[-1]] = v
    return found


class SlotStores(compat.AutoTrackable):
    """The slot stores of a wrapper's tables as checkpoint dependencies (tf.train.Checkpoint saves
    and restores them by name, also when they are created after `restore`), and in Keras weights
    files (`weights_file`, see slot_weights)."""

    def __init__(self):
        super().__init__()
        # A plain object: no checkpoint dependency (the stores are dependencies themselves).
        self.weights_file = slot_weights.SlotWeights()

    def track_slot(self, store, table):
        setattr(self, "slot:" + store.name, store)  # table names are unique in checkpoints
        self.weights_file.add(store, table)

    def track_step(self, step):
        self.step = step
