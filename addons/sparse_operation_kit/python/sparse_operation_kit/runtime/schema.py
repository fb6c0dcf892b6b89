"""The names that cross into the C++ ops, defined once on the Python side.

Each list mirrors a C++ name table in enum order (core/initializer.h kInitKindNames,
core/optimizer.h kOptimizerNames, core/table_config.h kSnapshotFieldNames); the SokSchema op
returns the built library's tables and tests/python/runtime/test_schema.py asserts they are
equal.
"""
import enum


class InitKind(enum.StrEnum):
    """How a new key's initial row is computed (the op attribute `init_kind`)."""

    CONSTANT = "constant"  # a
    UNIFORM = "uniform"  # U[a, b)
    NORMAL = "normal"  # N(a, b)
    TRUNCATED_NORMAL = "truncated_normal"  # N(a, b) redrawn outside 2 stddev
    MATRIX = "matrix"  # rows of an explicit [default_value_dim, dim] matrix


class Optimizer(enum.StrEnum):
    """The fused sparse updates (the op attribute `optimizer`); an exported `slot_kind` is the
    index of the optimizer owning the slots in this order, -1 none."""

    SGD = "sgd"
    ADAGRAD = "adagrad"
    ADAM = "adam"
    FTRL = "ftrl"


# What an Embedding Variable's export holds, in the export op's output order: the checkpoint
# tensors (tf.train.Checkpoint, Saver "<name>/<field>"), sok.dump's arrays and Keras weights.
EXPORT_FIELDS: tuple[str, ...] = (
    "keys", "values", "slots", "freqs", "versions", "slot_kind", "slot_init")
# The fields with an entry per row (the rest describe the slots of every row).
ROW_FIELDS: tuple[str, ...] = EXPORT_FIELDS[:5]

NO_SLOTS = -1  # slot_kind of a table whose rows carry no optimizer slots


def optimizer_of_slot_kind(slot_kind: int) -> str:
    """The optimizer name of an exported slot_kind ("none" for -1)."""
    return "none" if slot_kind == NO_SLOTS else list(Optimizer)[slot_kind].value
