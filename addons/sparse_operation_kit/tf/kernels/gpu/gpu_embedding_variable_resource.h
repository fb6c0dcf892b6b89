// The Embedding Variable on a GPU device: a TensorFlow resource that owns a core GpuEmbeddingTable,
// plus the little glue every GPU kernel needs (the op's CUDA stream, TF's allocator for the
// core's temporaries, Status conversion). Built only with GOOGLE_CUDA (tests/gpu/compile_check.sh,
// tools/build_gpu_ops.sh); the Bazel CPU build does not compile this directory.
#pragma once

#if GOOGLE_CUDA

#include <cuda_runtime_api.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "addons/sparse_operation_kit/core/cuda/gpu_api.h"
#include "addons/sparse_operation_kit/core/lookup.h"
#include "addons/sparse_operation_kit/core/table_config.h"
#include "addons/sparse_operation_kit/tf/kernels/embedding_variable_resource.h"
#include "tensorflow/core/framework/allocator.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"

namespace tensorflow {
namespace sok_kernels {

// The op's CUDA stream (TF's compute stream of the device): every core call is ordered on it.
inline cudaStream_t GpuStream(OpKernelContext* ctx) { return ctx->eigen_gpu_device().stream(); }

// TF's device allocator as the core's DeviceAllocator. Freeing right away is safe because every
// user of the memory runs on the same compute stream (TF's own model for GPU temporaries).
class TfDeviceAllocator : public sok::gpu::DeviceAllocator {
 public:
  explicit TfDeviceAllocator(Allocator* a) : a_(a) {}
  void* allocate(size_t bytes, cudaStream_t) override {
    return a_->AllocateRaw(Allocator::kAllocatorAlignment, bytes);
  }
  void deallocate(void* p, size_t, cudaStream_t) override { a_->DeallocateRaw(p); }

 private:
  Allocator* a_;
};

// Makes the stream's device current for a scope (TF normally has it current already; the table
// is created on the device current at Create()).
class ScopedStreamDevice {
 public:
  explicit ScopedStreamDevice(cudaStream_t stream) {
#if CUDART_VERSION >= 12080
    int dev = -1;
    if (cudaStreamGetDevice(stream, &dev) == cudaSuccess && cudaGetDevice(&prev_) == cudaSuccess &&
        dev != prev_) {
      restore_ = cudaSetDevice(dev) == cudaSuccess;
    }
    cudaGetLastError();  // a failed query must not leak into the next CUDA error check
#endif
  }
  ~ScopedStreamDevice() {
    if (restore_) cudaSetDevice(prev_);
  }
  ScopedStreamDevice(const ScopedStreamDevice&) = delete;
  ScopedStreamDevice& operator=(const ScopedStreamDevice&) = delete;

 private:
  int prev_ = -1;
  bool restore_ = false;
};

// A core error, named after the table it concerns (as the CPU kernels' messages are).
inline Status ToTfNamed(const sok::Status& s, const std::string& table) {
  if (s.ok()) return OkStatus();
  return errors::InvalidArgument("Embedding Variable '", table, "': ", s.message());
}

template <typename K>
class GpuEmbeddingVariableResource : public ResourceBase {
 public:
  // Creates the table on the device of `stream`; its later temporaries come from `device_alloc`
  // (the device's allocator, which lives as long as the process).
  static Status Create(const sok::TableConfig& config, Allocator* device_alloc, cudaStream_t stream,
                       GpuEmbeddingVariableResource** out) {
    auto* r = new GpuEmbeddingVariableResource(device_alloc);
    sok::gpu::GpuTableOptions options;
    options.allocator = &r->alloc_;
    ScopedStreamDevice device(stream);
    Status s = ToTfNamed(sok::gpu::GpuEmbeddingTable<K>::Create(config, options, &r->table_), config.name);
    if (!s.ok()) {
      r->Unref();  // ref-counted: never deleted directly
      return s;
    }
    *out = r;
    return OkStatus();
  }
  std::string DebugString() const override {
    return table_ ? "GPU EmbeddingVariable '" + table_->config().name + "'" : "GPU EmbeddingVariable (not created)";
  }
  sok::gpu::GpuEmbeddingTable<K>* table() { return table_.get(); }
  const std::string& name() const { return table_->config().name; }

 private:
  explicit GpuEmbeddingVariableResource(Allocator* a) : alloc_(a) {}
  TfDeviceAllocator alloc_;  // declared first: outlives the table
  std::unique_ptr<sok::gpu::GpuEmbeddingTable<K>> table_;
};

// LookupTable (embedding_variable_resource.h) for the GPU resource.
template <typename K>
Status LookupGpuTable(OpKernelContext* ctx, const ResourceHandle& handle,
                      core::RefCountPtr<GpuEmbeddingVariableResource<K>>* out) {
  Status s = LookupResource(ctx, handle, out);
  if (!s.ok()) {
    return errors::FailedPrecondition("Embedding Variable '", handle.name(),
                                      "' is not initialized on this GPU, or its key dtype is not ",
                                      DataTypeString(DataTypeToEnum<K>::v()),
                                      " (run its initializer first): ", s.message());
  }
  return OkStatus();
}

// A CUDA runtime error of the glue's own calls (copies, synchronisation).
inline Status CudaCall(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return OkStatus();
  return errors::Internal("CUDA error in ", what, ": ", cudaGetErrorName(e), " (", cudaGetErrorString(e), ")");
}

}  // namespace sok_kernels
}  // namespace tensorflow

#endif  // GOOGLE_CUDA
