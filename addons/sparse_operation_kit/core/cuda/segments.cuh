// Internal: Segments (gpu_api.h) -> a CSR view, shared by the pooled forward and backward.
// row_splits are used as they are; segment ids are counted into row splits plus, for unsorted (or
// partly invalid) segment ids, a permutation that lists the ids of each sample. The choice is
// made on the device (a flag), so no host round trip is needed.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "addons/sparse_operation_kit/core/cuda/gpu_api.h"
#include "addons/sparse_operation_kit/core/cuda/runtime.h"

namespace sok {
namespace gpu {
namespace detail {

struct CsrView {
  const int64_t* splits = nullptr;  // [batch + 1]
  const int64_t* perm = nullptr;    // [n], used when *use_perm != 0
  const int* use_perm = nullptr;
  int64_t n = 0;

  __device__ __forceinline__ void range(int64_t b, int64_t* a, int64_t* e) const {
    int64_t x = splits[b], y = splits[b + 1];
    x = x < 0 ? 0 : (x > n ? n : x);
    y = y < x ? x : (y > n ? n : y);
    *a = x;
    *e = y;
  }
  __device__ __forceinline__ bool permuted() const { return use_perm != nullptr && *use_perm != 0; }
};

__device__ __forceinline__ int64_t id_at(const CsrView& v, bool permuted, int64_t j) {
  return permuted ? v.perm[j] : j;
}

// Owns the temporaries of a CSR view built from segment ids.
struct CsrHolder {
  Temp tmp;
  CsrView view;
};

// Bad segment ids are reported through err (optional) and left out of the view.
Status build_csr(const Segments& seg, int64_t n, int64_t batch, GpuLookupError* err, cudaStream_t s,
                 DeviceAllocator* alloc, CsrHolder* h);

}  // namespace detail
}  // namespace gpu
}  // namespace sok
