// Key routing for the model-parallel pipeline (model_parallel.h): which rank owns each key, and
// gathers / scatters of keys and rows between orders. Device pointers, ordered on `stream`;
// `d_n` (optional device scalar <= n) is the real count, as in gpu_api.h.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "addons/sparse_operation_kit/core/cuda/gpu_api.h"

namespace sok {
namespace harness {

using gpu::DeviceAllocator;

// Stable grouping by owner = floor_mod(key, world_size): order[j] = position of the j-th key
// once grouped, counts[r] = how many keys rank r owns (device array of world_size entries).
template <typename K>
Status bucketize_by_owner(const K* keys, int64_t n, const int64_t* d_n, int world_size,
                          int64_t* order, int64_t* counts, cudaStream_t stream,
                          DeviceAllocator* alloc = nullptr);

// dst[j] = src[index[j]] for j < count (keys, counts, or rows of `dim` floats).
template <typename T>
Status gather(const T* src, const int64_t* index, int64_t n, const int64_t* d_n, T* dst,
              cudaStream_t stream);
Status gather_rows(const float* src, int64_t dim, const int64_t* index, int64_t n,
                   const int64_t* d_n, float* dst, cudaStream_t stream);
// dst[index[j]] = src[j] for j < count.
Status scatter_rows(const float* src, int64_t dim, const int64_t* index, int64_t n,
                    const int64_t* d_n, float* dst, cudaStream_t stream);

}  // namespace harness
}  // namespace sok
