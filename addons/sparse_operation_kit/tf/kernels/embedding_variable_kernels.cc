// Kernels of the Embedding Variable ops (tf/ops/embedding_variable_ops.cc), written once for the
// CPU and the GPU: tensors in, one call on the table interface (core/table.h), tensors out. On the
// GPU, keys, counts, values and gradients stay in device memory; the scalars the host reads
// (learning rate, global step, sizes) and the checkpoint tensors of Export/Import (they go
// through a host TableSnapshot) are HostMemory.
#include <algorithm>
#include <chrono>
#include <type_traits>
#include <vector>

#include "addons/sparse_operation_kit/tf/kernels/device.h"
#include "addons/sparse_operation_kit/tf/kernels/embedding_variable_resource.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/tensor.h"

namespace tensorflow {
namespace sok_kernels {
namespace {

template <typename K>
using Resource = EmbeddingVariableResource<K>;

template <typename Device, typename K>
class InitializeOp : public SokOpKernel<Device> {
 public:
  explicit InitializeOp(OpKernelConstruction* c) : SokOpKernel<Device>(c) {
    OP_REQUIRES_OK(c, ParseTableConfig(c, &config_));
  }

 protected:
  void ComputeOnDevice(OpKernelContext* ctx) override {
    const ResourceHandle& handle = HandleFromInput(ctx, 0);
    const Tensor& matrix = ctx->input(1);  // HostMemory
    sok::TableConfig config = config_;
    if (config.init.kind == sok::InitKind::kMatrix) {
      OP_REQUIRES(ctx,
                  matrix.dims() == 2 && matrix.dim_size(1) == config.dim &&
                      matrix.dim_size(0) == config.init.default_value_dim && matrix.dim_size(0) > 0,
                  errors::InvalidArgument("initial-value matrix of '", config.name, "' has shape ",
                                          matrix.shape().DebugString(), ", expected [",
                                          config.init.default_value_dim, ", ", config.dim, "]"));
      auto flat = matrix.flat<float>();
      config.init_matrix.assign(flat.data(), flat.data() + flat.size());
    }
    core::RefCountPtr<Resource<K>> res;
    OP_REQUIRES_OK(ctx,
                   LookupOrCreateResource<Resource<K>>(ctx, handle, &res, [&](Resource<K>** r) {
                     std::unique_ptr<sok::Table<K>> table;
                     std::shared_ptr<void> keep_alive;
                     TF_RETURN_IF_ERROR(
                         OnDevice<Device>::template NewTable<K>(ctx, config, &table, &keep_alive));
                     *r = new Resource<K>(std::move(table), std::move(keep_alive));
                     return OkStatus();
                   }));
    OP_REQUIRES(
        ctx, res->table()->dim() == config.dim,
        errors::InvalidArgument("Embedding Variable '", config.name, "' exists with dimension ",
                                res->table()->dim(), ", not ", config.dim));
  }

 private:
  sok::TableConfig config_;
};

template <typename Device, typename K>
class IsInitializedOp : public SokOpKernel<Device> {
 public:
  using SokOpKernel<Device>::SokOpKernel;

 protected:
  void ComputeOnDevice(OpKernelContext* ctx) override {
    core::RefCountPtr<Resource<K>> res;
    const bool found = LookupResource(ctx, HandleFromInput(ctx, 0), &res).ok();
    Tensor* out;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));  // HostMemory
    out->scalar<bool>()() = found;
  }
};

template <typename Device, typename K>
class SizeOp : public SokOpKernel<Device> {
 public:
  using SokOpKernel<Device>::SokOpKernel;

 protected:
  void ComputeOnDevice(OpKernelContext* ctx) override {
    core::RefCountPtr<Resource<K>> res;
    OP_REQUIRES_OK(ctx, LookupTable(ctx, HandleFromInput(ctx, 0), &res));
    int64_t size = 0;
    OP_REQUIRES_OK(
        ctx, ToTf(res->table()->size(OnDevice<Device>::Exec(ctx), &size), res->table()->name()));
    Tensor* out;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));  // HostMemory
    out->scalar<int64_t>()() = size;
  }
};

// The tables of an op's handles whose keys are K, looked up (and kept alive) for the call.
template <typename K>
struct OpTables {
  std::vector<core::RefCountPtr<Resource<K>>> resources;
  std::vector<TableCall<K>> calls;

  Status Add(OpKernelContext* ctx, const ResourceHandle& handle, TableCall<K>* call) {
    core::RefCountPtr<Resource<K>> res;
    TF_RETURN_IF_ERROR(LookupTable(ctx, handle, &res));
    call->table = res->table();
    resources.push_back(std::move(res));
    return OkStatus();
  }
};

// One table's share of Gather, checked.
template <typename K>
Status AddGather(OpKernelContext* ctx, const ResourceHandle& handle, const Tensor& keys,
                 const Tensor& counts, int64_t dim, Tensor* out, OpTables<K>* tables) {
  TableCall<K> call;
  TF_RETURN_IF_ERROR(tables->Add(ctx, handle, &call));
  const sok::Table<K>* table = call.table;
  if (table->dim() != dim) {
    return errors::InvalidArgument("Embedding Variable '", table->name(), "' has dimension ",
                                   table->dim(), " but the lookup expects ", dim);
  }
  call.n = keys.NumElements();
  if (counts.NumElements() != 0 && counts.NumElements() != call.n) {
    return errors::InvalidArgument("lookup of '", table->name(), "': ", counts.NumElements(),
                                   " counts for ", call.n, " keys");
  }
  call.keys = keys.flat<K>().data();
  call.out = out->flat<float>().data();
  call.counts = counts.NumElements() ? counts.flat<int64_t>().data() : nullptr;
  tables->calls.push_back(call);
  return OkStatus();
}

template <typename Device, typename K>
Status GatherTables(OpKernelContext* ctx, const OpTables<K>& tables, bool training) {
  if (tables.calls.empty()) return OkStatus();
  if (training) return OnDevice<Device>::FindOrInsert(ctx, tables.calls);
  return OnDevice<Device>::Find(ctx, tables.calls);
}

// valid [N] or [0] (every key counts), checked against N tables.
Status ValidInput(const Tensor& valid, int n, const int64_t** out) {
  if (valid.NumElements() != 0 && valid.NumElements() != n) {
    return errors::InvalidArgument("valid holds ", valid.NumElements(), " counts for ", n,
                                   " tables (one per table, or none)");
  }
  *out = valid.NumElements() ? valid.flat<int64_t>().data() : nullptr;
  return OkStatus();
}

// Limits each call to its table's valid keys (calls[j] is table first + j of the op's N).
template <typename Device, typename K>
Status LimitCounts(OpKernelContext* ctx, const int64_t* valid, const std::vector<int>& index,
                   OpTables<K>* tables) {
  if (valid == nullptr) return OkStatus();
  for (size_t j = 0; j < tables->calls.size(); ++j) {
    TF_RETURN_IF_ERROR(OnDevice<Device>::LimitCount(ctx, valid + index[j], &tables->calls[j]));
  }
  return OkStatus();
}

template <typename Device>
class GatherOp : public SokOpKernel<Device> {
 public:
  explicit GatherOp(OpKernelConstruction* c) : SokOpKernel<Device>(c) {
    OP_REQUIRES_OK(c, c->GetAttr("dims", &dims_));
    OP_REQUIRES_OK(c, c->GetAttr("training", &training_));
  }

 protected:
  void ComputeOnDevice(OpKernelContext* ctx) override {
    OpInputList keys, counts;
    OP_REQUIRES_OK(ctx, ctx->input_list("keys", &keys));
    OP_REQUIRES_OK(ctx, ctx->input_list("counts", &counts));
    const int n = keys.size();
    OP_REQUIRES(ctx, static_cast<int>(dims_.size()) == n,
                errors::InvalidArgument(dims_.size(), " dims for ", n, " tables"));
    const int64_t* valid;
    OP_REQUIRES_OK(ctx, ValidInput(ctx->input(3 * n), n, &valid));
    OpTables<int64_t> tables64;
    OpTables<int32_t> tables32;
    std::vector<int> index64, index32;
    std::vector<TensorShape> shapes;
    for (int i = 0; i < n; ++i) shapes.push_back(TensorShape({keys[i].NumElements(), dims_[i]}));
    std::vector<Tensor*> outs;
    OP_REQUIRES_OK(ctx, AllocateTableOutputs<Device>(ctx, 0, DT_FLOAT, shapes, &outs));
    for (int i = 0; i < n; ++i) {
      const ResourceHandle& h = HandleFromInput(ctx, i);
      const bool wide = keys[i].dtype() == DT_INT64;
      (wide ? index64 : index32).push_back(i);
      OP_REQUIRES_OK(ctx,
                     wide ? AddGather(ctx, h, keys[i], counts[i], dims_[i], outs[i], &tables64)
                          : AddGather(ctx, h, keys[i], counts[i], dims_[i], outs[i], &tables32));
    }
    OP_REQUIRES_OK(ctx, LimitCounts<Device>(ctx, valid, index64, &tables64));
    OP_REQUIRES_OK(ctx, LimitCounts<Device>(ctx, valid, index32, &tables32));
    OP_REQUIRES_OK(ctx, GatherTables<Device>(ctx, tables64, training_));
    OP_REQUIRES_OK(ctx, GatherTables<Device>(ctx, tables32, training_));
  }

 private:
  std::vector<int32_t> dims_;
  bool training_;
};

template <typename Device, typename K>
class AssignOp : public SokOpKernel<Device> {
 public:
  using SokOpKernel<Device>::SokOpKernel;

 protected:
  void ComputeOnDevice(OpKernelContext* ctx) override {
    core::RefCountPtr<Resource<K>> res;
    OP_REQUIRES_OK(ctx, LookupTable(ctx, HandleFromInput(ctx, 0), &res));
    const Tensor& keys = ctx->input(1);
    const Tensor& values = ctx->input(2);
    sok::Table<K>* table = res->table();
    OP_REQUIRES(ctx,
                values.dims() == 2 && values.dim_size(0) == keys.NumElements() &&
                    values.dim_size(1) == table->dim(),
                errors::InvalidArgument("assign to '", table->name(), "': values of shape ",
                                        values.shape().DebugString(), " for ", keys.NumElements(),
                                        " keys of dimension ", table->dim()));
    OP_REQUIRES_OK(ctx,
                   ToTf(table->insert_or_assign(OnDevice<Device>::Exec(ctx), keys.flat<K>().data(),
                                                keys.NumElements(), values.flat<float>().data()),
                        table->name()));
  }
};

// One table's share of SparseApply, checked.
template <typename K>
Status AddApply(OpKernelContext* ctx, const ResourceHandle& handle, const Tensor& keys,
                const Tensor& grads, OpTables<K>* tables) {
  TableCall<K> call;
  TF_RETURN_IF_ERROR(tables->Add(ctx, handle, &call));
  const sok::Table<K>* table = call.table;
  call.n = keys.NumElements();
  if (grads.dims() != 2 || grads.dim_size(0) != call.n || grads.dim_size(1) != table->dim()) {
    return errors::InvalidArgument("update of '", table->name(), "': gradient of shape ",
                                   grads.shape().DebugString(), " for ", call.n,
                                   " keys of dimension ", table->dim());
  }
  call.keys = keys.flat<K>().data();
  call.grads = grads.flat<float>().data();
  tables->calls.push_back(call);
  return OkStatus();
}

template <typename Device, typename K>
Status ApplyTables(OpKernelContext* ctx, const OpTables<K>& tables, const sok::OptimizerParams& p,
                   int64_t step, bool keys_unique, bool keys_present) {
  if (tables.calls.empty()) return OkStatus();
  return OnDevice<Device>::Apply(ctx, tables.calls, p, step, keys_unique, keys_present);
}

// The rows' version: the optional version_step input, else the optimizer's step.
inline Status VersionStep(OpKernelContext* ctx, int64_t step, int64_t* version) {
  OpInputList given;
  TF_RETURN_IF_ERROR(ctx->input_list("version_step", &given));
  if (given.size() == 0) {
    *version = step;
    return OkStatus();
  }
  if (given.size() != 1 || !TensorShapeUtils::IsScalar(given[0].shape())) {
    return errors::InvalidArgument("version_step must be one scalar, got ", given.size(),
                                   " tensors");
  }
  *version = given[0].scalar<int64_t>()();
  return OkStatus();
}

template <typename Device>
class SparseApplyOp : public SokOpKernel<Device> {
 public:
  explicit SparseApplyOp(OpKernelConstruction* c) : SokOpKernel<Device>(c) {
    OP_REQUIRES_OK(c, ParseOptimizerParams(c, &params_, &keys_unique_));
    OP_REQUIRES_OK(c, c->GetAttr("keys_present", &keys_present_));
  }

 protected:
  void ComputeOnDevice(OpKernelContext* ctx) override {
    OpInputList keys, grads;
    OP_REQUIRES_OK(ctx, ctx->input_list("keys", &keys));
    OP_REQUIRES_OK(ctx, ctx->input_list("grads", &grads));
    const int n = keys.size();
    sok::OptimizerParams p = params_;
    p.lr = ctx->input(3 * n).scalar<float>()();                      // HostMemory
    const int64_t step = ctx->input(3 * n + 1).scalar<int64_t>()();  // HostMemory
    p.step = step + 1;
    int64_t version;
    OP_REQUIRES_OK(ctx, VersionStep(ctx, step, &version));
    const int64_t* valid;
    OP_REQUIRES_OK(ctx, ValidInput(ctx->input(3 * n + 2), n, &valid));
    OpTables<int64_t> tables64;
    OpTables<int32_t> tables32;
    std::vector<int> index64, index32;
    for (int i = 0; i < n; ++i) {
      const ResourceHandle& h = HandleFromInput(ctx, i);
      const bool wide = keys[i].dtype() == DT_INT64;
      (wide ? index64 : index32).push_back(i);
      OP_REQUIRES_OK(ctx, wide ? AddApply(ctx, h, keys[i], grads[i], &tables64)
                               : AddApply(ctx, h, keys[i], grads[i], &tables32));
    }
    OP_REQUIRES_OK(ctx, LimitCounts<Device>(ctx, valid, index64, &tables64));
    OP_REQUIRES_OK(ctx, LimitCounts<Device>(ctx, valid, index32, &tables32));
    OP_REQUIRES_OK(ctx,
                   ApplyTables<Device>(ctx, tables64, p, version, keys_unique_, keys_present_));
    OP_REQUIRES_OK(ctx,
                   ApplyTables<Device>(ctx, tables32, p, version, keys_unique_, keys_present_));
  }

 private:
  sok::OptimizerParams params_;
  bool keys_unique_ = false;
  bool keys_present_ = false;
};

template <typename Device, typename K>
class ShrinkOp : public SokOpKernel<Device> {
 public:
  using SokOpKernel<Device>::SokOpKernel;

 protected:
  void ComputeOnDevice(OpKernelContext* ctx) override {
    core::RefCountPtr<Resource<K>> res;
    OP_REQUIRES_OK(ctx, LookupTable(ctx, HandleFromInput(ctx, 0), &res));
    int64_t removed = 0;
    OP_REQUIRES_OK(
        ctx, ToTf(res->table()->shrink(OnDevice<Device>::Exec(ctx),
                                       ctx->input(1).scalar<int64_t>()(), &removed),  // HostMemory
                  res->table()->name()));
    Tensor* out;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));  // HostMemory
    out->scalar<int64_t>()() = removed;
  }
};

// The output / input index of a snapshot field (Import's inputs follow its handle).
constexpr int Out(sok::SnapshotField f) { return static_cast<int>(f); }
constexpr int In(sok::SnapshotField f) { return 1 + static_cast<int>(f); }

template <typename Device, typename K>
class ExportOp : public SokOpKernel<Device> {
 public:
  using SokOpKernel<Device>::SokOpKernel;

 protected:
  // The table writes its fields into the op's outputs (host memory on both devices): a table
  // with its rows in host memory fills them directly, the others a field at a time from their
  // snapshot (table.h's export_into), so a dump holds at most one extra copy of the table.
  void ComputeOnDevice(OpKernelContext* ctx) override {
    core::RefCountPtr<Resource<K>> res;
    OP_REQUIRES_OK(ctx, LookupTable(ctx, HandleFromInput(ctx, 0), &res));
    const auto allocate = [ctx](sok::SnapshotField f, const std::vector<int64_t>& dims,
                                void** data) {
      TensorShape shape;
      for (int64_t d : dims) shape.AddDim(d);
      Tensor* t;
      Status s = ctx->allocate_output(Out(f), shape, &t);
      if (!s.ok()) return sok::Status::Invalid(std::string(s.message()));
      *data = const_cast<char*>(t->tensor_data().data());
      return sok::Status::OK();
    };
    OP_REQUIRES_OK(ctx, ToTf(res->table()->export_into(OnDevice<Device>::Exec(ctx), allocate),
                             res->table()->name()));
  }
};

template <typename Device, typename K>
class ImportOp : public SokOpKernel<Device> {
 public:
  explicit ImportOp(OpKernelConstruction* ctx) : SokOpKernel<Device>(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("append", &append_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("reserve_rows", &reserve_rows_));
  }

 protected:
  void ComputeOnDevice(OpKernelContext* ctx) override {
    core::RefCountPtr<Resource<K>> res;
    OP_REQUIRES_OK(ctx, LookupTable(ctx, HandleFromInput(ctx, 0), &res));
    sok::Table<K>* table = res->table();
    const Tensor& values = ctx->input(In(sok::SnapshotField::kValues));  // all HostMemory
    const Tensor& slots = ctx->input(In(sok::SnapshotField::kSlots));
    OP_REQUIRES(ctx, values.dims() == 2 && slots.dims() == 3,
                errors::InvalidArgument(
                    "cannot restore '", table->name(),
                    "': values must be [n, dim] and slots [n, num_slots, dim], got ",
                    values.shape().DebugString(), " and ", slots.shape().DebugString()));
    // The table reads the input tensors in place: no copy of a checkpoint that may be most of
    // the host's memory.
    sok::SnapshotView<K> s;
    s.dim = values.dim_size(1);
    s.num_slots = static_cast<int>(slots.dim_size(1));
    OP_REQUIRES(
        ctx, slots.dim_size(2) == s.dim || slots.NumElements() == 0,
        errors::InvalidArgument("cannot restore '", table->name(), "': slots of shape ",
                                slots.shape().DebugString(), " for values of dimension ", s.dim));
    const Tensor& keys = ctx->input(In(sok::SnapshotField::kKeys));
    const Tensor& freqs = ctx->input(In(sok::SnapshotField::kFreqs));
    const Tensor& versions = ctx->input(In(sok::SnapshotField::kVersions));
    const Tensor& slot_init = ctx->input(In(sok::SnapshotField::kSlotInit));
    s.n = keys.NumElements();
    s.keys = keys.flat<K>().data();
    s.values = values.flat<float>().data();
    s.values_size = values.NumElements();
    s.slots = slots.flat<float>().data();
    s.slots_size = slots.NumElements();
    s.freqs = freqs.flat<int64_t>().data();
    s.freqs_size = freqs.NumElements();
    s.versions = versions.flat<int64_t>().data();
    s.versions_size = versions.NumElements();
    s.slot_kind = ctx->input(In(sok::SnapshotField::kSlotKind)).scalar<int32_t>()();
    s.slot_init.assign(slot_init.flat<float>().data(),
                       slot_init.flat<float>().data() + slot_init.NumElements());
    const sok::ExecContext exec = OnDevice<Device>::Exec(ctx);
    OP_REQUIRES_OK(ctx, ToTf(append_ ? table->append_rows(exec, s) : table->import_rows(exec, s),
                             table->name()));
    if (reserve_rows_ > s.n)
      OP_REQUIRES_OK(ctx, ToTf(table->reserve(exec, reserve_rows_), table->name()));
  }

 private:
  bool append_ = false;
  int64_t reserve_rows_ = 0;
};

// How many times each SOK kernel ran so far: op types [n] and their counts [n, (CPU, GPU)].
class KernelRunCountsOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    KernelRunCounts& counts = KernelRunCounts::Get();
    std::lock_guard<std::mutex> l(counts.mu);
    const int64_t n = static_cast<int64_t>(counts.by_op.size());
    Tensor *types, *runs;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({n}), &types));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({n, 2}), &runs));
    int64_t i = 0;
    for (const auto& [op, c] : counts.by_op) {
      types->flat<tstring>()(i) = op;
      runs->matrix<int64_t>()(i, 0) = c[0];
      runs->matrix<int64_t>()(i, 1) = c[1];
      ++i;
    }
  }
};

class WallClockOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    Tensor* out;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    const auto now = std::chrono::system_clock::now().time_since_epoch();
    out->scalar<double>()() = std::chrono::duration<double>(now).count();
  }
};
REGISTER_KERNEL_BUILDER(Name("SokWallClock").Device(DEVICE_CPU), WallClockOp);

// The C++ name tables that cross into Python (see SokSchema in tf/ops).
class SchemaOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    Output(ctx, 0, sok::kInitKindNames);
    Output(ctx, 1, sok::kOptimizerNames);
    Output(ctx, 2, sok::kSnapshotFieldNames);
  }

 private:
  template <size_t N>
  void Output(OpKernelContext* ctx, int index, const char* const (&names)[N]) {
    Tensor* t;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(index, TensorShape({static_cast<int64_t>(N)}), &t));
    for (size_t i = 0; i < N; ++i) t->flat<tstring>()(i) = names[i];
  }
};
REGISTER_KERNEL_BUILDER(Name("SokSchema").Device(DEVICE_CPU), SchemaOp);
#if GOOGLE_CUDA  // every op has a GPU kernel (tests/gpu/compile_check.sh); the names stay on the
                 // host
REGISTER_KERNEL_BUILDER(Name("SokSchema")
                            .Device(DEVICE_GPU)
                            .HostMemory("init_kinds")
                            .HostMemory("optimizers")
                            .HostMemory("export_fields"),
                        SchemaOp);
#endif

// The handle lives in host memory on both devices; so do the scalars and the checkpoint tensors.
static_assert(sok::kNumSnapshotFields == 7,
              "SOK_SNAPSHOT_IN_HOST_MEMORY names every snapshot field");
#define SOK_SNAPSHOT_IN_HOST_MEMORY            \
  .HostMemory(sok::kSnapshotFieldNames[0])     \
      .HostMemory(sok::kSnapshotFieldNames[1]) \
      .HostMemory(sok::kSnapshotFieldNames[2]) \
      .HostMemory(sok::kSnapshotFieldNames[3]) \
      .HostMemory(sok::kSnapshotFieldNames[4]) \
      .HostMemory(sok::kSnapshotFieldNames[5]) \
      .HostMemory(sok::kSnapshotFieldNames[6])
#define SOK_REGISTER_EV_KERNELS(DEV, DEV_T, K)                                                \
  REGISTER_KERNEL_BUILDER(Name("SokEmbeddingVariableHandle")                                  \
                              .Device(DEV)                                                    \
                              .HostMemory("handle")                                           \
                              .TypeConstraint<K>("key_dtype"),                                \
                          ResourceHandleOp<Resource<K>>);                                     \
  REGISTER_KERNEL_BUILDER(Name("SokEmbeddingVariableInitialize")                              \
                              .Device(DEV)                                                    \
                              .HostMemory("handle")                                           \
                              .HostMemory("init_matrix")                                      \
                              .TypeConstraint<K>("key_dtype"),                                \
                          InitializeOp<DEV_T, K>);                                            \
  REGISTER_KERNEL_BUILDER(Name("SokEmbeddingVariableIsInitialized")                           \
                              .Device(DEV)                                                    \
                              .HostMemory("handle")                                           \
                              .HostMemory("is_initialized")                                   \
                              .TypeConstraint<K>("key_dtype"),                                \
                          IsInitializedOp<DEV_T, K>);                                         \
  REGISTER_KERNEL_BUILDER(Name("SokEmbeddingVariableSize")                                    \
                              .Device(DEV)                                                    \
                              .HostMemory("handle")                                           \
                              .HostMemory("size")                                             \
                              .TypeConstraint<K>("key_dtype"),                                \
                          SizeOp<DEV_T, K>);                                                  \
  REGISTER_KERNEL_BUILDER(Name("SokEmbeddingVariableAssign")                                  \
                              .Device(DEV)                                                    \
                              .HostMemory("handle")                                           \
                              .TypeConstraint<K>("key_dtype"),                                \
                          AssignOp<DEV_T, K>);                                                \
  REGISTER_KERNEL_BUILDER(Name("SokEmbeddingVariableShrink")                                  \
                              .Device(DEV)                                                    \
                              .HostMemory("handle")                                           \
                              .HostMemory("global_step")                                      \
                              .HostMemory("removed")                                          \
                              .TypeConstraint<K>("key_dtype"),                                \
                          ShrinkOp<DEV_T, K>);                                                \
  REGISTER_KERNEL_BUILDER(Name("SokEmbeddingVariableExport")                                  \
                              .Device(DEV)                                                    \
                              .HostMemory("handle")                                           \
                                  SOK_SNAPSHOT_IN_HOST_MEMORY.TypeConstraint<K>("key_dtype"), \
                          ExportOp<DEV_T, K>);                                                \
  REGISTER_KERNEL_BUILDER(Name("SokEmbeddingVariableImport")                                  \
                              .Device(DEV)                                                    \
                              .HostMemory("handle")                                           \
                                  SOK_SNAPSHOT_IN_HOST_MEMORY.TypeConstraint<K>("key_dtype"), \
                          ImportOp<DEV_T, K>);

#define SOK_REGISTER_MULTI_TABLE_KERNELS(DEV, DEV_T)                                            \
  REGISTER_KERNEL_BUILDER(Name("SokEmbeddingVariableGather").Device(DEV).HostMemory("handles"), \
                          GatherOp<DEV_T>);                                                     \
  REGISTER_KERNEL_BUILDER(Name("SokEmbeddingVariableSparseApply")                               \
                              .Device(DEV)                                                      \
                              .HostMemory("handles")                                            \
                              .HostMemory("learning_rate")                                      \
                              .HostMemory("global_step")                                        \
                              .HostMemory("version_step"),                                      \
                          SparseApplyOp<DEV_T>);                                                \
  REGISTER_KERNEL_BUILDER(                                                                      \
      Name("SokKernelRunCounts").Device(DEV).HostMemory("op_types").HostMemory("counts"),       \
      KernelRunCountsOp);

SOK_REGISTER_EV_KERNELS(DEVICE_CPU, CpuDevice, int32_t)
SOK_REGISTER_EV_KERNELS(DEVICE_CPU, CpuDevice, int64_t)
SOK_REGISTER_MULTI_TABLE_KERNELS(DEVICE_CPU, CpuDevice)
#if GOOGLE_CUDA
SOK_REGISTER_EV_KERNELS(DEVICE_GPU, GpuDevice, int32_t)
SOK_REGISTER_EV_KERNELS(DEVICE_GPU, GpuDevice, int64_t)
SOK_REGISTER_MULTI_TABLE_KERNELS(DEVICE_GPU, GpuDevice)
#endif
#undef SOK_REGISTER_EV_KERNELS
#undef SOK_SNAPSHOT_IN_HOST_MEMORY
#undef SOK_REGISTER_MULTI_TABLE_KERNELS

}  // namespace
}  // namespace sok_kernels
}  // namespace tensorflow
