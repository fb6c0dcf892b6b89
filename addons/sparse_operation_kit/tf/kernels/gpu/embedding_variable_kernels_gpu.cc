// GPU kernels of the Embedding Variable ops (tf/ops/embedding_variable_ops.cc): tensors in, core
// call on the op's CUDA stream, tensors out. Keys, counts, values and gradients stay in device
// memory; scalars the host must read (learning rate, global step, sizes) and the checkpoint
// tensors of Export/Import (they go through a host TableSnapshot) are HostMemory.
#if GOOGLE_CUDA

#ifndef EIGEN_USE_GPU
#define EIGEN_USE_GPU
#endif

#include <cmath>
#include <type_traits>
#include <vector>

#include "addons/sparse_operation_kit/tf/kernels/gpu/gpu_embedding_variable_resource.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/tensor.h"

namespace tensorflow {
namespace sok_kernels {
namespace {

template <typename K>
using GpuResource = GpuEmbeddingVariableResource<K>;

template <typename K>
class GpuInitializeOp : public OpKernel {
 public:
  explicit GpuInitializeOp(OpKernelConstruction* c) : OpKernel(c) {
    OP_REQUIRES_OK(c, ParseTableConfig(c, &config_));
  }

  void Compute(OpKernelContext* ctx) override {
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
      config.init_matrix.assign(flat.data(), flat.data() + flat.size());  // Create copies it to the device
    }
    Allocator* device_alloc = ctx->device()->GetAllocator(AllocatorAttributes());
    const cudaStream_t stream = GpuStream(ctx);
    core::RefCountPtr<GpuResource<K>> res;
    OP_REQUIRES_OK(ctx, LookupOrCreateResource<GpuResource<K>>(ctx, handle, &res, [&](GpuResource<K>** r) {
                     return GpuResource<K>::Create(config, device_alloc, stream, r);
                   }));
    OP_REQUIRES(ctx, res->table()->dim() == config.dim,
                errors::InvalidArgument("Embedding Variable '", config.name, "' exists with dimension ",
                                        res->table()->dim(), ", not ", config.dim));
  }

 private:
  sok::TableConfig config_;
};

template <typename K>
class GpuIsInitializedOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    core::RefCountPtr<GpuResource<K>> res;
    const bool found = LookupResource(ctx, HandleFromInput(ctx, 0), &res).ok();
    Tensor* out;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));  // HostMemory
    out->scalar<bool>()() = found;
  }
};

template <typename K>
class GpuSizeOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    core::RefCountPtr<GpuResource<K>> res;
    OP_REQUIRES_OK(ctx, LookupGpuTable(ctx, HandleFromInput(ctx, 0), &res));
    int64_t size = 0;
    OP_REQUIRES_OK(ctx, ToTfNamed(res->table()->size(&size, GpuStream(ctx)), res->name()));
    Tensor* out;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));  // HostMemory
    out->scalar<int64_t>()() = size;
  }
};

template <typename K>
Status GpuGatherOne(OpKernelContext* ctx, const ResourceHandle& handle, const Tensor& keys,
                    const Tensor& counts, int64_t dim, bool training, Tensor* out) {
  core::RefCountPtr<GpuResource<K>> res;
  TF_RETURN_IF_ERROR(LookupGpuTable(ctx, handle, &res));
  auto* table = res->table();
  if (table->dim() != dim) {
    return errors::InvalidArgument("Embedding Variable '", res->name(), "' has dimension ", table->dim(),
                                   " but the lookup expects ", dim);
  }
  const int64_t n = keys.NumElements();
  if (counts.NumElements() != 0 && counts.NumElements() != n) {
    return errors::InvalidArgument("lookup of '", res->name(), "': ", counts.NumElements(), " counts for ",
                                   n, " keys");
  }
  const K* k = keys.flat<K>().data();
  float* o = out->flat<float>().data();
  const cudaStream_t stream = GpuStream(ctx);
  if (training) {
    const int64_t* c = counts.NumElements() ? counts.flat<int64_t>().data() : nullptr;
    return ToTfNamed(table->find_or_insert(k, n, o, c, stream), res->name());
  }
  return ToTfNamed(table->find(k, n, o, stream), res->name());
}

class GpuGatherOp : public OpKernel {
 public:
  explicit GpuGatherOp(OpKernelConstruction* c) : OpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("dims", &dims_));
    OP_REQUIRES_OK(c, c->GetAttr("training", &training_));
  }

  void Compute(OpKernelContext* ctx) override {
    OpInputList keys, counts;
    OP_REQUIRES_OK(ctx, ctx->input_list("keys", &keys));
    OP_REQUIRES_OK(ctx, ctx->input_list("counts", &counts));
    // Tables one after another: each call only enqueues work on the stream.
    for (int i = 0; i < keys.size(); ++i) {
      Tensor* out;
      OP_REQUIRES_OK(ctx, ctx->allocate_output(i, TensorShape({keys[i].NumElements(), dims_[i]}), &out));
      const ResourceHandle& h = HandleFromInput(ctx, i);
      OP_REQUIRES_OK(ctx, keys[i].dtype() == DT_INT64
                              ? GpuGatherOne<int64_t>(ctx, h, keys[i], counts[i], dims_[i], training_, out)
                              : GpuGatherOne<int32_t>(ctx, h, keys[i], counts[i], dims_[i], training_, out));
    }
  }

 private:
  std::vector<int32_t> dims_;
  bool training_;
};

template <typename K>
class GpuAssignOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    core::RefCountPtr<GpuResource<K>> res;
    OP_REQUIRES_OK(ctx, LookupGpuTable(ctx, HandleFromInput(ctx, 0), &res));
    const Tensor& keys = ctx->input(1);
    const Tensor& values = ctx->input(2);
    auto* table = res->table();
    OP_REQUIRES(ctx,
                values.dims() == 2 && values.dim_size(0) == keys.NumElements() &&
                    values.dim_size(1) == table->dim(),
                errors::InvalidArgument("assign to '", res->name(), "': values of shape ",
                                        values.shape().DebugString(), " for ", keys.NumElements(),
                                        " keys of dimension ", table->dim()));
    OP_REQUIRES_OK(ctx, ToTfNamed(table->insert_or_assign(keys.flat<K>().data(), keys.NumElements(),
                                                          values.flat<float>().data(), GpuStream(ctx)),
                                  res->name()));
  }
};

template <typename K>
Status GpuApplyOne(OpKernelContext* ctx, const ResourceHandle& handle, const Tensor& keys,
                   const Tensor& grads, const sok::OptimizerParams& p, int64_t step, bool keys_unique) {
  core::RefCountPtr<GpuResource<K>> res;
  TF_RETURN_IF_ERROR(LookupGpuTable(ctx, handle, &res));
  auto* table = res->table();
  const int64_t n = keys.NumElements();
  if (grads.dims() != 2 || grads.dim_size(0) != n || grads.dim_size(1) != table->dim()) {
    return errors::InvalidArgument("update of '", res->name(), "': gradient of shape ",
                                   grads.shape().DebugString(), " for ", n, " keys of dimension ",
                                   table->dim());
  }
  return ToTfNamed(table->apply_gradients(keys.flat<K>().data(), n, grads.flat<float>().data(), p, step,
                                          GpuStream(ctx), keys_unique),
                   res->name());
}

class GpuSparseApplyOp : public OpKernel {
 public:
  explicit GpuSparseApplyOp(OpKernelConstruction* c) : OpKernel(c) {
    OP_REQUIRES_OK(c, ParseOptimizerParams(c, &params_, &keys_unique_));
  }

  void Compute(OpKernelContext* ctx) override {
    OpInputList keys, grads;
    OP_REQUIRES_OK(ctx, ctx->input_list("keys", &keys));
    OP_REQUIRES_OK(ctx, ctx->input_list("grads", &grads));
    sok::OptimizerParams p = params_;
    p.lr = ctx->input(3 * keys.size()).scalar<float>()();                 // HostMemory
    const int64_t step = ctx->input(3 * keys.size() + 1).scalar<int64_t>()();  // HostMemory
    p.step = step + 1;
    for (int i = 0; i < keys.size(); ++i) {
      const ResourceHandle& h = HandleFromInput(ctx, i);
      OP_REQUIRES_OK(ctx, keys[i].dtype() == DT_INT64
                              ? GpuApplyOne<int64_t>(ctx, h, keys[i], grads[i], p, step, keys_unique_)
                              : GpuApplyOne<int32_t>(ctx, h, keys[i], grads[i], p, step, keys_unique_));
    }
  }

 private:
  sok::OptimizerParams params_;
  bool keys_unique_ = false;
};

// The GPU table has no shrink of its own: the victims are chosen on the host from an export (the
// CPU table's rule: age over steps_to_live, or value L2 norm under the threshold) and erased on the
// device. Shrinking is rare (checkpoint time), so the full export is acceptable.
template <typename K>
class GpuShrinkOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    core::RefCountPtr<GpuResource<K>> res;
    OP_REQUIRES_OK(ctx, LookupGpuTable(ctx, HandleFromInput(ctx, 0), &res));
    const int64_t global_step = ctx->input(1).scalar<int64_t>()();  // HostMemory
    auto* table = res->table();
    const sok::TableConfig& cfg = table->config();
    const cudaStream_t stream = GpuStream(ctx);
    int64_t removed = 0;
    if (cfg.steps_to_live > 0 || cfg.l2_weight_threshold >= 0.f) {
      sok::TableSnapshot<K> s;
      OP_REQUIRES_OK(ctx, ToTfNamed(table->export_rows(&s, stream), res->name()));
      std::vector<K> victims;
      const int64_t d = s.dim;
      for (size_t row = 0; row < s.keys.size(); ++row) {
        bool evict = cfg.steps_to_live > 0 && global_step - s.versions[row] > cfg.steps_to_live;
        if (!evict && cfg.l2_weight_threshold >= 0.f) {
          double sq = 0;
          const float* v = s.values.data() + row * d;
          for (int64_t c = 0; c < d; ++c) sq += static_cast<double>(v[c]) * v[c];
          evict = std::sqrt(sq) < cfg.l2_weight_threshold;
        }
        if (evict) victims.push_back(s.keys[row]);
      }
      if (!victims.empty()) {
        const int64_t m = static_cast<int64_t>(victims.size());
        Tensor d_victims;
        OP_REQUIRES_OK(ctx, ctx->allocate_temp(DataTypeToEnum<K>::v(), TensorShape({m}), &d_victims));
        OP_REQUIRES_OK(ctx, CudaCall(cudaMemcpyAsync(d_victims.flat<K>().data(), victims.data(), m * sizeof(K),
                                                     cudaMemcpyHostToDevice, stream),
                                     "copying the keys to evict"));
        // With num_erased the erase synchronises the stream, so `victims` outlives the copy.
        OP_REQUIRES_OK(ctx, ToTfNamed(table->erase(d_victims.flat<K>().data(), m, stream, &removed), res->name()));
      }
    }
    Tensor* out;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));  // HostMemory
    out->scalar<int64_t>()() = removed;
  }
};

// Host output `index` holding a copy of v.
template <typename T>
Status HostOutput(OpKernelContext* ctx, int index, const std::vector<T>& v, const TensorShape& shape) {
  Tensor* t;
  TF_RETURN_IF_ERROR(ctx->allocate_output(index, shape, &t));
  std::copy(v.begin(), v.end(), t->flat<T>().data());
  return OkStatus();
}

template <typename K>
class GpuExportOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    core::RefCountPtr<GpuResource<K>> res;
    OP_REQUIRES_OK(ctx, LookupGpuTable(ctx, HandleFromInput(ctx, 0), &res));
    sok::TableSnapshot<K> s;
    OP_REQUIRES_OK(ctx, ToTfNamed(res->table()->export_rows(&s, GpuStream(ctx)), res->name()));
    const int64_t n = static_cast<int64_t>(s.keys.size());
    OP_REQUIRES_OK(ctx, HostOutput(ctx, 0, s.keys, TensorShape({n})));
    OP_REQUIRES_OK(ctx, HostOutput(ctx, 1, s.values, TensorShape({n, s.dim})));
    OP_REQUIRES_OK(ctx, HostOutput(ctx, 2, s.slots, TensorShape({n, s.num_slots, s.dim})));
    OP_REQUIRES_OK(ctx, HostOutput(ctx, 3, s.freqs, TensorShape({n})));
    OP_REQUIRES_OK(ctx, HostOutput(ctx, 4, s.versions, TensorShape({n})));
    OP_REQUIRES_OK(ctx, HostOutput(ctx, 5, std::vector<int32_t>{s.slot_kind}, TensorShape({})));
    OP_REQUIRES_OK(ctx, HostOutput(ctx, 6, s.slot_init,
                                   TensorShape({static_cast<int64_t>(s.slot_init.size())})));
  }
};

template <typename K>
class GpuImportOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    core::RefCountPtr<GpuResource<K>> res;
    OP_REQUIRES_OK(ctx, LookupGpuTable(ctx, HandleFromInput(ctx, 0), &res));
    const Tensor& values = ctx->input(2);  // all HostMemory
    const Tensor& slots = ctx->input(3);
    OP_REQUIRES(ctx, values.dims() == 2 && slots.dims() == 3,
                errors::InvalidArgument("cannot restore '", res->name(),
                                        "': values must be [n, dim] and slots [n, num_slots, dim], got ",
                                        values.shape().DebugString(), " and ", slots.shape().DebugString()));
    sok::TableSnapshot<K> s;
    s.dim = values.dim_size(1);
    s.num_slots = static_cast<int>(slots.dim_size(1));
    OP_REQUIRES(ctx, slots.dim_size(2) == s.dim || slots.NumElements() == 0,
                errors::InvalidArgument("cannot restore '", res->name(), "': slots of shape ",
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
    OP_REQUIRES_OK(ctx, ToTfNamed(res->table()->import_rows(s, GpuStream(ctx)), res->name()));
  }
};

#define SOK_REGISTER_EV_GPU_KERNELS(K)                                                        \
  REGISTER_KERNEL_BUILDER(Name("SokEmbeddingVariableHandle")                                  \
                              .Device(DEVICE_GPU)                                             \
                              .HostMemory("handle")                                           \
                              .TypeConstraint<K>("key_dtype"),                                \
                          ResourceHandleOp<GpuResource<K>>);                                  \
  REGISTER_KERNEL_BUILDER(Name("SokEmbeddingVariableInitialize")                              \
                              .Device(DEVICE_GPU)                                             \
                              .HostMemory("handle")                                           \
                              .HostMemory("init_matrix")                                      \
                              .TypeConstraint<K>("key_dtype"),                                \
                          GpuInitializeOp<K>);                                                \
  REGISTER_KERNEL_BUILDER(Name("SokEmbeddingVariableIsInitialized")                           \
                              .Device(DEVICE_GPU)                                             \
                              .HostMemory("handle")                                           \
                              .HostMemory("is_initialized")                                   \
                              .TypeConstraint<K>("key_dtype"),                                \
                          GpuIsInitializedOp<K>);                                             \
  REGISTER_KERNEL_BUILDER(Name("SokEmbeddingVariableSize")                                    \
                              .Device(DEVICE_GPU)                                             \
                              .HostMemory("handle")                                           \
                              .HostMemory("size")                                             \
                              .TypeConstraint<K>("key_dtype"),                                \
                          GpuSizeOp<K>);                                                      \
  REGISTER_KERNEL_BUILDER(Name("SokEmbeddingVariableAssign")                                  \
                              .Device(DEVICE_GPU)                                             \
                              .HostMemory("handle")                                           \
                              .TypeConstraint<K>("key_dtype"),                                \
                          GpuAssignOp<K>);                                                    \
  REGISTER_KERNEL_BUILDER(Name("SokEmbeddingVariableShrink")                                  \
                              .Device(DEVICE_GPU)                                             \
                              .HostMemory("handle")                                           \
                              .HostMemory("global_step")                                      \
                              .HostMemory("removed")                                          \
                              .TypeConstraint<K>("key_dtype"),                                \
                          GpuShrinkOp<K>);                                                    \
  REGISTER_KERNEL_BUILDER(Name("SokEmbeddingVariableExport")                                  \
                              .Device(DEVICE_GPU)                                             \
                              .HostMemory("handle")                                           \
                              .HostMemory("keys")                                             \
                              .HostMemory("values")                                           \
                              .HostMemory("slots")                                            \
                              .HostMemory("freqs")                                            \
                              .HostMemory("versions")                                         \
                              .HostMemory("slot_kind")                                        \
                              .HostMemory("slot_init")                                        \
                              .TypeConstraint<K>("key_dtype"),                                \
                          GpuExportOp<K>);                                                    \
  REGISTER_KERNEL_BUILDER(Name("SokEmbeddingVariableImport")                                  \
                              .Device(DEVICE_GPU)                                             \
                              .HostMemory("handle")                                           \
                              .HostMemory("keys")                                             \
                              .HostMemory("values")                                           \
                              .HostMemory("slots")                                            \
                              .HostMemory("freqs")                                            \
                              .HostMemory("versions")                                         \
                              .HostMemory("slot_kind")                                        \
                              .HostMemory("slot_init")                                        \
                              .TypeConstraint<K>("key_dtype"),                                \
                          GpuImportOp<K>);

SOK_REGISTER_EV_GPU_KERNELS(int32_t)
SOK_REGISTER_EV_GPU_KERNELS(int64_t)
#undef SOK_REGISTER_EV_GPU_KERNELS

REGISTER_KERNEL_BUILDER(Name("SokEmbeddingVariableGather").Device(DEVICE_GPU).HostMemory("handles"),
                        GpuGatherOp);
REGISTER_KERNEL_BUILDER(Name("SokEmbeddingVariableSparseApply")
                            .Device(DEVICE_GPU)
                            .HostMemory("handles")
                            .HostMemory("learning_rate")
                            .HostMemory("global_step"),
                        GpuSparseApplyOp);

}  // namespace
}  // namespace sok_kernels
}  // namespace tensorflow

#endif  // GOOGLE_CUDA
