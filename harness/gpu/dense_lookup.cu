// dense_lookup.h: the dense-table gather and pooled lookup.
#include <cuda_runtime.h>

#include "addons/sparse_operation_kit/core/cuda/device_util.cuh"
#include "addons/sparse_operation_kit/core/cuda/pooled_forward.cuh"
#include "addons/sparse_operation_kit/core/cuda/runtime.h"
#include "addons/sparse_operation_kit/core/cuda/segments.cuh"
#include "harness/gpu/dense_lookup.h"

namespace sok {
namespace harness {

using namespace gpu;          // NOLINT
using namespace gpu::detail;  // NOLINT

template <typename I>
Status static_pooled_forward(const float* table, int64_t num_rows, int64_t dim, const I* ids,
                             Segments seg, const float* weights, int64_t n, int64_t batch,
                             Combiner combiner, float* out, GpuLookupError* d_err,
                             cudaStream_t stream, DeviceAllocator* alloc) {
  if (d_err == nullptr)
    return Status::Invalid("static_pooled_forward: an error record is required");
  CsrHolder h;
  SOK_RETURN_IF_ERROR(build_csr(seg, n, batch, d_err, stream, alloc, &h));
  RowSrc<I> src{table, num_rows, ids, dim, d_err};
  return launch_pooled_forward(src, h.view, weights, batch, dim, combiner, out, stream,
                               checks_for(seg, n));
}

namespace {
template <typename I>
__global__ void k_gather_static(const float* table, int64_t num_rows, int64_t dim, const I* ids,
                                int64_t n, float* out, GpuLookupError* err) {
  constexpr int L = 8;
  const int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t i = t / L;
  const int l = static_cast<int>(t % L);
  if (i >= n) return;
  const int64_t r = static_cast<int64_t>(ids[i]);
  float* d = out + i * dim;
  if (r < 0 || r >= num_rows) {
    if (l == 0) report_error(err, i, 1);
    for (int64_t c = l; c < dim; c += L) d[c] = 0.f;
    return;
  }
  const float* s = table + r * dim;
  if ((dim & 3) == 0) {
    for (int64_t c = 4 * l; c < dim; c += 4 * L)
      *reinterpret_cast<float4*>(d + c) = __ldg(reinterpret_cast<const float4*>(s + c));
  } else {
    for (int64_t c = l; c < dim; c += L) d[c] = __ldg(s + c);
  }
}
}  // namespace

template <typename I>
Status gather_static(const float* table, int64_t num_rows, int64_t dim, const I* ids, int64_t n,
                     float* out, GpuLookupError* d_err, cudaStream_t stream) {
  if (d_err == nullptr) return Status::Invalid("gather_static: an error record is required");
  if (n <= 0 || dim <= 0) return Status::OK();
  k_gather_static<I>
      <<<grid_for(n * 8, kBlock), kBlock, 0, stream>>>(table, num_rows, dim, ids, n, out, d_err);
  SOK_LAUNCH_CHECK();
  return finalize_error<I>(d_err, ids, nullptr, nullptr, stream);
}

template Status gather_static<int32_t>(const float*, int64_t, int64_t, const int32_t*, int64_t,
                                       float*, GpuLookupError*, cudaStream_t);
template Status gather_static<int64_t>(const float*, int64_t, int64_t, const int64_t*, int64_t,
                                       float*, GpuLookupError*, cudaStream_t);
template Status static_pooled_forward<int32_t>(const float*, int64_t, int64_t, const int32_t*,
                                               Segments, const float*, int64_t, int64_t, Combiner,
                                               float*, GpuLookupError*, cudaStream_t,
                                               DeviceAllocator*);
template Status static_pooled_forward<int64_t>(const float*, int64_t, int64_t, const int64_t*,
                                               Segments, const float*, int64_t, int64_t, Combiner,
                                               float*, GpuLookupError*, cudaStream_t,
                                               DeviceAllocator*);

}  // namespace harness
}  // namespace sok
