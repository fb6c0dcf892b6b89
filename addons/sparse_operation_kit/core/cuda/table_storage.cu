// GpuEmbeddingTable<K> (gpu_api.h): growth (rehash into a larger table), reserve, export/import
// of the whole content, and the tiered tables' row batches (export_keys, put_rows).
#include <cooperative_groups.h>
#include <cuda_runtime.h>
#include <thrust/iterator/counting_iterator.h>

#include <algorithm>
#include <cub/device/device_select.cuh>
#include <mutex>
#include <string>
#include <vector>

#include "addons/sparse_operation_kit/core/common.h"
#include "addons/sparse_operation_kit/core/cuda/device_util.cuh"
#include "addons/sparse_operation_kit/core/cuda/gpu_api.h"
#include "addons/sparse_operation_kit/core/cuda/runtime.h"
#include "addons/sparse_operation_kit/core/cuda/table_impl.cuh"
#include "addons/sparse_operation_kit/core/cuda/table_layout.cuh"

namespace sok {
namespace gpu {

using namespace detail;  // NOLINT
namespace cg = cooperative_groups;

namespace {

// Moves every live slot of `o` into `t` (same stride).
__global__ void
__launch_bounds__(kBlock) k_rehash(DevTable o, DevTable t, int64_t old_slots, int* fail) {
  const Tile tile = cg::tiled_partition<kTile>(cg::this_thread_block());
  const int64_t s = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / kTile;
  if (s >= old_slots) return;
  if (!live_slot(o.digests, s)) return;
  const int64_t key = o.meta[s].key;
  const uint64_t h = hash_key(key);
  const Claim r = probe_insert(tile, t, key, h, fail);
  if (r.slot < 0) return;
  const int lane = tile.thread_rank();
  if (lane == 0) {
    t.meta[r.slot] = o.meta[s];
    t.versions[r.slot] = o.versions[s];
    if (t.row_of != nullptr) t.row_of[r.slot] = o.row_of[s];  // pooled: the row stays put
  }
  if (t.row_of == nullptr) {
    const float* src = o.rows + s * o.stride;
    float* dst = t.rows + r.slot * t.stride;
    for (int64_t c = lane; c < t.stride; c += kTile) dst[c] = src[c];
  }
  if (r.fresh) publish(tile, t, r.slot, h);
}

__global__ void k_fill_free(int32_t* list, int64_t pool, const int64_t* taken, float* rows,
                            PoolHeader* h) {
  const int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t first = taken != nullptr ? *taken : 0;
  if (j < pool - first) list[j] = static_cast<int32_t>(first + j);
  if (j == 0) {
    h->count = static_cast<unsigned long long>(pool - first);
    h->list = list;
    h->num_blocks = 1;
    h->start[0] = 0;
    h->block[0] = rows;
  }
}

// The free list of a pool grown from old_pool to pool rows: the old list's rows, then the new
// block's (k_point_pool then points the header at the list and the block).
__global__ void k_grow_free(const PoolHeader* h, int32_t* list, int64_t old_pool, int64_t pool) {
  const int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t had = static_cast<int64_t>(h->count);
  if (j < had) list[j] = h->list[j];
  else if (j < had + pool - old_pool) list[j] = static_cast<int32_t>(old_pool + j - had);
}

__global__ void k_point_pool(PoolHeader* h, int32_t* list, int64_t old_pool, int64_t pool,
                             float* block) {
  h->count += static_cast<unsigned long long>(pool - old_pool);
  h->list = list;
  h->start[h->num_blocks] = old_pool;
  h->block[h->num_blocks] = block;
  ++h->num_blocks;
}

// Rows per export/import chunk of at most chunk_bytes on the device (GpuTableOptions).
template <typename K>
int64_t chunk_rows(int64_t chunk_bytes, int64_t dim, int num_slots) {
  const int64_t row = dim * (1 + num_slots) * static_cast<int64_t>(sizeof(float)) + sizeof(K) +
                      2 * sizeof(int64_t);
  return std::max<int64_t>(1, chunk_bytes / row);
}

template <typename K>
__global__ void k_export(DevTable t, const int64_t* slots, int64_t n, int ns, K* keys,
                         float* values, float* slot_vals, int64_t* freqs, int64_t* versions) {
  const int64_t x = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t j = x / kTile;
  const int l = static_cast<int>(x % kTile);
  if (j >= n) return;
  const int64_t s = slots[j];
  if (l == 0) {
    keys[j] = static_cast<K>(t.meta[s].key);
    freqs[j] = t.meta[s].freq;
    versions[j] = t.versions[s];
  }
  const float* row = row_at(t, s);
  for (int64_t c = l; c < t.dim; c += kTile) values[j * t.dim + c] = row[c];
  for (int64_t c = l; c < ns * t.dim; c += kTile) slot_vals[j * ns * t.dim + c] = row[t.dim + c];
}

template <typename K>
__global__ void __launch_bounds__(kBlock) k_import(DevTable t, const K* keys, const float* values,
                                                   const float* slot_vals, const int64_t* freqs,
                                                   const int64_t* versions, int ns, int64_t n,
                                                   int64_t* counters, int* dup, int* fail) {
  const Tile tile = cg::tiled_partition<kTile>(cg::this_thread_block());
  const int64_t i = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / kTile;
  const int lane = tile.thread_rank();
  int inserted = 0;
  if (i < n) {
    const int64_t key = static_cast<int64_t>(keys[i]);
    const uint64_t h = hash_key(key);
    const Claim r = probe_insert(tile, t, key, h, fail);
    float* row = r.slot >= 0 && r.fresh ? fresh_row(tile, t, r.slot, fail) : nullptr;
    if (r.slot >= 0 && !r.fresh) {
      if (lane == 0) atomicOr(dup, 1);
    } else if (row != nullptr) {
      if (lane == 0) {
        t.meta[r.slot].key = key;
        t.meta[r.slot].freq = freqs[i];
        t.versions[r.slot] = versions[i];
      }
      for (int64_t c = lane; c < t.dim; c += kTile) row[c] = values[i * t.dim + c];
      for (int64_t c = lane; c < ns * t.dim; c += kTile) row[t.dim + c] = slot_vals[i * ns * t.dim + c];
      publish(tile, t, r.slot, h);
      inserted = lane == 0;
    }
  }
  add_count(counters, inserted);
}

// k_export's outputs for a chunk of rows of ns slots (device temporaries).
template <typename K>
struct ExportChunk {
  K* keys = nullptr;
  float *values = nullptr, *slot_vals = nullptr;
  int64_t *freqs = nullptr, *versions = nullptr;
  Temp tmp;
};

template <typename K, typename Impl>
Status carve_export_chunk(Impl& m, int64_t chunk, int ns, cudaStream_t stream,
                          ExportChunk<K>* b) {
  const int64_t d = m.cfg.dim;
  return carve_temp(m.alloc, stream, &b->tmp, [&](Workspace& ws) {
    b->keys = ws.take<K>(chunk);
    b->values = ws.take<float>(chunk * d);
    b->slot_vals = ws.take<float>(chunk * ns * d + 1);  // + 1: never empty
    b->freqs = ws.take<int64_t>(chunk);
    b->versions = ws.take<int64_t>(chunk);
  });
}

// The rows at slots[0, count) (device) to *out, through buffers of at most a chunk
// (synchronises); append: after out's rows (the same slot layout), else replacing them. The
// caller holds m.mu.
template <typename K, typename Impl>
Status copy_out_to(Impl& m, const int64_t* slots, int64_t count, const SnapshotArrays<K>& out,
                   int64_t at, cudaStream_t stream) {
  const int64_t d = m.cfg.dim;
  const int ns = m.num_slots;
  if (out.num_slots != ns || out.dim != d)
    return Status::Invalid("table '" + m.cfg.name + "': rows of " + std::to_string(ns) +
                           " slots cannot follow rows of " + std::to_string(out.num_slots));
  if (at + count > out.n)
    return Status::Invalid("table '" + m.cfg.name + "' gained rows while it was exported");
  const int64_t chunk =
      std::min(std::max<int64_t>(count, 1), chunk_rows<K>(m.opt.transfer_chunk_bytes, d, ns));
  ExportChunk<K> b;
  SOK_RETURN_IF_ERROR(carve_export_chunk(m, chunk, ns, stream, &b));
  for (int64_t from = 0; from < count; from += chunk) {
    const int64_t c = std::min(chunk, count - from);
    const int64_t to = at + from;
    k_export<K><<<grid_for(c * kTile, kBlock), kBlock, 0, stream>>>(
        m.t, slots + from, c, ns, b.keys, b.values, b.slot_vals, b.freqs, b.versions);
    SOK_LAUNCH_CHECK();
    SOK_CUDA_RETURN(
        cudaMemcpyAsync(out.keys + to, b.keys, c * sizeof(K), cudaMemcpyDeviceToHost, stream));
    SOK_CUDA_RETURN(cudaMemcpyAsync(out.values + to * d, b.values, c * d * sizeof(float),
                                    cudaMemcpyDeviceToHost, stream));
    if (ns > 0)
      SOK_CUDA_RETURN(cudaMemcpyAsync(out.slots + to * ns * d, b.slot_vals,
                                      c * ns * d * sizeof(float), cudaMemcpyDeviceToHost, stream));
    SOK_CUDA_RETURN(cudaMemcpyAsync(out.freqs + to, b.freqs, c * sizeof(int64_t),
                                    cudaMemcpyDeviceToHost, stream));
    SOK_CUDA_RETURN(cudaMemcpyAsync(out.versions + to, b.versions, c * sizeof(int64_t),
                                    cudaMemcpyDeviceToHost, stream));
    SOK_CUDA_RETURN(cudaStreamSynchronize(stream));  // the buffers are reused by the next chunk
  }
  return Status::OK();
}

// The same into a snapshot's vectors, after its rows (append) or replacing them.
template <typename K, typename Impl>
Status copy_out(Impl& m, const int64_t* slots, int64_t count, TableSnapshot<K>* out,
                cudaStream_t stream, bool append = false) {
  const int64_t base = append ? static_cast<int64_t>(out->keys.size()) : 0;
  if (base == 0) {
    out->dim = m.cfg.dim;
    out->num_slots = m.num_slots;
  }
  out->slot_kind = m.slot_kind;
  out->slot_init = m.slot_init;
  const int64_t d = out->dim, ns = out->num_slots;
  if (ns == m.num_slots && d == m.cfg.dim) {
    out->keys.resize(base + count);
    out->values.resize((base + count) * d);
    out->slots.resize((base + count) * ns * d);
    out->freqs.resize(base + count);
    out->versions.resize(base + count);
  }
  const SnapshotArrays<K> arrays{base + count,       d,
                                 static_cast<int>(ns), out->keys.data(),
                                 out->values.data(), out->slots.data(),
                                 out->freqs.data(),  out->versions.data()};
  return copy_out_to<K>(m, slots, count, arrays, base, stream);
}

// The keys of the rows should_evict() selects among `count` live slots, read a chunk at a time
// (keys and versions; values only under an L2 threshold): choosing victims holds no copy of the
// table on the host, which for a table larger than the GPU would be most of the host's memory.
template <typename K, typename Impl>
Status pick_victims(Impl& m, const int64_t* slots, int64_t count, int64_t global_step,
                    cudaStream_t stream, std::vector<K>* victims) {
  const int64_t d = m.cfg.dim;
  const bool by_norm = m.cfg.l2_weight_threshold >= 0.f;
  const int64_t chunk =
      std::min(std::max<int64_t>(count, 1), chunk_rows<K>(m.opt.transfer_chunk_bytes, d, 0));
  ExportChunk<K> b;
  SOK_RETURN_IF_ERROR(carve_export_chunk(m, chunk, 0, stream, &b));
  std::vector<K> h_keys(chunk);
  std::vector<int64_t> h_versions(chunk);
  std::vector<float> h_values(by_norm ? chunk * d : 0);
  for (int64_t at = 0; at < count; at += chunk) {
    const int64_t c = std::min(chunk, count - at);
    k_export<K><<<grid_for(c * kTile, kBlock), kBlock, 0, stream>>>(
        m.t, slots + at, c, 0, b.keys, b.values, b.slot_vals, b.freqs, b.versions);
    SOK_LAUNCH_CHECK();
    SOK_CUDA_RETURN(
        cudaMemcpyAsync(h_keys.data(), b.keys, c * sizeof(K), cudaMemcpyDeviceToHost, stream));
    SOK_CUDA_RETURN(cudaMemcpyAsync(h_versions.data(), b.versions, c * sizeof(int64_t),
                                    cudaMemcpyDeviceToHost, stream));
    if (by_norm)
      SOK_CUDA_RETURN(cudaMemcpyAsync(h_values.data(), b.values, c * d * sizeof(float),
                                      cudaMemcpyDeviceToHost, stream));
    SOK_CUDA_RETURN(cudaStreamSynchronize(stream));  // the buffers are reused by the next chunk
    for (int64_t i = 0; i < c; ++i) {
      const float* value = by_norm ? h_values.data() + i * d : nullptr;  // unread without
      if (should_evict(m.cfg, global_step, h_versions[i], value)) victims->push_back(h_keys[i]);
    }
  }
  return Status::OK();
}

// Inserts the snapshot's rows (the table's slot layout, room already made) through buffers of at
// most a chunk (synchronises); an error when a key is already there or repeats.
template <typename K, typename Impl>
Status copy_in(Impl& m, const SnapshotView<K>& s, cudaStream_t stream,
               const std::vector<int64_t>* pick = nullptr) {
  const int64_t n = pick ? static_cast<int64_t>(pick->size()) : s.n, d = m.cfg.dim;
  const int64_t chunk = std::min(n, chunk_rows<K>(m.opt.transfer_chunk_bytes, d, s.num_slots));
  K* keys;
  float *values, *slot_vals;
  int64_t *freqs, *versions;
  int* dup;
  Temp tmp;
  SOK_RETURN_IF_ERROR(carve_temp(m.alloc, stream, &tmp, [&](Workspace& ws) {
    keys = ws.take<K>(chunk);
    values = ws.take<float>(chunk * d);
    slot_vals = ws.take<float>(chunk * s.num_slots * d + 1);  // + 1: never empty
    freqs = ws.take<int64_t>(chunk);
    versions = ws.take<int64_t>(chunk);
    dup = ws.take<int>(1);
  }));
  SOK_CUDA_RETURN(cudaMemsetAsync(dup, 0, sizeof(int), stream));
  const int64_t sd = s.num_slots * d;
  // Picked rows are gathered a chunk at a time on the host, so a tiered import's split never
  // copies its tiers' rows whole.
  std::vector<K> hk;
  std::vector<float> hv, hs;
  std::vector<int64_t> hf, hver;
  for (int64_t at = 0; at < n; at += chunk) {
    const int64_t c = std::min(chunk, n - at);
    const K* src_keys = s.keys + at;
    const float *src_values = s.values + at * d, *src_slots = s.slots + at * sd;
    const int64_t *src_freqs = s.freqs + at, *src_versions = s.versions + at;
    if (pick != nullptr) {
      hk.resize(c);
      hv.resize(c * d);
      hs.resize(c * sd);
      hf.resize(c);
      hver.resize(c);
      for (int64_t j = 0; j < c; ++j) {
        const int64_t r = (*pick)[at + j];
        hk[j] = s.keys[r];
        hf[j] = s.freqs[r];
        hver[j] = s.versions[r];
        std::copy(s.values + r * d, s.values + (r + 1) * d, hv.begin() + j * d);
        std::copy(s.slots + r * sd, s.slots + (r + 1) * sd, hs.begin() + j * sd);
      }
      src_keys = hk.data();
      src_values = hv.data();
      src_slots = hs.data();
      src_freqs = hf.data();
      src_versions = hver.data();
    }
    SOK_CUDA_RETURN(cudaMemcpyAsync(keys, src_keys, c * sizeof(K), cudaMemcpyHostToDevice, stream));
    SOK_CUDA_RETURN(cudaMemcpyAsync(values, src_values, c * d * sizeof(float),
                                    cudaMemcpyHostToDevice, stream));
    if (sd > 0)
      SOK_CUDA_RETURN(cudaMemcpyAsync(slot_vals, src_slots, c * sd * sizeof(float),
                                      cudaMemcpyHostToDevice, stream));
    SOK_CUDA_RETURN(cudaMemcpyAsync(freqs, src_freqs, c * sizeof(int64_t),
                                    cudaMemcpyHostToDevice, stream));
    SOK_CUDA_RETURN(cudaMemcpyAsync(versions, src_versions, c * sizeof(int64_t),
                                    cudaMemcpyHostToDevice, stream));
    // A key repeated across chunks finds the earlier chunk's slot: flagged like one within a
    // chunk.
    k_import<K><<<grid_for(c * kTile, kBlock), kBlock, 0, stream>>>(
        m.t, keys, values, slot_vals, freqs, versions, s.num_slots, c, m.d_counters, dup,
        m.d_fail);
    SOK_LAUNCH_CHECK();
    SOK_CUDA_RETURN(cudaStreamSynchronize(stream));  // the buffers are reused by the next chunk
  }
  int h_dup = 0;
  SOK_CUDA_RETURN(cudaMemcpyAsync(&h_dup, dup, sizeof(int), cudaMemcpyDeviceToHost, stream));
  SOK_CUDA_RETURN(cudaStreamSynchronize(stream));
  if (h_dup != 0)
    return Status::Invalid("cannot restore table '" + m.cfg.name +
                           "': a key appears twice in the checkpoint");
  return Status::OK();
}

template <typename K>
__global__ void __launch_bounds__(kBlock)
    k_slots_of(DevTable t, const K* keys, int64_t n, int64_t* slots) {
  const Tile tile = cg::tiled_partition<kTile>(cg::this_thread_block());
  const int64_t i = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / kTile;
  if (i >= n) return;
  const int64_t key = static_cast<int64_t>(keys[i]);
  const int64_t s = probe_find<true>(tile, t, key, hash_key(key));
  if (tile.thread_rank() == 0) slots[i] = s;
}

struct IsSlot {
  __device__ bool operator()(int64_t s) const { return s >= 0; }
};

// Checks of a snapshot to restore, naming the table.
template <typename K>
Status check_import(const TableConfig& cfg, const SnapshotView<K>& s) {
  SOK_RETURN_IF_ERROR(check_snapshot(cfg.name, cfg.dim, s));
  if (s.num_slots < 0 || s.num_slots > 2)
    return Status::Invalid("cannot restore table '" + cfg.name +
                           "': at most 2 optimizer slots are supported");
  return Status::OK();
}

}  // namespace

Status detail::fill_free_rows(int32_t* list, int64_t pool, const int64_t* taken, float* rows,
                              int32_t* row_of, cudaStream_t s) {
  k_fill_free<<<grid_for(std::max<int64_t>(pool, 1), kBlock), kBlock, 0, s>>>(
      list, pool, taken, rows, pool_header(row_of));
  SOK_LAUNCH_CHECK();
  return Status::OK();
}

namespace {
std::string pool_what(int64_t rows, int64_t stride) {
  return "a pool of " + std::to_string(rows) + " rows of " + std::to_string(stride) + " floats";
}
}  // namespace

template <typename K>
Status GpuEmbeddingTable<K>::Impl::alloc_pool(int64_t rows, DevTable* a, cudaStream_t s) {
  SOK_RETURN_IF_ERROR(
      acquire_pool(rows, a->stride, &a->rows, &free_list, pool_what(rows, a->stride).c_str()));
  pool_rows = next_pool_rows = rows;
  pool_blocks = {a->rows};
  SOK_RETURN_IF_ERROR(note_row_memory(a->rows));
  return fill_free_rows(free_list, rows, nullptr, a->rows, a->row_of, s);
}

template <typename K>
Status GpuEmbeddingTable<K>::Impl::grow_pool_to(int64_t rows, cudaStream_t s) {
  SOK_RETURN_IF_ERROR(check_pool_rows(rows));
  if (pool_blocks.size() >= static_cast<size_t>(kMaxPoolBlocks))
    return Status::Invalid("table '" + cfg.name + "': its row pool has " +
                           std::to_string(pool_blocks.size()) + " blocks, the most it can have");
  SOK_CUDA_RETURN(cudaDeviceSynchronize());
  mixed = false;
  float* block = nullptr;
  int32_t* new_list = nullptr;
  const std::string what = pool_what(rows - pool_rows, t.stride) + " more";
  SOK_RETURN_IF_ERROR(acquire(&new_list, static_cast<size_t>(rows) * sizeof(int32_t), what.c_str()));
  Status st = acquire_rows(
      &block, static_cast<size_t>(rows - pool_rows) * t.stride * sizeof(float), what.c_str());
  if (st.ok()) {
    PoolHeader* h = pool_header(t.row_of);
    k_grow_free<<<grid_for(rows, kBlock), kBlock, 0, s>>>(h, new_list, pool_rows, rows);
    k_point_pool<<<1, 1, 0, s>>>(h, new_list, pool_rows, rows, block);
    if (cudaStreamSynchronize(s) != cudaSuccess)
      st = Status::Invalid("table '" + cfg.name + "': growing its row pool failed: " +
                           cudaGetErrorString(cudaGetLastError()));
  }
  if (!st.ok()) {
    release_pool(block, new_list);
    return st;
  }
  release(free_list);
  free_list = new_list;
  pool_blocks.push_back(block);
  pool_rows = next_pool_rows = rows;
  return Status::OK();
}

template <typename K>
Status GpuEmbeddingTable<K>::Impl::rehash(int64_t new_cap, cudaStream_t s) {
  SOK_CUDA_RETURN(cudaDeviceSynchronize());
  mixed = false;
  DevTable nt;
  SOK_RETURN_IF_ERROR(alloc_arrays(new_cap, t.stride, &nt, s));
  if (pooled()) {  // a new index over the same pool, its header copied
    nt.rows = t.rows;
    SOK_CUDA_RETURN(cudaMemcpyAsync(pool_header(nt.row_of), pool_header(t.row_of),
                                    sizeof(PoolHeader), cudaMemcpyDeviceToDevice, s));
  }
  if (capacity > 0) {
    k_rehash<<<grid_for(capacity * kTile, kBlock), kBlock, 0, s>>>(t, nt, capacity, d_fail);
    SOK_LAUNCH_CHECK();
  }
  SOK_CUDA_RETURN(cudaMemsetAsync(d_counters + 1, 0, sizeof(int64_t), s));
  SOK_CUDA_RETURN(cudaStreamSynchronize(s));
  free_index(&t);
  t = nt;
  capacity = new_cap;
  return Status::OK();
}

namespace {

// The table's live slots in slot order (device), checked against the live counter.
struct LiveSlots {
  Temp tmp;
  int64_t* slots = nullptr;
  int64_t count = 0;
};

// *out: the live slots of a table whose mutex the caller holds (synchronises).
template <typename Impl>
Status live_slots(Impl& m, cudaStream_t stream, LiveSlots* out) {
  m.note_stream(stream);
  int64_t live = 0, erased = 0;
  SOK_RETURN_IF_ERROR(m.sync_counts(stream, &live, &erased));
  m.set_upper(live + erased, live);
  size_t sel_bytes = 0;
  thrust::counting_iterator<int64_t> it(0);
  IsLiveSlot pred{m.t.digests};
  SOK_CUDA_RETURN(cub::DeviceSelect::If(nullptr, sel_bytes, it, static_cast<int64_t*>(nullptr),
                                        static_cast<int64_t*>(nullptr), m.capacity, pred, stream));
  int64_t* num;
  void* sel_tmp;
  SOK_RETURN_IF_ERROR(carve_temp(m.alloc, stream, &out->tmp, [&](Workspace& ws) {
    out->slots = ws.take<int64_t>(m.capacity);
    num = ws.take<int64_t>(1);
    sel_tmp = ws.take_bytes(sel_bytes);
  }));
  SOK_CUDA_RETURN(
      cub::DeviceSelect::If(sel_tmp, sel_bytes, it, out->slots, num, m.capacity, pred, stream));
  SOK_CUDA_RETURN(
      cudaMemcpyAsync(&out->count, num, sizeof(int64_t), cudaMemcpyDeviceToHost, stream));
  SOK_CUDA_RETURN(cudaStreamSynchronize(stream));
  if (out->count != live)
    return Status::Invalid("table '" + m.cfg.name + "': export found " + std::to_string(out->count) +
                           " live slots but the counter says " + std::to_string(live));
  return Status::OK();
}

}  // namespace

template <typename K>
Status GpuEmbeddingTable<K>::export_rows(TableSnapshot<K>* out, cudaStream_t stream,
                                         bool append) {
  Impl& m = *impl_;
  DeviceGuard g(m.device);
  std::lock_guard<std::mutex> l(m.mu);
  LiveSlots live;
  SOK_RETURN_IF_ERROR(live_slots(m, stream, &live));
  return copy_out<K>(m, live.slots, live.count, out, stream, append);
}

template <typename K>
Status GpuEmbeddingTable<K>::export_to(const SnapshotArrays<K>& out, int64_t at, int64_t* count,
                                       cudaStream_t stream) {
  Impl& m = *impl_;
  DeviceGuard g(m.device);
  std::lock_guard<std::mutex> l(m.mu);
  LiveSlots live;
  SOK_RETURN_IF_ERROR(live_slots(m, stream, &live));
  *count = live.count;
  return copy_out_to<K>(m, live.slots, live.count, out, at, stream);
}

// Victims are chosen on the host by the one eviction rule (shrinking is rare: checkpoint time),
// then erased on the device.
template <typename K>
Status GpuEmbeddingTable<K>::shrink(int64_t global_step, cudaStream_t stream, int64_t* removed) {
  *removed = 0;
  Impl& m = *impl_;
  if (!evicts_anything(m.cfg)) return Status::OK();
  DeviceGuard g(m.device);
  std::vector<K> victims;
  {
    std::lock_guard<std::mutex> l(m.mu);
    LiveSlots live;
    SOK_RETURN_IF_ERROR(live_slots(m, stream, &live));
    SOK_RETURN_IF_ERROR(pick_victims<K>(m, live.slots, live.count, global_step, stream, &victims));
  }
  if (victims.empty()) return Status::OK();
  Temp d_victims;
  const size_t bytes = victims.size() * sizeof(K);
  SOK_RETURN_IF_ERROR(d_victims.alloc(m.alloc, bytes, stream));
  SOK_CUDA_RETURN(
      cudaMemcpyAsync(d_victims.as<K>(), victims.data(), bytes, cudaMemcpyHostToDevice, stream));
  // erase() with a count synchronises the stream, so `victims` outlives the copy.
  return erase(d_victims.as<K>(), static_cast<int64_t>(victims.size()), stream, removed);
}

template <typename K>
Status GpuEmbeddingTable<K>::export_keys(const K* keys, int64_t n, TableSnapshot<K>* out,
                                         cudaStream_t stream) {
  Impl& m = *impl_;
  DeviceGuard g(m.device);
  std::lock_guard<std::mutex> l(m.mu);
  m.note_stream(stream);
  size_t sel_bytes = 0;
  SOK_CUDA_RETURN(cub::DeviceSelect::If(nullptr, sel_bytes, static_cast<int64_t*>(nullptr),
                                        static_cast<int64_t*>(nullptr),
                                        static_cast<int64_t*>(nullptr), n, IsSlot(), stream));
  int64_t *all, *slots, *num;
  void* sel_tmp;
  Temp tmp;
  SOK_RETURN_IF_ERROR(carve_temp(m.alloc, stream, &tmp, [&](Workspace& ws) {
    all = ws.take<int64_t>(std::max<int64_t>(n, 1));
    slots = ws.take<int64_t>(std::max<int64_t>(n, 1));
    num = ws.take<int64_t>(1);
    sel_tmp = ws.take_bytes(sel_bytes);
  }));
  int64_t h_num = 0;
  if (n > 0) {
    k_slots_of<K><<<grid_for(n * kTile, kBlock), kBlock, 0, stream>>>(m.t, keys, n, all);
    SOK_LAUNCH_CHECK();
    SOK_CUDA_RETURN(
        cub::DeviceSelect::If(sel_tmp, sel_bytes, all, slots, num, n, IsSlot(), stream));
    SOK_CUDA_RETURN(
        cudaMemcpyAsync(&h_num, num, sizeof(int64_t), cudaMemcpyDeviceToHost, stream));
    SOK_CUDA_RETURN(cudaStreamSynchronize(stream));
  }
  return copy_out<K>(m, slots, h_num, out, stream);
}

template <typename K>
Status GpuEmbeddingTable<K>::import_rows(const SnapshotView<K>& s, cudaStream_t stream,
                                         const std::vector<int64_t>* pick) {
  Impl& m = *impl_;
  const int64_t n = pick ? static_cast<int64_t>(pick->size()) : s.n, d = m.cfg.dim;
  SOK_RETURN_IF_ERROR(check_import(m.cfg, s));
  if (m.grow_pool) SOK_RETURN_IF_ERROR(m.check_pool_rows(n));
  DeviceGuard g(m.device);
  std::lock_guard<std::mutex> l(m.mu);
  SOK_CUDA_RETURN(cudaDeviceSynchronize());
  m.mixed = false;
  m.note_stream(stream);
  m.free_arrays(&m.t);
  m.capacity = 0;
  m.num_slots = s.num_slots;
  m.slot_kind = s.num_slots > 0 ? s.slot_kind : -1;
  m.slot_init = s.slot_init;
  const int64_t cap = capacity_for(
      std::max<int64_t>(std::max<int64_t>(n, m.cfg.initial_capacity), 1), m.opt.max_load_factor);
  if (m.grow_pool)  // a quarter to spare, so training can insert before the first growth
    m.next_pool_rows = std::min(std::max(m.first_pool_rows(), n + n / 4), kMaxPoolRows);
  SOK_RETURN_IF_ERROR(m.alloc_arrays(cap, d * (1 + s.num_slots), &m.t, stream));
  if (m.pooled()) SOK_RETURN_IF_ERROR(m.alloc_pool(m.next_pool_rows, &m.t, stream));
  m.capacity = cap;
  SOK_CUDA_RETURN(cudaMemsetAsync(m.d_counters, 0, 2 * sizeof(int64_t), stream));
  m.set_upper(n);
  if (n == 0) {
    SOK_CUDA_RETURN(cudaStreamSynchronize(stream));
    return Status::OK();
  }
  return copy_in<K>(m, s, stream, pick);
}

template <typename K>
Status GpuEmbeddingTable<K>::put_rows(const SnapshotView<K>& s, cudaStream_t stream) {
  Impl& m = *impl_;
  const int64_t n = s.n;
  SOK_RETURN_IF_ERROR(check_import<K>(m.cfg, s));
  if (n == 0) return Status::OK();
  DeviceGuard g(m.device);
  std::lock_guard<std::mutex> l(m.mu);
  if (s.num_slots != m.num_slots)
    return Status::Invalid("table '" + m.cfg.name + "': rows of " + std::to_string(s.num_slots) +
                           " slots cannot join rows of " + std::to_string(m.num_slots));
  std::vector<Impl*> snap;
  SOK_RETURN_IF_ERROR(prepare_inserts<Impl>({&m}, {n}, stream, &snap));
  SOK_RETURN_IF_ERROR(copy_in<K>(m, s, stream));
  return snapshot_counters(snap, stream);
}

template <typename K>
Status GpuEmbeddingTable<K>::reserve(int64_t num_keys, cudaStream_t stream) {
  Impl& m = *impl_;
  DeviceGuard g(m.device);
  std::lock_guard<std::mutex> l(m.mu);
  m.note_stream(stream);
  if (m.grow_pool && num_keys > m.pool_rows) SOK_RETURN_IF_ERROR(m.grow_pool_to(num_keys, stream));
  if (static_cast<double>(num_keys) <= m.opt.max_load_factor * static_cast<double>(m.capacity))
    return Status::OK();
  int64_t live = 0, erased = 0;
  SOK_RETURN_IF_ERROR(m.sync_counts(stream, &live, &erased));
  SOK_RETURN_IF_ERROR(m.rehash(capacity_for(std::max(num_keys, live), m.opt.max_load_factor), stream));
  m.set_upper(live);
  return Status::OK();
}

template Status GpuEmbeddingTable<int32_t>::Impl::alloc_pool(int64_t, DevTable*, cudaStream_t);
template Status GpuEmbeddingTable<int64_t>::Impl::alloc_pool(int64_t, DevTable*, cudaStream_t);
template Status GpuEmbeddingTable<int32_t>::Impl::grow_pool_to(int64_t, cudaStream_t);
template Status GpuEmbeddingTable<int64_t>::Impl::grow_pool_to(int64_t, cudaStream_t);
template Status GpuEmbeddingTable<int32_t>::Impl::rehash(int64_t, cudaStream_t);
template Status GpuEmbeddingTable<int64_t>::Impl::rehash(int64_t, cudaStream_t);
template Status GpuEmbeddingTable<int32_t>::export_rows(TableSnapshot<int32_t>*, cudaStream_t,
                                                         bool);
template Status GpuEmbeddingTable<int64_t>::export_rows(TableSnapshot<int64_t>*, cudaStream_t,
                                                         bool);
template Status GpuEmbeddingTable<int32_t>::export_to(const SnapshotArrays<int32_t>&, int64_t,
                                                       int64_t*, cudaStream_t);
template Status GpuEmbeddingTable<int64_t>::export_to(const SnapshotArrays<int64_t>&, int64_t,
                                                       int64_t*, cudaStream_t);
template Status GpuEmbeddingTable<int32_t>::import_rows(const SnapshotView<int32_t>&, cudaStream_t,
                                                         const std::vector<int64_t>*);
template Status GpuEmbeddingTable<int64_t>::import_rows(const SnapshotView<int64_t>&, cudaStream_t,
                                                         const std::vector<int64_t>*);
template Status GpuEmbeddingTable<int32_t>::put_rows(const SnapshotView<int32_t>&, cudaStream_t);
template Status GpuEmbeddingTable<int64_t>::put_rows(const SnapshotView<int64_t>&, cudaStream_t);
template Status GpuEmbeddingTable<int32_t>::export_keys(const int32_t*, int64_t, TableSnapshot<int32_t>*,
                                                        cudaStream_t);
template Status GpuEmbeddingTable<int64_t>::export_keys(const int64_t*, int64_t, TableSnapshot<int64_t>*,
                                                        cudaStream_t);
template Status GpuEmbeddingTable<int32_t>::reserve(int64_t, cudaStream_t);
template Status GpuEmbeddingTable<int64_t>::reserve(int64_t, cudaStream_t);
template Status GpuEmbeddingTable<int32_t>::shrink(int64_t, cudaStream_t, int64_t*);
template Status GpuEmbeddingTable<int64_t>::shrink(int64_t, cudaStream_t, int64_t*);

}  // namespace gpu
}  // namespace sok
