// Op registrations of the Embedding Variable (a hash-table-backed, growing embedding table).
#include <string>

#include "addons/sparse_operation_kit/core/table_config.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tensorflow {
namespace sok_ops {

using shape_inference::InferenceContext;
using shape_inference::ShapeHandle;

// "name: type" of a snapshot field, named by the one field list (core/table_config.h).
std::string Field(sok::SnapshotField f, const char* type) {
  return std::string(sok::snapshot_field_name(f)) + ": " + type;
}

REGISTER_OP("SokEmbeddingVariableHandle")
    .Output("handle: resource")
    .Attr("container: string = ''")
    .Attr("shared_name: string = ''")
    .Attr("key_dtype: {int32, int64}")
    .SetIsStateful()
    .SetShapeFn(shape_inference::ScalarShape)
    .Doc("Handle of an Embedding Variable (key -> row hash table).");

REGISTER_OP("SokEmbeddingVariableInitialize")
    .Input("handle: resource")
    .Input("init_matrix: float")  // [default_value_dim, dim] for init_kind "matrix", else empty
    .Attr("key_dtype: {int32, int64}")
    .Attr("table_name: string")
    .Attr("dim: int >= 1")
    .Attr("init_kind: string")  // a name of sok::kInitKindNames (core/initializer.h)
    .Attr("init_a: float = 0.0")
    .Attr("init_b: float = 0.0")
    .Attr("seed: int = 0")
    .Attr("default_value_dim: int = 0")
    .Attr("filter_freq: int = 0")
    .Attr("default_value_no_permission: float = 0.0")
    .Attr("steps_to_live: int = 0")
    .Attr("l2_weight_threshold: float = -1.0")
    // Storage tiers (DeepRec StorageOption): "DRAM", "DRAM_SSDHASH" (CPU only), "HBM",
    // "HBM_DRAM" or "HBM_DRAM_SSDHASH" (GPU only); the SSD tier's root directory; the byte
    // budget of each cached tier, top first; "LFU" or "LRU".
    .Attr("storage_type: string = 'DRAM'")
    .Attr("storage_path: string = ''")
    .Attr("storage_size: list(int) = []")
    .Attr("cache_strategy: string = 'LFU'")
    .SetIsStateful()
    .SetShapeFn(shape_inference::NoOutputs);

REGISTER_OP("SokEmbeddingVariableIsInitialized")
    .Input("handle: resource")
    .Output("is_initialized: bool")
    .Attr("key_dtype: {int32, int64}")
    .SetIsStateful()
    .SetShapeFn(shape_inference::ScalarShape);

REGISTER_OP("SokEmbeddingVariableSize")
    .Input("handle: resource")
    .Output("size: int64")
    .Attr("key_dtype: {int32, int64}")
    .SetIsStateful()
    .SetShapeFn(shape_inference::ScalarShape);

// Reads rows of many tables at once. training=True inserts missing keys (with their initial
// value) and counts frequencies; training=False never inserts.
REGISTER_OP("SokEmbeddingVariableGather")
    .Input("handles: N * resource")
    .Input("keys: Tkeys")
    .Input("counts: N * int64")  // per key; an empty tensor counts 1 each
    // [N] or [0] (all keys): table i reads only its first valid[i] keys (the exchange's padded
    // owner keys, counted on the device); the other rows of values_i are left unwritten.
    .Input("valid: int64")
    .Output("values: N * float")
    .Attr("N: int >= 1")
    .Attr("Tkeys: list({int32, int64})")
    .Attr("dims: list(int)")
    .Attr("training: bool")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      int n;
      TF_RETURN_IF_ERROR(c->GetAttr("N", &n));
      std::vector<int> dims;
      TF_RETURN_IF_ERROR(c->GetAttr("dims", &dims));
      if (static_cast<int>(dims.size()) != n) {
        return errors::InvalidArgument("SokEmbeddingVariableGather: ", dims.size(), " dims for ", n,
                                       " tables");
      }
      for (int i = 0; i < n; ++i) {
        ShapeHandle keys;
        TF_RETURN_IF_ERROR(c->WithRank(c->input(n + i), 1, &keys));
        c->set_output(i, c->Matrix(c->Dim(keys, 0), dims[i]));
      }
      return OkStatus();
    });

REGISTER_OP("SokEmbeddingVariableAssign")
    .Input("handle: resource")
    .Input("keys: key_dtype")
    .Input("values: float")
    .Attr("key_dtype: {int32, int64}")
    .SetIsStateful()
    .SetShapeFn(shape_inference::NoOutputs);

// Fused sparse optimizer step over many tables: keys may repeat (gradients are summed first).
REGISTER_OP("SokEmbeddingVariableSparseApply")
    .Input("handles: N * resource")
    .Input("keys: Tkeys")
    .Input("grads: N * float")
    .Input("learning_rate: float")
    .Input("global_step: int64")  // 0-based count of steps taken before this one
    .Input("valid: int64")        // as SokEmbeddingVariableGather's: the first valid[i] keys only
    // The step the updated rows record as their version (eviction, incremental dumps): the
    // caller's global step (DeepRec's); none: global_step. A list, so older graphs load.
    .Input("version_step: N_version * int64")
    .Attr("N: int >= 1")
    .Attr("N_version: int >= 0 = 0")
    .Attr("Tkeys: list({int32, int64})")
    .Attr("optimizer: string")  // a name of sok::kOptimizerNames (core/optimizer.h)
    .Attr("beta1: float = 0.9")
    .Attr("beta2: float = 0.999")
    .Attr("epsilon: float = 0.0")
    .Attr("initial_accumulator: float = 0.1")
    .Attr("l1: float = 0.0")
    .Attr("l2: float = 0.0")
    .Attr("lr_power: float = -0.5")
    // The caller guarantees each table's keys are distinct (e.g. they are SokUniqueKeys' output):
    // the dedup before the update is skipped.
    .Attr("keys_unique: bool = false")
    // The caller guarantees a training lookup of the same step inserted every key (lookup_sparse's
    // keys): the GPU tables reserve no room for them again.
    .Attr("keys_present: bool = false")
    .SetIsStateful()
    .SetShapeFn(shape_inference::NoOutputs);

REGISTER_OP("SokEmbeddingVariableShrink")
    .Input("handle: resource")
    .Input("global_step: int64")
    .Output("removed: int64")
    .Attr("key_dtype: {int32, int64}")
    .SetIsStateful()
    .SetShapeFn(shape_inference::ScalarShape);

REGISTER_OP("SokEmbeddingVariableExport")
    .Input("handle: resource")
    .Output(Field(sok::SnapshotField::kKeys, "key_dtype"))
    .Output(Field(sok::SnapshotField::kValues, "float"))  // [n, dim]
    .Output(Field(sok::SnapshotField::kSlots, "float"))   // [n, num_slots, dim]
    .Output(Field(sok::SnapshotField::kFreqs, "int64"))
    .Output(Field(sok::SnapshotField::kVersions, "int64"))
    .Output(Field(sok::SnapshotField::kSlotKind,
                  "int32"))  // OptimizerKind owning the slots, -1 none
    .Output(Field(sok::SnapshotField::kSlotInit, "float"))  // [num_slots]
    .Attr("key_dtype: {int32, int64}")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->Vector(InferenceContext::kUnknownDim));
      c->set_output(1, c->Matrix(InferenceContext::kUnknownDim, InferenceContext::kUnknownDim));
      c->set_output(2, c->UnknownShapeOfRank(3));
      c->set_output(3, c->Vector(InferenceContext::kUnknownDim));
      c->set_output(4, c->Vector(InferenceContext::kUnknownDim));
      c->set_output(5, c->Scalar());
      c->set_output(6, c->Vector(InferenceContext::kUnknownDim));
      return OkStatus();
    });

REGISTER_OP("SokEmbeddingVariableImport")
    .Input("handle: resource")
    .Input(Field(sok::SnapshotField::kKeys, "key_dtype"))
    .Input(Field(sok::SnapshotField::kValues, "float"))
    .Input(Field(sok::SnapshotField::kSlots, "float"))
    .Input(Field(sok::SnapshotField::kFreqs, "int64"))
    .Input(Field(sok::SnapshotField::kVersions, "int64"))
    .Input(Field(sok::SnapshotField::kSlotKind, "int32"))
    .Input(Field(sok::SnapshotField::kSlotInit, "float"))
    .Attr("key_dtype: {int32, int64}")
    // false: the rows replace the table's; true: they join those of an import before (a
    // checkpoint restored a chunk at a time).
    .Attr("append: bool = false")
    // > 0: the table makes room for this many rows after the import (the whole checkpoint, so
    // that its later chunks do not grow it step by step).
    .Attr("reserve_rows: int = 0")
    .SetIsStateful()
    .SetShapeFn(shape_inference::NoOutputs);

// How many times each SOK kernel ran in this process: op types and [CPU, GPU] counts.
REGISTER_OP("SokKernelRunCounts")
    .Output("op_types: string")
    .Output("counts: int64")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->Vector(InferenceContext::kUnknownDim));
      c->set_output(1, c->Matrix(InferenceContext::kUnknownDim, 2));
      return OkStatus();
    });

// Seconds since the epoch, now (the optimizer step clock of incremental dumps by time): unlike
// tf.timestamp, allowed under tf.config.experimental.enable_op_determinism, as no value a model
// computes depends on it.
REGISTER_OP("SokWallClock")
    .Output("seconds: double")
    .SetIsStateful()
    .SetShapeFn(shape_inference::ScalarShape);

// The names that cross into Python, as this build spells them (schema.py must agree; see
// tests/python/runtime/test_schema.py): initializer kinds, optimizers and snapshot fields, each in
// enum order.
REGISTER_OP("SokSchema")
    .Output("init_kinds: string")
    .Output("optimizers: string")
    .Output("export_fields: string")
    .SetShapeFn([](InferenceContext* c) {
      for (int i = 0; i < 3; ++i) c->set_output(i, c->Vector(InferenceContext::kUnknownDim));
      return OkStatus();
    });

}  // namespace sok_ops
}  // namespace tensorflow
