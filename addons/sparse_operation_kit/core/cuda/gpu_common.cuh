// Internal helpers of the CUDA core (not part of the public API).
#pragma once

#include <cuda_runtime.h>

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
#define SOK_RETURN_IF_ERROR(expr)      \
  do {                                 \
    ::sok::Status sok_s_ = (expr);     \
    if (!sok_s_.ok()) return sok_s_;   \
  } while (0)

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

inline int grid_for(int64_t threads, int block) {
  int64_t g = ceil_div(threads, block);
  if (g < 1) g = 1;
  if (g > 2147483647LL) g = 2147483647;
  return static_cast<int>(g);
}

// Device-side count: min(n, *d_n) when d_n is given.
__device__ __forceinline__ int64_t effective_n(int64_t n, const int64_t* d_n) {
  if (d_n == nullptr) return n;
  const int64_t m = *d_n;
  return m < n ? m : n;
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
      return Status::Invalid("GPU temporary allocation of " + std::to_string(bytes) + " bytes failed");
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

// Loads that bypass L1 (coherent at L2), for data other blocks may be writing.
__device__ __forceinline__ uint32_t ld_acquire_u32(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ uint32_t ld_relaxed_u32(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ int64_t ld_relaxed_i64(const int64_t* p) {
  int64_t v;
  asm volatile("ld.relaxed.gpu.global.s64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

// Records an error; the lowest (position, kind) wins. finalize_error() fills position/value/kind.
__device__ __forceinline__ void report_error(GpuLookupError* err, int64_t position, int64_t kind) {
  if (err == nullptr) return;
  atomicMin(reinterpret_cast<unsigned long long*>(&err->packed),
            (static_cast<unsigned long long>(position) << 3) | static_cast<unsigned long long>(kind));
}

}  // namespace detail
}  // namespace gpu
}  // namespace sok
