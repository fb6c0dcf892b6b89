// Internal: the host state of a GpuEmbeddingTable (its Impl), shared by table.cu,
// table_storage.cu and table_optimizer.cu.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
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

}  // namespace detail

template <typename K>
struct GpuEmbeddingTable<K>::Impl {
  TableConfig cfg;
  GpuTableOptions opt;
  DeviceAllocator* alloc = nullptr;    // temporaries
  DeviceAllocator* storage = nullptr;  // the arrays below
  int device = 0;
  detail::DevTable t;
  int64_t capacity = 0;
  float* d_matrix = nullptr;
  int64_t* d_counters = nullptr;  // [0] live keys, [1] erased slots
  int* d_fail = nullptr;
  int64_t* h_counters = nullptr;  // pinned: [0, 3) sync_counts' copy, [4, 6) the snapshot's
  int num_slots = 0;
  int slot_kind = -1;
  std::vector<float> slot_init;
  int64_t upper = 0;  // upper bound of live + erased
  // An asynchronous copy of the counters (h_counters[4, 6)), enqueued when the bound gets within
  // half the limit: once its event has passed, live + erased <= the copy + since_snapshot, a
  // tighter bound than `upper` (which grows by every call's n, inserted or not) without a sync.
  cudaEvent_t snapshot_event = nullptr;
  bool snapshot_pending = false;
  int64_t since_snapshot = 0;  // keys the calls enqueued after the snapshot may have inserted
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
    if (h_counters) cudaFreeHost(h_counters);
    if (snapshot_event) cudaEventDestroy(snapshot_event);
    cudaGetLastError();
  }

  // Storage of `bytes` from the storage allocator; an error names the table, the size asked and
  // the memory free.
  template <typename T>
  Status acquire(T** p, size_t bytes, const char* what) {
    *p = static_cast<T*>(storage->allocate(bytes < 16 ? 16 : bytes, nullptr));
    if (*p != nullptr) return Status::OK();
    cudaGetLastError();
    return Status::Invalid("table '" + cfg.name + "': cannot allocate " + std::to_string(bytes) +
                           " bytes for " + what + " on GPU " + std::to_string(device) + " (" +
                           storage->describe_free_memory() + ")");
  }
  template <typename T>
  void release(T*& p) {
    if (p != nullptr) storage->deallocate(p, 0, nullptr);
    p = nullptr;
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

  void free_arrays(detail::DevTable* a) {
    release(a->digests);
    release(a->meta);
    release(a->versions);
    release(a->rows);
    *a = detail::DevTable();
  }

  Status alloc_arrays(int64_t cap, int64_t stride, detail::DevTable* a, cudaStream_t s) {
    *a = detail::DevTable();
    const int64_t nb = cap / detail::kSlots;
    a->mask = static_cast<uint64_t>(nb - 1);
    a->stride = stride;
    a->dim = cfg.dim;
    const std::string what =
        std::to_string(cap) + " slots of " + std::to_string(stride) + " floats";
    Status st = acquire(&a->digests, nb * 8 * sizeof(uint32_t), what.c_str());
    if (st.ok()) st = acquire(&a->meta, cap * sizeof(detail::Meta), what.c_str());
    if (st.ok()) st = acquire(&a->versions, cap * sizeof(int64_t), what.c_str());
    if (st.ok())
      st = acquire(&a->rows, static_cast<size_t>(cap) * stride * sizeof(float), what.c_str());
    if (!st.ok()) {
      free_arrays(a);
      return st;
    }
    SOK_CUDA_RETURN(cudaMemsetAsync(a->digests, 0, nb * 8 * sizeof(uint32_t), s));
    // Versions start at 0 for every slot (slots are never reused before a rehash), so inserting
    // a key needs no extra random write for it.
    SOK_CUDA_RETURN(cudaMemsetAsync(a->versions, 0, cap * sizeof(int64_t), s));
    return Status::OK();
  }

  void note_stream(cudaStream_t s) {
    if (used && s != last_stream) mixed = true;
    used = true;
    last_stream = s;
  }

  // Waits for every launch that may touch the counters, then reads them.
  Status sync_counts(cudaStream_t s, int64_t* live, int64_t* erased) {
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
    if (h_fail != 0) return Status::Invalid("table '" + cfg.name + "': GPU hash table overflowed");
    *live = h_counters[0];
    *erased = h_counters[1];
    return Status::OK();
  }

  // Moves every key into a table of new_cap slots (synchronises the device).
  Status rehash(int64_t new_cap, cudaStream_t s);

  // The exact bound after a synchronisation (a snapshot still pending is dropped).
  void set_upper(int64_t v) {
    upper = v;
    snapshot_pending = false;
    since_snapshot = 0;
  }

  // Makes sure n more keys fit under the load factor, growing if needed. Synchronises only when
  // neither the running bound nor a finished snapshot shows room (tables of a fixed set of keys
  // would otherwise sync every few calls: the bound counts every key of every call).
  Status prepare_insert(int64_t n, cudaStream_t s) {
    note_stream(s);
    const int64_t limit = static_cast<int64_t>(opt.max_load_factor * static_cast<double>(capacity));
    if (upper + n > limit && snapshot_pending && !mixed) {
      const cudaError_t q = cudaEventQuery(snapshot_event);
      if (q == cudaSuccess) {
        upper = std::min(upper, h_counters[4] + h_counters[5] + since_snapshot);
        snapshot_pending = false;
      } else if (q == cudaErrorNotReady && cudaPeekAtLastError() == cudaErrorNotReady) {
        cudaGetLastError();  // not ready is no error
      }
    }
    if (upper + n <= limit) {
      if (!snapshot_pending && !mixed && upper > limit / 2 && snapshot_event != nullptr) {
        // Ordered after every call so far on s (one stream: mixed is false).
        SOK_CUDA_RETURN(cudaMemcpyAsync(&h_counters[4], d_counters, 2 * sizeof(int64_t),
                                        cudaMemcpyDeviceToHost, s));
        SOK_CUDA_RETURN(cudaEventRecord(snapshot_event, s));
        snapshot_pending = true;
        since_snapshot = 0;
      }
      upper += n;
      since_snapshot += n;
      return Status::OK();
    }
    int64_t live = 0, erased = 0;
    SOK_RETURN_IF_ERROR(sync_counts(s, &live, &erased));
    set_upper(live + erased);
    if (upper + n > limit) {
      int64_t cap = capacity;
      while (static_cast<double>(live + n) > opt.max_load_factor * static_cast<double>(cap))
        cap *= 2;
      SOK_RETURN_IF_ERROR(rehash(cap, s));
      set_upper(live);
    }
    upper += n;
    since_snapshot += n;
    return Status::OK();
  }

  // Makes the rows hold the slots optimizer p needs (relayout on first use; synchronises).
  Status ensure_slots(const OptimizerParams& p, cudaStream_t s);
};

}  // namespace gpu
}  // namespace sok
