// GpuTieredTable<K> (gpu_tiered_table.h): the two tiers' bookkeeping on the host; the kernels
// that move and read rows are in tier_moves.cu.
#include <cuda_runtime.h>

#include <algorithm>
#include <numeric>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "addons/sparse_operation_kit/core/cuda/gpu_tiered_table.h"
#include "addons/sparse_operation_kit/core/cuda/runtime.h"
#include "addons/sparse_operation_kit/core/cuda/table_impl.cuh"
#include "addons/sparse_operation_kit/core/cuda/tier_moves.cuh"
#include "addons/sparse_operation_kit/core/tier_policy.h"

namespace sok {
namespace gpu {

using detail::DeviceGuard;

namespace {

// Demotion empties the HBM tier down to this share of its budget: a demotion costs a host sync,
// so it should come once per many new rows, not after every call.
int64_t low_watermark(int64_t cap) { return cap - cap / 8; }

cudaStream_t stream_of(const ExecContext& e) { return static_cast<cudaStream_t>(e.stream); }

template <typename K>
void append(const TableSnapshot<K>& from, TableSnapshot<K>* to) {
  to->keys.insert(to->keys.end(), from.keys.begin(), from.keys.end());
  to->values.insert(to->values.end(), from.values.begin(), from.values.end());
  to->slots.insert(to->slots.end(), from.slots.begin(), from.slots.end());
  to->freqs.insert(to->freqs.end(), from.freqs.begin(), from.freqs.end());
  to->versions.insert(to->versions.end(), from.versions.begin(), from.versions.end());
}

}  // namespace

template <typename K>
Status GpuTieredTable<K>::Create(const TableConfig& config, const GpuTableOptions& options,
                                 std::unique_ptr<GpuTieredTable>* out) {
  const std::string where = "table '" + config.name + "': ";
  if (config.storage != StorageKind::kHbmDram)
    return Status::Invalid(where + "a GPU tiered table needs storage HBM_DRAM");
  if (config.hbm_bytes < tier_row_bytes(config.dim, 0)) {
    return Status::Invalid(where + "the HBM budget of " + std::to_string(config.hbm_bytes) +
                           " bytes is smaller than one row (" +
                           std::to_string(tier_row_bytes(config.dim, 0)) + " bytes)");
  }
  std::unique_ptr<GpuTieredTable> t;
  SOK_RETURN_IF_ERROR(CreateHostOnly(config, options, &t));
  SOK_RETURN_IF_ERROR(GpuEmbeddingTable<K>::Create(config, options, &t->hot_));
  *out = std::move(t);
  return Status::OK();
}

template <typename K>
Status GpuTieredTable<K>::CreateHostOnly(const TableConfig& config, const GpuTableOptions& options,
                                         std::unique_ptr<GpuTieredTable>* out) {
  std::unique_ptr<GpuTieredTable> t(new GpuTieredTable());
  t->cfg_ = config;
  t->cfg_.storage = StorageKind::kHbmDram;  // the glue tells tiered tables by it (device.h)
  GpuTableOptions host = options;
  host.row_storage = pinned_host_storage_allocator();
  SOK_RETURN_IF_ERROR(GpuEmbeddingTable<K>::Create(config, host, &t->cold_));
  SOK_CUDA_RETURN(cudaMallocHost(&t->h_live_, sizeof(int64_t)));
  SOK_CUDA_RETURN(cudaEventCreateWithFlags(&t->snap_event_, cudaEventDisableTiming));
  *out = std::move(t);
  return Status::OK();
}

template <typename K>
GpuTieredTable<K>::~GpuTieredTable() {
  if (snap_event_ != nullptr) cudaEventDestroy(snap_event_);
  if (h_live_ != nullptr) cudaFreeHost(h_live_);
  cudaGetLastError();
}

template <typename K>
Status GpuTieredTable<K>::budget_rows(int num_slots, int64_t* rows) const {
  const int64_t row = tier_row_bytes(cfg_.dim, num_slots);
  *rows = cfg_.hbm_bytes / row;
  if (*rows > 0) return Status::OK();
  return Status::Invalid("table '" + cfg_.name + "': the HBM budget of " +
                         std::to_string(cfg_.hbm_bytes) + " bytes is smaller than one row (" +
                         std::to_string(row) + " bytes with " + std::to_string(num_slots) +
                         " optimizer slots)");
}

template <typename K>
int64_t GpuTieredTable<K>::hbm_budget_rows() const {
  int64_t rows = 0;
  if (hot_ && !budget_rows(hot_->num_slots(), &rows).ok()) rows = 0;
  return rows;
}

template <typename K>
typename GpuTieredTable<K>::Stats GpuTieredTable<K>::stats() const {
  return stats_;
}

template <typename K>
void GpuTieredTable<K>::note_exact(int64_t hbm_rows, int64_t host_rows) {
  hot_bound_ = hbm_rows;
  cold_empty_ = host_rows == 0;
  snap_pending_ = false;
  since_snap_ = 0;
}

template <typename K>
Status GpuTieredTable<K>::tier_sizes(cudaStream_t s, int64_t* hbm_rows, int64_t* host_rows) {
  std::lock_guard<std::mutex> l(mu_);
  *hbm_rows = 0;
  if (hot_) SOK_RETURN_IF_ERROR(hot_->size(hbm_rows, s));
  SOK_RETURN_IF_ERROR(cold_->size(host_rows, s));
  note_exact(*hbm_rows, *host_rows);
  return Status::OK();
}

template <typename K>
Status GpuTieredTable<K>::size(const ExecContext& e, int64_t* out) {
  int64_t hbm = 0, host = 0;
  SOK_RETURN_IF_ERROR(tier_sizes(stream_of(e), &hbm, &host));
  *out = hbm + host;
  return Status::OK();
}

template <typename K>
Status GpuTieredTable<K>::find(const ExecContext& e, const K* keys, int64_t n, float* out) {
  std::lock_guard<std::mutex> l(mu_);
  const cudaStream_t s = stream_of(e);
  if (!hot_) return cold_->find(keys, n, out, s);
  // Keys of the host tier read as absent here (their initial value), then get their row.
  SOK_RETURN_IF_ERROR(hot_->find(keys, n, out, s));
  if (cold_empty_) return Status::OK();
  auto& c = *cold_->impl_;
  DeviceGuard g(c.device);
  std::lock_guard<std::mutex> cl(c.mu);
  c.note_stream(s);
  return detail::find_present(c.t, c.row_init(), keys, n, out, s);
}

// Moves rows from one tier to the other: room in `to` first (growth may sync), then one launch.
template <typename K>
Status GpuTieredTable<K>::move(GpuEmbeddingTable<K>* from, GpuEmbeddingTable<K>* to, const K* keys,
                               int64_t n, cudaStream_t s) {
  auto& src = *from->impl_;
  auto& dst = *to->impl_;
  DeviceGuard g(dst.device);
  std::lock_guard<std::mutex> l1(src.mu);
  std::lock_guard<std::mutex> l2(dst.mu);
  src.note_stream(s);
  SOK_RETURN_IF_ERROR(detail::prepare_inserts<typename GpuEmbeddingTable<K>::Impl>({&dst}, {n}, s));
  return detail::move_rows<K>(src.t, dst.t, keys, n, src.d_counters, dst.d_counters, dst.d_fail, s);
}

template <typename K>
Status GpuTieredTable<K>::promote(const K* keys, int64_t n, cudaStream_t s) {
  if (cold_empty_ || n <= 0) return Status::OK();
  ++stats_.promote_launches;
  return move(cold_.get(), hot_.get(), keys, n, s);
}

// After a call that may have added up to n rows to the HBM tier: demotes when it is over budget.
// The exact count needs a sync; it is read only when the host's bound passes the budget, and the
// bound is tightened first from the last asynchronous copy of the count, once that has landed.
template <typename K>
Status GpuTieredTable<K>::after_inserts(const K* keys, int64_t n, cudaStream_t s) {
  int64_t cap = 0;
  SOK_RETURN_IF_ERROR(budget_rows(hot_->num_slots(), &cap));
  hot_bound_ += n;
  since_snap_ += n;
  if (hot_bound_ > cap && snap_pending_) {
    const cudaError_t q = cudaEventQuery(snap_event_);
    if (q == cudaSuccess) {
      hot_bound_ = std::min(hot_bound_, *h_live_ + since_snap_);
      snap_pending_ = false;
    } else if (q == cudaErrorNotReady) {
      cudaGetLastError();  // not ready is no error
    } else {
      return cuda_status(q, "the HBM tier's row count");
    }
  }
  auto& h = *hot_->impl_;
  if (hot_bound_ <= cap) {
    if (!snap_pending_ && hot_bound_ > cap / 2) {
      DeviceGuard g(h.device);
      SOK_CUDA_RETURN(
          cudaMemcpyAsync(h_live_, h.d_counters, sizeof(int64_t), cudaMemcpyDeviceToHost, s));
      SOK_CUDA_RETURN(cudaEventRecord(snap_event_, s));
      snap_pending_ = true;
      since_snap_ = 0;
    }
    return Status::OK();
  }
  int64_t live = 0;
  ++stats_.size_syncs;
  SOK_RETURN_IF_ERROR(hot_->size(&live, s));
  hot_bound_ = live;
  snap_pending_ = false;
  since_snap_ = 0;
  if (live <= cap) return Status::OK();
  return demote(live - low_watermark(cap), keys, n, s);
}

template <typename K>
Status GpuTieredTable<K>::select_victims(int64_t live, int64_t count, const K* keys, int64_t n,
                                         K* victims, cudaStream_t s) {
  auto& h = *hot_->impl_;
  DeviceGuard g(h.device);
  std::lock_guard<std::mutex> l(h.mu);
  h.note_stream(s);
  const bool lfu = cfg_.cache_strategy == CacheStrategy::kLFU;
  return detail::coldest_keys<K>(h.t, h.capacity, live, lfu, keys, n, count, victims, h.alloc, s);
}

// Moves `count` of the HBM tier's rows down, the coldest first; the rows of keys[0, n) last.
template <typename K>
Status GpuTieredTable<K>::demote(int64_t count, const K* keys, int64_t n, cudaStream_t s) {
  const int64_t live = hot_bound_;
  detail::Temp victims;
  SOK_RETURN_IF_ERROR(victims.alloc(hot_->impl_->alloc, count * sizeof(K), s));
  SOK_RETURN_IF_ERROR(select_victims(live, count, keys, n, victims.as<K>(), s));
  SOK_RETURN_IF_ERROR(move(hot_.get(), cold_.get(), victims.as<K>(), count, s));
  ++stats_.demotions;
  stats_.demoted_rows += count;
  hot_bound_ = live - count;
  cold_empty_ = false;
  return Status::OK();
}

template <typename K>
Status GpuTieredTable<K>::find_or_insert(const ExecContext& e, const K* keys, int64_t n, float* out,
                                         const int64_t* counts) {
  std::lock_guard<std::mutex> l(mu_);
  const cudaStream_t s = stream_of(e);
  if (!hot_) return cold_->find_or_insert(keys, n, out, counts, s);
  SOK_RETURN_IF_ERROR(promote(keys, n, s));
  SOK_RETURN_IF_ERROR(hot_->find_or_insert(keys, n, out, counts, s));
  return after_inserts(keys, n, s);
}

template <typename K>
Status GpuTieredTable<K>::insert_or_assign(const ExecContext& e, const K* keys, int64_t n,
                                           const float* values) {
  std::lock_guard<std::mutex> l(mu_);
  const cudaStream_t s = stream_of(e);
  if (!hot_) return cold_->insert_or_assign(keys, n, values, s);
  SOK_RETURN_IF_ERROR(promote(keys, n, s));
  SOK_RETURN_IF_ERROR(hot_->insert_or_assign(keys, n, values, s));
  return after_inserts(keys, n, s);
}

// Both tiers take the optimizer's slots together, so a row keeps its layout when it moves.
template <typename K>
Status GpuTieredTable<K>::ensure_same_slots(const OptimizerParams& p, cudaStream_t s) {
  for (GpuEmbeddingTable<K>* t : {hot_.get(), cold_.get()}) {
    auto& m = *t->impl_;
    DeviceGuard g(m.device);
    std::lock_guard<std::mutex> l(m.mu);
    m.note_stream(s);
    SOK_RETURN_IF_ERROR(m.ensure_slots(p, s));
  }
  return Status::OK();
}

template <typename K>
Status GpuTieredTable<K>::apply_gradients(const ExecContext& e, const K* keys, int64_t n,
                                          const float* grads, const OptimizerParams& p,
                                          int64_t global_step, bool keys_unique) {
  std::lock_guard<std::mutex> l(mu_);
  const cudaStream_t s = stream_of(e);
  if (!hot_) return cold_->apply_gradients(keys, n, grads, p, global_step, s, keys_unique);
  int64_t cap = 0;
  SOK_RETURN_IF_ERROR(budget_rows(std::max(hot_->num_slots(), sok::num_slots(p.kind)), &cap));
  SOK_RETURN_IF_ERROR(ensure_same_slots(p, s));
  SOK_RETURN_IF_ERROR(promote(keys, n, s));
  SOK_RETURN_IF_ERROR(hot_->apply_gradients(keys, n, grads, p, global_step, s, keys_unique));
  return after_inserts(keys, n, s);
}

template <typename K>
Status GpuTieredTable<K>::erase(const K* keys, int64_t n, cudaStream_t s, int64_t* removed) {
  std::lock_guard<std::mutex> l(mu_);
  int64_t a = 0, b = 0;
  if (hot_) SOK_RETURN_IF_ERROR(hot_->erase(keys, n, s, removed ? &a : nullptr));
  SOK_RETURN_IF_ERROR(cold_->erase(keys, n, s, removed ? &b : nullptr));
  if (removed) *removed = a + b;
  return Status::OK();
}

template <typename K>
Status GpuTieredTable<K>::shrink(const ExecContext& e, int64_t global_step, int64_t* removed) {
  std::lock_guard<std::mutex> l(mu_);
  int64_t a = 0, b = 0;
  if (hot_) SOK_RETURN_IF_ERROR(hot_->shrink(global_step, stream_of(e), &a));
  SOK_RETURN_IF_ERROR(cold_->shrink(global_step, stream_of(e), &b));
  *removed = a + b;
  return Status::OK();
}

// The HBM tier's rows, then the host tier's (each in slot order).
template <typename K>
Status GpuTieredTable<K>::export_rows(const ExecContext& e, TableSnapshot<K>* out) {
  std::lock_guard<std::mutex> l(mu_);
  SOK_RETURN_IF_ERROR(cold_->export_rows(out, stream_of(e)));
  if (!hot_) return Status::OK();
  TableSnapshot<K> cold = std::move(*out);
  SOK_RETURN_IF_ERROR(hot_->export_rows(out, stream_of(e)));
  if (out->num_slots != cold.num_slots)
    return Status::Invalid("table '" + cfg_.name + "': its tiers have different slot layouts");
  append(cold, out);
  return Status::OK();
}

// The rows that stay in HBM: LFU the most frequent, LRU the most recently updated; ties by
// checkpoint order. Both tiers take the snapshot's slot layout, even when one gets no row.
template <typename K>
Status GpuTieredTable<K>::import_split(const TableSnapshot<K>& s, int64_t keep,
                                       cudaStream_t stream) {
  const int64_t n = static_cast<int64_t>(s.keys.size());
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  const std::vector<int64_t>& rank =
      cfg_.cache_strategy == CacheStrategy::kLFU ? s.freqs : s.versions;
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return rank[a] > rank[b]; });
  keep = std::min(n, keep);
  const std::vector<int64_t> up(order.begin(), order.begin() + keep);
  const std::vector<int64_t> down(order.begin() + keep, order.end());
  SOK_RETURN_IF_ERROR(hot_->import_rows(snapshot_rows(s, up), stream));
  SOK_RETURN_IF_ERROR(cold_->import_rows(snapshot_rows(s, down), stream));
  note_exact(keep, n - keep);
  return Status::OK();
}

template <typename K>
Status GpuTieredTable<K>::import_rows(const ExecContext& e, const TableSnapshot<K>& s) {
  std::lock_guard<std::mutex> l(mu_);
  if (!hot_) return cold_->import_rows(s, stream_of(e));
  SOK_RETURN_IF_ERROR(check_snapshot(cfg_.name, cfg_.dim, s));
  int64_t cap = 0;
  SOK_RETURN_IF_ERROR(budget_rows(s.num_slots, &cap));
  std::unordered_set<K> seen;  // the tiers' imports only see their own part's repeats
  for (const K key : s.keys) {
    if (!seen.insert(key).second) {
      return Status::Invalid("cannot restore table '" + cfg_.name + "': key " +
                             std::to_string(static_cast<int64_t>(key)) +
                             " appears twice in the checkpoint");
    }
  }
  const int64_t n = static_cast<int64_t>(s.keys.size());
  return import_split(s, n <= cap ? n : low_watermark(cap), stream_of(e));
}

template <typename K>
Status new_gpu_table(const TableConfig& config, const GpuTableOptions& options,
                     std::unique_ptr<Table<K>>* out) {
  if (config.storage == StorageKind::kHbmDram) {
    std::unique_ptr<GpuTieredTable<K>> t;
    SOK_RETURN_IF_ERROR(GpuTieredTable<K>::Create(config, options, &t));
    *out = std::move(t);
    return Status::OK();
  }
  if (config.storage != StorageKind::kDram && config.storage != StorageKind::kHbm) {
    // never placed elsewhere silently
    return Status::Invalid("table '" + config.name +
                           "': storage DRAM_SSDHASH is built for the CPU only; place the table "
                           "on the CPU (on the GPU use DRAM, HBM or HBM_DRAM)");
  }
  std::unique_ptr<GpuEmbeddingTable<K>> t;
  SOK_RETURN_IF_ERROR(GpuEmbeddingTable<K>::Create(config, options, &t));
  out->reset(new GpuTable<K>(std::move(t)));
  return Status::OK();
}

template class GpuTieredTable<int32_t>;
template class GpuTieredTable<int64_t>;
template Status new_gpu_table<int32_t>(const TableConfig&, const GpuTableOptions&,
                                       std::unique_ptr<Table<int32_t>>*);
template Status new_gpu_table<int64_t>(const TableConfig&, const GpuTableOptions&,
                                       std::unique_ptr<Table<int64_t>>*);

}  // namespace gpu
}  // namespace sok
