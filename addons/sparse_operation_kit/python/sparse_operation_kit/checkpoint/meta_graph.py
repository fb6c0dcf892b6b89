"""Embedding Variables in exported meta graphs (TF1 Saver.save, export_meta_graph).

TensorFlow writes GLOBAL_VARIABLES / TRAINABLE_VARIABLES as VariableDef protos, which cannot
describe a hash table: Embedding Variables leave themselves out of those (their to_proto gives
None) and are written to SOK's own collections instead, as NameAttrList protos naming the
table's handle and initializer ops and the collections it belongs to.
`tf.compat.v1.train.import_meta_graph` rebuilds the Python objects on the imported ops and puts
them back in their collections, so the restored graph's tables can be looked up, trained and
saved like the original ones (import sparse_operation_kit before importing).
"""
import tensorflow as tf

from sparse_operation_kit.parallel import partitioned
from sparse_operation_kit.runtime import compat
from sparse_operation_kit.tables.embedding_variable import SOK_VARIABLES, EmbeddingVariable

_Proto = tf.compat.v1.NameAttrList
_Attr = tf.compat.v1.AttrValue
_OWN = {SOK_VARIABLES, partitioned.PARTITIONED_VARIABLES}


def _export_name(name, export_scope):
    """`name` relative to `export_scope`, or None when it lies outside of it."""
    if not export_scope:
        return name
    prefix = export_scope.rstrip("/") + "/"
    return name[len(prefix):] if name.startswith(prefix) else None


def _import_name(name, import_scope):
    return f"{import_scope.rstrip('/')}/{name}" if import_scope else name


def _collections_of(var):
    graph = var.graph
    return [k for k in graph.get_all_collection_keys()
            if k not in _OWN and any(x is var for x in graph.get_collection(k))]


def _strings(values):
    return _Attr(list=_Attr.ListValue(s=[v.encode() for v in values]))


def _table_to_proto(var, export_scope=None):
    if not isinstance(var, EmbeddingVariable) or tf.executing_eagerly():
        return None
    handle = _export_name(var.handle.name, export_scope)
    init = _export_name(var.initializer.name, export_scope)
    if handle is None or init is None:
        return None
    proto = _Proto(name=var.name)
    proto.attr["handle"].s = handle.encode()
    proto.attr["initializer"].s = init.encode()
    proto.attr["trainable"].b = var.trainable
    proto.attr["target_gpu"].i = int(var.target_gpu)
    proto.attr["collections"].CopyFrom(_strings(_collections_of(var)))
    return proto


def _table_from_proto(proto, import_scope=None):
    graph = tf.compat.v1.get_default_graph()
    handle = graph.as_graph_element(_import_name(proto.attr["handle"].s.decode(), import_scope))
    init = graph.as_graph_element(_import_name(proto.attr["initializer"].s.decode(), import_scope))
    var = EmbeddingVariable.from_graph_ops(handle, init, proto.attr["trainable"].b, proto.attr["target_gpu"].i)
    for c in proto.attr["collections"].list.s:
        graph.add_to_collection(c.decode(), var)
    return var


def _partitioned_to_proto(var, export_scope=None):
    if not partitioned.is_partitioned(var) or tf.executing_eagerly():
        return None
    handles = [_export_name(p.handle.name, export_scope) for p in var.parts]
    if None in handles:
        return None
    proto = _Proto(name=var.name)
    proto.attr["parts"].CopyFrom(_strings(handles))
    proto.attr["collections"].CopyFrom(_strings(_collections_of(var)))
    return proto


def _partitioned_from_proto(proto, import_scope=None):
    # SOK_VARIABLES sorts before PARTITIONED_VARIABLES: the parts were rebuilt already.
    graph = tf.compat.v1.get_default_graph()
    by_handle = {v.handle.name: v for v in graph.get_collection(SOK_VARIABLES)}
    parts = [by_handle[_import_name(h.decode(), import_scope)] for h in proto.attr["parts"].list.s]
    var = partitioned.PartitionedEmbeddingVariable(proto.name, parts)
    for c in proto.attr["collections"].list.s:
        graph.add_to_collection(c.decode(), var)
    return var


compat.register_collection_proto(SOK_VARIABLES, _Proto, _table_to_proto, _table_from_proto)
compat.register_collection_proto(partitioned.PARTITIONED_VARIABLES, _Proto, _partitioned_to_proto,
                                 _partitioned_from_proto)
