// Internal host helpers of the CUDA core (not part of the public API): CUDA error macros, launch
// sizes, scoped temporaries and the workspace carver.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "addons/sparse_operation_kit/core/cuda/gpu_api.h"

namespace sok {
namespace gpu {
namespace detail {

// Returns a Status from the enclosing function on a CUDA error.
#define SOK_CUDA_RETURN(expr)                                                              \
  do {                                                                                     \
    cudaError_t sok_e_ = (expr);                                                           \
    if (sok_e_ != cudaSuccess)                                                             \
      return ::sok::gpu::cuda_status(sok_e_, #expr " at " __FILE__ ":" SOK_STR(__LINE__)); \
  } while (0)
#define SOK_STR2(x) #x
#define SOK_STR(x) SOK_STR2(x)
// After a kernel launch.
#define SOK_LAUNCH_CHECK() SOK_CUDA_RETURN(cudaGetLastError())
#define SOK_RETURN_IF_ERROR(expr)    \
  do {                               \
    ::sok::Status sok_s_ = (expr);   \
    if (!sok_s_.ok()) return sok_s_; \
  } while (0)

// Threads per block of the one-thread-per-item kernels.
constexpr int kBlock = 256;

// Kernel parameters CUDA passes (12.1 and later, Volta and later GPUs; this library needs a CUDA
// 13 driver): the multi-table launches carry their tables' arguments in one parameter.
constexpr size_t kMaxKernelParamBytes = 32764;

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

inline int grid_for(int64_t threads, int block) {
  int64_t g = ceil_div(threads, block);
  if (g < 1) g = 1;
  if (g > 2147483647LL) g = 2147483647;
  return static_cast<int>(g);
}

// Bits to represent values in [0, max_value] (the key width of a radix sort).
inline int bits_for(uint64_t max_value) {
  int b = 1;
  while (b < 64 && (max_value >> b) != 0) ++b;
  return b;
}

// Scoped temporary from a DeviceAllocator, freed on the same stream.
class Temp {
 public:
  Temp() = default;
  Temp(const Temp&) = delete;
  Temp& operator=(const Temp&) = delete;
  ~Temp() {
    if (p_ != nullptr) a_->deallocate(p_, bytes_, s_);
  }
  Status alloc(DeviceAllocator* a, size_t bytes, cudaStream_t s) {
    a_ = a ? a : default_allocator();
    s_ = s;
    bytes_ = bytes < 16 ? 16 : bytes;
    p_ = a_->allocate(bytes_, s);
    if (p_ == nullptr)
      return Status::Invalid("GPU temporary allocation of " + std::to_string(bytes) +
                             " bytes failed");
    return Status::OK();
  }
  template <typename T>
  T* as() const {
    return static_cast<T*>(p_);
  }
  size_t bytes() const { return bytes_; }

 private:
  DeviceAllocator* a_ = nullptr;
  void* p_ = nullptr;
  size_t bytes_ = 0;
  cudaStream_t s_ = nullptr;
};

// Cuts typed sub-buffers, each starting on a 256-byte boundary, out of one workspace. Without a
// base it only adds up the size, so one function can both size and carve a workspace (see
// carve_temp).
class Workspace {
 public:
  static constexpr size_t kAlign = 256;
  explicit Workspace(void* base = nullptr) : base_(static_cast<char*>(base)) {}
  // `count` objects of T.
  template <typename T>
  T* take(size_t count) {
    return static_cast<T*>(take_bytes(count * sizeof(T)));
  }
  void* take_bytes(size_t bytes) {
    char* p = base_ == nullptr ? nullptr : base_ + used_;
    used_ += (bytes + kAlign - 1) & ~(kAlign - 1);
    return p;
  }
  size_t bytes() const { return used_; }

 private:
  char* base_;
  size_t used_ = 0;
};

// Allocates `tmp` just large enough for what carve(Workspace&) takes, then calls carve again on
// the allocation, so it can assign its pointers.
template <typename Carve>
Status carve_temp(DeviceAllocator* alloc, cudaStream_t stream, Temp* tmp, Carve&& carve) {
  Workspace sizing;
  carve(sizing);
  SOK_RETURN_IF_ERROR(tmp->alloc(alloc, sizing.bytes(), stream));
  Workspace ws(tmp->as<void>());
  carve(ws);
  return Status::OK();
}

}  // namespace detail
}  // namespace gpu
}  // namespace sok
