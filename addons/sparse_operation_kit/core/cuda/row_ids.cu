// first_id_outside (row_ids.h): every thread checks ids and lowers the first bad position.
#include <cuda_runtime.h>

#include <algorithm>

#include "addons/sparse_operation_kit/core/cuda/row_ids.h"
#include "addons/sparse_operation_kit/core/cuda/runtime.h"

namespace sok {
namespace gpu {
namespace {

template <typename K>
__global__ void k_first_id_outside(const K* ids, int64_t n, int64_t rows,
                                   unsigned long long* first) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += stride) {
    const int64_t id = static_cast<int64_t>(ids[i]);
    if (id < 0 || id >= rows) {
      atomicMin(first, static_cast<unsigned long long>(i));
      return;  // later ids of this thread come after i
    }
  }
}

}  // namespace

template <typename K>
Status first_id_outside(const K* ids, int64_t n, int64_t rows, int64_t* d_scratch,
                        cudaStream_t stream, int64_t* position, K* id) {
  *position = -1;
  if (n <= 0) return Status::OK();
  // All ones: no position yet (atomicMin on unsigned).
  SOK_CUDA_RETURN(cudaMemsetAsync(d_scratch, 0xff, sizeof(int64_t), stream));
  // At most a few waves of blocks: the check is one read of the ids.
  const int grid = std::min(detail::grid_for(n, detail::kBlock), 1024);
  k_first_id_outside<<<grid, detail::kBlock, 0, stream>>>(
      ids, n, rows, reinterpret_cast<unsigned long long*>(d_scratch));
  SOK_LAUNCH_CHECK();
  uint64_t first = 0;
  SOK_CUDA_RETURN(
      cudaMemcpyAsync(&first, d_scratch, sizeof(first), cudaMemcpyDeviceToHost, stream));
  SOK_CUDA_RETURN(cudaStreamSynchronize(stream));
  if (first >= static_cast<uint64_t>(n)) return Status::OK();
  *position = static_cast<int64_t>(first);
  SOK_CUDA_RETURN(cudaMemcpyAsync(id, ids + first, sizeof(K), cudaMemcpyDeviceToHost, stream));
  SOK_CUDA_RETURN(cudaStreamSynchronize(stream));
  return Status::OK();
}

template Status first_id_outside<int32_t>(const int32_t*, int64_t, int64_t, int64_t*, cudaStream_t,
                                          int64_t*, int32_t*);
template Status first_id_outside<int64_t>(const int64_t*, int64_t, int64_t, int64_t*, cudaStream_t,
                                          int64_t*, int64_t*);

}  // namespace gpu
}  // namespace sok
