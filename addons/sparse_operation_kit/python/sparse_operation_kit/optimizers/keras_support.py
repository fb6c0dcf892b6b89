"""How `model.compile(optimizer=sok.OptimizerWrapper(keras_optimizer))` + `model.fit` train SOK
tables, for Keras 3 and tf_keras alike, without touching Keras itself.

Keras trains what `model.trainable_weights` lists and SOK tables are no Keras variables. Each
table of a SOK layer therefore has a *gradient carrier*: a tiny trainable Keras variable (shape
[1, dim], always zero) that Keras lists, differentiates and hands to the optimizer. A training
lookup adds `carry(carrier)` (zeros whose gradient is the table's gradient: a tf.IndexedSlices
keyed by id) to the layer's output, so Keras's own `train_step` computes the table's gradient as
the carrier's. sok.OptimizerWrapper (a Keras optimizer) recognises carriers and applies their
gradients to the table with SOK's fused sparse update (slots beside each row); every other
variable goes to the wrapped optimizer.

A plain Keras optimizer cannot update a hash table: when it tries to update a carrier (at the first
`fit` step, while Keras traces it), the carrier raises an error that names the layer, the table
and the fix. The carrier never changes, so it cannot alter the model's output.
"""
import importlib
import types

import numpy as np
import tensorflow as tf

from sparse_operation_kit.optimizers import generic_optimizer, slots, wrapper_step
from sparse_operation_kit.optimizers.generic_optimizer import SlotStores
from sparse_operation_kit.optimizers.rank_average import average_over_ranks
from sparse_operation_kit.runtime import compat
from sparse_operation_kit.runtime.keras_version import keras_is_v3, keras_optimizer_kind
from sparse_operation_kit.tables.embedding_variable import EmbeddingVariable


def _refusal(carrier):
    return (
        f"layer '{carrier._sok_layer}': its SOK table '{carrier._sok_table.name}' is a hash table "
        "that a plain "
        "Keras optimizer cannot update (it tried to update the table's gradient carrier "
        f"'{carrier._sok_carrier_name}'); compile with the optimizer wrapped: "
        "model.compile(optimizer=sok.OptimizerWrapper(keras.optimizers.Adam(...)), ...)"
    )


def _is_zero_constant(value):
    v = tf.get_static_value(value) if isinstance(value, (tf.Tensor, tf.Variable)) else value
    if v is None:
        return False
    try:
        return not np.any(np.asarray(v))
    except Exception:  # whatever the value is, it is not a zero constant
        return False


class _CarrierMixin:
    """Refuses every update: only sok.OptimizerWrapper handles carrier gradients (loading zeros is
    allowed, so that weight files and checkpoints restore)."""

    def assign(self, value, *args, **kwargs):
        if _is_zero_constant(value):
            return super().assign(value, *args, **kwargs)
        raise TypeError(_refusal(self))

    def _refuse(self, *args, **kwargs):
        raise TypeError(_refusal(self))

    assign_add = assign_sub = _refuse
    scatter_add = scatter_sub = scatter_update = scatter_max = scatter_min = _refuse
    scatter_mul = scatter_div = scatter_nd_add = scatter_nd_sub = scatter_nd_update = _refuse
    batch_scatter_update = _refuse


_carrier_classes = {}


def _carrier_class():
    key = keras_is_v3()
    if key not in _carrier_classes:
        if key:
            import keras

            class Keras3Carrier(_CarrierMixin, keras.Variable):
                # Keras 3 optimizers update raw tf.Variables (`v.value`), past any override
                # here; but first they give each variable marked `overwrite_with_gradient` its
                # gradient through
                # `v.assign(gradient)`, which this class refuses with the error that names the fix.
                @property
                def overwrite_with_gradient(self):
                    return True

                @overwrite_with_gradient.setter
                def overwrite_with_gradient(self, value):
                    pass

            _carrier_classes[key] = Keras3Carrier
        else:
            # tf_keras tracks tf.Variables; a subclass needs the concrete resource variable.
            class TfKerasCarrier(_CarrierMixin, compat.ResourceVariable):
                pass

            _carrier_classes[key] = TfKerasCarrier
    return _carrier_classes[key]


def make_carrier(layer_name, index, table):
    """The gradient carrier of `table` (an attribute of its layer: Keras tracks it)."""
    cls = _carrier_class()
    name = f"sok_gradient_carrier_{index}"
    dim = int(table.shape[-1])
    if keras_is_v3():
        carrier = cls(
            initializer="zeros", shape=(1, dim), dtype="float32", trainable=True, name=name
        )
    else:
        carrier = cls(tf.zeros([1, dim]), trainable=True, name=name)
    carrier._sok_table = table
    carrier._sok_layer = layer_name
    carrier._sok_carrier_name = name
    return carrier


def is_carrier(v):
    return getattr(v, "_sok_table", None) is not None and isinstance(v, _CarrierMixin)


def carrier_table(v):
    return v._sok_table


def _carrier_value(carrier):
    if keras_is_v3():
        return tf.convert_to_tensor(carrier.value)
    return tf.convert_to_tensor(carrier)


def lookup_with_carriers(compute, tables, carriers):
    """Runs `compute()` (a list of outputs, output i computed from tables[i]; a RaggedTensor output
    counts by its flat values) and returns its outputs with each table's gradient also routed to
    its carrier. Outputs of static tables (tf.Variables) are left as they are: Keras trains
    those only when they are Keras variables."""
    if compat.in_saved_model_export():
        # tf.saved_model.save traces training calls too (tf_keras); a SavedModel needs no carriers.
        return compute()
    with tf.GradientTape(persistent=True) as inner:  # watches the trainable tables as they are read
        outs = compute()
    result = []
    for out, table, carrier in zip(outs, tables, carriers):
        if carrier is None:
            result.append(out)
            continue
        flat = out.flat_values if isinstance(out, tf.RaggedTensor) else out
        flat = flat + _carry(_carrier_value(carrier), flat, inner, table)
        result.append(out.with_flat_values(flat) if isinstance(out, tf.RaggedTensor) else flat)
    return result


def _carry(carrier_value, out, inner, table):
    """Zeros like `out`; the gradient reaching them becomes the table's gradient, given to the
    carrier (a tf.IndexedSlices keyed by id)."""

    @tf.custom_gradient
    def carry(c, o):
        def grad(dy):
            g = inner.gradient(out, table, output_gradients=dy)
            if g is None:
                return tf.zeros_like(c), None
            if not isinstance(g, tf.IndexedSlices):  # not expected: lookups give IndexedSlices
                raise TypeError(f"the gradient of SOK table '{table.name}' is not tf.IndexedSlices")
            return tf.IndexedSlices(g.values, g.indices), None

        return tf.zeros_like(o), grad

    return carry(carrier_value, out)


# ---------------------------------------------------------------------------------------------
# sok.OptimizerWrapper as a Keras optimizer
# ---------------------------------------------------------------------------------------------
def split_gradients(grads_and_vars, keep_empty=False):
    """-> (sparse pairs (gradient, EmbeddingVariable), other pairs). A carrier's gradient goes to
    its table, unless the table's own gradient is in the list too (a custom loop that passes
    model.trainable_variables + sok.layers.embedding_variables(model)): one update per table."""
    grads_and_vars = list(grads_and_vars)
    direct = {id(v) for _, v in grads_and_vars if isinstance(v, EmbeddingVariable)}
    sparse, dense = [], []
    for g, v in grads_and_vars:
        if isinstance(v, EmbeddingVariable):
            sparse.append((g, v))
        elif is_carrier(v):
            table = carrier_table(v)
            if (g is None and not keep_empty) or id(table) in direct:
                continue
            if not isinstance(table, EmbeddingVariable):
                name = getattr(table, "name", "?")
                raise TypeError(
                    f"layer '{v._sok_layer}': its static table '{name}' (a tf.Variable, not a "
                    "Keras "
                    "variable) cannot be trained by Keras 3's fit; use a sok.DynamicVariable / "
                    "sok.EmbeddingVariable for it, or keras.layers.Embedding, or train it in a "
                    "custom loop (tape + sok.OptimizerWrapper with the table in the variable list)"
                )
            sparse.append((g, table))
        else:
            dense.append((g, v))
    return sparse, dense


_wrapper_classes = {}


def wrapper_class(kind, make_updater):
    """The Keras optimizer class of sok.OptimizerWrapper for `kind` ("keras3" or "tf_keras");
    `make_updater(keras_optimizer, max_touched_rows, tracker)` gives SOK's sparse update
    (optimizers.make_updater, passed in: optimizers.py builds on this module)."""
    if kind not in _wrapper_classes:
        _wrapper_classes[kind] = _make_wrapper(kind, make_updater)
    return _wrapper_classes[kind]


def _is_generic(updater):
    return isinstance(updater, generic_optimizer.GenericSparseUpdater)


def _build_inner(updater, opt, slot_stores, variables):
    """Builds the wrapped optimizer for the dense variables among `variables` (none: it stays
    unbuilt for the program's own variables) and, on the generic path, the scratch update of
    the SOK tables among them (scratch_optimizer: never the wrapped optimizer itself) with their
    slot stores, which a Keras weights file loaded before may fill now (slot_weights)."""
    sparse, dense = split_gradients([(None, v) for v in variables], keep_empty=True)
    dense_vars = [v for _, v in dense]
    if dense_vars:
        opt.build(dense_vars)
    if _is_generic(updater):
        updater.ensure([v for _, v in sparse])
    slot_stores.weights_file.all_added()


def _sok_apply(updater, opt, counter, sparse, dense, apply_dense, average=False):
    """SOK's update and the wrapped optimizer's, both at the wrapper's step `counter` (the
    wrapper's own `_iterations`, see wrapper_step), which the call advances once. average: the
    gradients averaged over ranks first (rank_average)."""
    dense = [(g, v) for g, v in dense if g is not None]
    if average:
        sparse, dense = average_over_ranks(sparse, dense)
    with wrapper_step.counting_with(opt, counter):
        if _is_generic(updater):
            updater.apply(sparse, dense, apply_dense, step=counter)
            return
        update = updater.apply(sparse, step=counter)
        graph_update = isinstance(update, (tf.Operation, tf.Tensor)) and not tf.executing_eagerly()
        with tf.control_dependencies([update] if graph_update else []):
            if dense:
                apply_dense(dense)
            else:
                wrapper_step.advance(counter)


class _SlotAccess(slots.HiddenFromCheckpointSlots):
    """get_slot / get_slot_names of the Keras wrappers (see sparse_operation_kit.optimizers.slots)."""

    def get_slot(self, var, name):
        kind = keras_optimizer_kind(self._opt)
        return slots.get_slot(self._opt, kind, self._sok_updater, var, name)

    def get_slot_names(self):
        return slots.get_slot_names(self._opt, keras_optimizer_kind(self._opt), self._sok_updater)

    @property
    def _slots(self):
        """SOK 2.x's `optimizer._slots.get(var._unique_id)`: {slot name: slot} or None (see
        slots.SlotsByUniqueId)."""
        return slots.SlotsByUniqueId(self)

    def sok_slot_names(self):
        """Every slot name a dump can hold for a table (see slots.dumped_slot_names)."""
        kind = keras_optimizer_kind(self._opt)
        return slots.dumped_slot_names(self._opt, kind, self._sok_updater)

    def sok_slot_variables(self, variables, create=False):
        """[(slot, primary, slot name)] that sok.dump / sok.load store for `variables` (create:
        check that they exist; a Keras optimizer creates its slots when it is built)."""
        kind = keras_optimizer_kind(self._opt)
        if create:
            slots.prepare_slots(self._opt, kind, self._sok_updater, variables)
        return slots.slot_variables(self._opt, kind, self._sok_updater, variables)


class _OptimizerWrapperBase(_SlotAccess):
    """The part of sok.OptimizerWrapper that Keras 3 and tf_keras share. _make_wrapper puts a
    flavour's parts (_Keras3Parts, _TfKerasParts) before it and that flavour's Keras Optimizer
    after it; the parts give `_sok_keras_optimizers` (the flavour's keras.optimizers module) and
    `_sok_base_init_kwargs` (for the Keras Optimizer's __init__), _make_wrapper gives
    `_sok_make_updater`."""

    _sok_optimizer_wrapper = True  # isinstance(self, sok.OptimizerWrapper)

    def __init__(self, optimizer, name=None, max_touched_rows=None, average_over_ranks=False,
                 **kwargs):
        if isinstance(optimizer, dict):
            optimizer = self._sok_keras_optimizers().deserialize(optimizer)
        slot_stores = SlotStores()
        updater = self._sok_make_updater(optimizer, max_touched_rows, tracker=slot_stores)
        super().__init__(name=name or f"sok_{optimizer.name}", **self._sok_base_init_kwargs)
        self._opt = optimizer
        self._sok_updater = updater
        self._max_touched_rows = max_touched_rows
        self._average_over_ranks = bool(average_over_ranks)
        self.sok_slots = slot_stores

    @property
    def optimizer(self):
        return self._opt

    @property
    def iterations(self):
        """The wrapper's own step (Keras made it with this optimizer): its calls, apart from the
        wrapped optimizer's `iterations` (see wrapper_step)."""
        return self._iterations

    @property
    def learning_rate(self):
        return self._opt.learning_rate

    @learning_rate.setter
    def learning_rate(self, value):
        self._opt.learning_rate = value

    @property
    def variables(self):
        return self._opt.variables

    def finalize_variable_values(self, var_list):
        _, dense = split_gradients([(None, v) for v in var_list])
        self._opt.finalize_variable_values([v for _, v in dense])

    # The wrapped optimizer is a child of this one in .keras files and checkpoints: it saves its
    # own variables; this one saves its step and the generic path's slot stores (the fused
    # kernels' slots live in the table rows, which the layers save).
    def save_own_variables(self, store):
        store["sok_iterations"] = np.asarray(self._iterations.numpy())
        self.sok_slots.weights_file.save(store)

    def load_own_variables(self, store):
        if "sok_iterations" in store:  # a file without the wrapper's step leaves it as is
            self._iterations.assign(store["sok_iterations"])
        self.sok_slots.weights_file.load(store, f"optimizer '{self.name}'")

    def get_config(self):
        return {
            "name": self.name,
            "optimizer": self._sok_keras_optimizers().serialize(self._opt),
            "max_touched_rows": self._max_touched_rows,
            "average_over_ranks": self._average_over_ranks,
        }

    @classmethod
    def from_config(cls, config, custom_objects=None):
        return cls(**config)


class _Keras3Parts:
    """sok.OptimizerWrapper(keras.optimizers.X(...)) for Keras 3: a Keras optimizer, so that
    `model.compile(optimizer=...)` takes it. SOK tables (their gradient carriers in `fit`, or
    the tables themselves in custom loops) get SOK's fused sparse update of the same
    optimizer at the wrapper's own step (wrapper_step); every other variable the wrapped optimizer."""

    _sok_base_init_kwargs = {"learning_rate": 0.0}

    @staticmethod
    def _sok_keras_optimizers():
        import keras

        return keras.optimizers

    def build(self, variables):
        _build_inner(self._sok_updater, self._opt, self.sok_slots, variables)
        self.built = True

    def apply_gradients(self, grads_and_vars):
        grads_and_vars = list(grads_and_vars)
        self.apply([g for g, _ in grads_and_vars], [v for _, v in grads_and_vars])
        return self.iterations

    def apply(self, grads, trainable_variables=None):
        if trainable_variables is None:
            raise ValueError("sok.OptimizerWrapper.apply needs trainable_variables")
        grads = self._sok_unscaled_carriers(grads, trainable_variables)
        sparse, dense = split_gradients(zip(grads, trainable_variables))

        def apply_dense(pairs):
            if not self._opt.built:
                self._opt.build([v for _, v in pairs])
            self._opt.apply([g for g, _ in pairs], [v for _, v in pairs])

        _sok_apply(self._sok_updater, self._opt, self._iterations, sparse, dense, apply_dense,
                   self._average_over_ranks)

    def scale_loss(self, loss):
        return self._opt.scale_loss(loss)

    def _sok_unscaled_carriers(self, grads, variables):
        """Inside sok.LossScaleOptimizer (optimizers/loss_scale.py, which sets
        `_sok_loss_scaler`), the carriers' gradients divided by its scale: Keras's loss scaling
        unscales every gradient but those of variables marked `overwrite_with_gradient`, which
        carriers are (_carrier_class)."""
        scaler = getattr(self, "_sok_loss_scaler", None)
        scaler = scaler() if scaler is not None else None
        if scaler is None:
            return grads
        scale = scaler.dynamic_scale
        return [
            tf.IndexedSlices(g.values / tf.cast(scale, g.values.dtype), g.indices, g.dense_shape)
            if isinstance(g, tf.IndexedSlices) and is_carrier(v) else g
            for g, v in zip(grads, variables)
        ]


class _TfKerasParts:
    """sok.OptimizerWrapper(tf_keras.optimizers.X(...)): a tf_keras optimizer (see the Keras 3
    wrapper)."""

    _sok_base_init_kwargs = {}

    @staticmethod
    def _sok_keras_optimizers():
        import tf_keras

        return tf_keras.optimizers

    @_OptimizerWrapperBase.iterations.setter
    def iterations(self, variable):
        pass  # the wrapper made its step counter with itself (_create_iteration_variable)

    def build(self, var_list):
        _build_inner(self._sok_updater, self._opt, self.sok_slots, var_list)

    def apply_gradients(
        self, grads_and_vars, name=None, skip_gradients_aggregation=False, **kwargs
    ):
        sparse, dense = split_gradients(grads_and_vars)
        _sok_apply(self._sok_updater, self._opt, self._iterations, sparse, dense,
                   self._opt.apply_gradients, self._average_over_ranks)
        return self.iterations


# kind -> (the wrapper's class name, its flavour's parts, the Keras package it registers in)
_FLAVOURS = {
    "keras3": ("KerasOptimizerWrapper", _Keras3Parts, "keras"),
    "tf_keras": ("TfKerasOptimizerWrapper", _TfKerasParts, "tf_keras"),
}


def _make_wrapper(kind, make_updater):
    """The sok.OptimizerWrapper class for `kind`: the flavour's parts over the shared base, over
    the flavour's Keras Optimizer; registered as "sok>OptimizerWrapper" with that Keras."""
    class_name, parts, package = _FLAVOURS[kind]
    api = importlib.import_module(package)
    namespace = {
        "__doc__": parts.__doc__,
        "__module__": __name__,
        "__qualname__": class_name,
        "_sok_make_updater": staticmethod(make_updater),
    }
    bases = (parts, _OptimizerWrapperBase, api.optimizers.Optimizer)
    cls = types.new_class(class_name, bases, exec_body=lambda ns: ns.update(namespace))
    return api.saving.register_keras_serializable(package="sok", name="OptimizerWrapper")(cls)
