// GpuTieredTable<K> (gpu_tiered_table.h): the tiers' bookkeeping on the host; the kernels that
// move and read rows are in tier_moves.cu, the SSD tier's file in core/ssd_rows.h.
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

cudaStream_t stream_of(const ExecContext& e) { return static_cast<cudaStream_t>(e.stream); }

template <typename K>
void append(const TableSnapshot<K>& from, TableSnapshot<K>* to) {
  to->keys.insert(to->keys.end(), from.keys.begin(), from.keys.end());
  to->values.insert(to->values.end(), from.values.begin(), from.values.end());
  to->slots.insert(to->slots.end(), from.slots.begin(), from.slots.end());
  to->freqs.insert(to->freqs.end(), from.freqs.begin(), from.freqs.end());
  to->versions.insert(to->versions.end(), from.versions.begin(), from.versions.end());
}

// Rows each way per placement pass, as a share of the budget: a skewed working set settles
// within some 8 steps, and when it is flat (uniform ids, every pass swaps the most) the swaps
// stay a few percent of the PCIe traffic of the rows served from host memory.
constexpr int64_t kSwapShare = 8;

}  // namespace

template <typename K>
Status GpuTieredTable<K>::Create(const TableConfig& config, const GpuTableOptions& options,
                                 std::unique_ptr<GpuTieredTable>* out) {
  const std::string where = "table '" + config.name + "': ";
  const bool ssd = config.storage == StorageKind::kHbmDramSsdHash;
  if (config.storage != StorageKind::kHbmDram && !ssd)
    return Status::Invalid(where + "a GPU tiered table needs storage HBM_DRAM or HBM_DRAM_SSDHASH");
  const int64_t row = tier_row_bytes(config.dim, 0);
  for (const auto& [tier, bytes] : {std::make_pair("HBM", config.hbm_bytes),
                                    std::make_pair("DRAM", ssd ? config.dram_bytes : row)}) {
    if (bytes < row) {
      return Status::Invalid(where + "the " + tier + " budget of " + std::to_string(bytes) +
                             " bytes is smaller than one row (" + std::to_string(row) + " bytes)");
    }
  }
  std::unique_ptr<GpuTieredTable> t;
  SOK_RETURN_IF_ERROR(CreateHostOnly(config, options, &t));
  t->cfg_.storage = config.storage;
  if (ssd) SOK_RETURN_IF_ERROR(SsdRows<K>::Open(config, &t->ssd_));
  // Sized for twice the largest budget (no slots; fit_capacity resizes it once slots come): the
  // HBM tier never grows, and the erased slots of demoted rows fill the spare room over several
  // passes before a rehash (at the same capacity, a device sync) drops them.
  TableConfig hot = config;
  const int64_t max_rows = config.hbm_bytes / tier_row_bytes(config.dim, 0);
  hot.initial_capacity = 2 * max_rows;
  SOK_RETURN_IF_ERROR(GpuEmbeddingTable<K>::Create(hot, options, &t->hot_));
  t->max_up_ = max_rows;
  t->max_swaps_ = std::max<int64_t>(1, max_rows / kSwapShare);
  SOK_RETURN_IF_ERROR(t->alloc_policy_buffers());
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
Status GpuTieredTable<K>::alloc_policy_buffers() {
  storage_ = hot_->impl_->storage;
  const size_t keys = static_cast<size_t>(max_up_ + 2 * max_swaps_) * sizeof(K);
  const size_t bytes = sizeof(detail::PlanScratch) + kNumCounts * sizeof(int64_t) + keys;
  char* p = static_cast<char*>(storage_->allocate(bytes, nullptr));
  if (p == nullptr) {
    cudaGetLastError();
    return Status::Invalid("table '" + cfg_.name + "': cannot allocate " + std::to_string(bytes) +
                           " bytes for the tiers' placement (" + storage_->describe_free_memory() +
                           ")");
  }
  d_plan_ = reinterpret_cast<detail::PlanScratch*>(p);
  d_counts_ = reinterpret_cast<int64_t*>(p + sizeof(detail::PlanScratch));
  d_up_ = reinterpret_cast<K*>(d_counts_ + kNumCounts);
  d_swap_in_ = d_up_ + max_up_;
  d_victims_ = d_swap_in_ + max_swaps_;
  SOK_CUDA_RETURN(cudaMemset(d_counts_, 0, kNumCounts * sizeof(int64_t)));
  return Status::OK();
}

template <typename K>
GpuTieredTable<K>::~GpuTieredTable() {
  if (d_plan_ != nullptr) {
    DeviceGuard g(hot_->impl_->device);
    cudaDeviceSynchronize();  // no placement pass still reads the buffers
    storage_->deallocate(d_plan_, 0, nullptr);
  }
  if (snap_event_ != nullptr) cudaEventDestroy(snap_event_);
  if (h_live_ != nullptr) cudaFreeHost(h_live_);
  cudaGetLastError();
}

template <typename K>
Status GpuTieredTable<K>::budget_rows(int num_slots, int64_t* rows) const {
  return tier_budget_rows(cfg_, "HBM", cfg_.hbm_bytes, num_slots, rows);
}

template <typename K>
int64_t GpuTieredTable<K>::hbm_budget_rows() const {
  int64_t rows = 0;
  if (hot_ && !budget_rows(hot_->num_slots(), &rows).ok()) rows = 0;
  return rows;
}

template <typename K>
typename GpuTieredTable<K>::Stats GpuTieredTable<K>::stats() const {
  Stats st = stats_;
  if (d_counts_ == nullptr) return st;
  int64_t c[kNumCounts] = {};
  if (cudaDeviceSynchronize() != cudaSuccess ||
      cudaMemcpy(c, d_counts_, sizeof(c), cudaMemcpyDeviceToHost) != cudaSuccess) {
    cudaGetLastError();
    return st;
  }
  st.host_keys = c[kFillCounts] + c[kSpillCounts + 1];
  st.hbm_keys = c[kFillCounts + 1] + c[kSpillCounts];
  st.promoted_rows = c[kPromoted];
  st.demoted_rows = c[kDemoted];
  return st;
}

template <typename K>
void GpuTieredTable<K>::note_exact(int64_t hbm_rows, int64_t host_rows) {
  hot_bound_ = hbm_rows;
  hot_floor_ = hbm_rows;
  cold_bound_ = host_rows;
  cold_empty_ = host_rows == 0;
  snap_pending_ = false;
}

template <typename K>
Status GpuTieredTable<K>::tier_sizes(cudaStream_t s, int64_t* hbm_rows, int64_t* host_rows,
                                     int64_t* ssd_rows) {
  std::lock_guard<std::mutex> l(mu_);
  *hbm_rows = 0;
  if (hot_) SOK_RETURN_IF_ERROR(hot_->size(hbm_rows, s));
  SOK_RETURN_IF_ERROR(cold_->size(host_rows, s));
  if (ssd_rows != nullptr) *ssd_rows = ssd_ ? ssd_->size() : 0;
  note_exact(*hbm_rows, *host_rows);
  return Status::OK();
}

template <typename K>
Status GpuTieredTable<K>::size(const ExecContext& e, int64_t* out) {
  int64_t hbm = 0, host = 0, ssd = 0;
  SOK_RETURN_IF_ERROR(tier_sizes(stream_of(e), &hbm, &host, &ssd));
  *out = hbm + host + ssd;
  return Status::OK();
}

template <typename K>
Status GpuTieredTable<K>::find(const ExecContext& e, const K* keys, int64_t n, float* out) {
  std::lock_guard<std::mutex> l(mu_);
  const cudaStream_t s = stream_of(e);
  if (!hot_) return cold_->find(keys, n, out, s);
  // Keys of the lower tiers read as absent here (their initial value), then get their row.
  SOK_RETURN_IF_ERROR(hot_->find(keys, n, out, s));
  if (!cold_empty_) {
    auto& c = *cold_->impl_;
    DeviceGuard g(c.device);
    std::lock_guard<std::mutex> cl(c.mu);
    c.note_stream(s);
    SOK_RETURN_IF_ERROR(detail::find_present(c.t, c.row_init(), keys, n, out, s));
  }
  return find_ssd(keys, n, out, s);
}

// Which tier inserts this call's new keys: the HBM tier while its row bound leaves room for
// every key of the call, else the host tier; the other one is probed first.
template <typename K>
Status GpuTieredTable<K>::route(const K* keys, int64_t n, cudaStream_t s, Keys* call) {
  int64_t cap = 0;
  SOK_RETURN_IF_ERROR(budget_rows(hot_->num_slots(), &cap));
  call->keys = keys;
  call->n = n;
  if (hot_bound_ + n <= cap) {
    hot_bound_ += n;
    call->table = hot_.get();
    call->probe_first = cold_empty_ ? nullptr : cold_.get();
    call->tier_counts = d_counts_ + kFillCounts;
  } else {
    cold_empty_ = false;
    cold_bound_ += n;
    call->table = cold_.get();
    call->probe_first = hot_.get();
    call->tier_counts = d_counts_ + kSpillCounts;
  }
  if (call->probe_first != nullptr) {  // its growth must see this stream's use
    auto& m = *call->probe_first->impl_;
    std::lock_guard<std::mutex> l(m.mu);
    m.note_stream(s);
  }
  return Status::OK();
}

// Moves rows from one tier to the other: room in `to` first (growth may sync), then one launch.
template <typename K>
Status GpuTieredTable<K>::move(GpuEmbeddingTable<K>* from, GpuEmbeddingTable<K>* to, const K* keys,
                               int64_t n, const int64_t* d_n, int64_t* moved, cudaStream_t s) {
  if (n <= 0) return Status::OK();
  auto& src = *from->impl_;
  auto& dst = *to->impl_;
  DeviceGuard g(dst.device);
  std::lock_guard<std::mutex> l1(src.mu);
  std::lock_guard<std::mutex> l2(dst.mu);
  src.note_stream(s);
  SOK_RETURN_IF_ERROR(detail::prepare_inserts<typename GpuEmbeddingTable<K>::Impl>({&dst}, {n}, s));
  return detail::move_rows<K>(src.t, dst.t, keys, n, d_n, src.d_counters, dst.d_counters,
                              dst.d_fail, moved, s);
}

template <typename K>
Status GpuTieredTable<K>::plan(const K* keys, int64_t n, const detail::PlanRule& rule,
                               cudaStream_t s) {
  auto& h = *hot_->impl_;
  auto& c = *cold_->impl_;
  DeviceGuard g(h.device);
  std::lock_guard<std::mutex> l1(h.mu);
  std::lock_guard<std::mutex> l2(c.mu);
  h.note_stream(s);
  c.note_stream(s);
  return detail::plan_moves<K>(h.t, h.capacity, h.d_counters, c.t, keys, n, rule, d_plan_, d_up_,
                               d_swap_in_, d_victims_, s);
}

// The last asynchronous copy of the HBM tier's row count, once it has landed, as its floor.
template <typename K>
void GpuTieredTable<K>::refresh_floor() {
  if (!snap_pending_) return;
  const cudaError_t q = cudaEventQuery(snap_event_);
  if (q == cudaErrorNotReady) {
    cudaGetLastError();  // not ready is no error
    return;
  }
  if (q == cudaSuccess) hot_floor_ = std::max(hot_floor_, *h_live_);
  snap_pending_ = false;
}

// One placement pass over a call's keys (the header comment): plan, demote the victims, promote
// into the room left and the swapped-in rows. No host sync.
template <typename K>
Status GpuTieredTable<K>::place(const K* keys, int64_t n, cudaStream_t s) {
  if (cold_empty_ || n <= 0) return Status::OK();
  detail::PlanRule rule;
  SOK_RETURN_IF_ERROR(budget_rows(hot_->num_slots(), &rule.budget));
  rule.lfu = cfg_.cache_strategy == CacheStrategy::kLFU;
  rule.now = now_;
  rule.max_up = max_up_;
  rule.max_swaps = max_swaps_;
  refresh_floor();
  const int64_t room = std::min({rule.budget - hot_floor_, max_up_, n});
  SOK_RETURN_IF_ERROR(plan(keys, n, rule, s));
  ++stats_.placement_passes;
  const int64_t* swaps = &d_plan_->num_swaps;
  SOK_RETURN_IF_ERROR(
      move(hot_.get(), cold_.get(), d_victims_, max_swaps_, swaps, d_counts_ + kDemoted, s));
  SOK_RETURN_IF_ERROR(
      move(cold_.get(), hot_.get(), d_up_, room, &d_plan_->num_up, d_counts_ + kPromoted, s));
  SOK_RETURN_IF_ERROR(
      move(cold_.get(), hot_.get(), d_swap_in_, max_swaps_, swaps, d_counts_ + kPromoted, s));
  if (room <= 0) return Status::OK();
  hot_bound_ = std::min(rule.budget, hot_bound_ + room);
  // While the tier fills, a copy of its row count tightens the room the next pass reserves.
  auto& h = *hot_->impl_;
  DeviceGuard g(h.device);
  SOK_CUDA_RETURN(
      cudaMemcpyAsync(h_live_, h.d_counters, sizeof(int64_t), cudaMemcpyDeviceToHost, s));
  SOK_CUDA_RETURN(cudaEventRecord(snap_event_, s));
  snap_pending_ = true;
  return Status::OK();
}

// Before the first optimizer step adds num_slots slots (fewer rows fit the budget): the coldest
// rows over it move down. Reads the row count (a host sync).
template <typename K>
Status GpuTieredTable<K>::fit_budget(int num_slots, const K* keys, int64_t n, cudaStream_t s) {
  int64_t cap = 0, live = 0;
  SOK_RETURN_IF_ERROR(budget_rows(num_slots, &cap));
  ++stats_.size_syncs;
  SOK_RETURN_IF_ERROR(hot_->size(&live, s));
  if (live > cap) SOK_RETURN_IF_ERROR(demote(live, live - cap, keys, n, s));
  hot_bound_ = std::min(live, cap);
  hot_floor_ = hot_bound_;
  snap_pending_ = false;
  return fit_capacity(cap, s);
}

// The HBM tier's hash table, sized at creation for the budget in rows without slots, down to
// twice the budget in rows of the new layout; the swaps per pass follow the budget.
template <typename K>
Status GpuTieredTable<K>::fit_capacity(int64_t cap, cudaStream_t s) {
  max_swaps_ = std::max<int64_t>(1, cap / kSwapShare);
  auto& h = *hot_->impl_;
  const int64_t want = detail::capacity_for(2 * cap, h.opt.max_load_factor);
  if (want >= h.capacity) return Status::OK();
  DeviceGuard g(h.device);
  std::lock_guard<std::mutex> l(h.mu);
  h.note_stream(s);
  int64_t live = 0, erased = 0;
  SOK_RETURN_IF_ERROR(h.sync_counts(s, &live, &erased));
  SOK_RETURN_IF_ERROR(h.rehash(want, s));
  h.set_upper(live);
  return Status::OK();
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

// Moves `count` of the HBM tier's `live` rows down, the coldest first; the rows of keys[0, n)
// last.
template <typename K>
Status GpuTieredTable<K>::demote(int64_t live, int64_t count, const K* keys, int64_t n,
                                 cudaStream_t s) {
  detail::Temp victims;
  SOK_RETURN_IF_ERROR(victims.alloc(hot_->impl_->alloc, count * sizeof(K), s));
  SOK_RETURN_IF_ERROR(select_victims(live, count, keys, n, victims.as<K>(), s));
  SOK_RETURN_IF_ERROR(
      move(hot_.get(), cold_.get(), victims.as<K>(), count, nullptr, d_counts_ + kDemoted, s));
  ++stats_.budget_demotions;
  cold_empty_ = false;
  cold_bound_ += count;
  return Status::OK();
}

// ---- The SSD tier (HBM_DRAM_SSDHASH; the header comment's end) ----

template <typename K>
Status GpuTieredTable<K>::dram_rows(int num_slots, int64_t* rows) const {
  return tier_budget_rows(cfg_, "DRAM", cfg_.dram_bytes, num_slots, rows);
}

template <typename K>
int64_t GpuTieredTable<K>::dram_budget_rows() const {
  int64_t rows = 0;
  if (ssd_ && !dram_rows(cold_->num_slots(), &rows).ok()) rows = 0;
  return rows;
}

// A call's keys on the host: the file's index is there (one copy, one stream sync).
template <typename K>
Status GpuTieredTable<K>::keys_on_host(const K* keys, int64_t n, cudaStream_t s,
                                       std::vector<K>* out) {
  DeviceGuard g(cold_->impl_->device);
  out->resize(n);
  SOK_CUDA_RETURN(cudaMemcpyAsync(out->data(), keys, n * sizeof(K), cudaMemcpyDeviceToHost, s));
  SOK_CUDA_RETURN(cudaStreamSynchronize(s));
  ++stats_.ssd_key_syncs;
  return Status::OK();
}

// Before a call that may update or insert: the rows of its keys on file move into the host tier,
// whole, so that the tiers' kernels serve every key.
template <typename K>
Status GpuTieredTable<K>::from_ssd(const K* keys, int64_t n, cudaStream_t s) {
  if (!ssd_ || ssd_->size() == 0 || n <= 0) return Status::OK();
  std::vector<K> h;
  SOK_RETURN_IF_ERROR(keys_on_host(keys, n, s, &h));
  const auto& c = *cold_->impl_;
  TableSnapshot<K> rows;  // in the host tier's slot layout
  rows.dim = cfg_.dim;
  rows.num_slots = c.num_slots;
  rows.slot_kind = c.slot_kind;
  rows.slot_init = c.slot_init;
  SOK_RETURN_IF_ERROR(ssd_->read(h.data(), n, &rows));
  const int64_t m = static_cast<int64_t>(rows.keys.size());
  if (m == 0) return Status::OK();
  SOK_RETURN_IF_ERROR(cold_->put_rows(rows, s));
  // Off the file only once the host tier holds them: a failed move loses no row.
  SOK_RETURN_IF_ERROR(ssd_->remove(rows.keys.data(), m));
  cold_empty_ = false;
  cold_bound_ += m;
  stats_.ssd_promoted_rows += m;
  return Status::OK();
}

// A read-only find: the output rows of keys on file get their rows; nothing moves.
template <typename K>
Status GpuTieredTable<K>::find_ssd(const K* keys, int64_t n, float* out, cudaStream_t s) {
  if (!ssd_ || ssd_->size() == 0 || n <= 0) return Status::OK();
  std::vector<K> h;
  SOK_RETURN_IF_ERROR(keys_on_host(keys, n, s, &h));
  std::vector<int64_t> pos;
  std::vector<float> rows;
  SOK_RETURN_IF_ERROR(ssd_->find(h.data(), n, &pos, &rows));
  const int64_t m = static_cast<int64_t>(pos.size());
  if (m == 0) return Status::OK();
  auto& c = *cold_->impl_;
  DeviceGuard g(c.device);
  detail::Temp d_pos, d_rows;
  SOK_RETURN_IF_ERROR(d_pos.alloc(c.alloc, m * sizeof(int64_t), s));
  SOK_RETURN_IF_ERROR(d_rows.alloc(c.alloc, rows.size() * sizeof(float), s));
  SOK_CUDA_RETURN(cudaMemcpyAsync(d_pos.as<int64_t>(), pos.data(), m * sizeof(int64_t),
                                  cudaMemcpyHostToDevice, s));
  SOK_CUDA_RETURN(cudaMemcpyAsync(d_rows.as<float>(), rows.data(), rows.size() * sizeof(float),
                                  cudaMemcpyHostToDevice, s));
  SOK_RETURN_IF_ERROR(
      detail::scatter_rows(d_rows.as<float>(), d_pos.as<int64_t>(), m, cfg_.dim, out, s));
  SOK_CUDA_RETURN(cudaStreamSynchronize(s));  // pos and rows (pageable) outlive the copies
  return Status::OK();
}

template <typename K>
Status GpuTieredTable<K>::select_cold_victims(int64_t live, int64_t count, const K* keys, int64_t n,
                                              K* victims, cudaStream_t s) {
  auto& c = *cold_->impl_;
  DeviceGuard g(c.device);
  std::lock_guard<std::mutex> l(c.mu);
  c.note_stream(s);
  const bool lfu = cfg_.cache_strategy == CacheStrategy::kLFU;
  const Status st =
      detail::coldest_keys<K>(c.t, c.capacity, live, lfu, keys, n, count, victims, c.alloc, s);
  return st.ok() ? st : Status::Invalid("table '" + cfg_.name + "': " + st.message());
}

// After a call that may have inserted: once the host tier's row bound passes its budget, its row
// count is read (a sync) and, when over, its coldest rows go to the file in one batch.
template <typename K>
Status GpuTieredTable<K>::to_ssd(const K* keys, int64_t n, cudaStream_t s) {
  if (!ssd_) return Status::OK();
  int64_t cap = 0, live = 0;
  SOK_RETURN_IF_ERROR(dram_rows(cold_->num_slots(), &cap));
  if (cold_bound_ <= cap) return Status::OK();
  ++stats_.size_syncs;
  SOK_RETURN_IF_ERROR(cold_->size(&live, s));
  cold_bound_ = live;
  if (live <= cap) return Status::OK();
  const int64_t count = live - tier_low_watermark(cap);
  detail::Temp victims;
  SOK_RETURN_IF_ERROR(victims.alloc(cold_->impl_->alloc, count * sizeof(K), s));
  SOK_RETURN_IF_ERROR(select_cold_victims(live, count, keys, n, victims.as<K>(), s));
  TableSnapshot<K> rows;
  SOK_RETURN_IF_ERROR(cold_->export_keys(victims.as<K>(), count, &rows, s));
  // On file first, out of the host tier after: a failed write loses no row.
  SOK_RETURN_IF_ERROR(ssd_->put(rows));
  SOK_RETURN_IF_ERROR(cold_->erase(victims.as<K>(), count, s));
  const int64_t m = static_cast<int64_t>(rows.keys.size());
  cold_bound_ = live - m;
  stats_.ssd_demoted_rows += m;
  ++stats_.ssd_batches;
  return Status::OK();
}

template <typename K>
Status GpuTieredTable<K>::find_or_insert(const ExecContext& e, const K* keys, int64_t n, float* out,
                                         const int64_t* counts) {
  std::lock_guard<std::mutex> l(mu_);
  const cudaStream_t s = stream_of(e);
  if (!hot_) return cold_->find_or_insert(keys, n, out, counts, s);
  if (n <= 0) return Status::OK();
  SOK_RETURN_IF_ERROR(from_ssd(keys, n, s));
  Keys call;
  SOK_RETURN_IF_ERROR(route(keys, n, s, &call));
  call.out = out;
  call.counts = counts;
  SOK_RETURN_IF_ERROR(GpuEmbeddingTable<K>::find_or_insert_many({call}, s));
  if (!trained_) SOK_RETURN_IF_ERROR(place(keys, n, s));
  return to_ssd(keys, n, s);
}

template <typename K>
Status GpuTieredTable<K>::insert_or_assign(const ExecContext& e, const K* keys, int64_t n,
                                           const float* values) {
  std::lock_guard<std::mutex> l(mu_);
  const cudaStream_t s = stream_of(e);
  if (!hot_) return cold_->insert_or_assign(keys, n, values, s);
  if (n <= 0) return Status::OK();
  SOK_RETURN_IF_ERROR(from_ssd(keys, n, s));
  Keys call;
  SOK_RETURN_IF_ERROR(route(keys, n, s, &call));
  SOK_RETURN_IF_ERROR(call.table->insert_or_assign(keys, n, values, s, call.probe_first));
  if (!trained_) SOK_RETURN_IF_ERROR(place(keys, n, s));
  return to_ssd(keys, n, s);
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
  // Slots to come lower the budget in rows: the coldest rows over it move down and the HBM
  // tier's hash table shrinks BEFORE the relayout widens the rows, whose old and new arrays
  // coexist while it copies (sized for the old budget, they need not fit the GPU together).
  const int slots = std::max(hot_->num_slots(), sok::num_slots(p.kind));
  int64_t dram = 0;  // checked before the update: no row changes on this error
  if (ssd_) SOK_RETURN_IF_ERROR(dram_rows(slots, &dram));
  if (slots != hot_->num_slots()) SOK_RETURN_IF_ERROR(fit_budget(slots, keys, n, s));
  SOK_RETURN_IF_ERROR(ensure_same_slots(p, s));
  trained_ = true;
  now_ = std::max(now_, global_step);
  if (n <= 0) return Status::OK();
  SOK_RETURN_IF_ERROR(from_ssd(keys, n, s));  // after the relayout: rows on file get its slots
  Keys call;
  SOK_RETURN_IF_ERROR(route(keys, n, s, &call));
  call.grads = grads;
  SOK_RETURN_IF_ERROR(
      GpuEmbeddingTable<K>::apply_gradients_many({call}, p, global_step, s, keys_unique));
  SOK_RETURN_IF_ERROR(place(keys, n, s));
  return to_ssd(keys, n, s);
}

template <typename K>
Status GpuTieredTable<K>::erase(const K* keys, int64_t n, cudaStream_t s, int64_t* removed) {
  std::lock_guard<std::mutex> l(mu_);
  int64_t a = 0, b = 0, c = 0;
  if (hot_) SOK_RETURN_IF_ERROR(hot_->erase(keys, n, s, removed ? &a : nullptr));
  SOK_RETURN_IF_ERROR(cold_->erase(keys, n, s, removed ? &b : nullptr));
  if (ssd_ && ssd_->size() > 0 && n > 0) {
    std::vector<K> h;
    SOK_RETURN_IF_ERROR(keys_on_host(keys, n, s, &h));
    SOK_RETURN_IF_ERROR(ssd_->remove(h.data(), n, &c));
  }
  if (removed) *removed = a + b + c;
  hot_floor_ = 0;
  snap_pending_ = false;
  return Status::OK();
}

template <typename K>
Status GpuTieredTable<K>::shrink(const ExecContext& e, int64_t global_step, int64_t* removed) {
  std::lock_guard<std::mutex> l(mu_);
  int64_t a = 0, b = 0, c = 0;
  if (hot_) SOK_RETURN_IF_ERROR(hot_->shrink(global_step, stream_of(e), &a));
  SOK_RETURN_IF_ERROR(cold_->shrink(global_step, stream_of(e), &b));
  if (ssd_) SOK_RETURN_IF_ERROR(ssd_->shrink(global_step, &c));
  *removed = a + b + c;
  hot_floor_ = 0;
  snap_pending_ = false;
  return Status::OK();
}

// The HBM tier's rows, then the host tier's (each in slot order), then the file's (file order).
template <typename K>
Status GpuTieredTable<K>::export_rows(const ExecContext& e, TableSnapshot<K>* out) {
  std::lock_guard<std::mutex> l(mu_);
  SOK_RETURN_IF_ERROR(cold_->export_rows(out, stream_of(e)));
  if (hot_) {
    TableSnapshot<K> cold = std::move(*out);
    SOK_RETURN_IF_ERROR(hot_->export_rows(out, stream_of(e)));
    if (out->num_slots != cold.num_slots)
      return Status::Invalid("table '" + cfg_.name + "': its tiers have different slot layouts");
    append(cold, out);
  }
  return ssd_ ? ssd_->export_rows(out) : Status::OK();
}

// The hottest `keep` rows go to HBM (tier_policy.h's hottest_first), the next `keep_host` to host
// memory, the rest to the file. Both GPU tiers take the snapshot's slot layout, even when one
// gets no row.
template <typename K>
Status GpuTieredTable<K>::import_split(const TableSnapshot<K>& s, int64_t keep, int64_t keep_host,
                                       cudaStream_t stream) {
  const std::vector<int64_t> order = hottest_first(s, cfg_.cache_strategy);
  const int64_t n = static_cast<int64_t>(order.size());
  keep = std::min(n, keep);
  keep_host = std::min(n - keep, keep_host);
  const auto part = [&](int64_t from, int64_t to) {
    return snapshot_rows(s, std::vector<int64_t>(order.begin() + from, order.begin() + to));
  };
  SOK_RETURN_IF_ERROR(hot_->import_rows(part(0, keep), stream));
  SOK_RETURN_IF_ERROR(cold_->import_rows(part(keep, keep + keep_host), stream));
  if (ssd_) {
    SOK_RETURN_IF_ERROR(ssd_->clear());
    SOK_RETURN_IF_ERROR(ssd_->put(part(keep + keep_host, n)));
  }
  note_exact(keep, keep_host);
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
  // Without an SSD tier every row below HBM stays in host memory.
  int64_t host = static_cast<int64_t>(s.keys.size());
  if (ssd_) {
    SOK_RETURN_IF_ERROR(dram_rows(s.num_slots, &host));
    host = tier_low_watermark(host);
  }
  // The HBM tier's import allocates its arrays afresh: for the checkpoint's slot layout.
  hot_->impl_->cfg.initial_capacity = 2 * cap;
  max_swaps_ = std::max<int64_t>(1, cap / kSwapShare);
  return import_split(s, cap, host, stream_of(e));
}

template <typename K>
Status new_gpu_table(const TableConfig& config, const GpuTableOptions& options,
                     std::unique_ptr<Table<K>>* out) {
  if (config.storage == StorageKind::kHbmDram || config.storage == StorageKind::kHbmDramSsdHash) {
    std::unique_ptr<GpuTieredTable<K>> t;
    SOK_RETURN_IF_ERROR(GpuTieredTable<K>::Create(config, options, &t));
    *out = std::move(t);
    return Status::OK();
  }
  if (cached_tiers(config.storage) > 0) {  // a CPU-only tiered kind: never placed elsewhere
    return Status::Invalid("table '" + config.name +
                           "': storage DRAM_SSDHASH is built for the CPU only; place the table "
                           "on the CPU (on the GPU use DRAM, HBM, HBM_DRAM or HBM_DRAM_SSDHASH)");
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
