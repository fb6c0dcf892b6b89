// key_routing.h: owner bucketing (a stable radix sort of owner ranks; keys past the device count
// sort last) and the gathers / scatters.
#include <cuda_runtime.h>

#include <cub/device/device_radix_sort.cuh>

#include "addons/sparse_operation_kit/core/common.h"
#include "addons/sparse_operation_kit/core/cuda/device_util.cuh"
#include "addons/sparse_operation_kit/core/cuda/runtime.h"
#include "harness/gpu/key_routing.h"

namespace sok {
namespace harness {

using namespace gpu::detail;  // NOLINT

namespace {
// Owner ranks; counts per rank aggregated per block in shared memory (world <= 256) so the few
// rank counters see one atomic per block.
template <typename K>
__global__ void
__launch_bounds__(256) k_owner(const K* keys, int64_t n, const int64_t* d_n, int world,
                                               uint32_t* owner, int64_t* idx, int64_t* counts) {
  __shared__ unsigned s_cnt[256];
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t m = effective_n(n, d_n);
  const bool in = i < n;
  const bool valid = i < m;
  const uint32_t o = valid ? static_cast<uint32_t>(floor_mod(keys[i], world)) : static_cast<uint32_t>(world);
  if (in) {
    owner[i] = o;
    idx[i] = i;
  }
  const bool small = world <= 256;
  if (small) {
    s_cnt[threadIdx.x] = 0;
    __syncthreads();
  }
  const unsigned active = __ballot_sync(0xffffffffu, valid);
  if (valid) {
    const unsigned peers = __match_any_sync(active, o);
    if ((threadIdx.x & 31) == __ffs(peers) - 1) {
      if (small) atomicAdd(&s_cnt[o], static_cast<unsigned>(__popc(peers)));
      else atomicAdd(reinterpret_cast<unsigned long long*>(counts + o), static_cast<unsigned long long>(__popc(peers)));
    }
  }
  if (small) {
    __syncthreads();
    if (threadIdx.x < world && s_cnt[threadIdx.x] != 0)
      atomicAdd(reinterpret_cast<unsigned long long*>(counts + threadIdx.x),
                static_cast<unsigned long long>(s_cnt[threadIdx.x]));
  }
}
}  // namespace

template <typename K>
Status bucketize_by_owner(const K* keys, int64_t n, const int64_t* d_n, int world_size,
                          int64_t* order, int64_t* counts, cudaStream_t stream,
                          DeviceAllocator* alloc) {
  if (world_size <= 0) return Status::Invalid("bucketize_by_owner: world_size must be positive");
  SOK_CUDA_RETURN(cudaMemsetAsync(counts, 0, sizeof(int64_t) * world_size, stream));
  if (n <= 0) return Status::OK();
  if (n >= (int64_t{1} << 31)) return Status::Invalid("bucketize_by_owner: too many keys");
  const int bits = bits_for(static_cast<uint64_t>(world_size));
  size_t sort_bytes = 0;
  SOK_CUDA_RETURN(cub::DeviceRadixSort::SortPairs(
      nullptr, sort_bytes, static_cast<uint32_t*>(nullptr), static_cast<uint32_t*>(nullptr),
      static_cast<int64_t*>(nullptr), static_cast<int64_t*>(nullptr), static_cast<int>(n), 0, bits, stream));
  uint32_t *own_in, *own_out;
  int64_t* idx;
  void* sort_tmp;
  Temp tmp;
  SOK_RETURN_IF_ERROR(carve_temp(alloc, stream, &tmp, [&](Workspace& ws) {
    own_in = ws.take<uint32_t>(n);
    own_out = ws.take<uint32_t>(n);
    idx = ws.take<int64_t>(n);
    sort_tmp = ws.take_bytes(sort_bytes);
  }));
  k_owner<K><<<grid_for(n, kBlock), kBlock, 0, stream>>>(keys, n, d_n, world_size, own_in, idx, counts);
  SOK_LAUNCH_CHECK();
  SOK_CUDA_RETURN(cub::DeviceRadixSort::SortPairs(sort_tmp, sort_bytes, own_in, own_out, idx, order,
                                                  static_cast<int>(n), 0, bits, stream));
  return Status::OK();
}

// ------------------------------------------------------------------------------------------------
// gather / scatter helpers.

namespace {
template <typename T>
__global__ void k_gather(const T* src, const int64_t* index, int64_t n, const int64_t* d_n, T* dst) {
  const int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (j < effective_n(n, d_n)) dst[j] = src[index[j]];
}

// One L-lane group per row; vectorised when dim % 4 == 0.
template <bool kScatter>
__global__ void k_move_rows(const float* src, int64_t dim, const int64_t* index, int64_t n,
                            const int64_t* d_n, float* dst) {
  constexpr int L = 8;
  const int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t j = t / L;
  const int l = static_cast<int>(t % L);
  if (j >= effective_n(n, d_n)) return;
  const int64_t r = index[j];
  const float* s = src + (kScatter ? j : r) * dim;
  float* d = dst + (kScatter ? r : j) * dim;
  if ((dim & 3) == 0) {
    for (int64_t c = 4 * l; c < dim; c += 4 * L)
      *reinterpret_cast<float4*>(d + c) = *reinterpret_cast<const float4*>(s + c);
  } else {
    for (int64_t c = l; c < dim; c += L) d[c] = s[c];
  }
}
}  // namespace

template <typename T>
Status gather(const T* src, const int64_t* index, int64_t n, const int64_t* d_n, T* dst,
              cudaStream_t stream) {
  if (n <= 0) return Status::OK();
  k_gather<T><<<grid_for(n, kBlock), kBlock, 0, stream>>>(src, index, n, d_n, dst);
  SOK_LAUNCH_CHECK();
  return Status::OK();
}

Status gather_rows(const float* src, int64_t dim, const int64_t* index, int64_t n,
                   const int64_t* d_n, float* dst, cudaStream_t stream) {
  if (n <= 0 || dim <= 0) return Status::OK();
  k_move_rows<false><<<grid_for(n * 8, kBlock), kBlock, 0, stream>>>(src, dim, index, n, d_n, dst);
  SOK_LAUNCH_CHECK();
  return Status::OK();
}

Status scatter_rows(const float* src, int64_t dim, const int64_t* index, int64_t n,
                    const int64_t* d_n, float* dst, cudaStream_t stream) {
  if (n <= 0 || dim <= 0) return Status::OK();
  k_move_rows<true><<<grid_for(n * 8, kBlock), kBlock, 0, stream>>>(src, dim, index, n, d_n, dst);
  SOK_LAUNCH_CHECK();
  return Status::OK();
}

template Status bucketize_by_owner<int32_t>(const int32_t*, int64_t, const int64_t*, int, int64_t*,
                                            int64_t*, cudaStream_t, DeviceAllocator*);
template Status bucketize_by_owner<int64_t>(const int64_t*, int64_t, const int64_t*, int, int64_t*,
                                            int64_t*, cudaStream_t, DeviceAllocator*);
template Status gather<int32_t>(const int32_t*, const int64_t*, int64_t, const int64_t*, int32_t*, cudaStream_t);
template Status gather<int64_t>(const int64_t*, const int64_t*, int64_t, const int64_t*, int64_t*, cudaStream_t);

}  // namespace harness
}  // namespace sok
