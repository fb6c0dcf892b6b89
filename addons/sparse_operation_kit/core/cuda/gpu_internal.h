// Internal entry points shared by the CUDA sources (not part of the public API).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "addons/sparse_operation_kit/core/cuda/gpu_api.h"

namespace sok {
namespace gpu {
namespace detail {

// out[g, dim] = sum over ids i with group[i] == g (ascending i) of
//   (weights ? weights[i] : 1) * (scale ? scale[r] : 1) * src[r, dim],  r = src_row ? src_row[i] : i.
// Groups outside [0, num_groups) are ignored; groups no id names are zero. d_num_groups
// (optional device scalar) limits the rows written. Deterministic: long groups are cut in
// fixed chunks whose partial sums are added in order.
// src_row entries outside [0, num_src_rows) (when num_src_rows > 0) are ignored as well.
Status sum_rows_by_group(const float* src, int64_t dim, const int32_t* group, const int64_t* src_row,
                         int64_t num_src_rows, const float* weights, const float* scale, int64_t n, int64_t num_groups,
                         const int64_t* d_num_groups, float* out, cudaStream_t stream,
                         DeviceAllocator* alloc);

// Kernel variants for benchmarks and tuning (0 = automatic choice). Not thread-safe; set before
// launching. Defaults are the measured best (benchmarks/gpu/RESULTS.md).
struct Tuning {
  int pooled_variant = 0;  // pooled forward: 1 = per-group id loads (4 rows in flight per lane),
                           // 2 = warp-wide id prefetch, 3 = as 1 with 8 rows in flight;
                           // 0 = 3 for rows of <= 16 lanes (dim <= 64 floats), else 1
  int apply_chunks = 0;    // optimizer kernel: column chunks in flight per lane (1, 2, 4)
  int find_min_blocks = 0; // find kernel: 0/8 = registers capped for 64 warps per SM, 1 = uncapped
};
Tuning& tuning();

}  // namespace detail
}  // namespace gpu
}  // namespace sok
