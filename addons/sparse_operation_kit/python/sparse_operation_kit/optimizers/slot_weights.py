"""The slot stores of sok.OptimizerWrapper's generic path in Keras weights files (`.keras`,
`save_weights` / `load_weights`), kept as tf.train.Checkpoint keeps them: by the store's name
("<table>/<slot>", see generic_optimizer.SlotStores), each with every row, as sok.Embedding
keeps its table (tables.keras_weights).

The wrapper creates a table's slot stores when it is built, which may come after the load
(`load_weights` into a model whose optimizer has not trained yet): a loaded store that does not
exist yet waits for its creation and is restored then, as tf.train.Checkpoint defers a restore.
"""
import json

import numpy as np
import tensorflow as tf

from sparse_operation_kit.tables import keras_weights
from sparse_operation_kit.tables.tables import target_of

# The names of the saved slot stores in entry order ("sok_slot_<i>_<field>"), as JSON bytes:
# Keras weights stores hold numeric arrays only.
NAMES_KEY = "sok_slot_stores"


def _prefix(index):
    return f"sok_slot_{index}"


def _describe(name):
    table, slot = name.rsplit("/", 1)
    return f"slot '{slot}' of table '{table}'"


def _not_in_file(where, name, saved):
    return ValueError(f"{where}: the weights file holds no {_describe(name)} (it holds: "
                      f"{', '.join(_describe(n) for n in saved)})")


class SlotWeights:
    """A wrapper's slot stores in Keras weights files. A plain object: no checkpoint dependency
    (tf.train.Checkpoint reaches the stores through SlotStores)."""

    def __init__(self):
        self._stores = {}  # name -> (slot store, the table it belongs to)
        self._pending = {}  # name -> (prefix, {key: array}): loaded, the store not created yet
        self._where = "sok.OptimizerWrapper"  # who loads, for errors
        self._complete = False  # every table the wrapper trains has its slot stores

    # --- the stores ---------------------------------------------------------------------------
    def add(self, store, table):
        """A new slot store; restored at once if a load is waiting for it."""
        self._stores[store.name] = (store, table)
        if not self._pending:
            return
        if store.name not in self._pending:
            raise _not_in_file(self._where, store.name, self._pending)
        prefix, entries = self._pending.pop(store.name)
        self._restore(store.name, entries, set(entries), prefix)

    def all_added(self):
        """The wrapper is built: a loaded slot store still waiting belongs to no table it trains."""
        self._complete = True
        self._check_nothing_waits()

    # --- Keras weights files ------------------------------------------------------------------
    def save(self, store):
        names = list(self._stores)
        if not names:  # nothing to restore: the file stays as older versions wrote it
            return
        store[NAMES_KEY] = np.frombuffer(json.dumps(names).encode(), np.uint8)
        for index, name in enumerate(names):
            keras_weights.save_rows(store, _prefix(index), self._stores[name][0])

    def load(self, store, where):
        self._where = where
        keys = set(store.keys())
        if NAMES_KEY not in keys:  # a file of an older version: the slots start fresh
            return
        names = json.loads(np.asarray(store[NAMES_KEY]).tobytes().decode())
        absent = [n for n in self._stores if n not in names]
        if absent:
            raise _not_in_file(where, absent[0], names)
        self._pending = {}
        for index, name in enumerate(names):
            prefix = _prefix(index)
            if name in self._stores:
                self._restore(name, store, keys, prefix)
            else:  # the file closes after the load: keep a copy of the entries
                self._pending[name] = (prefix, {
                    k: np.asarray(store[k]) for k in keras_weights.entry_keys(prefix) if k in keys})
        self._check_nothing_waits()

    def _restore(self, name, entries, keys, prefix):
        slot_store, table = self._stores[name]
        # Eagerly, also when the store is created while Keras traces a step; a slot's rows live
        # on the rank that holds the table's (under Horovod).
        with tf.init_scope():
            keras_weights.load_rows(entries, keys, prefix, slot_store, self._where,
                                    target=target_of(table))

    def _check_nothing_waits(self):
        if self._complete and self._pending:
            raise ValueError(
                f"{self._where}: the weights file holds {_describe(next(iter(self._pending)))}, "
                "a table this optimizer does not train (or trains without slot stores)")
