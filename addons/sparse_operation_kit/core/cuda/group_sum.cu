// sum_rows_by_group (group_sum.h): stable radix sort of (group, id), then fixed chunks of kChunk
// sorted ids; a group inside one chunk is written directly, a group crossing chunks leaves one
// partial per chunk, summed in order afterwards.
#include <cuda_runtime.h>

#include <cub/device/device_radix_sort.cuh>

#include "addons/sparse_operation_kit/core/cuda/device_util.cuh"
#include "addons/sparse_operation_kit/core/cuda/group_sum.h"
#include "addons/sparse_operation_kit/core/cuda/runtime.h"

namespace sok {
namespace gpu {
namespace detail {
namespace {

constexpr int kChunk = 64;

__global__ void k_group_prep(const int32_t* group, const int64_t* src_row, int64_t num_src_rows,
                             int64_t n, int64_t G, uint32_t* keys, int32_t* vals) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const int64_t g = group[i];
  bool valid = g >= 0 && g < G;
  if (valid && src_row != nullptr) {
    const int64_t r = src_row[i];
    valid = r >= 0 && (num_src_rows <= 0 || r < num_src_rows);
  }
  keys[i] = valid ? static_cast<uint32_t>(g) : static_cast<uint32_t>(G);
  vals[i] = static_cast<int32_t>(i);
}

__global__ void k_group_bounds(const uint32_t* keys, int64_t n, int64_t G, int32_t* start,
                               int32_t* end, int64_t* nvalid) {
  const int64_t p = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (p >= n) return;
  const uint32_t g = keys[p];
  if (g >= G) return;
  if (p == 0 || keys[p - 1] != g) start[g] = static_cast<int32_t>(p);
  if (p == n - 1 || keys[p + 1] != g) end[g] = static_cast<int32_t>(p + 1);
  if (p == n - 1 || keys[p + 1] >= G) *nvalid = p + 1;  // valid ids form a prefix (G sorts last)
}

struct GroupSrc {
  const float* src;
  const int64_t* src_row;
  const float* weights;
  const float* scale;
  int64_t dim;
  __device__ __forceinline__ void at(int32_t i, int64_t* row, float* w) const {
    const int64_t r = src_row ? src_row[i] : static_cast<int64_t>(i);
    float x = weights ? weights[i] : 1.f;
    if (scale) x *= scale[r];
    *w = x;
    *row = r;
  }
};

// One L-lane tile per chunk of kChunk sorted ids. The chunk's (group, source row, weight) are
// staged in shared memory first (coalesced loads, no dependent index loads in the sum loop), then
// rows are loaded 4 at a time across group boundaries and summed in id order. A group that lies
// in the chunk is written to out; one that began earlier leaves partial [2c], one that goes on
// leaves partial [2c+1] and is listed for the fixup.
template <int L, int VEC>
__global__ void
__launch_bounds__(256) k_group_chunks(GroupSrc gs, const uint32_t* keys, const int32_t* vals,
                                                      int64_t n, const int64_t* nvalid, float* partials,
                                                      float* out, int32_t* split_list, int* split_count) {
  constexpr int TPB = 256 / L;
  __shared__ int32_t s_g[TPB][kChunk];
  __shared__ int64_t s_r[TPB][kChunk];
  __shared__ float s_w[TPB][kChunk];
  const int tb = threadIdx.x / L, l = threadIdx.x % L;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * TPB + tb;
  const int64_t nv = *nvalid;
  const int64_t p0 = c * kChunk;
  const int64_t p1 = p0 + kChunk < nv ? p0 + kChunk : nv;
  const int m = p0 < nv ? static_cast<int>(p1 - p0) : 0;
  for (int e = l; e < m; e += L) {
    const int32_t i = vals[p0 + e];
    int64_t r;
    float w;
    gs.at(i, &r, &w);
    s_g[tb][e] = static_cast<int32_t>(keys[p0 + e]);
    s_r[tb][e] = r;
    s_w[tb][e] = w;
  }
  __syncthreads();
  if (m == 0) return;
  const int64_t prev_key = p0 > 0 ? static_cast<int64_t>(keys[p0 - 1]) : -1;
  const int64_t next_key = p1 < nv ? static_cast<int64_t>(keys[p1]) : -1;
  const int64_t dim = gs.dim;
  for (int64_t cb = 0; cb < dim; cb += L * VEC) {
    const int64_t c0 = cb + l * VEC;
    const bool cv = c0 < dim;
    int32_t cur = s_g[tb][0];
    bool first = true;
    float acc[VEC];
#pragma unroll
    for (int k = 0; k < VEC; ++k) acc[k] = 0.f;
    auto flush = [&](bool last) {
      const bool before = first && prev_key == cur;
      const bool after = last && next_key == cur;
      float* dst;
      if (!before && !after) dst = out + static_cast<int64_t>(cur) * dim;
      else if (before) dst = partials + (2 * c) * dim;
      else {
        dst = partials + (2 * c + 1) * dim;
        if (cb == 0 && l == 0) split_list[atomicAdd(split_count, 1)] = cur;
      }
      if (cv) store_vec<VEC>(dst + c0, acc);
    };
    for (int e0 = 0; e0 < m; e0 += 4) {
      Vec<VEC> x[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        if (e0 + u < m && cv) x[u] = load_vec<VEC>(gs.src + s_r[tb][e0 + u] * dim + c0);
        else {
#pragma unroll
          for (int k = 0; k < VEC; ++k) x[u].v[k] = 0.f;
        }
      }
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        if (e0 + u < m) {
          const int32_t g = s_g[tb][e0 + u];
          if (g != cur) {
            flush(false);
            cur = g;
            first = false;
#pragma unroll
            for (int k = 0; k < VEC; ++k) acc[k] = 0.f;
          }
          const float w = s_w[tb][e0 + u];
#pragma unroll
          for (int k = 0; k < VEC; ++k) acc[k] += w * x[u].v[k];
        }
      }
    }
    flush(true);
  }
}

// Rows no id names are zero.
__global__ void k_group_zero(const int32_t* start, int64_t G, const int64_t* d_G, int64_t dim, float* out) {
  const int64_t g = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (g >= effective_n(G, d_G) || start[g] >= 0) return;
  for (int64_t c = 0; c < dim; ++c) out[g * dim + c] = 0.f;
}

// Groups that cross chunks: one block per group (grid-stride over the list), its 8 warps sum
// fixed strided subsets of the partials, then warp 0 adds the 8 sums in order (deterministic).
template <int VEC>
__global__ void __launch_bounds__(256) k_group_fixup(const int32_t* split_list, const int* split_count,
                                                     const int32_t* start, const int32_t* end,
                                                     const float* partials, int64_t dim, float* out) {
  constexpr int W = 8;
  __shared__ float red[W][32 * VEC];
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  const int count = *split_count;
  for (int j = blockIdx.x; j < count; j += gridDim.x) {
    const int32_t g = split_list[j];
    const int64_t cs = start[g] / kChunk, ce = (static_cast<int64_t>(end[g]) - 1) / kChunk;
    const int64_t K = ce - cs + 1;  // partial 0: [2cs+1]; partial k >= 1: [2(cs+k)]
    for (int64_t cb = 0; cb < dim; cb += 32 * VEC) {
      const int64_t c0 = cb + lane * VEC;
      const bool cv = c0 < dim;
      float acc[VEC];
#pragma unroll
      for (int k = 0; k < VEC; ++k) acc[k] = 0.f;
      for (int64_t k0 = w; k0 < K; k0 += 4 * W) {
        Vec<VEC> x[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) {
          const int64_t k = k0 + u * W;
          if (k < K && cv) {
            const int64_t slot = k == 0 ? 2 * cs + 1 : 2 * (cs + k);
            x[u] = load_vec<VEC>(partials + slot * dim + c0);
          } else {
#pragma unroll
            for (int q = 0; q < VEC; ++q) x[u].v[q] = 0.f;
          }
        }
#pragma unroll
        for (int u = 0; u < 4; ++u) {
#pragma unroll
          for (int q = 0; q < VEC; ++q) acc[q] += x[u].v[q];
        }
      }
#pragma unroll
      for (int q = 0; q < VEC; ++q) red[w][lane * VEC + q] = acc[q];
      __syncthreads();
      if (w == 0 && cv) {
        float t[VEC];
#pragma unroll
        for (int q = 0; q < VEC; ++q) {
          t[q] = red[0][lane * VEC + q];
          for (int ww = 1; ww < W; ++ww) t[q] += red[ww][lane * VEC + q];
        }
        store_vec<VEC>(out + static_cast<int64_t>(g) * dim + c0, t);
      }
      __syncthreads();
    }
  }
}

template <int L, int VEC>
Status launch_group_kernels(const GroupSrc& gs, const uint32_t* keys, const int32_t* vals, int64_t n,
                            const int64_t* nvalid, int64_t G, const int64_t* d_G, const int32_t* start,
                            const int32_t* end, float* partials, int32_t* split_list, int* split_count,
                            float* out, cudaStream_t s) {
  constexpr int TPB = 256 / L;
  const int64_t chunks = ceil_div(n, kChunk);
  if (chunks > 0) {
    k_group_chunks<L, VEC><<<grid_for(chunks, TPB), 256, 0, s>>>(gs, keys, vals, n, nvalid, partials, out,
                                                                   split_list, split_count);
    SOK_LAUNCH_CHECK();
  }
  k_group_zero<<<grid_for(G, kBlock), kBlock, 0, s>>>(start, G, d_G, gs.dim, out);
  SOK_LAUNCH_CHECK();
  int dev = 0, sms = 132;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  k_group_fixup<VEC><<<4 * sms, 256, 0, s>>>(split_list, split_count, start, end, partials, gs.dim, out);
  SOK_LAUNCH_CHECK();
  return Status::OK();
}

}  // namespace

Status sum_rows_by_group(const float* src, int64_t dim, const int32_t* group, const int64_t* src_row,
                         int64_t num_src_rows, const float* weights, const float* scale, int64_t n,
                         int64_t num_groups, const int64_t* d_num_groups, float* out,
                         cudaStream_t stream, DeviceAllocator* alloc) {
  if (num_groups <= 0 || dim <= 0) return Status::OK();
  if (n >= (int64_t{1} << 31) - 1 || num_groups >= (int64_t{1} << 31) - 1)
    return Status::Invalid("sum_rows_by_group: more than 2^31-2 ids or rows");
  const int64_t nn = n > 0 ? n : 0;
  const int bits = bits_for(static_cast<uint64_t>(num_groups));
  size_t sort_bytes = 0;
  if (nn > 0) {
    SOK_CUDA_RETURN(cub::DeviceRadixSort::SortPairs(
        nullptr, sort_bytes, static_cast<uint32_t*>(nullptr), static_cast<uint32_t*>(nullptr),
        static_cast<int32_t*>(nullptr), static_cast<int32_t*>(nullptr), static_cast<int>(nn), 0,
        bits, stream));
  }
  const int64_t chunks = ceil_div(nn, kChunk);
  uint32_t *keys_in, *keys_out;
  int32_t *vals_in, *vals_out, *start, *end, *split_list;
  float* partials;
  int64_t* nvalid;  // and split_count in the next 8 bytes: one memset clears both
  void* sort_tmp;
  Temp tmp;
  SOK_RETURN_IF_ERROR(carve_temp(alloc, stream, &tmp, [&](Workspace& ws) {
    keys_in = ws.take<uint32_t>(nn + 1);
    keys_out = ws.take<uint32_t>(nn + 1);
    vals_in = ws.take<int32_t>(nn + 1);
    vals_out = ws.take<int32_t>(nn + 1);
    start = ws.take<int32_t>(num_groups);
    end = ws.take<int32_t>(num_groups);
    partials = ws.take<float>((2 * chunks + 1) * dim);
    split_list = ws.take<int32_t>(chunks + 1);
    nvalid = ws.take<int64_t>(2);
    sort_tmp = ws.take_bytes(sort_bytes);
  }));
  int* split_count = reinterpret_cast<int*>(nvalid + 1);
  const size_t gb = num_groups * sizeof(int32_t);
  SOK_CUDA_RETURN(cudaMemsetAsync(start, 0xff, gb, stream));
  SOK_CUDA_RETURN(cudaMemsetAsync(nvalid, 0, 16, stream));  // nvalid and split_count
  if (nn > 0) {
    k_group_prep<<<grid_for(nn, kBlock), kBlock, 0, stream>>>(group, src_row, num_src_rows, nn,
                                                              num_groups, keys_in, vals_in);
    SOK_LAUNCH_CHECK();
    SOK_CUDA_RETURN(cub::DeviceRadixSort::SortPairs(sort_tmp, sort_bytes, keys_in, keys_out, vals_in,
                                                    vals_out, static_cast<int>(nn), 0, bits, stream));
    k_group_bounds<<<grid_for(nn, kBlock), kBlock, 0, stream>>>(keys_out, nn, num_groups, start, end, nvalid);
    SOK_LAUNCH_CHECK();
  }
  GroupSrc gs{src, src_row, weights, scale, dim};
  const bool v4 = (dim % 4) == 0 && (reinterpret_cast<uintptr_t>(src) % 16) == 0 &&
                  (reinterpret_cast<uintptr_t>(out) % 16) == 0;
#define SOK_GROUP_LAUNCH(L, V)                                                                       \
  return launch_group_kernels<L, V>(gs, keys_out, vals_out, nn, nvalid, num_groups, d_num_groups, start, \
                                    end, partials, split_list, split_count, out, stream)
  if (v4) {
    const int64_t lanes = dim / 4;
    if (lanes <= 8) SOK_GROUP_LAUNCH(8, 4);
    if (lanes <= 16) SOK_GROUP_LAUNCH(16, 4);
    SOK_GROUP_LAUNCH(32, 4);
  }
  if (dim <= 8) SOK_GROUP_LAUNCH(8, 1);
  SOK_GROUP_LAUNCH(32, 1);
#undef SOK_GROUP_LAUNCH
}

}  // namespace detail
}  // namespace gpu
}  // namespace sok
