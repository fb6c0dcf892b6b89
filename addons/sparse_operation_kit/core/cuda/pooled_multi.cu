// pooled_forward_multi / pooled_backward_multi_unordered (gpu_api.h): the pooled combine of many
// tables in one launch, for segment ids already known in range (no error record, no host sync).
//
// One warp per (table, sample). The ids of sample b are found by two binary searches over the
// table's segment ids in sample order (through `order` when the table has one). The warp is cut
// into 32 / L groups of L lanes (L per table, from its dim); each lane holds VEC consecutive
// columns, group k takes ids k, k + 32 / L, ... and the groups are summed with shuffles.
// The table descriptors travel as one __grid_constant__ kernel parameter (no copy, no lifetime
// to manage); calls with more than kTablesPerLaunch tables take one launch per chunk.
#include <cuda_runtime.h>

#include <cstdint>

#include "addons/sparse_operation_kit/core/cuda/device_util.cuh"
#include "addons/sparse_operation_kit/core/cuda/gpu_api.h"
#include "addons/sparse_operation_kit/core/cuda/runtime.h"

namespace sok {
namespace gpu {

using namespace detail;  // NOLINT

namespace {

// 32 descriptors of 104 bytes: the parameters stay under the classic 4 KB limit.
constexpr int kTablesPerLaunch = 32;
constexpr int kWarpsPerBlock = kBlock / 32;

struct LaunchTable {
  const float* src;  // forward: rows [num_rows, dim]; backward: grad_out [batch, dim]
  float* out;        // forward: [batch, dim]; backward: grad_rows [num_rows, dim]
  const int32_t* inverse;
  const int64_t* seg;
  const int32_t* order;  // null: seg is non-decreasing
  const float* weights;  // null: all 1
  int64_t n, batch, num_rows, dim;
  int64_t first_warp;  // warps before this table's samples
  int32_t combiner, lanes, vec4, unused;
};

struct LaunchTables {
  LaunchTable t[kTablesPerLaunch];
  int32_t count;
};

// Index of the id at position k of the sample-ordered view; -1 for an order entry out of range.
__device__ __forceinline__ int64_t id_at(const LaunchTable& t, int64_t k) {
  if (t.order == nullptr) return k;
  const int64_t i = t.order[k];
  return (i >= 0 && i < t.n) ? i : -1;
}

// First position k of the sample-ordered view whose sample is >= b. Bounds-safe for any input
// (an unsorted view only gives a wrong range, never an out-of-range read).
__device__ __forceinline__ int64_t lower_bound_sample(const LaunchTable& t, int64_t b) {
  int64_t lo = 0, hi = t.n;
  while (lo < hi) {
    const int64_t mid = lo + ((hi - lo) >> 1);
    const int64_t i = id_at(t, mid);
    const int64_t s = i < 0 ? INT64_MAX : t.seg[i];
    if (s < b) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

// Row of id i, or -1 when out of range.
__device__ __forceinline__ int64_t row_of(const LaunchTable& t, int64_t i) {
  const int64_t r = t.inverse[i];
  return (r >= 0 && r < t.num_rows) ? r : -1;
}

// [a, e): the positions of sample b (even lanes search b, odd lanes b + 1).
__device__ __forceinline__ void sample_range(const LaunchTable& t, int64_t b, int lane, int64_t* a,
                                             int64_t* e) {
  const int64_t x = lower_bound_sample(t, b + (lane & 1));
  *a = __shfl_sync(0xffffffffu, x, 0);
  *e = __shfl_sync(0xffffffffu, x, 1);
}

// 1 (sum), 1 / sum(w) (mean) or 1 / sqrt(sum(w^2)) (sqrtn); 0 for a zero weight sum.
__device__ __forceinline__ float sample_scale(const LaunchTable& t, int64_t a, int64_t e,
                                              int lane) {
  if (t.combiner == static_cast<int32_t>(Combiner::kSum)) return 1.f;
  const bool mean = t.combiner == static_cast<int32_t>(Combiner::kMean);
  double acc = 0.0;
  for (int64_t j = a + lane; j < e; j += 32) {
    const int64_t i = id_at(t, j);
    if (i < 0 || row_of(t, i) < 0) continue;
    const double w = t.weights ? t.weights[i] : 1.0;
    acc += mean ? w : w * w;
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  const double denom = mean ? acc : sqrt(acc);
  return denom == 0.0 ? 0.f : static_cast<float>(1.0 / denom);
}

// The table of warp w (tables with no warps are skipped: their first_warp equals the next one's).
__device__ __forceinline__ int table_of(const LaunchTables& ts, int64_t w) {
  int t = 0;
  while (t + 1 < ts.count && w >= ts.t[t + 1].first_warp) ++t;
  return t;
}

template <int VEC>
__device__ void forward_sample(const LaunchTable& t, int64_t b, int lane) {
  constexpr int U = 4;  // rows in flight per lane
  int64_t a, e;
  sample_range(t, b, lane, &a, &e);
  const float scale = sample_scale(t, a, e, lane);
  const int L = t.lanes, S = 32 / L, sub = lane / L, l = lane % L;
  for (int64_t cb = 0; cb < t.dim; cb += static_cast<int64_t>(L) * VEC) {
    const int64_t c0 = cb + l * VEC;
    const bool cv = c0 < t.dim;
    float acc[VEC];
#pragma unroll
    for (int k = 0; k < VEC; ++k) acc[k] = 0.f;
    for (int64_t j0 = a + sub; j0 < e; j0 += static_cast<int64_t>(S) * U) {
      int64_t rr[U];
      float wv[U];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int64_t j = j0 + static_cast<int64_t>(u) * S;
        rr[u] = -1;
        wv[u] = 0.f;
        const int64_t i = j < e ? id_at(t, j) : -1;
        if (i >= 0) {
          rr[u] = row_of(t, i);
          wv[u] = t.weights ? t.weights[i] : 1.f;
        }
      }
      Vec<VEC> x[U];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        if (rr[u] >= 0 && cv) {
          x[u] = load_vec<VEC>(t.src + rr[u] * t.dim + c0);
        } else {
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
    for (int o = L; o < 32; o <<= 1) {
#pragma unroll
      for (int k = 0; k < VEC; ++k) acc[k] += __shfl_xor_sync(0xffffffffu, acc[k], o);
    }
    if (sub == 0 && cv) {
#pragma unroll
      for (int k = 0; k < VEC; ++k) acc[k] *= scale;
      store_vec<VEC>(t.out + b * t.dim + c0, acc);
    }
  }
}

// dst[0, VEC) += w * g (sm_90 has a 16-byte vector atomic: one per float4 instead of four).
template <int VEC>
__device__ __forceinline__ void add_scaled(float* dst, float w, const Vec<VEC>& g) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if constexpr (VEC == 4) {
    atomicAdd(reinterpret_cast<float4*>(dst),
              make_float4(w * g.v[0], w * g.v[1], w * g.v[2], w * g.v[3]));
    return;
  } else {
    atomicAdd(dst, w * g.v[0]);
  }
#else
#pragma unroll
  for (int k = 0; k < VEC; ++k) atomicAdd(dst + k, w * g.v[k]);
#endif
}

// grad_rows[row of each id of sample b] += w * scale * grad_out[b] with atomics.
template <int VEC>
__device__ void backward_sample(const LaunchTable& t, int64_t b, int lane) {
  int64_t a, e;
  sample_range(t, b, lane, &a, &e);
  if (a >= e) return;
  const float scale = sample_scale(t, a, e, lane);
  const int L = t.lanes, S = 32 / L, sub = lane / L, l = lane % L;
  for (int64_t cb = 0; cb < t.dim; cb += static_cast<int64_t>(L) * VEC) {
    const int64_t c0 = cb + l * VEC;
    if (c0 >= t.dim) continue;
    const Vec<VEC> g = load_vec<VEC>(t.src + b * t.dim + c0);
    for (int64_t j = a + sub; j < e; j += S) {
      const int64_t i = id_at(t, j);
      const int64_t r = i < 0 ? -1 : row_of(t, i);
      if (r < 0) continue;
      const float w = (t.weights ? t.weights[i] : 1.f) * scale;
      float* dst = t.out + r * t.dim + c0;
      add_scaled<VEC>(dst, w, g);
    }
  }
}

__global__ void
__launch_bounds__(kBlock) k_forward_multi(const __grid_constant__ LaunchTables ts,
                                                          int64_t total_warps) {
  const int64_t w = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) >> 5;
  if (w >= total_warps) return;
  const LaunchTable& t = ts.t[table_of(ts, w)];
  const int64_t b = w - t.first_warp;
  const int lane = threadIdx.x & 31;
  if (t.vec4) forward_sample<4>(t, b, lane);
  else forward_sample<1>(t, b, lane);
}

__global__ void __launch_bounds__(kBlock) k_backward_multi(const __grid_constant__ LaunchTables ts,
                                                           int64_t total_warps) {
  const int64_t w = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) >> 5;
  if (w >= total_warps) return;
  const LaunchTable& t = ts.t[table_of(ts, w)];
  const int64_t b = w - t.first_warp;
  const int lane = threadIdx.x & 31;
  if (t.vec4) backward_sample<4>(t, b, lane);
  else backward_sample<1>(t, b, lane);
}

// Zeroes out[num_rows, dim] of every table (grid-stride; float4 stores where aligned).
__global__ void k_zero_multi(const __grid_constant__ LaunchTables ts) {
  const int64_t start = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int k = 0; k < ts.count; ++k) {
    float* p = ts.t[k].out;
    const int64_t m = ts.t[k].num_rows * ts.t[k].dim;
    int64_t head = 0;
    if ((reinterpret_cast<uintptr_t>(p) & 15) == 0) {
      head = m / 4 * 4;
      for (int64_t x = start; x < m / 4; x += stride)
        reinterpret_cast<float4*>(p)[x] = make_float4(0.f, 0.f, 0.f, 0.f);
    }
    for (int64_t x = head + start; x < m; x += stride) p[x] = 0.f;
  }
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

// Lanes per row: the next power of two of the row's columns (VEC floats each), at most 32.
int32_t lanes_for(int64_t columns) {
  int32_t l = 1;
  while (l < columns && l < 32) l <<= 1;
  return l;
}

Status check_table(const PooledTable& p, int index) {
  if (p.n < 0 || p.batch < 0 || p.num_rows < 0 || p.dim < 0)
    return Status::Invalid("pooled lookup: negative size in table #" + std::to_string(index));
  if (p.n > 0 && (p.inverse == nullptr || p.segment_ids == nullptr))
    return Status::Invalid("pooled lookup: table #" + std::to_string(index) +
                           " has ids but no inverse or segment ids");
  return Status::OK();
}

// Descriptors of tables [begin, end); `warps_of` gives each table's number of sample warps.
template <typename WarpsOf>
int64_t pack(const PooledTable* tables, int begin, int end, WarpsOf&& warps_of, LaunchTables* ts) {
  int64_t warps = 0;
  ts->count = end - begin;
  for (int k = begin; k < end; ++k) {
    const PooledTable& p = tables[k];
    LaunchTable& t = ts->t[k - begin];
    t.src = p.src;
    t.out = p.out;
    t.inverse = p.inverse;
    t.seg = p.segment_ids;
    t.order = p.order;
    t.weights = p.weights;
    t.n = p.n;
    t.batch = p.batch;
    t.num_rows = p.num_rows;
    t.dim = p.dim;
    t.first_warp = warps;
    t.combiner = static_cast<int32_t>(p.combiner);
    t.vec4 = p.dim % 4 == 0 && aligned16(p.src) && aligned16(p.out);
    t.lanes = lanes_for(t.vec4 ? p.dim / 4 : p.dim);
    t.unused = 0;
    warps += warps_of(p);
  }
  return warps;
}

template <typename Body>
Status for_each_chunk(const PooledTable* tables, int count, Body&& body) {
  for (int k = 0; k < count; ++k) SOK_RETURN_IF_ERROR(check_table(tables[k], k));
  for (int begin = 0; begin < count; begin += kTablesPerLaunch) {
    const int end = begin + kTablesPerLaunch < count ? begin + kTablesPerLaunch : count;
    SOK_RETURN_IF_ERROR(body(begin, end));
  }
  return Status::OK();
}

}  // namespace

Status pooled_forward_multi(const PooledTable* tables, int count, cudaStream_t stream) {
  return for_each_chunk(tables, count, [&](int begin, int end) {
    LaunchTables ts;
    const int64_t warps = pack(tables, begin, end,
                               [](const PooledTable& p) { return p.dim > 0 ? p.batch : 0; }, &ts);
    if (warps == 0) return Status::OK();
    k_forward_multi<<<grid_for(warps, kWarpsPerBlock), kBlock, 0, stream>>>(ts, warps);
    SOK_LAUNCH_CHECK();
    return Status::OK();
  });
}

Status pooled_backward_multi_unordered(const PooledTable* tables, int count,
                                       cudaStream_t stream) {
  return for_each_chunk(tables, count, [&](int begin, int end) {
    LaunchTables ts;
    const int64_t warps = pack(
        tables, begin, end,
        [](const PooledTable& p) {
          return p.dim > 0 && p.num_rows > 0 && p.n > 0 ? p.batch : 0;
        },
        &ts);
    int64_t elements = 0;
    for (int k = begin; k < end; ++k) elements += tables[k].num_rows * tables[k].dim;
    if (elements == 0) return Status::OK();
    // Enough blocks to fill the GPU; the grid-stride loop does the rest.
    const int zero_grid = grid_for(ceil_div(elements, 4) < 4096 * kBlock ? ceil_div(elements, 4)
                                                                         : 4096 * kBlock,
                                   kBlock);
    k_zero_multi<<<zero_grid, kBlock, 0, stream>>>(ts);
    SOK_LAUNCH_CHECK();
    if (warps == 0) return Status::OK();
    k_backward_multi<<<grid_for(warps, kWarpsPerBlock), kBlock, 0, stream>>>(ts, warps);
    SOK_LAUNCH_CHECK();
    return Status::OK();
  });
}

}  // namespace gpu
}  // namespace sok
