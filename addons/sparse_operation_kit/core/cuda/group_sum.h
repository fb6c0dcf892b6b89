// Internal: the deterministic sum of rows by group, shared by the pooled backward and the
// table's duplicate-key summing before an optimizer step.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "addons/sparse_operation_kit/core/cuda/gpu_api.h"

namespace sok {
namespace gpu {
namespace detail {

// out[g, dim] = sum over ids i with group[i] == g (ascending i) of
//   (weights ? weights[i] : 1) * (scale ? scale[r] : 1) * src[r, dim],  r = src_row ? src_row[i] :
//   i.
// Groups outside [0, num_groups) are ignored; groups no id names are zero. d_num_groups
// (optional device scalar) limits the rows written. Deterministic: long groups are cut in
// fixed chunks whose partial sums are added in order.
// src_row entries outside [0, num_src_rows) (when num_src_rows > 0) are ignored as well.
Status sum_rows_by_group(const float* src, int64_t dim, const int32_t* group,
                         const int64_t* src_row, int64_t num_src_rows, const float* weights,
                         const float* scale, int64_t n, int64_t num_groups,
                         const int64_t* d_num_groups, float* out, cudaStream_t stream,
                         DeviceAllocator* alloc);

}  // namespace detail
}  // namespace gpu
}  // namespace sok
