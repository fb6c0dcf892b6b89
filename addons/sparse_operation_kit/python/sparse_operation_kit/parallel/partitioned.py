"""Partitioned Embedding Variables: `get_embedding_variable(..., partitioner=...)`.

A partitioned table is n Embedding Variables "<name>/part_<i>" that act as one table. Key k lives
in part (k mod 1000) mod n (floor modulo, so negative keys too), the rule DeepRec applies to
partitioned Embedding Variables; the key itself is stored unchanged in its part. For n dividing
1000 this is k mod n.

One table to every consumer:
- lookups (`sok.lookup_sparse`, `tf.nn.embedding_lookup`, `sparse_read`) route each key to its
  part; gradients arrive as tf.IndexedSlices on the parts, which the optimizer wrapper updates;
- in TF1 graphs the parts are trainable variables (TRAINABLE_VARIABLES), the partitioned table
  is the global variable (GLOBAL_VARIABLES): Saver writes it as one table "<name>/keys", ... (the
  layout of an unpartitioned table of that name), so a checkpoint restores into any number of
  parts, or into an unpartitioned table, and back.
"""

import tensorflow as tf

from sparse_operation_kit.parallel import exchange
from sparse_operation_kit.runtime import compat
from sparse_operation_kit.runtime._ops import ops
from sparse_operation_kit.runtime.schema import EXPORT_FIELDS
from sparse_operation_kit.tables.embedding_variable import SOK_VARIABLES, distinct_with_counts

PARTITIONED_VARIABLES = "sok_partitioned_embedding_variables"
DEEPREC_KEY_BUCKETS = 1000
# An Embedding Variable has no fixed row count: partitioners see this many rows.
_PARTITIONER_ROWS = 2**31 - 1


class PartitionedEmbeddingVariable(compat.TensorsTrackable):
    """n Embedding Variables acting as one table (see the module docstring). Iterating gives the
    parts, as iterating DeepRec's partitioned variable does."""

    def __init__(self, name, parts):
        if not parts:
            raise ValueError(f"Partitioned Embedding Variable '{name}': no parts")
        dims = {p.embedding_dim for p in parts}
        key_dtypes = {p.key_dtype for p in parts}
        if len(dims) != 1 or len(key_dtypes) != 1:
            raise ValueError(
                f"Partitioned Embedding Variable '{name}': parts differ in dimension or key dtype"
            )
        self._name = name
        self._parts = list(parts)

    # --- the parts ----------------------------------------------------------------------------
    @property
    def parts(self):
        return list(self._parts)

    def __iter__(self):
        return iter(self._parts)

    def __len__(self):
        return len(self._parts)

    def __getitem__(self, i):
        return self._parts[i]

    def partition_index(self, keys):
        """Part of each key: (k mod 1000) mod n, as int32."""
        keys = tf.convert_to_tensor(keys)
        n = len(self._parts)
        return tf.cast(
            tf.math.floormod(
                tf.math.floormod(keys, tf.cast(DEEPREC_KEY_BUCKETS, keys.dtype)),
                tf.cast(n, keys.dtype),
            ),
            tf.int32,
        )

    # --- variable-like surface ------------------------------------------------------------------
    @property
    def name(self):
        return self._name

    @property
    def embedding_dim(self):
        return self._parts[0].embedding_dim

    @property
    def key_dtype(self):
        return self._parts[0].key_dtype

    @property
    def dtype(self):
        return tf.float32

    @property
    def shape(self):
        return tf.TensorShape([None, self.embedding_dim])

    def get_shape(self):
        return self.shape

    @property
    def trainable(self):
        return self._parts[0].trainable

    @property
    def op(self):
        return self._parts[0].op

    @property
    def graph(self):
        return self._parts[0].graph

    @property
    def device(self):
        return self._parts[0].device

    @property
    def initializer(self):
        return tf.group(*[p.initializer for p in self._parts], name=f"{self._name}/initializer")

    def is_initialized(self, name=None):
        return tf.reduce_all(tf.stack([p.is_initialized() for p in self._parts]), name=name)

    def size(self, name=None):
        return tf.add_n([p.size() for p in self._parts], name=name)

    def total_count(self):
        """[number of keys, dimension] (DeepRec's total_count)."""
        return tf.stack([self.size(), tf.constant(self.embedding_dim, tf.int64)])

    def read_value(self):
        raise TypeError(
            f"Embedding Variable '{self._name}' has no dense value; use sparse_read(ids) "
            "or sok.export(var)"
        )

    def _split(self, keys, counts=None):
        """(keys of each part, their positions in `keys`, their counts or [0] each) for flat
        `keys` and their per-key `counts` (None: one each)."""
        part = self.partition_index(keys)
        n = len(self._parts)
        positions = tf.dynamic_partition(tf.range(tf.size(keys)), part, n)
        if counts is None:
            part_counts = [tf.zeros([0], tf.int64)] * n
        else:
            part_counts = tf.dynamic_partition(counts, part, n)
        return tf.dynamic_partition(keys, part, n), positions, part_counts

    def sparse_read(self, indices, name=None, training=True):
        """Rows of `indices` (any shape) -> [*indices.shape, dim]; training reads insert new keys.
        With a filter a training read gathers the distinct keys with their counts (as
        EmbeddingVariable.sparse_read): every occurrence of a key reads the same row."""
        indices = self._parts[0]._check_keys(indices)
        with tf.name_scope(name or "sparse_read"):
            flat = tf.reshape(indices, [-1])
            for p in self._parts:
                compat.variable_accessed(p)
            if training and self._parts[0].admits_by_count:
                keys, inverse, counts = distinct_with_counts(flat)
                rows = tf.gather(self._gather(keys, counts, training), inverse)
            else:
                rows = self._gather(flat, None, training)
            return tf.reshape(rows, tf.concat([tf.shape(indices), [self.embedding_dim]], 0))

    def _gather(self, keys, counts, training):
        """Rows of flat `keys` from their parts, in the keys' order; counts: per key or None (one
        each)."""
        n = len(self._parts)
        parts, positions, part_counts = self._split(keys, counts)
        rows = ops.sok_embedding_variable_gather(
            [p.handle for p in self._parts], parts, part_counts, tf.zeros([0], tf.int64),
            dims=[self.embedding_dim] * n, training=training,
        )
        return tf.dynamic_stitch(positions, list(rows))

    def assign(self, keys, values):
        keys = self._parts[0]._check_keys(keys)
        values = tf.reshape(tf.convert_to_tensor(values, tf.float32), [-1, self.embedding_dim])
        keys = tf.reshape(keys, [-1])
        part = self.partition_index(keys)
        n = len(self._parts)
        return tf.group(
            *[
                p.assign(k, v)
                for p, k, v in zip(
                    self._parts,
                    tf.dynamic_partition(keys, part, n),
                    tf.dynamic_partition(values, part, n),
                )
            ]
        )

    def shrink(self, global_step):
        """Applies the eviction options to every part; returns how many keys were removed."""
        return tf.add_n([p.shrink(global_step) for p in self._parts])

    def export(self):
        """(keys, values, slots, freqs, versions, slot_kind, slot_init) of the whole table."""
        fields = [p.export() for p in self._parts]
        kinds = tf.stack([f[5] for f in fields])
        num_slots = tf.stack([tf.shape(f[6])[0] for f in fields])
        widest = tf.argmax(num_slots, output_type=tf.int32)
        slot_init = tf.gather(
            tf.stack(
                [tf.pad(f[6], [[0, tf.reduce_max(num_slots) - tf.shape(f[6])[0]]]) for f in fields]
            ),
            widest,
        )
        # A part no optimizer has updated yet has no slots: its rows get the slots' initial values,
        # which is what the optimizer would give them on their first update.
        slots = [
            tf.concat(
                [
                    f[2],
                    tf.broadcast_to(
                        tf.reshape(slot_init[num_slots[i] :], [1, -1, 1]),
                        [
                            tf.shape(f[2])[0],
                            tf.reduce_max(num_slots) - num_slots[i],
                            self.embedding_dim,
                        ],
                    ),
                ],
                axis=1,
            )
            for i, f in enumerate(fields)
        ]
        used = tf.boolean_mask(kinds, kinds >= 0)
        kind = tf.reduce_max(tf.concat([kinds, [-1]], 0))
        check = tf.debugging.assert_equal(
            used,
            tf.fill(tf.shape(used), kind),
            message=f"Embedding Variable '{self._name}': its parts were trained by different optimizers",
        )
        with tf.control_dependencies([check]):
            return (
                tf.concat([f[0] for f in fields], 0),
                tf.concat([f[1] for f in fields], 0),
                tf.concat(slots, 0),
                tf.concat([f[3] for f in fields], 0),
                tf.concat([f[4] for f in fields], 0),
                tf.identity(kind),
                slot_init,
            )

    # --- checkpoints: one table, whatever the number of parts -----------------------------------
    # compat.TensorsTrackable's hooks: saved as one table's fields ("<name>/keys", ...), restored
    # into any number of parts.
    def checkpoint_tensors(self):
        return dict(zip(EXPORT_FIELDS, self.export(), strict=True))

    def restore_checkpoint_tensors(self, tensors):
        t = [tensors[f] for f in EXPORT_FIELDS]
        keys = t[0]  # the part's restore checks that they fit its key dtype
        part = self.partition_index(keys)
        n = len(self._parts)
        per_row = [tf.dynamic_partition(x, part, n) for x in (keys, t[1], t[2], t[3], t[4])]
        restores = []
        for i, p in enumerate(self._parts):
            fields = [rows[i] for rows in per_row] + [t[5], t[6]]
            restores.append(p.import_snapshot(dict(zip(EXPORT_FIELDS, fields, strict=True))))
        return tf.group(*restores)

    def to_proto(self, export_scope=None):
        return None  # see EmbeddingVariable.to_proto

    def __repr__(self):
        return (
            f"<sok.PartitionedEmbeddingVariable '{self._name}' parts={len(self._parts)} "
            f"dim={self.embedding_dim} key_dtype={self.key_dtype.name}>"
        )


def _fetch_rows(table):
    """sess.run(table): the rows of every part, in sok.export's order (see
    embedding_variable.fetch_rows)."""
    return tf.concat([p.export()[1] for p in table.parts], 0, name="rows")


compat.fetch_as(PartitionedEmbeddingVariable, _fetch_rows)


def is_partitioned(v):
    return isinstance(v, PartitionedEmbeddingVariable)


def num_partitions(partitioner, name, embedding_dim):
    """How many parts `partitioner` (tf.compat.v1.fixed_size_partitioner(n), ...) asks for."""
    shape = tf.TensorShape([_PARTITIONER_ROWS, int(embedding_dim)])
    parts = partitioner(shape=shape, dtype=tf.float32)
    parts = [int(x) for x in parts]
    if len(parts) != 2 or parts[1] != 1 or parts[0] < 1:
        raise ValueError(
            f"Embedding Variable '{name}': the partitioner must split axis 0 only into >= 1 "
            f"parts, it gave {parts}"
        )
    return parts[0]


def create(full_name, embedding_dim, partitioner, make_part, trainable, collections):
    """A partitioned table of `partitioner`'s parts; make_part(part_name, part_collections) builds
    one part."""
    n = num_partitions(partitioner, full_name, embedding_dim)
    if tf.executing_eagerly():
        return PartitionedEmbeddingVariable(
            full_name, [make_part(f"{full_name}/part_{i}", None) for i in range(n)]
        )
    part_collections = (
        [tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES] if trainable else [SOK_VARIABLES]
    )
    parts = [make_part(f"{full_name}/part_{i}", part_collections) for i in range(n)]
    var = PartitionedEmbeddingVariable(full_name, parts)
    default = [tf.compat.v1.GraphKeys.GLOBAL_VARIABLES]
    graph = tf.compat.v1.get_default_graph()
    for c in set(list(collections or default) + [PARTITIONED_VARIABLES]) - {
        tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES
    }:
        graph.add_to_collection(c, var)
    return var


def find(graph, full_name):
    for v in graph.get_collection(PARTITIONED_VARIABLES):
        if v.name == full_name:
            return v
    return None


def flat_tables(params):
    """Every table of `params`, partitioned ones replaced by their parts."""
    out = []
    for p in params:
        out.extend(p.parts if is_partitioned(p) else [p])
    return out


def fetch_rows(params, keys, counts, training, names, valid=None, padded=False):
    """exchange.fetch_rows, with the keys of a partitioned table routed to their parts and the
    rows put back in the keys' order (valid, padded: exchange.fetch_rows', never with a
    partitioned table)."""
    if not any(is_partitioned(p) for p in params):
        return exchange.fetch_rows(params, keys, counts, training, names, valid, padded)
    if valid is not None:
        raise ValueError("fetch_rows: the dedup's valid counts with a partitioned table")
    flat_params, flat_keys, flat_counts, flat_names, plan = [], [], [], [], []
    for p, k, c, nm in zip(params, keys, counts, names):
        if not is_partitioned(p):
            plan.append(None)
            flat_params.append(p), flat_keys.append(k), flat_counts.append(c), flat_names.append(nm)
            continue
        part = p.partition_index(k)
        n = len(p)
        plan.append((n, tf.dynamic_partition(tf.range(tf.size(k)), part, n)))
        flat_params += p.parts
        flat_keys += tf.dynamic_partition(k, part, n)
        flat_counts += tf.dynamic_partition(c, part, n)
        flat_names += [q.name for q in p.parts]
    rows = exchange.fetch_rows(flat_params, flat_keys, flat_counts, training, flat_names)
    out, at = [], 0
    for step in plan:
        if step is None:
            out.append(rows[at])
            at += 1
        else:
            n, positions = step
            out.append(tf.dynamic_stitch(positions, list(rows[at : at + n])))
            at += n
    return out


# tf.nn.embedding_lookup(partitioned, ids): DeepRec's way to read a partitioned table.
compat.register_dispatchable_type(PartitionedEmbeddingVariable)  # lookup.py dispatches on it
