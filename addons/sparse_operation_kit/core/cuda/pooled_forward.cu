// pooled_forward (gpu_api.h): the pooled combine of rows that unique_keys' inverse indexes.
#include "addons/sparse_operation_kit/core/cuda/gpu_api.h"
#include "addons/sparse_operation_kit/core/cuda/pooled_forward.cuh"
#include "addons/sparse_operation_kit/core/cuda/runtime.h"
#include "addons/sparse_operation_kit/core/cuda/segments.cuh"

namespace sok {
namespace gpu {

using namespace detail;  // NOLINT

Status pooled_forward(const float* rows, int64_t dim, int64_t num_rows, const int32_t* inverse,
                      Segments seg, const float* weights, int64_t n, int64_t batch,
                      Combiner combiner, float* out, cudaStream_t stream, GpuLookupError* d_err,
                      DeviceAllocator* alloc) {
  CsrHolder h;
  SOK_RETURN_IF_ERROR(build_csr(seg, n, batch, d_err, stream, alloc, &h));
  RowSrc<int32_t> src{rows, num_rows, inverse, dim, d_err};
  return launch_pooled_forward(src, h.view, weights, batch, dim, combiner, out, stream,
                               checks_for(seg, n));
}

}  // namespace gpu
}  // namespace sok
