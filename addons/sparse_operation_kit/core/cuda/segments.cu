// build_csr (segments.cuh): segment ids -> row splits (+ a permutation when they are unsorted).
#include <cuda_runtime.h>

#include <cub/device/device_scan.cuh>

#include "addons/sparse_operation_kit/core/cuda/device_util.cuh"
#include "addons/sparse_operation_kit/core/cuda/segments.cuh"

namespace sok {
namespace gpu {
namespace detail {
namespace {

__global__ void k_seg_count(const int64_t* seg, int64_t n, int64_t batch, int64_t* counts,
                            int* flag, GpuLookupError* err) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const bool in = i < n;
  const int64_t s = in ? seg[i] : -1;
  const bool good = in && s >= 0 && s < batch;
  if (in && !good) {
    report_error(err, i, 2);
    atomicOr(flag, 1);
  }
  if (in && i > 0 && seg[i - 1] > s) atomicOr(flag, 1);
  const unsigned active = __ballot_sync(0xffffffffu, good);
  if (!good) return;
  const unsigned peers = __match_any_sync(active, s);
  if ((threadIdx.x & 31) == __ffs(peers) - 1)
    atomicAdd(reinterpret_cast<unsigned long long*>(counts + s),
              static_cast<unsigned long long>(__popc(peers)));
}

__global__ void k_fill_perm(const int64_t* seg, int64_t n, int64_t batch, const int64_t* splits,
                            unsigned long long* cursor, const int* flag, int64_t* perm) {
  if (*flag == 0) return;
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const int64_t s = seg[i];
  if (s < 0 || s >= batch) return;
  perm[splits[s] + static_cast<int64_t>(atomicAdd(cursor + s, 1ull))] = i;
}

}  // namespace

Status build_csr(const Segments& seg, int64_t n, int64_t batch, GpuLookupError* err, cudaStream_t s,
                 DeviceAllocator* alloc, CsrHolder* h) {
  h->view.n = n;
  // No ids at all: an empty segment_ids tensor may come as a null pointer.
  if (seg.segment_ids != nullptr && seg.row_splits != nullptr)
    return Status::Invalid("pooled lookup: give exactly one of segment_ids and row_splits");
  if (seg.segment_ids == nullptr && seg.row_splits == nullptr && n > 0)
    return Status::Invalid("pooled lookup: give exactly one of segment_ids and row_splits");
  if (seg.row_splits != nullptr) {  // validated inside the pooled kernel
    h->view.splits = seg.row_splits;
    return Status::OK();
  }
  size_t scan_bytes = 0;
  SOK_CUDA_RETURN(cub::DeviceScan::ExclusiveSum(nullptr, scan_bytes, static_cast<int64_t*>(nullptr),
                                                static_cast<int64_t*>(nullptr),
                                                static_cast<int64_t>(batch + 1), s));
  int64_t *counts, *splits, *perm;
  unsigned long long* cursor;
  int* flag;
  void* scan_tmp;
  SOK_RETURN_IF_ERROR(carve_temp(alloc, s, &h->tmp, [&](Workspace& ws) {
    counts = ws.take<int64_t>(batch + 1);
    splits = ws.take<int64_t>(batch + 1);
    cursor = ws.take<unsigned long long>(batch + 1);
    perm = ws.take<int64_t>(n > 0 ? n : 1);
    flag = ws.take<int>(1);
    scan_tmp = ws.take_bytes(scan_bytes);
  }));
  const size_t cb = (batch + 1) * sizeof(int64_t);
  SOK_CUDA_RETURN(cudaMemsetAsync(counts, 0, cb, s));
  SOK_CUDA_RETURN(cudaMemsetAsync(cursor, 0, cb, s));
  SOK_CUDA_RETURN(cudaMemsetAsync(flag, 0, sizeof(int), s));
  if (n > 0) {
    k_seg_count<<<grid_for(n, kBlock), kBlock, 0, s>>>(seg.segment_ids, n, batch, counts, flag,
                                                       err);
    SOK_LAUNCH_CHECK();
  }
  SOK_CUDA_RETURN(cub::DeviceScan::ExclusiveSum(scan_tmp, scan_bytes, counts, splits,
                                                static_cast<int64_t>(batch + 1), s));
  if (n > 0) {
    k_fill_perm<<<grid_for(n, kBlock), kBlock, 0, s>>>(seg.segment_ids, n, batch, splits, cursor,
                                                       flag, perm);
    SOK_LAUNCH_CHECK();
  }
  h->view.splits = splits;
  h->view.perm = perm;
  h->view.use_perm = flag;
  return Status::OK();
}

}  // namespace detail
}  // namespace gpu
}  // namespace sok
