// Internal: the pooled forward kernel, templated on the index type I of the rows it reads
// (pooled_forward reads int32 `inverse` entries; the benchmarks' dense-table lookup in
// harness/gpu reads int64 ids straight from the table).
//
// One warp per sample; the warp is cut into S = 32 / L groups of L lanes, each lane holding VEC
// consecutive columns. Group k reads the rows of ids k, k+S, ... of the sample, U rows per lane
// in flight (each group loads its own ids, one id load ahead of its rows), and the groups are
// summed with shuffles at the end.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "addons/sparse_operation_kit/core/cuda/device_util.cuh"
#include "addons/sparse_operation_kit/core/cuda/gpu_api.h"
#include "addons/sparse_operation_kit/core/cuda/runtime.h"
#include "addons/sparse_operation_kit/core/cuda/segments.cuh"

namespace sok {
namespace gpu {
namespace detail {

// Writes position/value/kind from the packed minimum (one thread).
template <typename I>
__global__ void k_finalize_error(GpuLookupError* err, const I* ids, const int64_t* seg,
                                 const int64_t* splits) {
  const unsigned long long p = static_cast<unsigned long long>(err->packed);
  if (p == ~0ull) return;
  const int64_t pos = static_cast<int64_t>(p >> 3);
  const int64_t kind = static_cast<int64_t>(p & 7);
  err->position = pos;
  err->kind = kind;
  if (kind == 1) err->value = ids ? static_cast<int64_t>(ids[pos]) : -1;
  else if (kind == 2) err->value = seg ? seg[pos] : -1;
  else err->value = splits ? splits[pos] : -1;
}

template <typename I>
Status finalize_error(GpuLookupError* err, const I* ids, const int64_t* seg, const int64_t* splits,
                      cudaStream_t s) {
  if (err == nullptr) return Status::OK();
  k_finalize_error<I><<<1, 1, 0, s>>>(err, ids, seg, splits);
  SOK_LAUNCH_CHECK();
  return Status::OK();
}

template <typename I>
struct RowSrc {
  const float* rows;
  int64_t num_rows;
  const I* idx;
  int64_t dim;
  GpuLookupError* err;
  // Row of id i, or -1 (reported when `report`).
  __device__ __forceinline__ int64_t index(int64_t i, bool report) const {
    const int64_t r = static_cast<int64_t>(idx[i]);
    if (r < 0 || r >= num_rows) {
      if (report) report_error(err, i, 1);
      return -1;
    }
    return r;
  }
};

// The sum over one sample (one warp).
template <int L, int VEC, int U, typename I>
__device__ __forceinline__ void pooled_sample(const RowSrc<I>& src, const CsrView& csr,
                                              const float* weights, int64_t batch, int64_t dim,
                                              int combiner, float* out) {
  constexpr int S = 32 / L;
  const int lane = threadIdx.x & 31;
  const int64_t b = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) >> 5;
  if (b >= batch) return;
  int64_t a, e;
  csr.range(b, &a, &e);
  const bool perm = csr.permuted();
  const int sub = lane / L, l = lane % L;
  float scale = 1.f;
  if (combiner != static_cast<int>(Combiner::kSum)) {
    double acc = 0.0;
    for (int64_t j = a + lane; j < e; j += 32) {
      const int64_t i = id_at(csr, perm, j);
      if (src.index(i, false) < 0) continue;
      const double w = weights ? weights[i] : 1.0;
      acc += combiner == static_cast<int>(Combiner::kMean) ? w : w * w;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    const double denom = combiner == static_cast<int>(Combiner::kMean) ? acc : sqrt(acc);
    scale = denom == 0.0 ? 0.f : static_cast<float>(1.0 / denom);
  }
  for (int64_t cb = 0; cb < dim; cb += L * VEC) {
    const int64_t c0 = cb + l * VEC;
    const bool cv = c0 < dim;
    float acc[VEC];
#pragma unroll
    for (int k = 0; k < VEC; ++k) acc[k] = 0.f;
    for (int64_t j0 = a + sub; j0 < e; j0 += S * U) {
      int64_t rr[U];
      float wv[U];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int64_t j = j0 + static_cast<int64_t>(u) * S;
        rr[u] = -1;
        wv[u] = 0.f;
        if (j < e) {
          const int64_t i = id_at(csr, perm, j);
          rr[u] = src.index(i, cb == 0 && l == 0);
          wv[u] = weights ? weights[i] : 1.f;
        }
      }
      Vec<VEC> x[U];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        if (rr[u] >= 0 && cv) x[u] = load_vec<VEC>(src.rows + rr[u] * dim + c0);
        else {
#pragma unroll
          for (int k = 0; k < VEC; ++k) x[u].v[k] = 0.f;
        }
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
#pragma unroll
        for (int k = 0; k < VEC; ++k) acc[k] += wv[u] * x[u].v[k];
      }
    }
#pragma unroll
    for (int o = L; o < 32; o <<= 1) {
#pragma unroll
      for (int k = 0; k < VEC; ++k) acc[k] += __shfl_xor_sync(0xffffffffu, acc[k], o);
    }
    if (sub == 0 && cv) {
#pragma unroll
      for (int k = 0; k < VEC; ++k) acc[k] *= scale;
      store_vec<VEC>(out + b * dim + c0, acc);
    }
  }
}

// Error checks fused into the pooled kernel (one launch instead of three): each warp validates
// its sample's user row splits, and the last block to finish writes position/value/kind from the
// packed minimum (the classic last-block pattern; the record's counter is reset by that block).
struct Checks {
  const int64_t* splits = nullptr;  // user row splits to validate, or null
  const int64_t* seg = nullptr;     // segment ids (for the value of a kind-2 report), or null
  int64_t n = 0;
};

inline Checks checks_for(const Segments& seg, int64_t n) {
  Checks ck;
  ck.splits = seg.row_splits;
  ck.seg = seg.segment_ids;
  ck.n = n;
  return ck;
}

template <typename I>
__device__ __forceinline__ void check_splits_of(const RowSrc<I>& src, const Checks& ck, int64_t b,
                                                int64_t batch) {
  const int64_t* sp = ck.splits;
  if (sp[b + 1] < sp[b]) report_error(src.err, b + 1, 3);
  if (b == 0 && sp[0] != 0) report_error(src.err, 0, 3);
  if (b == batch - 1 && sp[batch] != ck.n) report_error(src.err, batch, 3);
}

template <typename I>
__device__ __forceinline__ void finish_block(const RowSrc<I>& src, const Checks& ck) {
  __syncthreads();
  if (threadIdx.x != 0) return;
  GpuLookupError* err = src.err;
  __threadfence();
  const unsigned long long ticket =
      atomicAdd(reinterpret_cast<unsigned long long*>(&err->blocks_done), 1ull);
  if (ticket != static_cast<unsigned long long>(gridDim.x) - 2ull) return;  // counter starts at ~0
  __threadfence();
  const unsigned long long p = static_cast<unsigned long long>(ld_relaxed_i64(&err->packed));
  if (p != ~0ull) {
    const int64_t pos = static_cast<int64_t>(p >> 3);
    const int64_t kind = static_cast<int64_t>(p & 7);
    err->position = pos;
    err->kind = kind;
    if (kind == 1) err->value = static_cast<int64_t>(src.idx[pos]);
    else if (kind == 2) err->value = ck.seg ? ck.seg[pos] : -1;
    else err->value = ck.splits ? ck.splits[pos] : -1;
  }
  err->blocks_done = -1;
}

template <int L, int VEC, int U, typename I>
__global__ void
__launch_bounds__(256) k_pooled_forward(RowSrc<I> src, CsrView csr, const float* weights,
                                                        int64_t batch, int64_t dim, int combiner, float* out,
                                                        Checks ck) {
  const int64_t b = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) >> 5;
  if (b < batch) {
    if (src.err != nullptr && ck.splits != nullptr && (threadIdx.x & 31) == 0) check_splits_of(src, ck, b, batch);
    pooled_sample<L, VEC, U, I>(src, csr, weights, batch, dim, combiner, out);
  }
  if (src.err != nullptr) finish_block(src, ck);
}

template <typename I>
Status launch_pooled_forward(const RowSrc<I>& src, const CsrView& csr, const float* weights,
                           int64_t batch, int64_t dim, Combiner combiner, float* out,
                           cudaStream_t s, const Checks& ck) {
  if (batch <= 0 || dim <= 0) {
    if (src.err != nullptr) return finalize_error<I>(src.err, src.idx, ck.seg, ck.splits, s);
    return Status::OK();
  }
  const int grid = grid_for(batch * 32, kBlock);
  const int c = static_cast<int>(combiner);
  const bool v4 = (dim % 4) == 0 && (reinterpret_cast<uintptr_t>(src.rows) % 16) == 0 &&
                  (reinterpret_cast<uintptr_t>(out) % 16) == 0;
  const int lanes = v4 ? static_cast<int>(std::min<int64_t>(dim / 4, 32)) : static_cast<int>(std::min<int64_t>(dim, 32));
  const int L = lanes <= 8 ? 8 : (lanes <= 16 && v4 ? 16 : 32);
  // Rows in flight per lane, measured on H200 (benchmarks/gpu/RESULTS.md): 8 when a row takes
  // at most 16 lanes (dim <= 64), 4 for wider rows.
#define SOK_POOL(LL, VV)                                                                      \
  do {                                                                                        \
    if constexpr (LL <= 16)                                                                   \
      k_pooled_forward<LL, VV, 8, I><<<grid, kBlock, 0, s>>>(src, csr, weights, batch, dim, c, out, ck); \
    else                                                                                      \
      k_pooled_forward<LL, VV, 4, I><<<grid, kBlock, 0, s>>>(src, csr, weights, batch, dim, c, out, ck); \
  } while (0)
  if (v4) {
    if (L == 8) SOK_POOL(8, 4);
    else if (L == 16) SOK_POOL(16, 4);
    else SOK_POOL(32, 4);
  } else {
    if (L == 8) SOK_POOL(8, 1);
    else SOK_POOL(32, 1);
  }
#undef SOK_POOL
  SOK_LAUNCH_CHECK();
  return Status::OK();
}

}  // namespace detail
}  // namespace gpu
}  // namespace sok
