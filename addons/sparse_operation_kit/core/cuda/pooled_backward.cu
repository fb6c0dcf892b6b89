// pooled_backward (deterministic: segment CSR + sum_rows_by_group) and pooled_backward_unordered
// (atomics) of gpu_api.h.
#include <cuda_runtime.h>

#include "addons/sparse_operation_kit/core/cuda/gpu_api.h"
#include "addons/sparse_operation_kit/core/cuda/group_sum.h"
#include "addons/sparse_operation_kit/core/cuda/runtime.h"
#include "addons/sparse_operation_kit/core/cuda/segments.cuh"

namespace sok {
namespace gpu {

using namespace detail;  // NOLINT

namespace {

__global__ void k_segment_scale(CsrView csr, const float* weights, int64_t batch, int combiner,
                                float* scale) {
  const int lane = threadIdx.x & 31;
  const int64_t b = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) >> 5;
  if (b >= batch) return;
  int64_t a, e;
  csr.range(b, &a, &e);
  const bool perm = csr.permuted();
  double acc = 0.0;
  for (int64_t j = a + lane; j < e; j += 32) {
    const int64_t i = id_at(csr, perm, j);
    const double w = weights ? weights[i] : 1.0;
    acc += combiner == static_cast<int>(Combiner::kMean) ? w : w * w;
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  if (lane == 0) {
    const double denom = combiner == static_cast<int>(Combiner::kMean) ? acc : sqrt(acc);
    scale[b] = denom == 0.0 ? 0.f : static_cast<float>(1.0 / denom);
  }
}

// Segment of every id from row splits (ids outside every sample keep -1).
__global__ void k_splits_to_segments(CsrView csr, int64_t batch, int64_t* seg) {
  const int lane = threadIdx.x & 31;
  const int64_t b = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) >> 5;
  if (b >= batch) return;
  int64_t a, e;
  csr.range(b, &a, &e);
  for (int64_t j = a + lane; j < e; j += 32) seg[j] = b;
}

}  // namespace

Status pooled_backward(const float* grad_out, int64_t dim, const int32_t* inverse, Segments seg,
                       const float* weights, int64_t n, int64_t batch, Combiner combiner,
                       int64_t num_rows, const int64_t* d_num_rows, float* grad_rows,
                       cudaStream_t stream, DeviceAllocator* alloc) {
  if (num_rows <= 0 || dim <= 0) return Status::OK();
  CsrHolder h;
  SOK_RETURN_IF_ERROR(build_csr(seg, n, batch, nullptr, stream, alloc, &h));
  const bool need_scale = combiner != Combiner::kSum;
  const bool need_seg = seg.segment_ids == nullptr;
  const int64_t nn = n > 0 ? n : 1;
  float* scale_buf;
  int64_t* seg_of;
  Temp tmp;
  SOK_RETURN_IF_ERROR(carve_temp(alloc, stream, &tmp, [&](Workspace& ws) {
    scale_buf = ws.take<float>(batch > 0 ? batch : 1);
    seg_of = ws.take<int64_t>(nn);
  }));
  float* scale = need_scale ? scale_buf : nullptr;
  if (need_scale && batch > 0) {
    k_segment_scale<<<grid_for(batch * 32, kBlock), kBlock, 0, stream>>>(
        h.view, weights, batch, static_cast<int>(combiner), scale);
    SOK_LAUNCH_CHECK();
  }
  const int64_t* src_row = seg.segment_ids;
  if (need_seg) {
    SOK_CUDA_RETURN(cudaMemsetAsync(seg_of, 0xff, nn * sizeof(int64_t), stream));
    if (batch > 0) {
      k_splits_to_segments<<<grid_for(batch * 32, kBlock), kBlock, 0, stream>>>(h.view, batch,
                                                                                seg_of);
      SOK_LAUNCH_CHECK();
    }
    src_row = seg_of;
  }
  return detail::sum_rows_by_group(grad_out, dim, inverse, src_row, batch, weights, scale, n,
                                   num_rows, d_num_rows, grad_rows, stream, alloc);
}

// ------------------------------------------------------------------------------------------------
// Unordered pooled backward: atomics instead of a sort.

namespace {

// sums[b] = sum over the ids of sample b of w (mean) or w^2 (sqrtn).
__global__ void k_weight_sums(const int64_t* seg, const float* weights, int64_t n, int64_t batch,
                              bool squares, float* sums) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t b = seg[i];
    if (b < 0 || b >= batch) continue;
    const float w = weights ? weights[i] : 1.f;
    atomicAdd(&sums[b], squares ? w * w : w);
  }
}

// grad_rows[inverse[i], c] += scale_i * grad_out[seg[i], c], one thread per (id, column).
__global__ void k_backward_unordered(const float* grad_out, int64_t dim, const int32_t* inverse,
                                     const int64_t* seg, const float* weights, int64_t n,
                                     int64_t batch, int64_t num_rows, const float* sums,
                                     int combiner, float* grad_rows) {
  const int64_t total = n * dim;
  for (int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; t < total;
       t += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = t / dim, c = t - i * dim;
    const int64_t b = seg[i], r = inverse[i];
    if (b < 0 || b >= batch || r < 0 || r >= num_rows) continue;
    float s = weights ? weights[i] : 1.f;
    if (combiner == static_cast<int>(Combiner::kMean)) {
      s = sums[b] == 0.f ? 0.f : s / sums[b];
    } else if (combiner == static_cast<int>(Combiner::kSqrtn)) {
      s = sums[b] == 0.f ? 0.f : s / sqrtf(sums[b]);
    }
    atomicAdd(&grad_rows[r * dim + c], s * grad_out[b * dim + c]);
  }
}

}  // namespace

Status pooled_backward_unordered(const float* grad_out, int64_t dim, const int32_t* inverse,
                                 const int64_t* segment_ids, const float* weights, int64_t n,
                                 int64_t batch, Combiner combiner, int64_t num_rows,
                                 float* grad_rows, cudaStream_t stream, DeviceAllocator* alloc) {
  if (num_rows <= 0 || dim <= 0) return Status::OK();
  SOK_CUDA_RETURN(
      cudaMemsetAsync(grad_rows, 0, static_cast<size_t>(num_rows) * dim * sizeof(float), stream));
  if (n <= 0 || batch <= 0) return Status::OK();
  Temp sums;
  if (combiner != Combiner::kSum) {
    SOK_RETURN_IF_ERROR(sums.alloc(alloc, batch * sizeof(float), stream));
    SOK_CUDA_RETURN(cudaMemsetAsync(sums.as<float>(), 0, batch * sizeof(float), stream));
    k_weight_sums<<<grid_for(n, kBlock), kBlock, 0, stream>>>(
        segment_ids, weights, n, batch, combiner == Combiner::kSqrtn, sums.as<float>());
    SOK_LAUNCH_CHECK();
  }
  k_backward_unordered<<<grid_for(n * dim, kBlock), kBlock, 0, stream>>>(
      grad_out, dim, inverse, segment_ids, weights, n, batch, num_rows,
      combiner != Combiner::kSum ? sums.as<float>() : nullptr, static_cast<int>(combiner),
      grad_rows);
  SOK_LAUNCH_CHECK();
  return Status::OK();
}

}  // namespace gpu
}  // namespace sok
