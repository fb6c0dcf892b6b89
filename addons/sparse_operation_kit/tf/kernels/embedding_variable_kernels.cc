// CPU kernels of the Embedding Variable ops: tensors in, core call, tensors out.
#include <algorithm>
#include <vector>

#include "addons/sparse_operation_kit/tf/kernels/embedding_variable_resource.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/tensor.h"

namespace tensorflow {
namespace sok_kernels {

template <typename K>
using Resource = EmbeddingVariableResource<K>;

template <typename K>
class InitializeOp : public OpKernel {
 public:
  explicit InitializeOp(OpKernelConstruction* c) : OpKernel(c) {
    OP_REQUIRES_OK(c, ParseTableConfig(c, &config_));
  }

  void Compute(OpKernelContext* ctx) override {
    const ResourceHandle& handle = HandleFromInput(ctx, 0);
    const Tensor& matrix = ctx->input(1);
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
    OP_REQUIRES_OK(ctx, LookupOrCreateResource<Resource<K>>(ctx, handle, &res, [&](Resource<K>** r) {
                     *r = new Resource<K>(config);
                     return OkStatus();
                   }));
    OP_REQUIRES(ctx, res->table()->dim() == config.dim,
                errors::InvalidArgument("Embedding Variable '", config.name, "' exists with dimension ",
                                        res->table()->dim(), ", not ", config.dim));
  }

 private:
  sok::TableConfig config_;
};

template <typename K>
class IsInitializedOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    core::RefCountPtr<Resource<K>> res;
    const bool found = LookupResource(ctx, HandleFromInput(ctx, 0), &res).ok();
    Tensor* out;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    out->scalar<bool>()() = found;
  }
};

template <typename K>
class SizeOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    core::RefCountPtr<Resource<K>> res;
    OP_REQUIRES_OK(ctx, LookupTable(ctx, HandleFromInput(ctx, 0), &res));
    Tensor* out;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    out->scalar<int64_t>()() = res->table()->size();
  }
};

// One table's share of a multi-table op, dispatched on its key dtype.
template <typename K>
Status GatherOne(OpKernelContext* ctx, const ResourceHandle& handle, const Tensor& keys,
                 const Tensor& counts, int64_t dim, bool training, Tensor* out,
                 const sok::ParallelFor& pf) {
  core::RefCountPtr<Resource<K>> res;
  TF_RETURN_IF_ERROR(LookupTable(ctx, handle, &res));
  auto* table = res->table();
  if (table->dim() != dim) {
    return errors::InvalidArgument("Embedding Variable '", table->config().name, "' has dimension ",
                                   table->dim(), " but the lookup expects ", dim);
  }
  const int64_t n = keys.NumElements();
  if (counts.NumElements() != 0 && counts.NumElements() != n) {
    return errors::InvalidArgument("lookup of '", table->config().name, "': ", counts.NumElements(),
                                   " counts for ", n, " keys");
  }
  const K* k = keys.flat<K>().data();
  float* o = out->flat<float>().data();
  if (training) {
    table->find_or_insert(k, n, o, counts.NumElements() ? counts.flat<int64_t>().data() : nullptr, pf);
  } else {
    table->find(k, n, o, pf);
  }
  return OkStatus();
}

class GatherOp : public OpKernel {
 public:
  explicit GatherOp(OpKernelConstruction* c) : OpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("dims", &dims_));
    OP_REQUIRES_OK(c, c->GetAttr("training", &training_));
  }

  void Compute(OpKernelContext* ctx) override {
    OpInputList keys, counts;
    OP_REQUIRES_OK(ctx, ctx->input_list("keys", &keys));
    OP_REQUIRES_OK(ctx, ctx->input_list("counts", &counts));
    const int n = keys.size();
    std::vector<Tensor*> outs(n);
    for (int i = 0; i < n; ++i) {
      OP_REQUIRES_OK(ctx, ctx->allocate_output(i, TensorShape({keys[i].NumElements(), dims_[i]}), &outs[i]));
    }
    std::vector<Status> status(n);
    const sok::ParallelFor pf = CpuParallelFor(ctx);
    auto one = [&](int i, const sok::ParallelFor& inner) {
      const ResourceHandle& h = HandleFromInput(ctx, i);
      status[i] = keys[i].dtype() == DT_INT64
                      ? GatherOne<int64_t>(ctx, h, keys[i], counts[i], dims_[i], training_, outs[i], inner)
                      : GatherOne<int32_t>(ctx, h, keys[i], counts[i], dims_[i], training_, outs[i], inner);
    };
    if (n == 1) {
      one(0, pf);
    } else {
      const sok::ParallelFor serial(sok::serial_for);
      ParallelForTables(ctx, n, [&](int i) { one(i, serial); });
    }
    for (const Status& s : status) OP_REQUIRES_OK(ctx, s);
  }

 private:
  std::vector<int32_t> dims_;
  bool training_;
};

template <typename K>
class AssignOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    core::RefCountPtr<Resource<K>> res;
    OP_REQUIRES_OK(ctx, LookupTable(ctx, HandleFromInput(ctx, 0), &res));
    const Tensor& keys = ctx->input(1);
    const Tensor& values = ctx->input(2);
    auto* table = res->table();
    OP_REQUIRES(ctx,
                values.dims() == 2 && values.dim_size(0) == keys.NumElements() &&
                    values.dim_size(1) == table->dim(),
                errors::InvalidArgument("assign to '", table->config().name, "': values of shape ",
                                        values.shape().DebugString(), " for ", keys.NumElements(),
                                        " keys of dimension ", table->dim()));
    table->insert_or_assign(keys.flat<K>().data(), keys.NumElements(), values.flat<float>().data());
  }
};

template <typename K>
Status ApplyOne(OpKernelContext* ctx, const ResourceHandle& handle, const Tensor& keys,
                const Tensor& grads, const sok::OptimizerParams& p, int64_t step,
                const sok::ParallelFor& pf, bool keys_unique) {
  core::RefCountPtr<Resource<K>> res;
  TF_RETURN_IF_ERROR(LookupTable(ctx, handle, &res));
  auto* table = res->table();
  const int64_t n = keys.NumElements();
  if (grads.dims() != 2 || grads.dim_size(0) != n || grads.dim_size(1) != table->dim()) {
    return errors::InvalidArgument("update of '", table->config().name, "': gradient of shape ",
                                   grads.shape().DebugString(), " for ", n, " keys of dimension ",
                                   table->dim());
  }
  return ToTf(table->apply_gradients(keys.flat<K>().data(), n, grads.flat<float>().data(), p, step, pf,
                                     keys_unique));
}

class SparseApplyOp : public OpKernel {
 public:
  explicit SparseApplyOp(OpKernelConstruction* c) : OpKernel(c) {
    OP_REQUIRES_OK(c, ParseOptimizerParams(c, &params_, &keys_unique_));
  }

  void Compute(OpKernelContext* ctx) override {
    OpInputList keys, grads;
    OP_REQUIRES_OK(ctx, ctx->input_list("keys", &keys));
    OP_REQUIRES_OK(ctx, ctx->input_list("grads", &grads));
    sok::OptimizerParams p = params_;
    p.lr = ctx->input(3 * keys.size()).scalar<float>()();
    const int64_t step = ctx->input(3 * keys.size() + 1).scalar<int64_t>()();
    p.step = step + 1;
    const int n = keys.size();
    std::vector<Status> status(n);
    const sok::ParallelFor pf = CpuParallelFor(ctx);
    auto one = [&](int i, const sok::ParallelFor& inner) {
      const ResourceHandle& h = HandleFromInput(ctx, i);
      status[i] = keys[i].dtype() == DT_INT64
                      ? ApplyOne<int64_t>(ctx, h, keys[i], grads[i], p, step, inner, keys_unique_)
                      : ApplyOne<int32_t>(ctx, h, keys[i], grads[i], p, step, inner, keys_unique_);
    };
    if (n == 1) {
      one(0, pf);
    } else {
      const sok::ParallelFor serial(sok::serial_for);
      ParallelForTables(ctx, n, [&](int i) { one(i, serial); });
    }
    for (const Status& s : status) OP_REQUIRES_OK(ctx, s);
  }

 private:
  sok::OptimizerParams params_;
  bool keys_unique_ = false;
};

template <typename K>
class ShrinkOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    core::RefCountPtr<Resource<K>> res;
    OP_REQUIRES_OK(ctx, LookupTable(ctx, HandleFromInput(ctx, 0), &res));
    const int64_t removed = res->table()->shrink(ctx->input(1).scalar<int64_t>()());
    Tensor* out;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    out->scalar<int64_t>()() = removed;
  }
};

template <typename T>
Tensor VectorTensor(const std::vector<T>& v, TensorShape shape) {
  Tensor t(DataTypeToEnum<T>::v(), shape);
  std::copy(v.begin(), v.end(), t.flat<T>().data());
  return t;
}

template <typename K>
class ExportOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    core::RefCountPtr<Resource<K>> res;
    OP_REQUIRES_OK(ctx, LookupTable(ctx, HandleFromInput(ctx, 0), &res));
    const sok::TableSnapshot<K> s = res->table()->export_rows();
    const int64_t n = static_cast<int64_t>(s.keys.size());
    ctx->set_output(0, VectorTensor(s.keys, TensorShape({n})));
    ctx->set_output(1, VectorTensor(s.values, TensorShape({n, s.dim})));
    ctx->set_output(2, VectorTensor(s.slots, TensorShape({n, s.num_slots, s.dim})));
    ctx->set_output(3, VectorTensor(s.freqs, TensorShape({n})));
    ctx->set_output(4, VectorTensor(s.versions, TensorShape({n})));
    Tensor kind(DT_INT32, TensorShape({}));
    kind.scalar<int32_t>()() = s.slot_kind;
    ctx->set_output(5, kind);
    ctx->set_output(6, VectorTensor(s.slot_init, TensorShape({static_cast<int64_t>(s.slot_init.size())})));
  }
};

template <typename K>
class ImportOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    core::RefCountPtr<Resource<K>> res;
    OP_REQUIRES_OK(ctx, LookupTable(ctx, HandleFromInput(ctx, 0), &res));
    auto* table = res->table();
    const Tensor& values = ctx->input(2);
    const Tensor& slots = ctx->input(3);
    OP_REQUIRES(ctx, values.dims() == 2 && slots.dims() == 3,
                errors::InvalidArgument("cannot restore '", table->config().name,
                                        "': values must be [n, dim] and slots [n, num_slots, dim], got ",
                                        values.shape().DebugString(), " and ", slots.shape().DebugString()));
    sok::TableSnapshot<K> s;
    s.dim = values.dim_size(1);
    s.num_slots = static_cast<int>(slots.dim_size(1));
    OP_REQUIRES(ctx, slots.dim_size(2) == s.dim || slots.NumElements() == 0,
                errors::InvalidArgument("cannot restore '", table->config().name, "': slots of shape ",
                                        slots.shape().DebugString(), " for values of dimension ", s.dim));
    auto copy = [](const Tensor& t, auto* v) {
      using T = typename std::remove_reference_t<decltype(*v)>::value_type;
      auto f = t.flat<T>();
      v->assign(f.data(), f.data() + f.size());
    };
    copy(ctx->input(1), &s.keys);
    copy(values, &s.values);
    copy(slots, &s.slots);
    copy(ctx->input(4), &s.freqs);
    copy(ctx->input(5), &s.versions);
    s.slot_kind = ctx->input(6).scalar<int32_t>()();
    copy(ctx->input(7), &s.slot_init);
    OP_REQUIRES_OK(ctx, ToTf(table->import_rows(s)));
  }
};

#define SOK_REGISTER_EV_KERNELS(K)                                                                 \
  REGISTER_KERNEL_BUILDER(                                                                         \
      Name("SokEmbeddingVariableHandle").Device(DEVICE_CPU).TypeConstraint<K>("key_dtype"),        \
      ResourceHandleOp<Resource<K>>);                                                              \
  REGISTER_KERNEL_BUILDER(                                                                         \
      Name("SokEmbeddingVariableInitialize").Device(DEVICE_CPU).TypeConstraint<K>("key_dtype"),    \
      InitializeOp<K>);                                                                            \
  REGISTER_KERNEL_BUILDER(                                                                         \
      Name("SokEmbeddingVariableIsInitialized").Device(DEVICE_CPU).TypeConstraint<K>("key_dtype"), \
      IsInitializedOp<K>);                                                                         \
  REGISTER_KERNEL_BUILDER(                                                                         \
      Name("SokEmbeddingVariableSize").Device(DEVICE_CPU).TypeConstraint<K>("key_dtype"),          \
      SizeOp<K>);                                                                                  \
  REGISTER_KERNEL_BUILDER(                                                                         \
      Name("SokEmbeddingVariableAssign").Device(DEVICE_CPU).TypeConstraint<K>("key_dtype"),        \
      AssignOp<K>);                                                                                \
  REGISTER_KERNEL_BUILDER(                                                                         \
      Name("SokEmbeddingVariableShrink").Device(DEVICE_CPU).TypeConstraint<K>("key_dtype"),        \
      ShrinkOp<K>);                                                                                \
  REGISTER_KERNEL_BUILDER(                                                                         \
      Name("SokEmbeddingVariableExport").Device(DEVICE_CPU).TypeConstraint<K>("key_dtype"),        \
      ExportOp<K>);                                                                                \
  REGISTER_KERNEL_BUILDER(                                                                         \
      Name("SokEmbeddingVariableImport").Device(DEVICE_CPU).TypeConstraint<K>("key_dtype"),        \
      ImportOp<K>);

SOK_REGISTER_EV_KERNELS(int32_t)
SOK_REGISTER_EV_KERNELS(int64_t)
#undef SOK_REGISTER_EV_KERNELS

REGISTER_KERNEL_BUILDER(Name("SokEmbeddingVariableGather").Device(DEVICE_CPU), GatherOp);
REGISTER_KERNEL_BUILDER(Name("SokEmbeddingVariableSparseApply").Device(DEVICE_CPU), SparseApplyOp);

}  // namespace sok_kernels
}  // namespace tensorflow
