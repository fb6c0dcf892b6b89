// Internal: a tiered table's stage (gpu_tiered_table.h). A training lookup copies each row it
// serves from host memory whole (values and slots) into GPU memory, where the update that
// follows reads it: the update then only writes its host rows over PCIe, where it read and wrote
// them, and the lookup reads each row in one access instead of its values alone
// (benchmarks/gpu/host_read_bench: a row read and written at once moves 0.72x the copy
// bandwidth each way, a row read 0.92x).
//
// A staged row is a copy: it is used only while the host row is unchanged. The table starts a
// new epoch (which empties the stage) after every update and every other call that writes rows;
// a row the stage has no room for, or no copy of, is read from host memory as before. Results
// are those of the host rows to the bit.
#pragma once

#include <cstdint>

#include "addons/sparse_operation_kit/core/cuda/table_layout.cuh"

namespace sok {
namespace gpu {
namespace detail {

struct HostRowStage {
  int64_t* keys = nullptr;   // [mask + 1]: open addressing by key
  int32_t* tags = nullptr;   // [mask + 1]: an entry is live while its tag is `epoch`
  int32_t* at = nullptr;     // [mask + 1]: its row in `rows`
  float* rows = nullptr;     // [capacity, stride]; null: no stage
  int64_t* taken = nullptr;  // rows given out this epoch (may pass capacity: those go unstaged)
  int64_t* used = nullptr;   // updates served from a staged row (a statistic)
  uint64_t mask = 0;         // entries - 1, entries >= 2 * capacity: a probe meets a free entry
  int64_t capacity = 0;
  int32_t epoch = 1;
  int32_t stride = 0;
};

// A row of the stage for `key` (recorded under it), or null when the stage is full.
__device__ inline float* stage_claim(const Tile& tile, const HostRowStage& st, int64_t key) {
  int64_t r = 0;
  if (tile.thread_rank() == 0) {
    r = static_cast<int64_t>(atomicAdd(reinterpret_cast<unsigned long long*>(st.taken), 1ull));
    if (r < st.capacity) {
      for (uint64_t e = hash_key(key) & st.mask;; e = (e + 1) & st.mask) {
        const int32_t tag =
            static_cast<int32_t>(ld_relaxed_u32(reinterpret_cast<const uint32_t*>(st.tags + e)));
        if (tag != st.epoch && atomicCAS(st.tags + e, tag, st.epoch) == tag) {
          st.keys[e] = key;
          st.at[e] = static_cast<int32_t>(r);
          break;
        }
      }
    }
  }
  r = tile.shfl(r, 0);
  return r < st.capacity ? st.rows + r * st.stride : nullptr;
}

// Copies the whole row `src` (stride floats) to the stage row `dst`, and its first dim floats
// to `out` (when not null), reading each element once.
template <bool V4>
__device__ __forceinline__ void stage_copy(const Tile& tile, const float* src, float* dst,
                                           float* out, int64_t stride, int64_t dim) {
  const int lane = tile.thread_rank();
  if (V4) {
    for (int64_t c = 4 * lane; c < stride; c += 4 * kTile) {
      const float4 x = __ldcg(reinterpret_cast<const float4*>(src + c));
      __stcg(reinterpret_cast<float4*>(dst + c), x);
      if (out != nullptr && c < dim) __stcs(reinterpret_cast<float4*>(out + c), x);
    }
  } else {
    for (int64_t c = lane; c < stride; c += kTile) {
      const float x = __ldcg(src + c);
      dst[c] = x;
      if (out != nullptr && c < dim) __stcs(out + c, x);
    }
  }
}

// The staged copy of `key`'s row, or null.
__device__ inline const float* staged_row(const HostRowStage& st, int64_t key) {
  if (st.rows == nullptr) return nullptr;
  for (uint64_t e = hash_key(key) & st.mask;; e = (e + 1) & st.mask) {
    if (st.tags[e] != st.epoch) return nullptr;
    if (st.keys[e] == key) return st.rows + static_cast<int64_t>(st.at[e]) * st.stride;
  }
}

}  // namespace detail
}  // namespace gpu
}  // namespace sok
