// Internal: the device work of GpuTieredTable (gpu_tiered_table.h) on the two tables' arrays.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "addons/sparse_operation_kit/core/cuda/gpu_api.h"
#include "addons/sparse_operation_kit/core/cuda/table_layout.cuh"

namespace sok {
namespace gpu {
namespace detail {

// Moves the keys `src` holds into `dst` (same stride), whole: key, frequency, version, row. The
// source slot is erased once the destination has the row; a key `src` lacks is skipped, a key
// repeated in `keys` moves once. counters: each table's [live, erased] (table_impl.cuh).
template <typename K>
Status move_rows(const DevTable& src, const DevTable& dst, const K* keys, int64_t n,
                 int64_t* src_counters, int64_t* dst_counters, int* dst_fail, cudaStream_t s);

// out[i] = the row of keys[i] where `t` holds it (the counter filter's default value while not
// admitted); other rows of out are left alone.
template <typename K>
Status find_present(const DevTable& t, const RowInit& ri, const K* keys, int64_t n, float* out,
                    cudaStream_t s);

// victims[0, count) = the keys of the `count` coldest of the `live` rows of `t` (capacity slots):
// LFU the lowest frequency, else the oldest version; the rows of `keys` come last.
template <typename K>
Status coldest_keys(const DevTable& t, int64_t capacity, int64_t live, bool lfu, const K* keys,
                    int64_t n, int64_t count, K* victims, DeviceAllocator* alloc, cudaStream_t s);

}  // namespace detail
}  // namespace gpu
}  // namespace sok
