// Internal: the host state of a GpuEmbeddingTable (its Impl), shared by table.cu,
// table_storage.cu and table_optimizer.cu.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "addons/sparse_operation_kit/core/cuda/gpu_api.h"
#include "addons/sparse_operation_kit/core/cuda/runtime.h"
#include "addons/sparse_operation_kit/core/cuda/table_layout.cuh"
#include "addons/sparse_operation_kit/core/optimizer.h"

namespace sok {
namespace gpu {
namespace detail {

// Sets the current device for a scope, restoring the previous one.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    cudaGetDevice(&prev_);
    if (prev_ != device) cudaSetDevice(device);
    restore_ = prev_ != device;
  }
  ~DeviceGuard() {
    if (restore_) cudaSetDevice(prev_);
  }

 private:
  int prev_ = 0;
  bool restore_ = false;
};

// The event after one copy of several tables' counters (each into its own pinned h_counters[4, 6)),
// shared by those tables: a call over 26 tables enqueues one copy and one event, not 26 of each.
class SnapshotEvent {
 public:
  SnapshotEvent() = default;
  SnapshotEvent(const SnapshotEvent&) = delete;
  SnapshotEvent& operator=(const SnapshotEvent&) = delete;
  ~SnapshotEvent() {
    if (event_ != nullptr) cudaEventDestroy(event_);
  }
  Status record(cudaStream_t s) {
    if (event_ == nullptr)
      SOK_CUDA_RETURN(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming));
    SOK_CUDA_RETURN(cudaEventRecord(event_, s));
    recorded_ = true;
    return Status::OK();
  }
  // True once the stream has passed the copy (an event never recorded has not).
  bool passed() {
    if (passed_.load(std::memory_order_acquire)) return true;
    if (!recorded_) return false;
    const cudaError_t q = cudaEventQuery(event_);
    if (q == cudaSuccess) {
      passed_.store(true, std::memory_order_release);
      return true;
    }
    if (q == cudaErrorNotReady && cudaPeekAtLastError() == cudaErrorNotReady)
      cudaGetLastError();  // not ready is no error
    return false;
  }

 private:
  cudaEvent_t event_ = nullptr;
  bool recorded_ = false;
  std::atomic<bool> passed_{false};
};

// dst[i][0, 2) = src[i][0, 2) in stream order, for every i in one launch (dst: pinned host memory,
// which the device writes directly under unified addressing).
Status copy_counters(const std::vector<const int64_t*>& src, const std::vector<int64_t*>& dst,
                     cudaStream_t s);

// `list` as the free list of a pool of `pool` rows (one block, `rows`) after *taken (device;
// null: 0) were given out (rows taken, taken + 1, ..., pool - 1), and the pool header before
// row_of pointing to both.
Status fill_free_rows(int32_t* list, int64_t pool, const int64_t* taken, float* rows,
                      int32_t* row_of, cudaStream_t s);

}  // namespace detail

template <typename K>
struct GpuEmbeddingTable<K>::Impl {
  TableConfig cfg;
  GpuTableOptions opt;
  DeviceAllocator* alloc = nullptr;        // temporaries
  DeviceAllocator* storage = nullptr;      // the arrays below but the rows
  DeviceAllocator* row_storage = nullptr;  // t.rows (values and slots)
  bool host_rows = false;                  // t.rows in (pinned, mapped) host memory
  int device = 0;
  detail::DevTable t;
  int64_t capacity = 0;
  // Pooled rows (GpuTableOptions::pool_rows > 0 or grow_pool): t.rows holds pool_rows rows; the
  // next slot relayout or import allocates next_pool_rows (a tiered table lowers it with its
  // budget). A growing pool grows before an insert could find it empty.
  int64_t pool_rows = 0;
  int64_t next_pool_rows = 0;
  bool grow_pool = false;
  int32_t* free_list = nullptr;     // the pool's (device; table_layout.cuh's PoolHeader)
  std::vector<float*> pool_blocks;  // the pool's row blocks (t.rows is the first)
  float* d_matrix = nullptr;
  int64_t* d_counters = nullptr;  // [0] live keys, [1] erased slots
  int* d_fail = nullptr;
  int64_t* h_counters = nullptr;  // pinned: [0, 3) sync_counts' copy, [4, 6) the snapshot's
  int num_slots = 0;
  int slot_kind = -1;
  std::vector<float> slot_init;
  int64_t upper = 0;       // upper bound of live + erased
  int64_t live_upper = 0;  // upper bound of live (a growing pool's rows in use)
  // An asynchronous copy of the counters (h_counters[4, 6)), enqueued after a call's launches
  // when the bound gets within half the limit: once its event has passed, live + erased <= the
  // copy + since_snapshot, a tighter bound than `upper` (which grows by every call's n, inserted
  // or not) without a sync. Null: none pending.
  std::shared_ptr<detail::SnapshotEvent> snapshot;
  int64_t since_snapshot = 0;  // keys the calls enqueued after the snapshot may have inserted
  int64_t host_syncs = 0;      // sync_counts calls (GpuEmbeddingTable::host_syncs)
  cudaStream_t last_stream = nullptr;
  bool used = false, mixed = false;
  std::mutex mu;

  ~Impl() {
    if (storage == nullptr) return;
    cudaDeviceSynchronize();  // no kernel still reads the arrays given back
    free_arrays(&t);
    release(d_matrix);
    release(d_counters);
    release(d_fail);
    snapshot.reset();
    if (h_counters) cudaFreeHost(h_counters);
    cudaGetLastError();
  }

  // Storage of `bytes` from the storage allocator; an error names the table, the size asked and
  // the memory free.
  template <typename T>
  Status acquire(T** p, size_t bytes, const char* what) {
    return acquire_from(storage, p, bytes, what);
  }
  template <typename T>
  void release(T*& p) {
    if (p != nullptr) storage->deallocate(p, 0, nullptr);
    p = nullptr;
  }
  // The rows' own allocator (pinned host memory for a host-resident table).
  Status acquire_rows(float** p, size_t bytes, const char* what) {
    return acquire_from(row_storage, p, bytes, what);
  }
  void release_rows(float*& p) {
    if (p != nullptr) row_storage->deallocate(p, 0, nullptr);
    p = nullptr;
  }
  template <typename T>
  Status acquire_from(DeviceAllocator* a, T** p, size_t bytes, const char* what) {
    *p = static_cast<T*>(a->allocate(bytes < 16 ? 16 : bytes, nullptr));
    if (*p != nullptr) return Status::OK();
    cudaGetLastError();
    return Status::Invalid("table '" + cfg.name + "': cannot allocate " + std::to_string(bytes) +
                           " bytes for " + what + " on GPU " + std::to_string(device) + " (" +
                           a->describe_free_memory() + ")");
  }

  detail::RowInit row_init() const {
    detail::RowInit ri;
    ri.init = cfg.init;
    ri.init.matrix = d_matrix;
    ri.num_slots = num_slots;
    ri.slot_init[0] = num_slots > 0 ? slot_init[0] : 0.f;
    ri.slot_init[1] = num_slots > 1 ? slot_init[1] : 0.f;
    ri.filter_freq = cfg.filter_freq;
    ri.no_perm = cfg.default_value_no_permission;
    return ri;
  }

  bool pooled() const { return pool_rows > 0; }
  Status check_pool_rows(int64_t rows) const {
    if (rows <= detail::kMaxPoolRows) return Status::OK();
    return Status::Invalid("table '" + cfg.name + "': " + std::to_string(rows) +
                           " rows, more than the 2^31 - 1 a GPU table's row pool can number "
                           "(shard the table over more GPUs)");
  }
  // A growing pool's rows at creation (and at least, after an import).
  int64_t first_pool_rows() const {
    return std::min(std::max<int64_t>({opt.pool_rows, cfg.initial_capacity, 1}),
                    detail::kMaxPoolRows);
  }

  // The index's arrays (and, unpooled, the rows at its slots).
  void free_index(detail::DevTable* a) {
    release(a->digests);
    release(a->meta);
    release(a->versions);
    if (a->row_of != nullptr) {
      char* block = reinterpret_cast<char*>(a->row_of) - detail::kPoolAlign;  // its pool header
      release(block);
      a->row_of = nullptr;
    }
    if (!pooled()) release_rows(a->rows);
  }
  // A pool of `pool` rows of `stride` floats (one block) from the row storage, and its free list
  // from the device storage; release_pool gives back such a pool, not (or no longer) in use.
  Status acquire_pool(int64_t pool, int64_t stride, float** rows, int32_t** list,
                      const char* what) {
    SOK_RETURN_IF_ERROR(acquire(list, static_cast<size_t>(pool) * sizeof(int32_t), what));
    const Status st = acquire_rows(rows, static_cast<size_t>(pool) * stride * sizeof(float), what);
    if (!st.ok()) release(*list);
    return st;
  }
  void release_pool(float*& rows, int32_t*& list) {
    release(list);
    release_rows(rows);
  }
  // The pool in use: its free list and every block.
  void free_pool(detail::DevTable* a) {
    if (!pooled()) return;
    release(free_list);
    for (float*& b : pool_blocks) release_rows(b);
    pool_blocks.clear();
    a->rows = nullptr;
  }
  void free_arrays(detail::DevTable* a) {
    free_index(a);
    free_pool(a);
    *a = detail::DevTable();
  }

  // An index of cap slots for rows of `stride` floats: with its rows, or, pooled, with a slot's
  // pool row each (the pool itself: alloc_pool).
  Status alloc_arrays(int64_t cap, int64_t stride, detail::DevTable* a, cudaStream_t s) {
    *a = detail::DevTable();
    const int64_t nb = cap / detail::kSlots;
    a->mask = static_cast<uint64_t>(nb - 1);
    a->stride = static_cast<int32_t>(stride);
    a->dim = static_cast<int32_t>(cfg.dim);
    const std::string what =
        std::to_string(cap) + " slots of " + std::to_string(stride) + " floats";
    Status st = acquire(&a->digests, nb * 8 * sizeof(uint32_t), what.c_str());
    if (st.ok()) st = acquire(&a->meta, cap * sizeof(detail::Meta), what.c_str());
    if (st.ok()) st = acquire(&a->versions, cap * sizeof(int64_t), what.c_str());
    char* row_of = nullptr;  // after the pool's header
    if (st.ok() && pooled())
      st = acquire(&row_of, detail::kPoolAlign + cap * sizeof(int32_t), what.c_str());
    if (row_of != nullptr) a->row_of = reinterpret_cast<int32_t*>(row_of + detail::kPoolAlign);
    if (st.ok() && !pooled())
      st = acquire_rows(&a->rows, static_cast<size_t>(cap) * stride * sizeof(float), what.c_str());
    if (!st.ok()) {
      free_index(a);
      *a = detail::DevTable();
      return st;
    }
    if (!pooled()) SOK_RETURN_IF_ERROR(note_row_memory(a->rows));
    SOK_CUDA_RETURN(cudaMemsetAsync(a->digests, 0, nb * 8 * sizeof(uint32_t), s));
    // Versions start at 0 for every slot (slots are never reused before a rehash), so inserting
    // a key needs no extra random write for it.
    SOK_CUDA_RETURN(cudaMemsetAsync(a->versions, 0, cap * sizeof(int64_t), s));
    return Status::OK();
  }

  // A pooled table's pool of `rows` rows of a->stride floats, every row free, into *a.
  Status alloc_pool(int64_t rows, detail::DevTable* a, cudaStream_t s);
  // A growing pool of `rows` rows: a block of the rows added, which join the free list; no row
  // moves (synchronises the device).
  Status grow_pool_to(int64_t rows, cudaStream_t s);

  Status note_row_memory(const float* rows) {
    cudaPointerAttributes pa;
    SOK_CUDA_RETURN(cudaPointerGetAttributes(&pa, rows));
    host_rows = pa.type == cudaMemoryTypeHost;
    return Status::OK();
  }

  void note_stream(cudaStream_t s) {
    if (used && s != last_stream) mixed = true;
    used = true;
    last_stream = s;
  }

  // Waits for every launch that may touch the counters, then reads them.
  Status sync_counts(cudaStream_t s, int64_t* live, int64_t* erased) {
    ++host_syncs;
    if (mixed) {
      SOK_CUDA_RETURN(cudaDeviceSynchronize());
      mixed = false;
    }
    SOK_CUDA_RETURN(
        cudaMemcpyAsync(h_counters, d_counters, 2 * sizeof(int64_t), cudaMemcpyDeviceToHost, s));
    int h_fail = 0;
    SOK_CUDA_RETURN(
        cudaMemcpyAsync(&h_counters[2], d_fail, sizeof(int), cudaMemcpyDeviceToHost, s));
    SOK_CUDA_RETURN(cudaStreamSynchronize(s));
    std::memcpy(&h_fail, &h_counters[2], sizeof(int));
    if (h_fail & detail::kFailPoolEmpty)
      return Status::Invalid("table '" + cfg.name + "': the GPU tier's row pool ran out of rows");
    if (h_fail != 0) return Status::Invalid("table '" + cfg.name + "': GPU hash table overflowed");
    *live = h_counters[0];
    *erased = h_counters[1];
    return Status::OK();
  }

  // Moves every key into a table of new_cap slots (synchronises the device).
  Status rehash(int64_t new_cap, cudaStream_t s);

  // The exact bounds after a synchronisation (a snapshot still pending is dropped); live < 0:
  // at most v live keys.
  void set_upper(int64_t v, int64_t live = -1) {
    upper = v;
    live_upper = live < 0 ? v : live;
    snapshot.reset();
    since_snapshot = 0;
  }

  // Makes sure n more keys fit under the load factor, growing if needed, and synchronises only
  // to grow: the bound adds each call's n (inserted or not) to the last snapshot of the counters,
  // taken after the previous call's launches (*want_snapshot: snapshot_counters enqueues it for
  // every table of a call at once) once the bound passes half the limit. A sync makes room for
  // two calls of n, so the next call fits unless its keys grow; without a snapshot the bound is
  // under half the limit, so only an n over half the limit misses, and that grows anyway. A
  // snapshot taken before the launch would leave one call's n in the bound: with an owner's
  // padded n (every rank's copy of a key) the next call then synced without growing.
  Status prepare_insert(int64_t n, cudaStream_t s, bool* want_snapshot) {
    *want_snapshot = false;
    const int64_t limit = static_cast<int64_t>(opt.max_load_factor * static_cast<double>(capacity));
    // A growing pool must also hold every live key's row.
    const int64_t rows = grow_pool ? pool_rows : std::numeric_limits<int64_t>::max();
    if (snapshot && !mixed && snapshot->passed()) {
      upper = std::min(upper, h_counters[4] + h_counters[5] + since_snapshot);
      live_upper = std::min(live_upper, h_counters[4] + since_snapshot);
      snapshot.reset();
    }
    if (upper + n > limit || live_upper + n > rows) SOK_RETURN_IF_ERROR(make_room(n, s, limit));
    upper += n;
    live_upper += n;
    since_snapshot += n;
    *want_snapshot = !snapshot && !mixed && (upper > limit / 2 || live_upper > rows / 2);
    return Status::OK();
  }

  // prepare_insert's sync: the exact counts, then growth to room for two calls of n: the next
  // call's bound (a snapshot plus its own n) then fits without a sync.
  Status make_room(int64_t n, cudaStream_t s, int64_t limit) {
    int64_t live = 0, erased = 0;
    SOK_RETURN_IF_ERROR(sync_counts(s, &live, &erased));
    set_upper(live + erased, live);
    if (upper + 2 * n > limit) {
      int64_t cap = capacity;
      while (static_cast<double>(live + 2 * n) > opt.max_load_factor * static_cast<double>(cap))
        cap *= 2;
      SOK_RETURN_IF_ERROR(rehash(cap, s));
      set_upper(live);
    }
    // By half: few blocks (each an allocation of pinned memory, slow for host rows), and the
    // spare rows stay under a third of the pool.
    if (grow_pool && live + 2 * n > pool_rows) {
      const int64_t want = std::max(pool_rows + pool_rows / 2, live + 2 * n);
      SOK_RETURN_IF_ERROR(
          grow_pool_to(std::min(want, std::max(detail::kMaxPoolRows, live + n)), s));
    }
    return Status::OK();
  }

  // Makes the rows hold the slots optimizer p needs (relayout on first use; synchronises).
  Status ensure_slots(const OptimizerParams& p, cudaStream_t s);
  // ensure_slots of a pooled table: a pool of next_pool_rows rows of `stride` floats.
  Status relayout_pool(int64_t stride, cudaStream_t s);
};

namespace detail {

// prepare_insert of every call's table (impls[i] gets ns[i] keys; a table may come more than
// once, and is prepared once for the sum of its ns: a sync for a later entry would otherwise
// drop an earlier entry's keys, not yet launched, from the bound); *snap gets the tables that
// want a counter snapshot after the call's launches.
template <typename Impl>
Status prepare_inserts(const std::vector<Impl*>& impls, const std::vector<int64_t>& ns,
                       cudaStream_t s, std::vector<Impl*>* snap) {
  std::vector<Impl*> tables;
  std::vector<int64_t> totals;
  for (size_t i = 0; i < impls.size(); ++i) {
    impls[i]->note_stream(s);
    const auto at = std::find(tables.begin(), tables.end(), impls[i]);
    if (at == tables.end()) {
      tables.push_back(impls[i]);
      totals.push_back(std::max<int64_t>(ns[i], 0));
    } else {
      totals[at - tables.begin()] += std::max<int64_t>(ns[i], 0);
    }
  }
  for (size_t i = 0; i < tables.size(); ++i) {
    if (totals[i] == 0) continue;
    bool want = false;
    SOK_RETURN_IF_ERROR(tables[i]->prepare_insert(totals[i], s, &want));
    if (want) snap->push_back(tables[i]);
  }
  return Status::OK();
}

// The snapshots prepare_inserts asked for, in one copy launch and one event, after the call's
// launches on s (each table still locked by the call).
template <typename Impl>
Status snapshot_counters(const std::vector<Impl*>& snap, cudaStream_t s) {
  if (snap.empty()) return Status::OK();
  auto event = std::make_shared<SnapshotEvent>();
  std::vector<const int64_t*> src;
  std::vector<int64_t*> dst;
  for (Impl* m : snap) {
    m->snapshot = event;  // not passed() before record() below
    m->since_snapshot = 0;
    src.push_back(m->d_counters);
    dst.push_back(m->h_counters + 4);
  }
  SOK_RETURN_IF_ERROR(copy_counters(src, dst, s));
  return event->record(s);
}

}  // namespace detail
}  // namespace gpu
}  // namespace sok
