// GpuEmbeddingTable<K>::apply_gradients (gpu_api.h): one fused optimizer step per key
// (optimizer.h's apply_element), after summing the gradients of repeated keys; and the relayout
// that adds the optimizer slots to every row on first use. Compiled with -fmad=false (see
// README.md), like every table source.
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <mutex>
#include <string>
#include <vector>

#include "addons/sparse_operation_kit/core/common.h"
#include "addons/sparse_operation_kit/core/cuda/device_util.cuh"
#include "addons/sparse_operation_kit/core/cuda/gpu_api.h"
#include "addons/sparse_operation_kit/core/cuda/group_sum.h"
#include "addons/sparse_operation_kit/core/cuda/host_row_jobs.cuh"
#include "addons/sparse_operation_kit/core/cuda/runtime.h"
#include "addons/sparse_operation_kit/core/cuda/table_impl.cuh"
#include "addons/sparse_operation_kit/core/cuda/table_layout.cuh"
#include "addons/sparse_operation_kit/core/cuda/table_many.cuh"
#include "addons/sparse_operation_kit/core/optimizer.h"

namespace sok {
namespace gpu {

using namespace detail;  // NOLINT
namespace cg = cooperative_groups;

namespace {

// One table's keys in an optimizer launch.
template <typename K>
struct ApplyPart {
  DevTable t;
  RowInit ri;
  const K* keys;
  const int64_t* d_n;
  const float* grads;
  int64_t* counters;
  int* fail;
  int64_t n;
  FirstTier first;
};
struct ApplyStep {
  OptimizerParams p;
  float alpha;
  int64_t step;
};
template <typename K>
struct ApplyLaunch : PartsLaunch<ApplyPart<K>> {
  ApplyStep s;
  HostJobs<ApplyJob> jobs;  // on: host rows' updates go to k_apply_host_rows
};
static_assert(sizeof(ApplyLaunch<int64_t>) <= kMaxKernelParamBytes,
              "kernel parameters beyond what CUDA passes");

// The row of `key` for an update, inserted into `t` at its initial value if missing (inserted:
// 1 on the lane that inserted it), or `first`'s row where that tier holds it (*in_first).
// freq: the key's frequency before this step (0 when fresh).
template <typename K>
__device__ float* claim_update_row(const Tile& tile, const DevTable& first, const DevTable& t,
                                   const RowInit& ri, int64_t key, int* fail, int64_t* slot,
                                   int64_t* freq, int* inserted, bool* in_first) {
  const uint64_t h = hash_key(key);
  const Claim r = claim_in_tiers(tile, first, t, key, h, fail, in_first);
  *slot = r.slot;
  *freq = 0;
  if (r.slot < 0) return nullptr;
  float* row = r.fresh ? fresh_row(tile, t, r.slot, fail) : row_at(*in_first ? first : t, r.slot);
  if (row == nullptr) {
    *slot = -1;
    return nullptr;
  }
  if (r.fresh) {
    if (tile.thread_rank() == 0) {
      t.meta[r.slot].key = key;
      t.meta[r.slot].freq = 0;
    }
    for (int64_t c = tile.thread_rank(); c < t.stride; c += kTile) {
      row[c] = fresh_element(ri, key, c, t.dim);
    }
    publish(tile, t, r.slot, h);
    *inserted = tile.thread_rank() == 0;
  } else {
    *freq = ld_relaxed_i64(&(*in_first ? first : t).meta[r.slot].freq);
  }
  return row;
}

// apply_element on four consecutive columns: values v, slots s0 and s1 (unused ones ignored).
__device__ __forceinline__ void apply_float4(const OptimizerParams& p, float alpha, float4* v,
                                             float4* s0, float4* s1, const float4& g) {
  float* vp = &v->x;
  float* s0p = &s0->x;
  float* s1p = &s1->x;
  const float* gp = &g.x;
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    float sl[2] = {s0p[q], s1p[q]};
    apply_element(p, alpha, vp + q, sl, 1, 0, gp[q]);
    s0p[q] = sl[0];
    s1p[q] = sl[1];
  }
}

// apply_element from optimizer.h over a row's float4 columns: C chunks of 32 columns loaded
// before the math (more bytes in flight, more registers), then stored.
template <int C>
__device__ void apply_row_vec(const OptimizerParams& p, float alpha, float* row, const float* g,
                              int64_t dim, int ns, int lane) {
  for (int64_t c0 = 4 * lane; c0 < dim; c0 += 4 * kTile * C) {
    float4 v[C], s0[C], s1[C], gg[C];
#pragma unroll
    for (int k = 0; k < C; ++k) {
      const int64_t c = c0 + k * 4 * kTile;
      s0[k] = s1[k] = make_float4(0.f, 0.f, 0.f, 0.f);
      if (c < dim) {
        v[k] = __ldcg(reinterpret_cast<const float4*>(row + c));
        if (ns > 0) s0[k] = __ldcg(reinterpret_cast<const float4*>(row + dim + c));
        if (ns > 1) s1[k] = __ldcg(reinterpret_cast<const float4*>(row + 2 * dim + c));
        gg[k] = __ldg(reinterpret_cast<const float4*>(g + c));
      }
    }
#pragma unroll
    for (int k = 0; k < C; ++k) {
      if (c0 + k * 4 * kTile < dim) apply_float4(p, alpha, &v[k], &s0[k], &s1[k], gg[k]);
    }
#pragma unroll
    for (int k = 0; k < C; ++k) {
      const int64_t c = c0 + k * 4 * kTile;
      if (c >= dim) continue;
      *reinterpret_cast<float4*>(row + c) = v[k];
      if (ns > 0) *reinterpret_cast<float4*>(row + dim + c) = s0[k];
      if (ns > 1) *reinterpret_cast<float4*>(row + 2 * dim + c) = s1[k];
    }
  }
}

// The same over scalar columns (dim % 4 != 0).
__device__ void apply_row_scalar(const OptimizerParams& p, float alpha, float* row, const float* g,
                                 int64_t dim, int ns, int lane) {
  for (int64_t c = lane; c < dim; c += kTile) {
    float v = __ldcg(row + c);
    float sl[2] = {ns > 0 ? __ldcg(row + dim + c) : 0.f, ns > 1 ? __ldcg(row + 2 * dim + c) : 0.f};
    apply_element(p, alpha, &v, sl, 1, 0, g[c]);
    row[c] = v;
    if (ns > 0) row[dim + c] = sl[0];
    if (ns > 1) row[2 * dim + c] = sl[1];
  }
}

__device__ __forceinline__ float4 shfl4(const Tile& tile, const float4& x, int src) {
  return make_float4(tile.shfl(x.x, src), tile.shfl(x.y, src), tile.shfl(x.z, src),
                     tile.shfl(x.w, src));
}

// A row of at most 32 floats (value and slots; dim a multiple of 4), one float4 per lane: the
// tile reads and writes the whole row at once, where the value and each slot would be separate
// accesses of 16 * dim bytes or less. Rows in host memory (a tiered table's host tier) serve such
// whole-row accesses at 1.3x the bytes per second (benchmarks/gpu/host_read_bench). Lane
// q < dim / 4 does the math of columns [4q, 4q + 4); shuffles bring it their slots and take them
// back.
__device__ void apply_row_packed(const Tile& tile, const OptimizerParams& p, float alpha,
                                 float* row, const float* g, int64_t dim, int ns, int lane) {
  const int d4 = static_cast<int>(dim / 4), used = d4 * (1 + ns);
  const float4 zero = make_float4(0.f, 0.f, 0.f, 0.f);
  float4 x = lane < used ? __ldcg(reinterpret_cast<const float4*>(row) + lane) : zero;
  const float4 gg = lane < d4 ? __ldg(reinterpret_cast<const float4*>(g) + lane) : zero;
  float4 s0 = shfl4(tile, x, (lane + d4) % kTile);
  float4 s1 = shfl4(tile, x, (lane + 2 * d4) % kTile);
  if (ns < 1) s0 = zero;
  if (ns < 2) s1 = zero;
  if (lane < d4) apply_float4(p, alpha, &x, &s0, &s1, gg);
  const float4 back0 = shfl4(tile, s0, (lane + kTile - d4) % kTile);
  const float4 back1 = shfl4(tile, s1, (lane + kTile - 2 * d4) % kTile);
  if (lane >= d4 && lane < 2 * d4) x = back0;
  if (lane >= 2 * d4) x = back1;
  if (lane < used) reinterpret_cast<float4*>(row)[lane] = x;
}

// One key's update of its row, the columns as NC says (k_apply).
template <int NC>
__device__ __forceinline__ void apply_row(const Tile& tile, const ApplyStep& s, float* row,
                                          const float* g, int64_t dim, int ns) {
  const int lane = tile.thread_rank();
  if constexpr (NC < 0) apply_row_packed(tile, s.p, s.alpha, row, g, dim, ns, lane);
  else if constexpr (NC > 0) apply_row_vec<NC>(s.p, s.alpha, row, g, dim, ns, lane);
  else apply_row_scalar(s.p, s.alpha, row, g, dim, ns, lane);
}

// One optimizer step per (unique) key; apply_element from optimizer.h on a one-element view
// of the row (dim 1, column 0), so the math is the CPU's, element by element.
// NC > 0: float4 columns in NC chunks (apply_row_vec); NC == 0: scalar columns; NC < 0: rows of
// at most 32 floats, whole (apply_row_packed).
template <typename K, int NC>
__global__ void
__launch_bounds__(kBlock) k_apply(const __grid_constant__ ApplyLaunch<K> L) {
  const int part = part_of_block(L, blockIdx.x);
  const ApplyPart<K>& q = L.part[part];
  const DevTable& t = q.t;
  const Tile tile = cg::tiled_partition<kTile>(cg::this_thread_block());
  const int64_t i = key_of_thread(L.first_block[part]);
  int inserted = 0;
  bool in_first = false, served = false;
  if (i < effective_n(q.n, q.d_n)) {
    const int64_t key = static_cast<int64_t>(q.keys[i]);
    int64_t slot, freq;
    float* row = claim_update_row<K>(tile, q.first.t, t, q.ri, key, q.fail, &slot, &freq,
                                     &inserted, &in_first);
    served = row != nullptr && tile.thread_rank() == 0;  // one count per key, not per lane
    if (row != nullptr && (q.ri.filter_freq <= 0 || freq >= q.ri.filter_freq)) {
      const float* g = q.grads + i * t.dim;
      const int lane = tile.thread_rank();
      if (L.jobs.defer(part, in_first)) {
        if (lane == 0) append_job(L.jobs, ApplyJob{row, g, part});
      } else {
        apply_row<NC>(tile, L.s, row, g, t.dim, q.ri.num_slots);
      }
      if (lane == 0) (in_first ? q.first.t : t).versions[slot] = L.s.step;
    }
  }
  add_count(q.counters, inserted);
  count_tiers(q.first.counts, served, in_first);
}

// The updates of k_apply's host rows (host_row_jobs.cuh).
template <typename K, int NC>
__global__ void __launch_bounds__(kBlock)
    k_apply_host_rows(const __grid_constant__ ApplyLaunch<K> L) {
  const Tile tile = cg::tiled_partition<kTile>(cg::this_thread_block());
  const int64_t j = job_of_thread(L.jobs.count);
  if (j < 0) return;
  const ApplyJob job = L.jobs.list[j];
  const ApplyPart<K>& q = L.part[job.part];
  apply_row<NC>(tile, L.s, job.row, job.grad, q.t.dim, q.ri.num_slots);
}

// [value | old slots] -> [value | new slots at their initial value], every slot position.
__global__ void k_relayout(const float* old_rows, int64_t old_stride, float* rows, int64_t stride,
                           int64_t dim, RowInit ri, int64_t slots) {
  const int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t s = t / kTile;
  const int l = static_cast<int>(t % kTile);
  if (s >= slots) return;
  for (int64_t c = l; c < stride; c += kTile)
    rows[s * stride + c] = c < dim ? old_rows[s * old_stride + c] : initial_slot_element(ri, c, dim);
}

// A pooled table's relayout: each live slot's row to the next row of the new pool (a tile per
// slot), so the new pool, sized for the tier's budget in wider rows, need not cover the old
// pool's row numbers. *taken counts the rows given out.
__global__ void __launch_bounds__(kBlock)
    k_relayout_pooled(DevTable o, float* rows, int64_t stride, RowInit ri, int64_t slots,
                      int64_t pool_rows, int64_t* taken, int* fail) {
  const Tile tile = cg::tiled_partition<kTile>(cg::this_thread_block());
  const int64_t s = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / kTile;
  if (s >= slots || !live_slot(o.digests, s)) return;
  int64_t r = 0;
  if (tile.thread_rank() == 0)
    r = static_cast<int64_t>(atomicAdd(reinterpret_cast<unsigned long long*>(taken), 1ull));
  r = tile.shfl(r, 0);
  if (r >= pool_rows) {
    if (tile.thread_rank() == 0) atomicOr(fail, kFailPoolEmpty);
    return;
  }
  const float* from = row_at(o, s);
  for (int64_t c = tile.thread_rank(); c < stride; c += kTile)
    rows[r * stride + c] = c < o.dim ? from[c] : initial_slot_element(ri, c, o.dim);
  tile.sync();  // every lane read row_of[s] (row_at) before it changes
  if (tile.thread_rank() == 0) o.row_of[s] = static_cast<int32_t>(r);
}

}  // namespace

template <typename K>
Status GpuEmbeddingTable<K>::Impl::relayout_pool(int64_t stride, cudaStream_t s) {
  float* rows = nullptr;
  int32_t* list = nullptr;
  SOK_RETURN_IF_ERROR(acquire_pool(next_pool_rows, stride, &rows, &list, "optimizer slots"));
  Temp taken;
  const Status st = taken.alloc(alloc, sizeof(int64_t), s);
  if (!st.ok()) {
    release_pool(rows, list);
    return st;
  }
  SOK_CUDA_RETURN(cudaMemsetAsync(taken.as<int64_t>(), 0, sizeof(int64_t), s));
  k_relayout_pooled<<<grid_for(capacity * kTile, kBlock), kBlock, 0, s>>>(
      t, rows, stride, row_init(), capacity, next_pool_rows, taken.as<int64_t>(), d_fail);
  SOK_LAUNCH_CHECK();
  SOK_RETURN_IF_ERROR(
      fill_free_rows(list, next_pool_rows, taken.as<int64_t>(), rows, t.row_of, s));
  SOK_CUDA_RETURN(cudaStreamSynchronize(s));
  free_pool(&t);
  t.rows = rows;
  pool_blocks = {rows};
  t.stride = static_cast<int32_t>(stride);
  free_list = list;
  pool_rows = next_pool_rows;
  return Status::OK();
}

template <typename K>
Status GpuEmbeddingTable<K>::Impl::ensure_slots(const OptimizerParams& p, cudaStream_t s) {
  SlotPlan plan;
  std::string error;
  if (!plan_slots(cfg.name, slot_kind, num_slots, p.kind, &plan, &error)) return Status::Invalid(error);
  const int want = sok::num_slots(p.kind);
  const int kind = static_cast<int>(p.kind);
  if (plan != SlotPlan::kRelayout) {
    slot_kind = kind;
    return Status::OK();
  }
  std::vector<float> init(want);
  for (int i = 0; i < want; ++i) init[i] = slot_initial_value(p, i);
  if (want > 0) {
    SOK_CUDA_RETURN(cudaDeviceSynchronize());
    mixed = false;
    const int64_t stride = cfg.dim * (1 + want);
    float* rows = nullptr;
    if (!pooled())
      SOK_RETURN_IF_ERROR(acquire_rows(&rows, static_cast<size_t>(capacity) * stride * sizeof(float), "optimizer slots"));
    const int old_slots = num_slots;
    const std::vector<float> old_init = slot_init;
    num_slots = want;
    slot_init = init;
    if (pooled()) {
      const Status st = relayout_pool(stride, s);
      if (!st.ok()) {
        num_slots = old_slots;
        slot_init = old_init;
        return st;
      }
      slot_kind = kind;
      return Status::OK();
    }
    k_relayout<<<grid_for(capacity * kTile, kBlock), kBlock, 0, s>>>(t.rows, t.stride, rows, stride,
                                                                     cfg.dim, row_init(), capacity);
    SOK_LAUNCH_CHECK();
    SOK_CUDA_RETURN(cudaStreamSynchronize(s));
    release_rows(t.rows);
    t.rows = rows;
    t.stride = static_cast<int32_t>(stride);
  }
  num_slots = want;
  slot_kind = kind;
  slot_init = init;
  return Status::OK();
}

template <typename K>
Status GpuEmbeddingTable<K>::apply_gradients(const K* keys, int64_t n, const float* grads,
                                             const OptimizerParams& p, int64_t global_step,
                                             cudaStream_t stream, bool keys_unique, const int64_t* d_n) {
  Keys call;
  call.table = this;
  call.keys = keys;
  call.n = n;
  call.grads = grads;
  call.d_n = d_n;
  return apply_gradients_many({call}, p, global_step, stream, keys_unique);
}

template <typename K>
Status GpuEmbeddingTable<K>::apply_gradients_many(const std::vector<Keys>& calls, const OptimizerParams& p,
                                                  int64_t global_step, cudaStream_t stream, bool keys_unique,
                                                  bool keys_present) {
  if (calls.empty()) return Status::OK();
  const size_t count = calls.size();
  std::vector<Impl*> impls;
  for (const Keys& c : calls) impls.push_back(c.table->impl_.get());
  SOK_RETURN_IF_ERROR(same_device(impls));
  DeviceGuard g(impls[0]->device);
  TablesLock<Impl> lock(impls);
  for (Impl* m : impls) {
    m->note_stream(stream);
    SOK_RETURN_IF_ERROR(m->ensure_slots(p, stream));
  }
  // Repeated keys summed first (one dedup per table), unless the caller's keys are distinct.
  std::vector<Temp> tmp(count);
  std::vector<Keys> distinct = calls;
  for (size_t i = 0; i < count; ++i) {
    const Keys& c = calls[i];
    if (keys_unique || c.n <= 0) continue;
    if (c.d_n != nullptr)
      return Status::Invalid("apply_gradients: a device count needs keys_unique (run unique_keys first)");
    const int64_t n = c.n, dim = impls[i]->cfg.dim;
    K* uniq;
    int32_t* inverse;
    float* summed;
    int64_t* num;
    SOK_RETURN_IF_ERROR(carve_temp(impls[i]->alloc, stream, &tmp[i], [&](Workspace& ws) {
      uniq = ws.take<K>(n);
      inverse = ws.take<int32_t>(n);
      summed = ws.take<float>(static_cast<size_t>(n) * dim);
      num = ws.take<int64_t>(1);
    }));
    SOK_RETURN_IF_ERROR(unique_keys<K>(c.keys, n, uniq, inverse, nullptr, num, stream, impls[i]->alloc));
    SOK_RETURN_IF_ERROR(sum_rows_by_group(c.grads, dim, inverse, nullptr, 0, nullptr, nullptr, n, n, num,
                                          summed, stream, impls[i]->alloc));
    distinct[i].keys = uniq;
    distinct[i].grads = summed;
    distinct[i].d_n = num;
  }
  std::vector<int64_t> ns;
  for (const Keys& c : calls) ns.push_back(keys_present ? 0 : c.n);
  std::vector<Impl*> snap;
  SOK_RETURN_IF_ERROR(prepare_inserts(impls, ns, stream, &snap));
  std::vector<FirstTier> firsts;
  SOK_RETURN_IF_ERROR(first_tiers(calls, &firsts));
  ApplyStep s{p, p.kind == OptimizerKind::kAdam ? adam_step_size(p) : 0.f, global_step};
  SOK_RETURN_IF_ERROR(for_each_launch(impls, [&](int begin, int end) -> Status {
    ApplyLaunch<K> L;
    L.count = end - begin;
    L.s = s;
    int64_t blocks = 0, max_dim = 0, max_stride = 0;
    bool v4 = true;
    for (int i = begin; i < end; ++i) {
      const Keys& c = distinct[i];
      Impl& m = *impls[i];
      L.part[i - begin] = ApplyPart<K>{m.t,          m.row_init(), c.keys,
                                       c.d_n,        c.grads,      m.d_counters,
                                       m.d_fail,     std::max<int64_t>(c.n, 0), firsts[i]};
      L.first_block[i - begin] = static_cast<int32_t>(blocks);
      blocks += blocks_for_keys(c.n);
      max_dim = std::max(max_dim, m.cfg.dim);
      max_stride = std::max<int64_t>(max_stride, m.t.stride);
      if (m.host_rows) L.jobs.host_tables |= 1u << (i - begin);
      if (calls[i].probe_first && calls[i].probe_first->impl_->host_rows)
        L.jobs.host_firsts |= 1u << (i - begin);
      v4 = v4 && m.cfg.dim % 4 == 0 && reinterpret_cast<uintptr_t>(c.grads) % 16 == 0;
    }
    if (blocks == 0) return Status::OK();
    if (blocks > 2147483647LL) return Status::Invalid("apply_gradients: too many keys in one call");
    const int grid = static_cast<int>(blocks);
    // Column chunks in flight per lane, measured best on H200 (benchmarks/gpu/RESULTS.md).
    const int nc = v4 ? (max_stride <= 4 * kTile ? -1 : max_dim <= 32 ? 1 : 2) : 0;
    Temp jobs;
    const bool host_rows = (L.jobs.host_tables | L.jobs.host_firsts) != 0;
    if (host_rows) {
      const int64_t max_jobs = blocks * kBlock / kTile;
      SOK_RETURN_IF_ERROR(jobs.alloc(impls[begin]->alloc, 16 + max_jobs * sizeof(ApplyJob), stream));
      L.jobs.count = jobs.as<int64_t>();
      L.jobs.list = reinterpret_cast<ApplyJob*>(jobs.as<char>() + 16);
      SOK_CUDA_RETURN(cudaMemsetAsync(L.jobs.count, 0, sizeof(int64_t), stream));
    }
    if (nc < 0) k_apply<K, -1><<<grid, kBlock, 0, stream>>>(L);
    else if (nc == 1) k_apply<K, 1><<<grid, kBlock, 0, stream>>>(L);
    else if (nc == 2) k_apply<K, 2><<<grid, kBlock, 0, stream>>>(L);
    else k_apply<K, 0><<<grid, kBlock, 0, stream>>>(L);
    SOK_LAUNCH_CHECK();
    if (host_rows) {
      if (nc < 0) k_apply_host_rows<K, -1><<<grid, kBlock, 0, stream>>>(L);
      else if (nc == 1) k_apply_host_rows<K, 1><<<grid, kBlock, 0, stream>>>(L);
      else if (nc == 2) k_apply_host_rows<K, 2><<<grid, kBlock, 0, stream>>>(L);
      else k_apply_host_rows<K, 0><<<grid, kBlock, 0, stream>>>(L);
      SOK_LAUNCH_CHECK();
    }
    return Status::OK();
  }));
  return snapshot_counters(snap, stream);
}

template Status GpuEmbeddingTable<int32_t>::Impl::ensure_slots(const OptimizerParams&, cudaStream_t);
template Status GpuEmbeddingTable<int64_t>::Impl::ensure_slots(const OptimizerParams&, cudaStream_t);
template Status GpuEmbeddingTable<int32_t>::apply_gradients(const int32_t*, int64_t, const float*,
                                                            const OptimizerParams&, int64_t, cudaStream_t,
                                                            bool, const int64_t*);
template Status GpuEmbeddingTable<int64_t>::apply_gradients(const int64_t*, int64_t, const float*,
                                                            const OptimizerParams&, int64_t, cudaStream_t,
                                                            bool, const int64_t*);

template Status GpuEmbeddingTable<int32_t>::apply_gradients_many(const std::vector<Keys>&,
                                                                 const OptimizerParams&, int64_t,
                                                                 cudaStream_t, bool, bool);
template Status GpuEmbeddingTable<int64_t>::apply_gradients_many(const std::vector<Keys>&,
                                                                 const OptimizerParams&, int64_t,
                                                                 cudaStream_t, bool, bool);

}  // namespace gpu
}  // namespace sok
