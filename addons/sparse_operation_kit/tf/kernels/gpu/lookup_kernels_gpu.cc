// GPU kernels of the lookup steps (tf/ops/lookup_ops.cc): dedup and pooled combine, forward and
// backward, over the CUDA core (core/cuda/gpu_api.h) on the op's stream. Same layouts as the CPU
// kernels: ids of table i belong to sample segment_ids_i[j] and read row inverse_i[j].
#if GOOGLE_CUDA

#ifndef EIGEN_USE_GPU
#define EIGEN_USE_GPU
#endif

#include <string>
#include <vector>

#include "addons/sparse_operation_kit/tf/kernels/gpu/gpu_embedding_variable_resource.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"

namespace tensorflow {
namespace sok_kernels {
namespace {

// Device scratch for `count` objects of T (kept as int64 words so that it is 8-byte aligned).
template <typename T>
Status DeviceScratch(OpKernelContext* ctx, int64_t count, Tensor* t, T** out) {
  const int64_t words = (count * static_cast<int64_t>(sizeof(T)) + 7) / 8;
  TF_RETURN_IF_ERROR(ctx->allocate_temp(DT_INT64, TensorShape({words > 0 ? words : 1}), t));
  *out = reinterpret_cast<T*>(t->flat<int64_t>().data());
  return OkStatus();
}

// The outputs' sizes (number of distinct keys) are only known on the device once the dedup ran,
// and TensorFlow must know an output's shape when allocating it. So every table is deduplicated
// into n-sized scratch, the N device counts are read back with ONE synchronisation, and the
// outputs are allocated and filled by device-to-device copies. (The inverse output has the
// input's size and is written directly.)
class GpuUniqueKeysOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    OpInputList keys;
    OP_REQUIRES_OK(ctx, ctx->input_list("keys", &keys));
    const int n = keys.size();
    const cudaStream_t stream = GpuStream(ctx);
    TfDeviceAllocator alloc(ctx->get_allocator(AllocatorAttributes()));
    Tensor num_unique_t;
    int64_t* d_num_unique;
    OP_REQUIRES_OK(ctx, DeviceScratch(ctx, n, &num_unique_t, &d_num_unique));
    std::vector<Tensor> uniq(n), counts(n);
    for (int i = 0; i < n; ++i) {
      const Tensor& k = keys[i];
      const int64_t m = k.NumElements();
      Tensor* inverse;
      OP_REQUIRES_OK(ctx, ctx->allocate_output(n + i, TensorShape({m}), &inverse));
      OP_REQUIRES_OK(ctx, ctx->allocate_temp(k.dtype(), TensorShape({m}), &uniq[i]));
      OP_REQUIRES_OK(ctx, ctx->allocate_temp(DT_INT64, TensorShape({m}), &counts[i]));
      sok::Status s =
          k.dtype() == DT_INT64
              ? sok::gpu::unique_keys(k.flat<int64_t>().data(), m, uniq[i].flat<int64_t>().data(),
                                      inverse->flat<int32_t>().data(), counts[i].flat<int64_t>().data(),
                                      d_num_unique + i, stream, &alloc)
              : sok::gpu::unique_keys(k.flat<int32_t>().data(), m, uniq[i].flat<int32_t>().data(),
                                      inverse->flat<int32_t>().data(), counts[i].flat<int64_t>().data(),
                                      d_num_unique + i, stream, &alloc);
      OP_REQUIRES_OK(ctx, ToTf(s));
    }
    std::vector<int64_t> num_unique(n);
    OP_REQUIRES_OK(ctx, CudaCall(cudaMemcpyAsync(num_unique.data(), d_num_unique, n * sizeof(int64_t),
                                                 cudaMemcpyDeviceToHost, stream),
                                 "reading the number of distinct keys"));
    OP_REQUIRES_OK(ctx, CudaCall(cudaStreamSynchronize(stream), "reading the number of distinct keys"));
    for (int i = 0; i < n; ++i) {
      const int64_t u = num_unique[i];
      Tensor *uo, *co;
      OP_REQUIRES_OK(ctx, ctx->allocate_output(i, TensorShape({u}), &uo));
      OP_REQUIRES_OK(ctx, ctx->allocate_output(2 * n + i, TensorShape({u}), &co));
      if (u == 0) continue;
      const size_t key_bytes = u * DataTypeSize(uniq[i].dtype());
      OP_REQUIRES_OK(ctx, CudaCall(cudaMemcpyAsync(uo->data(), uniq[i].data(), key_bytes,
                                                   cudaMemcpyDeviceToDevice, stream),
                                   "copying the distinct keys"));
      OP_REQUIRES_OK(ctx, CudaCall(cudaMemcpyAsync(co->data(), counts[i].data(), u * sizeof(int64_t),
                                                   cudaMemcpyDeviceToDevice, stream),
                                   "copying the key counts"));
    }
  }
};

class GpuPooledCombineOp : public OpKernel {
 public:
  explicit GpuPooledCombineOp(OpKernelConstruction* c) : OpKernel(c) {
    int n;
    OP_REQUIRES_OK(c, c->GetAttr("N", &n));
    OP_REQUIRES_OK(c, ParseCombiners(c, n, &combiners_));
    OP_REQUIRES_OK(c, c->GetAttr("table_names", &names_));
    OP_REQUIRES(c, static_cast<int>(names_.size()) == n,
                errors::InvalidArgument(names_.size(), " table names for ", n, " tables"));
  }

  void Compute(OpKernelContext* ctx) override {
    OpInputList rows, inverse, segments, weights;
    OP_REQUIRES_OK(ctx, ctx->input_list("rows", &rows));
    OP_REQUIRES_OK(ctx, ctx->input_list("inverse", &inverse));
    OP_REQUIRES_OK(ctx, ctx->input_list("segment_ids", &segments));
    OP_REQUIRES_OK(ctx, ctx->input_list("weights", &weights));
    const Tensor& batch_sizes = ctx->input(4 * rows.size());  // HostMemory
    const int n = rows.size();
    OP_REQUIRES(ctx, batch_sizes.NumElements() == n,
                errors::InvalidArgument(batch_sizes.NumElements(), " batch sizes for ", n, " tables"));
    const cudaStream_t stream = GpuStream(ctx);
    TfDeviceAllocator alloc(ctx->get_allocator(AllocatorAttributes()));
    // One bad-index record per table, checked after every table's work is enqueued.
    Tensor err_t;
    sok::gpu::GpuLookupError* d_err;
    OP_REQUIRES_OK(ctx, DeviceScratch(ctx, n, &err_t, &d_err));
    for (int i = 0; i < n; ++i) {
      const int64_t m = inverse[i].NumElements();
      OP_REQUIRES(ctx, rows[i].dims() == 2,
                  errors::InvalidArgument("rows of table '", names_[i], "' must be a matrix"));
      OP_REQUIRES(ctx, segments[i].NumElements() == m,
                  errors::InvalidArgument("table '", names_[i], "': ", segments[i].NumElements(),
                                          " sample indices for ", m, " ids"));
      OP_REQUIRES(ctx, weights[i].NumElements() == 0 || weights[i].NumElements() == m,
                  errors::InvalidArgument("table '", names_[i], "': ", weights[i].NumElements(),
                                          " weights for ", m, " ids"));
      const int64_t b = batch_sizes.flat<int64_t>()(i);
      OP_REQUIRES(ctx, b >= 0, errors::InvalidArgument("table '", names_[i], "': batch size ", b));
      Tensor* out;
      OP_REQUIRES_OK(ctx, ctx->allocate_output(i, TensorShape({b, rows[i].dim_size(1)}), &out));
      sok::gpu::Segments seg;
      seg.segment_ids = segments[i].flat<int64_t>().data();
      OP_REQUIRES_OK(ctx, ToTf(sok::gpu::reset_lookup_error(d_err + i, stream)));
      OP_REQUIRES_OK(ctx, ToTf(sok::gpu::pooled_forward(
                              rows[i].flat<float>().data(), rows[i].dim_size(1), rows[i].dim_size(0),
                              inverse[i].flat<int32_t>().data(), seg,
                              weights[i].NumElements() ? weights[i].flat<float>().data() : nullptr, m, b,
                              combiners_[i], out->flat<float>().data(), stream, d_err + i, &alloc)));
    }
    // Bad sample indices or rows are skipped on the device and reported here, naming the table
    // (the first check synchronises the stream once; the others only read back).
    for (int i = 0; i < n; ++i) {
      OP_REQUIRES_OK(ctx, ToTf(sok::gpu::check_lookup_error(d_err + i, "lookup of table '" + names_[i] + "'",
                                                            stream)));
    }
  }

 private:
  std::vector<sok::Combiner> combiners_;
  std::vector<std::string> names_;
};

// Bad indices are skipped by the core's backward (never read or written out of bounds); the op
// has no table names and the core's pooled_backward no error record, so they are not reported
// here (the forward of the same ids reports them).
class GpuPooledCombineGradOp : public OpKernel {
 public:
  explicit GpuPooledCombineGradOp(OpKernelConstruction* c) : OpKernel(c) {
    int n;
    OP_REQUIRES_OK(c, c->GetAttr("N", &n));
    OP_REQUIRES_OK(c, ParseCombiners(c, n, &combiners_));
  }

  void Compute(OpKernelContext* ctx) override {
    OpInputList grads, inverse, segments, weights;
    OP_REQUIRES_OK(ctx, ctx->input_list("grads", &grads));
    OP_REQUIRES_OK(ctx, ctx->input_list("inverse", &inverse));
    OP_REQUIRES_OK(ctx, ctx->input_list("segment_ids", &segments));
    OP_REQUIRES_OK(ctx, ctx->input_list("weights", &weights));
    const Tensor& num_rows = ctx->input(4 * grads.size());  // HostMemory
    const int n = grads.size();
    OP_REQUIRES(ctx, num_rows.NumElements() == n,
                errors::InvalidArgument(num_rows.NumElements(), " row counts for ", n, " tables"));
    const cudaStream_t stream = GpuStream(ctx);
    TfDeviceAllocator alloc(ctx->get_allocator(AllocatorAttributes()));
    for (int i = 0; i < n; ++i) {
      const int64_t m = inverse[i].NumElements();
      OP_REQUIRES(ctx, segments[i].NumElements() == m && (weights[i].NumElements() == 0 || weights[i].NumElements() == m),
                  errors::InvalidArgument("pooled-combine gradient of table ", i, ": ", segments[i].NumElements(),
                                          " sample indices and ", weights[i].NumElements(), " weights for ", m,
                                          " ids"));
      const int64_t r = num_rows.flat<int64_t>()(i);
      OP_REQUIRES(ctx, r >= 0, errors::InvalidArgument("pooled-combine gradient of table ", i, ": ", r, " rows"));
      Tensor* out;
      OP_REQUIRES_OK(ctx, ctx->allocate_output(i, TensorShape({r, grads[i].dim_size(1)}), &out));
      sok::gpu::Segments seg;
      seg.segment_ids = segments[i].flat<int64_t>().data();
      OP_REQUIRES_OK(ctx, ToTf(sok::gpu::pooled_backward(
                              grads[i].flat<float>().data(), grads[i].dim_size(1), inverse[i].flat<int32_t>().data(),
                              seg, weights[i].NumElements() ? weights[i].flat<float>().data() : nullptr, m,
                              grads[i].dim_size(0), combiners_[i], r, nullptr, out->flat<float>().data(), stream,
                              &alloc)));
    }
  }

 private:
  std::vector<sok::Combiner> combiners_;
};

REGISTER_KERNEL_BUILDER(Name("SokUniqueKeys").Device(DEVICE_GPU), GpuUniqueKeysOp);
REGISTER_KERNEL_BUILDER(Name("SokPooledCombine").Device(DEVICE_GPU).HostMemory("batch_sizes"),
                        GpuPooledCombineOp);
REGISTER_KERNEL_BUILDER(Name("SokPooledCombineGrad").Device(DEVICE_GPU).HostMemory("num_rows"),
                        GpuPooledCombineGradOp);

}  // namespace
}  // namespace sok_kernels
}  // namespace tensorflow

#endif  // GOOGLE_CUDA
