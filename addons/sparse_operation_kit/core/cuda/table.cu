// GpuEmbeddingTable<K> (gpu_api.h): creation, size, and the lookup kernels (find,
// find_or_insert, insert_or_assign, erase, shrink). The layout and probing are in
// table_layout.cuh; growth and export/import in table_storage.cu; the optimizer step in
// table_optimizer.cu.
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <limits>
#include <mutex>
#include <string>
#include <vector>

#include "addons/sparse_operation_kit/core/common.h"
#include "addons/sparse_operation_kit/core/cuda/device_util.cuh"
#include "addons/sparse_operation_kit/core/cuda/gpu_api.h"
#include "addons/sparse_operation_kit/core/cuda/runtime.h"
#include "addons/sparse_operation_kit/core/cuda/table_impl.cuh"
#include "addons/sparse_operation_kit/core/cuda/table_layout.cuh"
#include "addons/sparse_operation_kit/core/cuda/table_many.cuh"
#include "addons/sparse_operation_kit/core/initializer.h"

namespace sok {
namespace gpu {

using namespace detail;  // NOLINT
namespace cg = cooperative_groups;

namespace {

// MINB 8 caps the registers at 32 for 64 resident warps per SM (more lookups in flight).
template <typename K, bool V4, int MINB>
__global__ void
__launch_bounds__(kBlock, MINB) k_find(DevTable t, RowInit ri, const K* keys, int64_t n,
                                                 const int64_t* d_n, float* out) {
  const Tile tile = cg::tiled_partition<kTile>(cg::this_thread_block());
  const int64_t i = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / kTile;
  if (i >= effective_n(n, d_n)) return;
  const int64_t key = static_cast<int64_t>(keys[i]);
  const uint64_t h = hash_key(key);
  const int64_t s = probe_find<false>(tile, t, key, h);
  float* o = out + i * t.dim;
  if (s >= 0 && (ri.filter_freq <= 0 || ld_relaxed_i64(&t.meta[s].freq) >= ri.filter_freq)) {
    copy_row<V4, true>(tile, row_at(t, s), o, t.dim);
  } else if (ri.filter_freq > 0) {
    fill_row<V4>(tile, ri.no_perm, o, t.dim);
  } else {
    for (int64_t c = tile.thread_rank(); c < t.dim; c += kTile) o[c] = initial_value(ri.init, key, c, t.dim);
  }
}

// One table's keys in a find_or_insert launch.
template <typename K>
struct InsertPart {
  DevTable t;
  RowInit ri;
  const K* keys;
  const int64_t* d_n;
  float* out;
  const int64_t* counts;
  int64_t* counters;
  int* fail;
  int64_t n;
  FirstTier first;
};
static_assert(sizeof(PartsLaunch<InsertPart<int64_t>>) <= kMaxKernelParamBytes,
              "kernel parameters beyond what CUDA passes");

template <typename K, bool V4>
__global__ void __launch_bounds__(kBlock)
    k_find_or_insert(const __grid_constant__ PartsLaunch<InsertPart<K>> L) {
  const int part = part_of_block(L, blockIdx.x);
  const InsertPart<K>& q = L.part[part];
  const DevTable& t = q.t;
  const RowInit& ri = q.ri;
  const Tile tile = cg::tiled_partition<kTile>(cg::this_thread_block());
  const int64_t i = key_of_thread(L.first_block[part]);
  const int lane = tile.thread_rank();
  int inserted = 0;
  bool in_first = false, served = false;
  if (i < effective_n(q.n, q.d_n)) {
    const int64_t key = static_cast<int64_t>(q.keys[i]);
    const uint64_t h = hash_key(key);
    const int64_t cnt = q.counts ? q.counts[i] : 1;
    const Claim r = claim_in_tiers(tile, q.first.t, t, key, h, q.fail, &in_first);
    const DevTable& rt = in_first ? q.first.t : t;  // the tier that holds the row
    served = r.slot >= 0 && lane == 0;  // one count per key, not per lane
    float* o = q.out ? q.out + i * t.dim : nullptr;
    float* row = r.slot >= 0 && r.fresh ? fresh_row(tile, t, r.slot, q.fail) : nullptr;
    if (r.slot < 0 || (r.fresh && row == nullptr)) {
      served = false;
      if (o) fill_row<V4>(tile, 0.f, o, t.dim);
    } else if (r.fresh) {
      if (lane == 0) {
        t.meta[r.slot].key = key;
        t.meta[r.slot].freq = cnt;
      }
      const bool admitted = ri.filter_freq <= 0 || cnt >= ri.filter_freq;
      for (int64_t c = lane; c < t.stride; c += kTile) {
        const float v = fresh_element(ri, key, c, t.dim);
        row[c] = v;
        if (o && c < t.dim) o[c] = admitted ? v : ri.no_perm;
      }
      publish(tile, t, r.slot, h);
      inserted = lane == 0;
    } else {
      unsigned long long* fp = reinterpret_cast<unsigned long long*>(&rt.meta[r.slot].freq);
      bool admitted = true;
      if (ri.filter_freq > 0) {  // the new frequency decides what is read
        int64_t f = 0;
        if (lane == 0) f = static_cast<int64_t>(atomicAdd(fp, static_cast<unsigned long long>(cnt))) + cnt;
        admitted = tile.shfl(f, 0) >= ri.filter_freq;
      } else if (lane == 0) {
        atomicAdd(fp, static_cast<unsigned long long>(cnt));  // result unused: no round trip
      }
      if (o) {
        if (!admitted) fill_row<V4>(tile, ri.no_perm, o, t.dim);
        else copy_row<V4>(tile, row_at(rt, r.slot), o, t.dim);
      }
    }
  }
  add_count(q.counters, inserted);
  count_tiers(q.first.counts, served, in_first);
}

template <typename K>
__global__ void __launch_bounds__(kBlock)
    k_insert_or_assign(DevTable t, RowInit ri, const K* keys, int64_t n, const float* values,
                       int64_t* counters, int* fail, DevTable first) {
  const Tile tile = cg::tiled_partition<kTile>(cg::this_thread_block());
  const int64_t i = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / kTile;
  const int lane = tile.thread_rank();
  int inserted = 0;
  if (i < n) {
    const int64_t key = static_cast<int64_t>(keys[i]);
    const uint64_t h = hash_key(key);
    bool in_first = false;
    const Claim r = claim_in_tiers(tile, first, t, key, h, fail, &in_first);
    const float* v = values + i * t.dim;
    float* row = nullptr;
    if (r.slot >= 0)
      row = r.fresh ? fresh_row(tile, t, r.slot, fail) : row_at(in_first ? first : t, r.slot);
    if (row != nullptr) {
      if (r.fresh) {
        if (lane == 0) {
          t.meta[r.slot].key = key;
          t.meta[r.slot].freq = 0;
        }
        for (int64_t c = lane; c < t.stride; c += kTile)
          row[c] = c < t.dim ? v[c] : initial_slot_element(ri, c, t.dim);
        publish(tile, t, r.slot, h);
        inserted = lane == 0;
      } else {
        for (int64_t c = lane; c < t.dim; c += kTile) __stcg(row + c, v[c]);
      }
    }
  }
  add_count(counters, inserted);
}

template <typename K>
__global__ void __launch_bounds__(kBlock) k_erase(DevTable t, const K* keys, int64_t n,
                                                  int64_t* counters, int64_t* erased_out) {
  const Tile tile = cg::tiled_partition<kTile>(cg::this_thread_block());
  const int64_t i = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / kTile;
  int erased = 0;
  if (i < n) {
    const int64_t key = static_cast<int64_t>(keys[i]);
    const uint64_t h = hash_key(key);
    const int64_t s = probe_find<true>(tile, t, key, h);
    if (s >= 0 && tile.thread_rank() == 0) {
      uint32_t* wp = t.digests + (s >> 2);
      const int sh = 8 * static_cast<int>(s & 3);
      const uint32_t d = digest_of(h);
      uint32_t w = ld_relaxed_u32(wp);
      while (((w >> sh) & 0xffu) == d) {
        const uint32_t nw = (w & ~(0xffu << sh)) | (kErasedB << sh);
        const uint32_t old = atomicCAS(wp, w, nw);
        if (old == w) {
          erased = 1;
          give_row(t, s);
          break;
        }
        w = old;
      }
    }
  }
  const int total = __syncthreads_count(erased);
  if (threadIdx.x == 0 && total != 0) {
    atomicAdd(reinterpret_cast<unsigned long long*>(&counters[0]), static_cast<unsigned long long>(-total));
    atomicAdd(reinterpret_cast<unsigned long long*>(&counters[1]), static_cast<unsigned long long>(total));
    atomicAdd(reinterpret_cast<unsigned long long*>(erased_out), static_cast<unsigned long long>(total));
  }
}

// Up to 64 tables' counter copies in one kernel parameter (1 KB).
struct CounterCopies {
  static constexpr int kMax = 64;
  const int64_t* src[kMax];
  int64_t* dst[kMax];
  int count;
};

__global__ void k_copy_counters(const __grid_constant__ CounterCopies c) {
  const int i = threadIdx.x >> 1;
  if (i < c.count) c.dst[i][threadIdx.x & 1] = c.src[i][threadIdx.x & 1];
}

}  // namespace

namespace detail {

Status copy_counters(const std::vector<const int64_t*>& src, const std::vector<int64_t*>& dst,
                     cudaStream_t s) {
  for (size_t begin = 0; begin < src.size(); begin += CounterCopies::kMax) {
    CounterCopies c;
    c.count = static_cast<int>(std::min<size_t>(CounterCopies::kMax, src.size() - begin));
    for (int i = 0; i < c.count; ++i) {
      c.src[i] = src[begin + i];
      c.dst[i] = dst[begin + i];
    }
    k_copy_counters<<<1, 2 * CounterCopies::kMax, 0, s>>>(c);
    SOK_LAUNCH_CHECK();
  }
  return Status::OK();
}

}  // namespace detail

template <typename K>
GpuEmbeddingTable<K>::GpuEmbeddingTable() : impl_(new Impl) {}

template <typename K>
GpuEmbeddingTable<K>::~GpuEmbeddingTable() {
  if (impl_) {
    DeviceGuard g(impl_->device);
    impl_.reset();
  }
}

template <typename K>
Status GpuEmbeddingTable<K>::Create(const TableConfig& config, const GpuTableOptions& options,
                                    std::unique_ptr<GpuEmbeddingTable>* out) {
  if (config.dim <= 0) return Status::Invalid("table '" + config.name + "': dim must be positive");
  if (!(options.max_load_factor > 0.0 && options.max_load_factor <= 0.98))
    return Status::Invalid("table '" + config.name + "': max_load_factor must be in (0, 0.98]");
  std::unique_ptr<GpuEmbeddingTable> tab(new GpuEmbeddingTable());
  Impl& m = *tab->impl_;
  m.cfg = config;
  m.opt = options;
  m.alloc = options.allocator ? options.allocator : default_allocator();
  m.storage = options.storage ? options.storage : default_storage_allocator();
  m.row_storage = options.row_storage ? options.row_storage : m.storage;
  SOK_CUDA_RETURN(cudaGetDevice(&m.device));
  if (config.init.kind == InitKind::kMatrix) {
    const size_t count = static_cast<size_t>(config.init.default_value_dim) * config.dim;
    if (config.init.default_value_dim <= 0 || config.init_matrix.size() != count)
      return Status::Invalid("table '" + config.name + "': the initializer matrix must hold default_value_dim x dim values");
    SOK_RETURN_IF_ERROR(m.acquire(&m.d_matrix, count * sizeof(float), "the initializer matrix"));
    SOK_CUDA_RETURN(cudaMemcpy(m.d_matrix, config.init_matrix.data(), count * sizeof(float), cudaMemcpyHostToDevice));
  }
  if (options.pool_rows < 0 || options.pool_rows > detail::kMaxPoolRows)
    return Status::Invalid("table '" + config.name + "': pool_rows must be in [0, 2^31)");
  m.grow_pool = options.grow_pool;
  m.pool_rows = m.next_pool_rows = m.grow_pool ? m.first_pool_rows() : options.pool_rows;
  SOK_RETURN_IF_ERROR(m.acquire(&m.d_counters, 2 * sizeof(int64_t), "counters"));
  SOK_RETURN_IF_ERROR(m.acquire(&m.d_fail, sizeof(int), "counters"));
  SOK_CUDA_RETURN(cudaMallocHost(&m.h_counters, 6 * sizeof(int64_t)));
  SOK_CUDA_RETURN(cudaMemset(m.d_counters, 0, 2 * sizeof(int64_t)));
  SOK_CUDA_RETURN(cudaMemset(m.d_fail, 0, sizeof(int)));
  const int64_t cap = capacity_for(std::max<int64_t>(config.initial_capacity, 1), options.max_load_factor);
  SOK_RETURN_IF_ERROR(m.alloc_arrays(cap, config.dim, &m.t, nullptr));
  if (m.pooled()) SOK_RETURN_IF_ERROR(m.alloc_pool(m.pool_rows, &m.t, nullptr));
  m.capacity = cap;
  SOK_CUDA_RETURN(cudaDeviceSynchronize());
  *out = std::move(tab);
  return Status::OK();
}

template <typename K>
Status GpuEmbeddingTable<K>::first_tiers(const std::vector<Keys>& calls,
                                         std::vector<FirstTier>* out) {
  out->assign(calls.size(), FirstTier());
  for (size_t i = 0; i < calls.size(); ++i) {
    const Keys& c = calls[i];
    (*out)[i].counts = c.tier_counts;
    if (c.probe_first == nullptr) continue;
    const DevTable& first = c.probe_first->impl_->t;
    if (first.stride != c.table->impl_->t.stride || first.dim != c.table->impl_->t.dim)
      return Status::Invalid("table '" + c.table->impl_->cfg.name +
                             "': its tiers have different row layouts");
    (*out)[i].t = first;
  }
  return Status::OK();
}

template <typename K>
const TableConfig& GpuEmbeddingTable<K>::config() const { return impl_->cfg; }
template <typename K>
int64_t GpuEmbeddingTable<K>::dim() const { return impl_->cfg.dim; }
template <typename K>
int GpuEmbeddingTable<K>::num_slots() const { return impl_->num_slots; }
template <typename K>
int GpuEmbeddingTable<K>::slot_kind() const {
  return impl_->slot_kind;
}
template <typename K>
const std::vector<float>& GpuEmbeddingTable<K>::slot_init() const {
  return impl_->slot_init;
}
template <typename K>
int64_t GpuEmbeddingTable<K>::capacity() const { return impl_->capacity; }
template <typename K>
int64_t GpuEmbeddingTable<K>::host_syncs() const {
  std::lock_guard<std::mutex> l(impl_->mu);
  return impl_->host_syncs;
}

template <typename K>
Status GpuEmbeddingTable<K>::size(int64_t* out, cudaStream_t stream) {
  Impl& m = *impl_;
  DeviceGuard g(m.device);
  std::lock_guard<std::mutex> l(m.mu);
  m.note_stream(stream);
  int64_t live = 0, erased = 0;
  SOK_RETURN_IF_ERROR(m.sync_counts(stream, &live, &erased));
  m.set_upper(live + erased, live);
  *out = live;
  return Status::OK();
}

template <typename K>
Status GpuEmbeddingTable<K>::find(const K* keys, int64_t n, float* out, cudaStream_t stream,
                                  const int64_t* d_n) {
  if (n <= 0) return Status::OK();
  Impl& m = *impl_;
  DeviceGuard g(m.device);
  std::lock_guard<std::mutex> l(m.mu);
  m.note_stream(stream);
  const bool v4 = m.cfg.dim % 4 == 0 && reinterpret_cast<uintptr_t>(out) % 16 == 0;
  const int grid = grid_for(n * kTile, kBlock);
  // With V4 rows, registers capped for 64 warps per SM: more lookups in flight (measured faster
  // on H200, benchmarks/gpu/RESULTS.md).
  if (v4) k_find<K, true, 8><<<grid, kBlock, 0, stream>>>(m.t, m.row_init(), keys, n, d_n, out);
  else k_find<K, false, 1><<<grid, kBlock, 0, stream>>>(m.t, m.row_init(), keys, n, d_n, out);
  SOK_LAUNCH_CHECK();
  return Status::OK();
}

template <typename K>
Status GpuEmbeddingTable<K>::find_or_insert(const K* keys, int64_t n, float* out, const int64_t* counts,
                                            cudaStream_t stream, const int64_t* d_n) {
  Keys call;
  call.table = this;
  call.keys = keys;
  call.n = n;
  call.out = out;
  call.counts = counts;
  call.d_n = d_n;
  return find_or_insert_many({call}, stream);
}

template <typename K>
Status GpuEmbeddingTable<K>::find_or_insert_many(const std::vector<Keys>& calls, cudaStream_t stream) {
  if (calls.empty()) return Status::OK();
  std::vector<Impl*> impls;
  for (const Keys& c : calls) impls.push_back(c.table->impl_.get());
  SOK_RETURN_IF_ERROR(same_device(impls));
  DeviceGuard g(impls[0]->device);
  TablesLock<Impl> lock(impls);
  // Growth (which may synchronise and move the arrays) first: the parts copy the arrays' addresses.
  std::vector<int64_t> ns;
  for (const Keys& c : calls) ns.push_back(c.n);
  std::vector<Impl*> snap;
  SOK_RETURN_IF_ERROR(prepare_inserts(impls, ns, stream, &snap));
  std::vector<FirstTier> firsts;
  SOK_RETURN_IF_ERROR(first_tiers(calls, &firsts));
  SOK_RETURN_IF_ERROR(for_each_launch(impls, [&](int begin, int end) -> Status {
    PartsLaunch<InsertPart<K>> L;
    L.count = end - begin;
    int64_t blocks = 0;
    bool v4 = true;
    for (int i = begin; i < end; ++i) {
      const Keys& c = calls[i];
      Impl& m = *impls[i];
      L.part[i - begin] = InsertPart<K>{m.t,        m.row_init(), c.keys, c.d_n,
                                        c.out,      c.counts,     m.d_counters,
                                        m.d_fail,   std::max<int64_t>(c.n, 0), firsts[i]};
      L.first_block[i - begin] = static_cast<int32_t>(blocks);
      blocks += blocks_for_keys(c.n);
      v4 = v4 && m.cfg.dim % 4 == 0 && reinterpret_cast<uintptr_t>(c.out) % 16 == 0;
    }
    if (blocks == 0) return Status::OK();
    if (blocks > 2147483647LL) return Status::Invalid("find_or_insert: too many keys in one call");
    const int grid = static_cast<int>(blocks);
    if (v4) k_find_or_insert<K, true><<<grid, kBlock, 0, stream>>>(L);
    else k_find_or_insert<K, false><<<grid, kBlock, 0, stream>>>(L);
    SOK_LAUNCH_CHECK();
    return Status::OK();
  }));
  return snapshot_counters(snap, stream);
}

template <typename K>
Status GpuEmbeddingTable<K>::insert_or_assign(const K* keys, int64_t n, const float* values,
                                              cudaStream_t stream,
                                              const GpuEmbeddingTable* probe_first) {
  if (n <= 0) return Status::OK();
  Impl& m = *impl_;
  DeviceGuard g(m.device);
  std::lock_guard<std::mutex> l(m.mu);
  std::vector<Impl*> snap;
  SOK_RETURN_IF_ERROR(prepare_inserts<Impl>({&m}, {n}, stream, &snap));
  Keys call;
  call.table = this;
  call.probe_first = probe_first;
  std::vector<FirstTier> firsts;
  SOK_RETURN_IF_ERROR(first_tiers({call}, &firsts));
  k_insert_or_assign<K><<<grid_for(n * kTile, kBlock), kBlock, 0, stream>>>(
      m.t, m.row_init(), keys, n, values, m.d_counters, m.d_fail, firsts[0].t);
  SOK_LAUNCH_CHECK();
  return snapshot_counters(snap, stream);
}

template <typename K>
Status GpuEmbeddingTable<K>::erase(const K* keys, int64_t n, cudaStream_t stream, int64_t* num_erased) {
  if (num_erased) *num_erased = 0;
  if (n <= 0) return Status::OK();
  Impl& m = *impl_;
  DeviceGuard g(m.device);
  std::lock_guard<std::mutex> l(m.mu);
  m.note_stream(stream);
  Temp cnt;
  SOK_RETURN_IF_ERROR(cnt.alloc(m.alloc, sizeof(int64_t), stream));
  SOK_CUDA_RETURN(cudaMemsetAsync(cnt.as<int64_t>(), 0, sizeof(int64_t), stream));
  k_erase<K><<<grid_for(n * kTile, kBlock), kBlock, 0, stream>>>(m.t, keys, n, m.d_counters, cnt.as<int64_t>());
  SOK_LAUNCH_CHECK();
  if (num_erased) {
    SOK_CUDA_RETURN(cudaMemcpyAsync(num_erased, cnt.as<int64_t>(), sizeof(int64_t), cudaMemcpyDeviceToHost, stream));
    SOK_CUDA_RETURN(cudaStreamSynchronize(stream));
  }
  return Status::OK();
}

// The members defined here; the others are instantiated where they are defined.
template class GpuEmbeddingTable<int32_t>;
template class GpuEmbeddingTable<int64_t>;

}  // namespace gpu
}  // namespace sok
