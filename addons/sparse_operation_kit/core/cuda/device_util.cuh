// Internal device helpers of the CUDA core (not part of the public API).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "addons/sparse_operation_kit/core/cuda/gpu_api.h"

namespace sok {
namespace gpu {
namespace detail {

// Device-side count: min(n, *d_n) when d_n is given.
__device__ __forceinline__ int64_t effective_n(int64_t n, const int64_t* d_n) {
  if (d_n == nullptr) return n;
  const int64_t m = *d_n;
  return m < n ? m : n;
}

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
  atomicMin(
      reinterpret_cast<unsigned long long*>(&err->packed),
      (static_cast<unsigned long long>(position) << 3) | static_cast<unsigned long long>(kind));
}

// VEC consecutive floats of a row (VEC = 4: one float4 load/store; VEC = 1: one float).
template <int VEC>
struct Vec {
  float v[VEC];
};

template <int VEC>
__device__ __forceinline__ Vec<VEC> load_vec(const float* p) {
  Vec<VEC> r;
  if constexpr (VEC == 4) {
    const float4 x = __ldg(reinterpret_cast<const float4*>(p));
    r.v[0] = x.x;
    r.v[1] = x.y;
    r.v[2] = x.z;
    r.v[3] = x.w;
  } else {
    r.v[0] = __ldg(p);
  }
  return r;
}

template <int VEC>
__device__ __forceinline__ void store_vec(float* p, const float* v) {
  if constexpr (VEC == 4) {
    *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
  } else {
    p[0] = v[0];
  }
}

}  // namespace detail
}  // namespace gpu
}  // namespace sok
