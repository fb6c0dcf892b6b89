"""Optimizer slots of SOK tables, as sok.OptimizerWrapper's get_slot / get_slot_names /
variables show them.

Generic path (any optimizer without a fused kernel): each slot of a table is an Embedding
Variable keyed like the table, named "<table>/<slot>" (DeepRec's slots of Embedding Variables
are Embedding Variables too); it trains, saves and restores like a table.

Fused kernels (SGD, Adagrad, Adam, FTRL): the slots live in the table's rows. get_slot returns
a read-only `RowSlot` view whose `export()` (and `sok.export(slot)`) gives (keys, [rows, dim]
values): the same keys in the same order as `sok.export(table)`.
"""

import tensorflow as tf

from sparse_operation_kit.optimizers import generic_optimizer
from sparse_operation_kit.runtime import compat
from sparse_operation_kit.runtime.schema import Optimizer
from sparse_operation_kit.tables.embedding_variable import _BY_UNIQUE_ID, EmbeddingVariable

# Slot names of the fused kernels in row order; Adam's are spelled as TF1/tf_keras ("m", "v")
# or Keras 3 ("momentum", "velocity") name them.
FUSED_SLOTS = {
    Optimizer.SGD: (),
    Optimizer.ADAGRAD: (("accumulator",),),
    Optimizer.ADAM: (("m", "momentum"), ("v", "velocity")),
    Optimizer.FTRL: (("accumulator",), ("linear",)),
}


class RowSlot:
    """A read-only view of one slot stored in the rows of a table (fused kernels)."""

    def __init__(self, table, name, index):
        self.table, self.name, self.index = table, name, index

    @property
    def embedding_dim(self):
        return self.table.embedding_dim

    def export(self):
        """(keys, [rows, dim] slot values) of every row of the table, in sok.export's order (a table
        no fused update reached yet has no slots: they read 0)."""
        keys, _, slots, _, _, _, slot_init = self.table.export()[:7]
        index = self.index
        init = tf.cond(
            tf.size(slot_init) > index, lambda: slot_init[index], lambda: tf.constant(0.0)
        )
        fill = tf.fill([tf.shape(keys)[0], self.table.embedding_dim], init)
        values = tf.cond(tf.shape(slots)[1] > index, lambda: slots[:, index, :], lambda: fill)
        return keys, values

    def __repr__(self):
        return f"<sok.RowSlot '{self.name}' of '{self.table.name}'>"


class HiddenFromCheckpointSlots:
    """tf.train.Checkpoint treats an object whose dir() lists `get_slot_names` as an optimizer and
    saves what its get_slot returns as slot variables; a wrapper's slots are saved already (by
    the wrapped optimizer, and the slot stores), so its dir() leaves the method out."""

    def __dir__(self):
        return [n for n in super().__dir__() if n != "get_slot_names"]


def _fused_kind(updater):
    return getattr(updater, "kind", None)


def get_slot(optimizer, flavor, updater, var, name):
    if isinstance(var, EmbeddingVariable):
        if isinstance(updater, generic_optimizer.GenericSparseUpdater):
            return updater.slot(var, name)
        for index, names in enumerate(FUSED_SLOTS.get(_fused_kind(updater), ())):
            if name in names:
                return RowSlot(var, name, index)
        return None
    if flavor in ("v1", "keras_legacy"):
        return optimizer.get_slot(var, name)
    return generic_optimizer.optimizer_slots(optimizer, flavor, var).get(name)


def get_slot_names(optimizer, flavor, updater):
    names = set()
    if flavor in ("v1", "keras_legacy"):
        names.update(optimizer.get_slot_names())
    if isinstance(updater, generic_optimizer.GenericSparseUpdater):
        names.update(updater.slot_names())
    else:
        names.update(n[0] for n in FUSED_SLOTS.get(_fused_kind(updater), ()))
    return sorted(names)


def dumped_slot_names(optimizer, flavor, updater):
    """Every slot name a dump by this wrapper can hold for a table: a Keras optimizer creates the
    slots of a variable only when it is built with it, so its names come from a fresh copy built
    on a probe variable (sok.load then refuses a dumped slot that the optimizer lacks)."""
    names = set(get_slot_names(optimizer, flavor, updater))
    if flavor in ("keras3", "tf_keras"):
        fresh = type(optimizer).from_config(optimizer.get_config())
        with tf.init_scope():
            probe = tf.Variable(tf.zeros([1, 1]), trainable=False, name="sok_slot_probe")
        fresh.build([probe])
        names.update(generic_optimizer.optimizer_slots(fresh, flavor, probe))
    return sorted(names)


def optimizer_variables(optimizer, flavor, updater):
    if flavor == "v1" or flavor == "keras_legacy":
        own = optimizer.variables()
    else:
        own = list(optimizer.variables)
    if isinstance(updater, generic_optimizer.GenericSparseUpdater):
        own = [v for v in own if not updater.is_scratch_slot(v)] + updater.slot_tables()
    return own


def prepare_slots(optimizer, flavor, updater, variables):
    """Creates the slots of `variables` that do not exist yet (before sok.load fills them)."""
    tables = [v for v in variables if isinstance(v, EmbeddingVariable)]
    dense = [v for v in variables if not isinstance(v, EmbeddingVariable)]
    if flavor in ("v1", "keras_legacy"):
        if isinstance(updater, generic_optimizer.GenericSparseUpdater):
            updater.ensure(tables)
        if dense:
            (compat.v1_create_slots if flavor == "v1" else compat.keras_legacy_create_slots)(
                optimizer, dense
            )
        return
    if dense and not generic_optimizer.optimizer_built(optimizer):
        raise ValueError(
            f"sok.load: the wrapped {type(optimizer).__name__} is not built yet, so its slots do not "
            "exist; call optimizer.build(<every variable it trains>) before loading its slots"
        )
    if isinstance(updater, generic_optimizer.GenericSparseUpdater):
        updater.ensure(tables)


def slot_variables(optimizer, flavor, updater, variables):
    """[(slot variable, its primary, slot name)] of `variables` that sok.dump/load store: slot
    tables of the generic path and dense variables' slots (slots in a table's rows travel with
    the table)."""
    out = []
    names = get_slot_names(optimizer, flavor, updater)
    for var in variables:
        if not isinstance(var, EmbeddingVariable):
            out.extend((slot, var, name) for name, slot in _own_slots(optimizer, flavor, var))
            continue
        for name in names:
            slot = get_slot(optimizer, flavor, updater, var, name)
            if slot is not None and not isinstance(slot, RowSlot):
                out.append((slot, var, name))
    return out


def _own_slots(optimizer, flavor, var):
    """[(name, slot)] the wrapped optimizer keeps for a static table or dense variable: read from
    the optimizer itself, since get_slot_names of a Keras wrapper knows only the tables' slots
    (the generic path's names exist once it updated a dynamic table)."""
    try:
        found = generic_optimizer.optimizer_slots(optimizer, flavor, var)
    except KeyError:  # a legacy optimizer's get_slot of a variable it never updated
        found = {}
    return sorted(found.items())


class SlotsByUniqueId:
    """A wrapper's `_slots` as SOK 2.x programs read it: `_slots.get(var._unique_id)` gives
    {slot name: get_slot(var, name)} of a SOK table or of a variable the wrapped optimizer keeps
    slots for, or None where it keeps none. Read-only: the slots live in the wrapper."""

    def __init__(self, wrapper):
        self._wrapper = wrapper

    def get(self, unique_id, default=None):
        var = _BY_UNIQUE_ID.get(unique_id)
        if var is None:
            return self._dense(unique_id, default)
        found = {}
        for name in self._wrapper.get_slot_names():
            slot = self._wrapper.get_slot(var, name)
            if slot is not None:
                found[name] = slot
        return found or default

    def _dense(self, unique_id, default):
        # The wrapped optimizer keys its own slots by `_unique_id` too (tf_keras legacy:
        # {id: {name: slot}}; tf.compat.v1 in eager mode: {name: {id: slot}}).
        own = getattr(self._wrapper.optimizer, "_slots", None)
        if not isinstance(own, dict):
            return default
        if isinstance(own.get(unique_id), dict):  # tf_keras legacy
            return dict(own[unique_id]) or default
        found = {n: d[unique_id] for n, d in own.items() if isinstance(d, dict) and unique_id in d}
        return found or default

    def __getitem__(self, unique_id):
        found = self.get(unique_id)
        if found is None:
            raise KeyError(unique_id)
        return found

    def __contains__(self, unique_id):
        return self.get(unique_id) is not None
