// The device work of GpuTieredTable (tier_moves.cuh): moving rows between the tiers, reading the
// host tier and the SSD tier's rows, picking a tier's coldest rows.
#include <cooperative_groups.h>
#include <cuda_runtime.h>
#include <thrust/iterator/counting_iterator.h>

#include <algorithm>
#include <cstdint>
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_select.cuh>
#include <limits>

#include "addons/sparse_operation_kit/core/common.h"
#include "addons/sparse_operation_kit/core/cuda/device_util.cuh"
#include "addons/sparse_operation_kit/core/cuda/runtime.h"
#include "addons/sparse_operation_kit/core/cuda/table_many.cuh"
#include "addons/sparse_operation_kit/core/cuda/tier_moves.cuh"

namespace sok {
namespace gpu {
namespace detail {
namespace {

namespace cg = cooperative_groups;

// Marks `s` erased (lane 0); false when another tile erased it first.
__device__ bool erase_slot(const DevTable& t, int64_t s, uint64_t h) {
  uint32_t* wp = t.digests + (s >> 2);
  const int sh = 8 * static_cast<int>(s & 3);
  const uint32_t d = digest_of(h);
  uint32_t w = ld_relaxed_u32(wp);
  while (((w >> sh) & 0xffu) == d) {
    const uint32_t old = atomicCAS(wp, w, (w & ~(0xffu << sh)) | (kErasedB << sh));
    if (old == w) return true;
    w = old;
  }
  return false;
}

// The blocks of the part holding this block (the parts' blocks are consecutive).
template <typename Part>
__device__ __forceinline__ int32_t blocks_of_part(const PartsLaunch<Part>& L, int part) {
  const int32_t next =
      part + 1 < L.count ? L.first_block[part + 1] : static_cast<int32_t>(gridDim.x);
  return next - L.first_block[part];
}

template <typename K>
__global__ void
__launch_bounds__(kBlock)
    k_move(const __grid_constant__ PartsLaunch<MovePart<K>> L) {
  const int part = part_of_block(L, blockIdx.x);
  const MovePart<K>& q = L.part[part];
  const DevTable& src = q.src;
  const DevTable& dst = q.dst;
  const Tile tile = cg::tiled_partition<kTile>(cg::this_thread_block());
  const int64_t i = key_of_thread(L.first_block[part]);
  const int lane = tile.thread_rank();
  int inserted = 0, erased = 0;
  if (i < effective_n(q.keys.n, q.keys.d_n)) {
    const int64_t key = static_cast<int64_t>(q.keys.keys[i]);
    const uint64_t h = hash_key(key);
    const int64_t s = probe_find<true>(tile, src, key, h);
    // A repeated key: the tile that claims the destination copies; whichever tile gets there
    // first erases the source (its row stays readable: slots are not reused before a rehash).
    const Claim r = s >= 0 ? probe_insert(tile, dst, key, h, q.dst_fail) : Claim{-1, false};
    // A launch moves one way: a pooled source only gives rows back, a pooled destination only
    // takes them (table_layout.cuh).
    float* to = r.slot >= 0 && r.fresh ? fresh_row(tile, dst, r.slot, q.dst_fail) : nullptr;
    if (to != nullptr) {
      if (lane == 0) {
        dst.meta[r.slot] = src.meta[s];
        dst.versions[r.slot] = src.versions[s];
      }
      const float* from = row_at(src, s);
      for (int64_t c = lane; c < dst.stride; c += kTile) to[c] = __ldcg(from + c);
      publish(tile, dst, r.slot, h);
      inserted = lane == 0;
    }
    if (r.slot >= 0 && (!r.fresh || to != nullptr) && lane == 0 && erase_slot(src, s, h)) {
      erased = 1;
      give_row(src, s);
    }
  }
  add_count(q.dst_counters, inserted);
  if (q.moved != nullptr) add_count(q.moved, inserted);
  const int total = __syncthreads_count(erased);
  if (threadIdx.x == 0 && total != 0) {
    atomicAdd(reinterpret_cast<unsigned long long*>(&q.src_counters[0]),
              static_cast<unsigned long long>(-total));
    atomicAdd(reinterpret_cast<unsigned long long*>(&q.src_counters[1]),
              static_cast<unsigned long long>(total));
  }
}

template <typename K>
__global__ void __launch_bounds__(kBlock) k_find_present(DevTable t, int64_t filter, float no_perm,
                                                         const K* keys, int64_t n,
                                                         const int64_t* d_n, float* out) {
  const Tile tile = cg::tiled_partition<kTile>(cg::this_thread_block());
  const int64_t i = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / kTile;
  if (i >= effective_n(n, d_n)) return;
  const int64_t key = static_cast<int64_t>(keys[i]);
  const int64_t s = probe_find<false>(tile, t, key, hash_key(key));
  if (s < 0) return;
  float* o = out + i * t.dim;
  if (filter > 0 && ld_relaxed_i64(&t.meta[s].freq) < filter) {
    fill_row<false>(tile, no_perm, o, t.dim);
  } else {
    copy_row<false>(tile, row_at(t, s), o, t.dim);
  }
}

template <typename K>
__global__ void __launch_bounds__(kBlock)
    k_protect(DevTable t, const K* keys, int64_t n, const int64_t* d_n, uint8_t* flags) {
  const Tile tile = cg::tiled_partition<kTile>(cg::this_thread_block());
  const int64_t i = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / kTile;
  if (i >= effective_n(n, d_n)) return;
  const int64_t key = static_cast<int64_t>(keys[i]);
  const int64_t s = probe_find<false>(tile, t, key, hash_key(key));
  if (s >= 0 && tile.thread_rank() == 0) flags[s] = 1;
}


// The sort key of each listed slot: protected rows (and entries past the real count) last.
__global__ void k_scores(DevTable t, int64_t* slots, const int64_t* d_num, int64_t m,
                         const uint8_t* flags, bool lfu, uint64_t* scores) {
  const int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (j >= m) return;
  constexpr uint64_t kLast = ~uint64_t{0};
  if (j >= *d_num) {
    slots[j] = -1;
    scores[j] = kLast;
    return;
  }
  const int64_t s = slots[j];
  uint64_t v;
  if (flags[s] != 0) {
    v = kLast;
  } else {
    const int64_t x = lfu ? t.meta[s].freq : t.versions[s];
    v = static_cast<uint64_t>(x) ^ (uint64_t{1} << 63);  // signed order as unsigned
    if (v == kLast) v = kLast - 1;
  }
  scores[j] = v;
}

template <typename K>
__global__ void k_keys_of(DevTable t, const int64_t* slots, int64_t count, K* out) {
  const int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (j >= count) return;
  const int64_t s = slots[j] >= 0 ? slots[j] : slots[0];  // a stale count: repeat a real victim
  out[j] = static_cast<K>(t.meta[s].key);
}


// Heat on a log scale with 4 steps per octave (a small histogram covers every int64): LFU the
// frequency, LRU the recency (rule.now - version, reversed). Higher is hotter.
__device__ __forceinline__ int log_bin(int64_t x) {
  if (x < 4) return x < 0 ? 0 : static_cast<int>(x);
  const int e = 63 - __clzll(static_cast<long long>(x));
  return 4 * (e - 1) + static_cast<int>((x >> (e - 2)) & 3);
}
__device__ __forceinline__ int heat_bin(const PlanRule& r, const DevTable& t, int64_t s) {
  if (r.lfu) return log_bin(t.meta[s].freq);
  return kHeatBins - 1 - log_bin(r.now - t.versions[s]);
}

__device__ __forceinline__ int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }

__device__ __forceinline__ int64_t atomic_inc(int64_t* p) {
  return static_cast<int64_t>(atomicAdd(reinterpret_cast<unsigned long long*>(p), 1ull));
}

int scan_grid(int64_t slots) { return std::min(grid_for(slots, kBlock), 1024); }

static_assert(sizeof(PartsLaunch<PlanPart<int64_t>>) <= kMaxKernelParamBytes &&
                  sizeof(PartsLaunch<MovePart<int64_t>>) <= kMaxKernelParamBytes,
              "a launch's parts must fit the kernel parameters CUDA passes");

// The plan's kernels, one launch each over every part: the scans of the HBM tier (heat_hist,
// pick_victims) give each part its own blocks, pick_up its keys' blocks, the one-thread steps a
// thread per part.
template <typename K>
__global__ void k_plan_reset(const __grid_constant__ PartsLaunch<PlanPart<K>> L) {
  auto* w = reinterpret_cast<uint32_t*>(L.part[blockIdx.x].ps);
  for (size_t j = threadIdx.x; j < sizeof(PlanScratch) / 4; j += blockDim.x) w[j] = 0;
}

template <typename K>
__global__ void __launch_bounds__(kBlock)
    k_heat_hist(const __grid_constant__ PartsLaunch<PlanPart<K>> L) {
  const int part = part_of_block(L, blockIdx.x);
  const PlanPart<K>& q = L.part[part];
  __shared__ uint32_t hist[kHeatBins];
  for (int b = threadIdx.x; b < kHeatBins; b += blockDim.x) hist[b] = 0;
  __syncthreads();
  const int64_t step = static_cast<int64_t>(blocks_of_part(L, part)) * blockDim.x;
  for (int64_t s = (blockIdx.x - L.first_block[part]) * static_cast<int64_t>(blockDim.x) +
                   threadIdx.x;
       s < q.hot_capacity; s += step) {
    if (live_slot(q.hot.digests, s)) atomicAdd(&hist[heat_bin(q.rule, q.hot, s)], 1u);
  }
  __syncthreads();
  for (int b = threadIdx.x; b < kHeatBins; b += blockDim.x)
    if (hist[b] != 0) atomicAdd(&q.ps->hist[b], hist[b]);
}

// The room left, and the threshold: the lowest bin at which max_swaps HBM rows are at or below.
template <typename K>
__global__ void k_plan_threshold(const __grid_constant__ PartsLaunch<PlanPart<K>> L) {
  if (static_cast<int>(threadIdx.x) >= L.count) return;
  const PlanPart<K>& q = L.part[threadIdx.x];
  PlanScratch* ps = q.ps;
  ps->room = q.rule.budget - q.hot_counters[0];
  int64_t below = 0;
  ps->threshold = kHeatBins;  // too few rows to swap: no host row is hotter
  for (int b = 0; b < kHeatBins; ++b) {
    below += ps->hist[b];
    if (below >= q.rule.max_swaps) {
      ps->threshold = b;
      break;
    }
  }
}

// The host tier's rows of this call's keys: into the room left while there is some, else into
// swap_in when hotter than the threshold.
template <typename K>
__global__ void __launch_bounds__(kBlock)
    k_pick_up(const __grid_constant__ PartsLaunch<PlanPart<K>> L) {
  const int part = part_of_block(L, blockIdx.x);
  const PlanPart<K>& q = L.part[part];
  const Tile tile = cg::tiled_partition<kTile>(cg::this_thread_block());
  const int64_t i = key_of_thread(L.first_block[part]);
  if (i >= effective_n(q.keys.n, q.keys.d_n)) return;
  const K k = q.keys.keys[i];
  const int64_t key = static_cast<int64_t>(k);
  const int64_t s = probe_find<false>(tile, q.cold, key, hash_key(key));
  if (s < 0 || tile.thread_rank() != 0) return;
  PlanScratch* ps = q.ps;
  const int64_t token = static_cast<int64_t>(atomicAdd(
      reinterpret_cast<unsigned long long*>(&ps->room), static_cast<unsigned long long>(-1)));
  if (token > 0) {
    const int64_t j = atomic_inc(&ps->num_up);
    if (j < q.rule.max_up) q.up[j] = k;
    return;
  }
  if (heat_bin(q.rule, q.cold, s) <= ps->threshold) return;
  const int64_t j = atomic_inc(&ps->num_in);
  if (j < q.rule.max_swaps) q.swap_in[j] = k;
}

// HBM rows at or below the threshold, as many as there are hotter host rows to replace them.
template <typename K>
__global__ void __launch_bounds__(kBlock)
    k_pick_victims(const __grid_constant__ PartsLaunch<PlanPart<K>> L) {
  const int part = part_of_block(L, blockIdx.x);
  const PlanPart<K>& q = L.part[part];
  PlanScratch* ps = q.ps;
  const int64_t want = imin(ps->num_in, q.rule.max_swaps);
  if (want == 0) return;
  const int64_t step = static_cast<int64_t>(blocks_of_part(L, part)) * blockDim.x;
  for (int64_t s = (blockIdx.x - L.first_block[part]) * static_cast<int64_t>(blockDim.x) +
                   threadIdx.x;
       s < q.hot_capacity; s += step) {
    if (!live_slot(q.hot.digests, s) || heat_bin(q.rule, q.hot, s) > ps->threshold) continue;
    const int64_t j = atomic_inc(&ps->num_victims);
    if (j < want) q.victims[j] = static_cast<K>(q.hot.meta[s].key);
  }
}

template <typename K>
__global__ void k_plan_swaps(const __grid_constant__ PartsLaunch<PlanPart<K>> L) {
  if (static_cast<int>(threadIdx.x) >= L.count) return;
  const PlanPart<K>& q = L.part[threadIdx.x];
  PlanScratch* ps = q.ps;
  ps->num_up = imin(ps->num_up, q.rule.max_up);
  ps->num_swaps = imin(imin(ps->num_in, ps->num_victims), q.rule.max_swaps);
}

__global__ void k_scatter_rows(const float* rows, const int64_t* pos, int64_t m, int64_t dim,
                               float* out) {
  const int64_t x = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (x >= m * dim) return;
  const int64_t j = x / dim;
  out[pos[j] * dim + x % dim] = rows[x];
}

}  // namespace

Status scatter_rows(const float* rows, const int64_t* pos, int64_t m, int64_t dim, float* out,
                    cudaStream_t s) {
  if (m <= 0) return Status::OK();
  k_scatter_rows<<<grid_for(m * dim, kBlock), kBlock, 0, s>>>(rows, pos, m, dim, out);
  SOK_LAUNCH_CHECK();
  return Status::OK();
}

template <typename K>
Status move_rows_many(const std::vector<MovePart<K>>& parts, cudaStream_t s) {
  for (size_t begin = 0; begin < parts.size(); begin += kPartsPerLaunch) {
    const size_t end = std::min(parts.size(), begin + kPartsPerLaunch);
    PartsLaunch<MovePart<K>> L;
    L.count = static_cast<int32_t>(end - begin);
    int64_t blocks = 0;
    for (size_t i = begin; i < end; ++i) {
      if (parts[i].src.stride != parts[i].dst.stride)
        return Status::Invalid("tiers of different row layouts");
      L.part[i - begin] = parts[i];
      L.first_block[i - begin] = static_cast<int32_t>(blocks);
      blocks += blocks_for_keys(parts[i].keys.n);
    }
    if (blocks == 0) continue;
    k_move<K><<<static_cast<int>(blocks), kBlock, 0, s>>>(L);
    SOK_LAUNCH_CHECK();
  }
  return Status::OK();
}

template <typename K>
Status find_present(const DevTable& t, const RowInit& ri, const KeySpan<K>& keys, float* out,
                    cudaStream_t s) {
  if (keys.n <= 0) return Status::OK();
  k_find_present<K><<<grid_for(keys.n * kTile, kBlock), kBlock, 0, s>>>(
      t, ri.filter_freq, ri.no_perm, keys.keys, keys.n, keys.d_n, out);
  SOK_LAUNCH_CHECK();
  return Status::OK();
}

template <typename K>
Status coldest_keys(const DevTable& t, int64_t capacity, int64_t live, bool lfu,
                    const KeySpan<K>& keys, int64_t count, K* victims, DeviceAllocator* alloc,
                    cudaStream_t s) {
  if (count <= 0 || live <= 0) return Status::OK();
  if (live > std::numeric_limits<int>::max() || count > live)
    return Status::Invalid("demotion: bad row count");
  const int m = static_cast<int>(live);
  thrust::counting_iterator<int64_t> it(0);
  const IsLiveSlot pred{t.digests};
  size_t sel_bytes = 0, sort_bytes = 0;
  SOK_CUDA_RETURN(cub::DeviceSelect::If(nullptr, sel_bytes, it, static_cast<int64_t*>(nullptr),
                                        static_cast<int64_t*>(nullptr), capacity, pred, s));
  SOK_CUDA_RETURN(cub::DeviceRadixSort::SortPairs(
      nullptr, sort_bytes, static_cast<uint64_t*>(nullptr), static_cast<uint64_t*>(nullptr),
      static_cast<int64_t*>(nullptr), static_cast<int64_t*>(nullptr), m, 0, 64, s));
  uint8_t* flags;
  int64_t *slots, *sorted, *num;
  uint64_t *scores, *scores_out;
  void *sel_tmp, *sort_tmp;
  Temp tmp;
  SOK_RETURN_IF_ERROR(carve_temp(alloc, s, &tmp, [&](Workspace& ws) {
    flags = ws.take<uint8_t>(capacity);
    slots = ws.take<int64_t>(capacity);
    sorted = ws.take<int64_t>(m);
    num = ws.take<int64_t>(1);
    scores = ws.take<uint64_t>(m);
    scores_out = ws.take<uint64_t>(m);
    sel_tmp = ws.take_bytes(sel_bytes);
    sort_tmp = ws.take_bytes(sort_bytes);
  }));
  SOK_CUDA_RETURN(cudaMemsetAsync(flags, 0, capacity, s));
  if (keys.n > 0) {
    k_protect<K><<<grid_for(keys.n * kTile, kBlock), kBlock, 0, s>>>(t, keys.keys, keys.n,
                                                                     keys.d_n, flags);
    SOK_LAUNCH_CHECK();
  }
  SOK_CUDA_RETURN(cub::DeviceSelect::If(sel_tmp, sel_bytes, it, slots, num, capacity, pred, s));
  k_scores<<<grid_for(m, kBlock), kBlock, 0, s>>>(t, slots, num, m, flags, lfu, scores);
  SOK_LAUNCH_CHECK();
  SOK_CUDA_RETURN(cub::DeviceRadixSort::SortPairs(sort_tmp, sort_bytes, scores, scores_out, slots,
                                                  sorted, m, 0, 64, s));
  k_keys_of<K><<<grid_for(count, kBlock), kBlock, 0, s>>>(t, sorted, count, victims);
  SOK_LAUNCH_CHECK();
  return Status::OK();
}

template <typename K>
Status plan_moves_many(const std::vector<PlanPart<K>>& parts, cudaStream_t s) {
  for (size_t begin = 0; begin < parts.size(); begin += kPartsPerLaunch) {
    const size_t end = std::min(parts.size(), begin + kPartsPerLaunch);
    PartsLaunch<PlanPart<K>> L;
    L.count = static_cast<int32_t>(end - begin);
    // The parts' blocks: over their HBM tier's slots (scans) or over their keys (pick_up).
    const auto lay_out = [&](bool over_keys) {
      int64_t blocks = 0;
      for (size_t i = begin; i < end; ++i) {
        L.first_block[i - begin] = static_cast<int32_t>(blocks);
        blocks += over_keys ? blocks_for_keys(parts[i].keys.n) : scan_grid(parts[i].hot_capacity);
      }
      return static_cast<int>(blocks);
    };
    for (size_t i = begin; i < end; ++i) L.part[i - begin] = parts[i];
    k_plan_reset<K><<<L.count, kBlock, 0, s>>>(L);
    SOK_LAUNCH_CHECK();
    const int scan = lay_out(false);
    if (scan > 0) k_heat_hist<K><<<scan, kBlock, 0, s>>>(L);
    SOK_LAUNCH_CHECK();
    k_plan_threshold<K><<<1, kPartsPerLaunch, 0, s>>>(L);
    SOK_LAUNCH_CHECK();
    const int keys = lay_out(true);
    if (keys > 0) k_pick_up<K><<<keys, kBlock, 0, s>>>(L);
    SOK_LAUNCH_CHECK();
    lay_out(false);
    if (scan > 0) k_pick_victims<K><<<scan, kBlock, 0, s>>>(L);
    SOK_LAUNCH_CHECK();
    k_plan_swaps<K><<<1, kPartsPerLaunch, 0, s>>>(L);
    SOK_LAUNCH_CHECK();
  }
  return Status::OK();
}

#define SOK_TIER_MOVES(K)                                                                       \
  template Status move_rows_many<K>(const std::vector<MovePart<K>>&, cudaStream_t);             \
  template Status plan_moves_many<K>(const std::vector<PlanPart<K>>&, cudaStream_t);            \
  template Status find_present<K>(const DevTable&, const RowInit&, const KeySpan<K>&, float*,   \
                                  cudaStream_t);                                                \
  template Status coldest_keys<K>(const DevTable&, int64_t, int64_t, bool, const KeySpan<K>&,   \
                                  int64_t, K*, DeviceAllocator*, cudaStream_t);
SOK_TIER_MOVES(int32_t)
SOK_TIER_MOVES(int64_t)
#undef SOK_TIER_MOVES

}  // namespace detail
}  // namespace gpu
}  // namespace sok
