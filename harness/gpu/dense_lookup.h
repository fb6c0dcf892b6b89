// The benchmarks' dense-table lookup: ids index a table[num_rows, dim] (row-major, on the device)
// directly, with no dedup. It runs the core's pooled forward kernel (pooled_forward.cuh) on the
// table itself. I = int32_t or int64_t.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "addons/sparse_operation_kit/core/cuda/gpu_api.h"

namespace sok {
namespace harness {

// out[i] = table[ids[i]]; an id outside [0, num_rows) is reported through d_err (required) and
// its output row is zero-filled instead of read.
template <typename I>
Status gather_static(const float* table, int64_t num_rows, int64_t dim, const I* ids, int64_t n,
                     float* out, gpu::GpuLookupError* d_err, cudaStream_t stream);
// Fused pooled lookup straight from the dense table: out[b] = combine(table[ids[i]]) over the
// ids of sample b (no intermediate rows). Bad ids are reported and skipped.
template <typename I>
Status static_pooled_forward(const float* table, int64_t num_rows, int64_t dim, const I* ids,
                             gpu::Segments seg, const float* weights, int64_t n, int64_t batch,
                             Combiner combiner, float* out, gpu::GpuLookupError* d_err,
                             cudaStream_t stream, gpu::DeviceAllocator* alloc = nullptr);

}  // namespace harness
}  // namespace sok
