// Internal: the device work of GpuTieredTable (gpu_tiered_table.h) on the two tables' arrays.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "addons/sparse_operation_kit/core/cuda/gpu_api.h"
#include "addons/sparse_operation_kit/core/cuda/table_layout.cuh"

namespace sok {
namespace gpu {
namespace detail {

// A call's keys: keys[0, n), of which only the first *d_n count when d_n (device memory) is given
// (a dedup's padded output).
template <typename K>
struct KeySpan {
  const K* keys = nullptr;
  int64_t n = 0;
  const int64_t* d_n = nullptr;
};

// One table's move: the keys `src` holds go into `dst` (same stride), whole: key, frequency,
// version, row. The source slot is erased once the destination has the row; a key `src` lacks is
// skipped, a key repeated in `keys` moves once. counters: each table's [live, erased]
// (table_impl.cuh); moved (optional device counter) += the rows moved.
template <typename K>
struct MovePart {
  DevTable src, dst;
  KeySpan<K> keys;
  int64_t* src_counters = nullptr;
  int64_t* dst_counters = nullptr;
  int* dst_fail = nullptr;
  int64_t* moved = nullptr;
};
// Every part's move, of different tables, in few launches (32 parts each).
template <typename K>
Status move_rows_many(const std::vector<MovePart<K>>& parts, cudaStream_t s);

// One pass of the tiers' placement policy (gpu_tiered_table.h), what it moves.
constexpr int kHeatBins = 256;
struct PlanRule {
  bool lfu = true;
  int64_t now = 0;        // LRU: the latest global step (recency = now - version)
  int64_t budget = 0;     // the HBM tier's rows allowed
  int64_t max_up = 0;     // capacity of `up`
  int64_t max_swaps = 1;  // capacity of swap_in and victims
};
struct PlanScratch {         // device memory
  uint32_t hist[kHeatBins];  // the HBM tier's rows per heat bin
  int64_t room;              // promotion tokens: budget - HBM rows
  int64_t threshold;         // HBM rows at or below this bin may go down, hotter host rows up
  int64_t num_up;            // up[0, num_up): the call's host rows promoted into the room left
  int64_t num_in;            // host rows of the call hotter than the threshold
  int64_t num_victims;       // HBM rows at or below it
  int64_t num_swaps;         // swap_in[0, num_swaps) go up after victims[0, num_swaps) go down
};
// One table's pass over the keys of one call: it plans up, swap_in (the host tier's rows of
// `keys`) and victims (the HBM tier's coldest rows, never a row hotter than any of swap_in).
template <typename K>
struct PlanPart {
  DevTable hot;
  int64_t hot_capacity = 0;  // slots
  const int64_t* hot_counters = nullptr;
  DevTable cold;
  KeySpan<K> keys;
  PlanRule rule;
  PlanScratch* ps = nullptr;
  K* up = nullptr;
  K* swap_in = nullptr;
  K* victims = nullptr;
};
// Every part's plan, of different tables, in few launches (32 parts each; no host sync).
template <typename K>
Status plan_moves_many(const std::vector<PlanPart<K>>& parts, cudaStream_t s);

// out[i] = the row of keys[i] where `t` holds it (the counter filter's default value while not
// admitted); other rows of out are left alone.
template <typename K>
Status find_present(const DevTable& t, const RowInit& ri, const KeySpan<K>& keys, float* out,
                    cudaStream_t s);

// out[pos[j]] = rows[j] for j < m (dim floats each; device pointers): a find's rows read from the
// SSD tier.
Status scatter_rows(const float* rows, const int64_t* pos, int64_t m, int64_t dim, float* out,
                    cudaStream_t s);

// victims[0, count) = the keys of the `count` coldest of the `live` rows of `t` (capacity slots):
// LFU the lowest frequency, else the oldest version; the rows of `keys` come last.
template <typename K>
Status coldest_keys(const DevTable& t, int64_t capacity, int64_t live, bool lfu,
                    const KeySpan<K>& keys, int64_t count, K* victims, DeviceAllocator* alloc,
                    cudaStream_t s);

}  // namespace detail
}  // namespace gpu
}  // namespace sok
