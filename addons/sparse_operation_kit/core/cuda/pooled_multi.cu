// pooled_forward_multi / pooled_backward_multi_unordered (gpu_api.h): the pooled combine of many
// tables in one launch, for segment ids already known in range (no error record, no host sync).
//
// First one launch over every sparse table's ids writes offsets[b], where sample b starts in the
// table's sample-ordered view (through `order` when it has one). Dense tables (no segment ids:
// k ids per sample) need none. Then each sample is a group of G lanes (G = L * S, S groups of L
// lanes; L per table from its dim, S from its ids per sample), 32 / G samples per warp: each lane
// holds VEC consecutive columns, sub-group s takes ids s, s + S, ... and the sub-groups are summed
// with shuffles. Every block belongs to one table (found by a binary search over the blocks'
// table starts). The table descriptors travel as one __grid_constant__ kernel parameter (no copy,
// no lifetime to manage); calls with more than kTablesPerLaunch tables take one launch per chunk.
// A table's rows may also be read (their gradient written) in place, wherever row_at says each
// one starts: the exchange's returned rows, every table in one buffer, need no copy per table.
#include <cuda_runtime.h>

#include <cstdint>

#include "addons/sparse_operation_kit/core/cuda/device_util.cuh"
#include "addons/sparse_operation_kit/core/cuda/gpu_api.h"
#include "addons/sparse_operation_kit/core/cuda/runtime.h"

namespace sok {
namespace gpu {

using namespace detail;  // NOLINT

namespace {

// 29 descriptors of 136 bytes: the parameters stay under the classic 4 KB limit.
constexpr int kTablesPerLaunch = 29;
constexpr int kWarpsPerBlock = kBlock / 32;

struct LaunchTable {
  const float* src;  // forward: rows [num_rows, dim]; backward: grad_out [batch, dim]
  float* out;        // forward: [batch, dim]; backward: grad_rows [num_rows, dim]
  const int32_t* inverse;
  const int64_t* seg;     // null: dense (or no ids)
  const int32_t* order;   // null: seg is non-decreasing
  const float* weights;   // null: all 1
  const int64_t* row_at;  // null: row r at r * dim; else where it starts, -1: none
  int64_t* offsets;  // [batch + 1] sample starts in the ordered view; null: per_sample ids each
  int64_t n, batch, num_rows, dim, per_sample;
  int32_t first_block;                         // blocks of the sample kernel before this table's
  int32_t first_offset_block;                  // blocks of the offsets kernel before this table's
  int32_t combiner, lanes, group_shift, vec4;  // group_shift: log2 of the lanes per sample
  int32_t seg_stride;                          // int64 words between the samples of two ids
  int32_t unused;
};

struct LaunchTables {
  LaunchTable t[kTablesPerLaunch];
  int32_t count;
};
static_assert(sizeof(LaunchTables) <= 4096, "kernel parameters beyond 4 KB");

// The table whose blocks hold block x: the last one starting at or before x (tables without
// blocks start where the next one does, so they are passed over).
template <int32_t LaunchTable::* kFirst>
__device__ __forceinline__ int table_of_block(const LaunchTables& ts, int32_t x) {
  int lo = 0, hi = ts.count - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (ts.t[mid].*kFirst <= x) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

// Index of the id at position k of the sample-ordered view; -1 for an order entry out of range.
__device__ __forceinline__ int64_t id_at(const LaunchTable& t, int64_t k) {
  if (t.order == nullptr) return k;
  const int64_t i = t.order[k];
  return (i >= 0 && i < t.n) ? i : -1;
}

// Row of id i, or -1 when out of range.
__device__ __forceinline__ int64_t row_of(const LaunchTable& t, int64_t i) {
  const int64_t r = t.inverse[i];
  return (r >= 0 && r < t.num_rows) ? r : -1;
}

// The first float of row r in src (forward) or out (backward); -1: the row is not there.
__device__ __forceinline__ int64_t row_start(const LaunchTable& t, int64_t r) {
  return t.row_at == nullptr ? r * t.dim : t.row_at[r];
}

// Sample of position k of the ordered view, clamped to [-1, batch]: k == n and bad order entries
// give batch, so the ranges below never include them.
__device__ __forceinline__ int64_t sample_at(const LaunchTable& t, int64_t k) {
  if (k >= t.n) return t.batch;
  const int64_t i = id_at(t, k);
  if (i < 0) return t.batch;
  const int64_t s = t.seg[i * t.seg_stride];
  return s < -1 ? -1 : (s > t.batch ? t.batch : s);
}

// offsets[b] = k for every b in (sample(k - 1), sample(k)], k in [0, n] (sample(-1) = -1): in a
// sorted view every b in [0, batch] is written once. An unsorted view (bad input) leaves some
// entries unwritten or written twice: the readers clamp them, so only the ranges are wrong. (Its
// cost grows with how often the samples go down and up again; a checked view never does.)
__global__ void
__launch_bounds__(kBlock) k_sample_offsets(const __grid_constant__ LaunchTables ts) {
  const LaunchTable& t = ts.t[table_of_block<&LaunchTable::first_offset_block>(ts, blockIdx.x)];
  const int64_t k =
      static_cast<int64_t>(blockIdx.x - t.first_offset_block) * blockDim.x + threadIdx.x;
  if (t.offsets == nullptr || k > t.n) return;
  const int64_t prev = k == 0 ? -1 : sample_at(t, k - 1);
  const int64_t cur = sample_at(t, k);
  for (int64_t b = prev + 1; b <= cur; ++b) t.offsets[b] = k;
}

// Positions [*a, *e) of sample b in the ordered view (empty for b outside the batch).
__device__ __forceinline__ void sample_range(const LaunchTable& t, int64_t b, int64_t* a,
                                             int64_t* e) {
  if (b >= t.batch) {
    *a = *e = 0;
  } else if (t.offsets == nullptr) {
    const int64_t x = b * t.per_sample;
    *a = x < t.n ? x : t.n;
    *e = x + t.per_sample < t.n ? x + t.per_sample : t.n;
  } else {
    const int64_t x = t.offsets[b], y = t.offsets[b + 1];
    *a = x < 0 ? 0 : (x > t.n ? t.n : x);
    *e = y < *a ? *a : (y > t.n ? t.n : y);
  }
}

// The sample of this lane's group and its lane within the group (G = 1 << group_shift lanes).
struct Slot {
  int64_t b;
  int gl, G;
};

// A block covers `reps` consecutive spans of kWarpsPerBlock warps' samples; `rep` picks one.
__device__ __forceinline__ Slot slot_of(const LaunchTable& t, int rep = 0, int reps = 1) {
  const int lane = threadIdx.x & 31;
  const int64_t warp =
      (static_cast<int64_t>(blockIdx.x - t.first_block) * reps + rep) * kWarpsPerBlock +
      (threadIdx.x >> 5);
  Slot s;
  s.G = 1 << t.group_shift;
  s.b = (warp << (5 - t.group_shift)) + (lane >> t.group_shift);
  s.gl = lane & (s.G - 1);
  return s;
}

// Sum over the G lanes of a group (aligned groups of a power of two: xor stays inside).
template <typename T>
__device__ __forceinline__ T group_sum(T x, int from, int G) {
  for (int o = from; o < G; o <<= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

// 1 (sum), 1 / sum(w) (mean) or 1 / sqrt(sum(w^2)) (sqrtn); 0 for a zero weight sum. Every lane
// of the warp calls it (shuffles).
__device__ __forceinline__ float sample_scale(const LaunchTable& t, int64_t a, int64_t e,
                                              const Slot& s) {
  if (t.combiner == static_cast<int32_t>(Combiner::kSum)) return 1.f;
  const bool mean = t.combiner == static_cast<int32_t>(Combiner::kMean);
  double acc = 0.0;
  for (int64_t j = a + s.gl; j < e; j += s.G) {
    const int64_t i = id_at(t, j);
    if (i < 0 || row_of(t, i) < 0) continue;
    const double w = t.weights ? t.weights[i] : 1.0;
    acc += mean ? w : w * w;
  }
  acc = group_sum(acc, 1, s.G);
  const double denom = mean ? acc : sqrt(acc);
  return denom == 0.0 ? 0.f : static_cast<float>(1.0 / denom);
}

template <int VEC>
__device__ void forward_sample(const LaunchTable& t) {
  constexpr int U = 4;  // rows in flight per lane
  const Slot s = slot_of(t);
  int64_t a, e;
  sample_range(t, s.b, &a, &e);
  const float scale = sample_scale(t, a, e, s);
  const int L = t.lanes, S = s.G / L, sub = s.gl / L, l = s.gl % L;
  const bool has_out = s.b < t.batch && sub == 0;
  for (int64_t cb = 0; cb < t.dim; cb += static_cast<int64_t>(L) * VEC) {
    const int64_t c0 = cb + l * VEC;
    const bool cv = c0 < t.dim;
    float acc[VEC];
#pragma unroll
    for (int k = 0; k < VEC; ++k) acc[k] = 0.f;
    for (int64_t j0 = a + sub; j0 < e; j0 += static_cast<int64_t>(S) * U) {
      int64_t at[U];  // first float of each row, -1: none
      float wv[U];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int64_t j = j0 + static_cast<int64_t>(u) * S;
        at[u] = -1;
        wv[u] = 0.f;
        const int64_t i = j < e ? id_at(t, j) : -1;
        const int64_t r = i >= 0 ? row_of(t, i) : -1;
        if (r >= 0) {
          at[u] = row_start(t, r);
          wv[u] = t.weights ? t.weights[i] : 1.f;
        }
      }
      Vec<VEC> x[U];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        if (at[u] >= 0 && cv) {
          x[u] = load_vec<VEC>(t.src + at[u] + c0);
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
#pragma unroll
    for (int k = 0; k < VEC; ++k) acc[k] = group_sum(acc[k], L, s.G);
    if (has_out && cv) {
#pragma unroll
      for (int k = 0; k < VEC; ++k) acc[k] *= scale;
      store_vec<VEC>(t.out + s.b * t.dim + c0, acc);
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

// A block's sums of up to kHotSlots rows in shared memory, flushed to grad_rows once at the
// block's end. With skewed ids (a power law) a hot row took thousands of atomics at one address
// per table and step, which the L2 serialises: the 26-field backward was 10x slower on Zipf 1.15
// rows than on uniform ones (tests/gpu/bench_pooled_multi). A row's slot is claimed by its
// first id in the block and kept (a hot row's ids come first); an id whose slot holds another
// row goes to grad_rows directly. On one H200, batch 65,536, a block covering 4 spans of
// samples: Zipf 3.56 -> 0.67 ms, uniform rows (which rarely meet in a block) 0.34 -> 0.46 ms.
// One span a block gave 0.99 and 0.55; with it, 64 slots gave 0.83 and 0.64, 16 gave 1.33, 0.50.
constexpr int kHotBits = 5;
// Sample spans per block of the backward: more ids share a block's hot rows and pay for its
// shared memory's set-up and flush once.
constexpr int kBackwardReps = 4;
constexpr int kHotSlots = 1 << kHotBits;
constexpr int kHotFloats = 4096;  // kHotSlots rows of dim <= 4096 / kHotSlots; wider ones skip it

struct HotRows {
  int32_t* row;  // [kHotSlots], -1: free
  float* acc;    // [kHotSlots * dim]
};

__device__ __forceinline__ int hot_slot(int64_t r) {
  return static_cast<int>((static_cast<uint32_t>(r) * 2654435761u) >> (32 - kHotBits));
}

// acc of row r's slot += w * g at columns [c0, c0 + VEC) when the slot is (or becomes) r's.
template <int VEC>
__device__ __forceinline__ bool add_hot(const HotRows& h, int64_t dim, int64_t r, int64_t c0,
                                        float w, const Vec<VEC>& g) {
  const int slot = hot_slot(r);
  int32_t cur = *reinterpret_cast<volatile int32_t*>(h.row + slot);
  if (cur < 0) cur = atomicCAS(h.row + slot, -1, static_cast<int32_t>(r));
  if (cur >= 0 && cur != r) return false;
  float* a = h.acc + slot * dim + c0;
#pragma unroll
  for (int k = 0; k < VEC; ++k) atomicAdd(a + k, w * g.v[k]);
  return true;
}

// grad_rows[row of each id of sample b] += w * scale * grad_out[b] with atomics (through the
// block's hot rows when `hot`).
template <int VEC>
__device__ void backward_sample(const LaunchTable& t, const HotRows* hot, int rep) {
  const Slot s = slot_of(t, rep, kBackwardReps);
  int64_t a, e;
  sample_range(t, s.b, &a, &e);
  // Whole warps without ids leave (the scale's shuffles need every lane of the warp).
  if (__all_sync(0xffffffffu, a >= e)) return;
  const float scale = sample_scale(t, a, e, s);
  if (a >= e) return;
  const int L = t.lanes, S = s.G / L, sub = s.gl / L, l = s.gl % L;
  for (int64_t cb = 0; cb < t.dim; cb += static_cast<int64_t>(L) * VEC) {
    const int64_t c0 = cb + l * VEC;
    if (c0 >= t.dim) continue;
    const Vec<VEC> g = load_vec<VEC>(t.src + s.b * t.dim + c0);
    for (int64_t j = a + sub; j < e; j += S) {
      const int64_t i = id_at(t, j);
      const int64_t r = i < 0 ? -1 : row_of(t, i);
      const int64_t at = r < 0 ? -1 : row_start(t, r);
      if (at < 0) continue;
      const float w = (t.weights ? t.weights[i] : 1.f) * scale;
      if (hot == nullptr || !add_hot<VEC>(*hot, t.dim, r, c0, w, g))
        add_scaled<VEC>(t.out + at + c0, w, g);
    }
  }
}

__global__ void __launch_bounds__(kBlock) k_forward_multi(const __grid_constant__ LaunchTables ts) {
  const LaunchTable& t = ts.t[table_of_block<&LaunchTable::first_block>(ts, blockIdx.x)];
  if (t.vec4) forward_sample<4>(t);
  else forward_sample<1>(t);
}

__global__ void __launch_bounds__(kBlock)
    k_backward_multi(const __grid_constant__ LaunchTables ts) {
  __shared__ int32_t hot_row[kHotSlots];
  __shared__ __align__(16) float hot_acc[kHotFloats];
  const LaunchTable& t = ts.t[table_of_block<&LaunchTable::first_block>(ts, blockIdx.x)];
  const int64_t floats = kHotSlots * t.dim;
  const bool cached = floats <= kHotFloats;  // block-uniform: one table per block
  if (cached) {
    for (int k = threadIdx.x; k < kHotSlots; k += blockDim.x) hot_row[k] = -1;
    for (int64_t k = threadIdx.x; k < floats; k += blockDim.x) hot_acc[k] = 0.f;
    __syncthreads();
  }
  const HotRows hot{hot_row, hot_acc};
  for (int rep = 0; rep < kBackwardReps; ++rep) {
    if (t.vec4) backward_sample<4>(t, cached ? &hot : nullptr, rep);
    else backward_sample<1>(t, cached ? &hot : nullptr, rep);
  }
  if (!cached) return;
  __syncthreads();
  // Flush: one atomic per column of each claimed row (float4 where the rows allow it).
  const int step = t.vec4 ? 4 : 1;
  for (int64_t k = threadIdx.x * step; k < floats; k += blockDim.x * step) {
    const int32_t r = hot_row[k / t.dim];
    if (r < 0) continue;
    float* dst = t.out + row_start(t, r) + k % t.dim;  // a claimed row has a start
    if (t.vec4) {
      const float4 v = *reinterpret_cast<const float4*>(hot_acc + k);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
      atomicAdd(reinterpret_cast<float4*>(dst), v);
#else
      atomicAdd(dst, v.x), atomicAdd(dst + 1, v.y), atomicAdd(dst + 2, v.z), atomicAdd(dst + 3, v.w);
#endif
    } else {
      atomicAdd(dst, hot_acc[k]);
    }
  }
}

// Zeroes out[num_rows, dim] of every table without row_at (grid-stride; float4 stores where
// aligned).
__global__ void k_zero_multi(const __grid_constant__ LaunchTables ts) {
  const int64_t start = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int k = 0; k < ts.count; ++k) {
    if (ts.t[k].row_at != nullptr) continue;
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

__global__ void k_dense_row_splits(int64_t batch, int64_t per_sample, int64_t* row_splits) {
  const int64_t b = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (b <= batch) row_splits[b] = b * per_sample;
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

// Lanes per row: the next power of two of the row's columns (VEC floats each), at most 32.
int32_t lanes_for(int64_t columns) {
  int32_t l = 1;
  while (l < columns && l < 32) l <<= 1;
  return l;
}

// log2 of the lanes per sample: L lanes per row times enough sub-groups that one pass of U rows
// each covers a sample of average length (at most the warp).
int32_t group_shift_for(int32_t lanes, int64_t n, int64_t batch) {
  constexpr int64_t kRowsPerLane = 4;  // forward_sample's U
  const int64_t avg = batch > 0 ? ceil_div(n, batch) : 0;
  int32_t g = lanes, shift = 0;
  while ((1 << shift) < g) ++shift;
  while (g < 32 && static_cast<int64_t>(g / lanes) * kRowsPerLane < avg) {
    g <<= 1;
    ++shift;
  }
  return shift;
}

bool is_dense(const PooledTable& p) { return p.segment_ids == nullptr; }

// Sparse tables whose samples need the offsets pass.
bool needs_offsets(const PooledTable& p) { return !is_dense(p) && p.n > 0 && p.batch > 0; }

Status check_table(const PooledTable& p, int index) {
  const std::string name = "pooled lookup: table #" + std::to_string(index);
  if (p.n < 0 || p.batch < 0 || p.num_rows < 0 || p.dim < 0)
    return Status::Invalid(name + ": negative size");
  if (p.n > 0 && p.inverse == nullptr) return Status::Invalid(name + " has ids but no inverse");
  if (is_dense(p) && p.n > 0 && (p.batch == 0 || p.n % p.batch != 0 || p.order != nullptr)) {
    return Status::Invalid(name + ": " + std::to_string(p.n) +
                           " ids without segment ids must be k ids per sample of batch " +
                           std::to_string(p.batch) + " (and have no order)");
  }
  return Status::OK();
}

// Descriptors of tables [begin, end); `active` says whether a table gets sample warps, and the
// active sparse ones take batch + 1 offsets each from *offsets (advanced past them). Returns the
// blocks of the sample kernel; *offset_blocks gets those of the offsets kernel.
template <typename Active>
int64_t pack(const PooledTable* tables, int begin, int end, Active&& active, int64_t** offsets,
             LaunchTables* ts, int64_t* offset_blocks, int reps) {
  int64_t blocks = 0;
  *offset_blocks = 0;
  ts->count = end - begin;
  for (int k = begin; k < end; ++k) {
    const PooledTable& p = tables[k];
    LaunchTable& t = ts->t[k - begin];
    t.src = p.src;
    t.out = p.out;
    t.inverse = p.inverse;
    t.seg = p.segment_ids;
    t.seg_stride = static_cast<int32_t>(p.segment_stride);
    t.unused = 0;
    t.order = p.order;
    t.weights = p.weights;
    t.row_at = p.row_at;
    t.n = p.n;
    t.batch = p.batch;
    t.num_rows = p.num_rows;
    t.dim = p.dim;
    t.per_sample = p.batch > 0 ? p.n / p.batch : 0;  // dense tables (sparse ones use offsets)
    t.combiner = static_cast<int32_t>(p.combiner);
    t.vec4 = p.dim % 4 == 0 && aligned16(p.src) && aligned16(p.out) &&
             (p.row_at == nullptr || p.row_at_x4);
    t.lanes = lanes_for(t.vec4 ? p.dim / 4 : p.dim);
    t.group_shift = group_shift_for(t.lanes, p.n, p.batch);
    t.offsets = nullptr;
    t.first_offset_block = static_cast<int32_t>(*offset_blocks);
    if (needs_offsets(p) && active(p)) {
      t.offsets = *offsets;
      *offsets += p.batch + 1;
      *offset_blocks += ceil_div(p.n + 1, kBlock);
    } else if (!is_dense(p)) {
      t.per_sample = 0;  // no ids, or no sample is read
    }
    t.first_block = static_cast<int32_t>(blocks);
    if (active(p)) {
      const int64_t samples_per_warp = 32 >> t.group_shift;
      blocks += ceil_div(ceil_div(p.batch, samples_per_warp), kWarpsPerBlock * reps);
    }
  }
  return blocks;
}

// Calls body(ts, sample_blocks) once per chunk of kTablesPerLaunch tables, after the offsets
// pass of the chunk's tables (into one temporary of alloc for all chunks).
template <typename Active, typename Body>
Status for_each_chunk(const PooledTable* tables, int count, DeviceAllocator* alloc,
                      cudaStream_t stream, int reps, Active&& active, Body&& body) {
  int64_t offset_entries = 0;
  for (int k = 0; k < count; ++k) {
    SOK_RETURN_IF_ERROR(check_table(tables[k], k));
    if (needs_offsets(tables[k]) && active(tables[k])) offset_entries += tables[k].batch + 1;
  }
  Temp offsets;
  if (offset_entries > 0) {
    SOK_RETURN_IF_ERROR(offsets.alloc(alloc, offset_entries * sizeof(int64_t), stream));
  }
  int64_t* next = offsets.as<int64_t>();
  for (int begin = 0; begin < count; begin += kTablesPerLaunch) {
    const int end = begin + kTablesPerLaunch < count ? begin + kTablesPerLaunch : count;
    LaunchTables ts;
    int64_t offset_blocks;
    const int64_t blocks = pack(tables, begin, end, active, &next, &ts, &offset_blocks, reps);
    if (blocks > 2147483647LL || offset_blocks > 2147483647LL)
      return Status::Invalid("pooled lookup: too many samples or ids for one launch");
    if (offset_blocks > 0) {
      k_sample_offsets<<<static_cast<int>(offset_blocks), kBlock, 0, stream>>>(ts);
      SOK_LAUNCH_CHECK();
    }
    SOK_RETURN_IF_ERROR(body(ts, blocks));
  }
  return Status::OK();
}

}  // namespace

Status pooled_forward_multi(const PooledTable* tables, int count, cudaStream_t stream,
                            DeviceAllocator* alloc) {
  auto active = [](const PooledTable& p) { return p.dim > 0 && p.batch > 0; };
  return for_each_chunk(tables, count, alloc, stream, 1, active,
                        [&](const LaunchTables& ts, int64_t blocks) {
                          if (blocks == 0) return Status::OK();
                          k_forward_multi<<<static_cast<int>(blocks), kBlock, 0, stream>>>(ts);
                          SOK_LAUNCH_CHECK();
                          return Status::OK();
                        });
}

Status pooled_backward_multi_unordered(const PooledTable* tables, int count, cudaStream_t stream,
                                       DeviceAllocator* alloc) {
  auto active = [](const PooledTable& p) {
    return p.dim > 0 && p.num_rows > 0 && p.n > 0 && p.batch > 0;
  };
  return for_each_chunk(
      tables, count, alloc, stream, kBackwardReps, active,
      [&](const LaunchTables& ts, int64_t blocks) {
        int64_t elements = 0;
        for (int k = 0; k < ts.count; ++k) {
          if (ts.t[k].row_at == nullptr) elements += ts.t[k].num_rows * ts.t[k].dim;
        }
        if (elements == 0 && blocks == 0) return Status::OK();
        // Enough blocks to fill the GPU; the grid-stride loop does the rest.
        const int zero_grid = grid_for(
            ceil_div(elements, 4) < 4096 * kBlock ? ceil_div(elements, 4) : 4096 * kBlock, kBlock);
        if (elements > 0) {
          k_zero_multi<<<zero_grid, kBlock, 0, stream>>>(ts);
          SOK_LAUNCH_CHECK();
        }
        if (blocks == 0) return Status::OK();
        k_backward_multi<<<static_cast<int>(blocks), kBlock, 0, stream>>>(ts);
        SOK_LAUNCH_CHECK();
        return Status::OK();
      });
}

Status dense_row_splits(int64_t batch, int64_t per_sample, int64_t* row_splits,
                        cudaStream_t stream) {
  if (batch < 0 || per_sample < 0) return Status::Invalid("dense_row_splits: negative size");
  k_dense_row_splits<<<grid_for(batch + 1, kBlock), kBlock, 0, stream>>>(batch, per_sample,
                                                                          row_splits);
  SOK_LAUNCH_CHECK();
  return Status::OK();
}

}  // namespace gpu
}  // namespace sok
