// GpuTieredTable<K> (gpu_tiered_table.h): the tiers' bookkeeping on the host; the kernels that
// move and read rows are in tier_moves.cu, the SSD tier's part in gpu_tiered_ssd.cu (its file in
// core/ssd_rows.h).
#include <cuda_runtime.h>

#include <algorithm>
#include <limits>
#include <numeric>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "addons/sparse_operation_kit/core/cuda/gpu_tiered_table.h"
#include "addons/sparse_operation_kit/core/cuda/runtime.h"
#include "addons/sparse_operation_kit/core/cuda/table_impl.cuh"
#include "addons/sparse_operation_kit/core/cuda/table_many.cuh"
#include "addons/sparse_operation_kit/core/cuda/tier_moves.cuh"
#include "addons/sparse_operation_kit/core/tier_policy.h"

namespace sok {
namespace gpu {

using detail::DeviceGuard;

namespace {

cudaStream_t stream_of(const ExecContext& e) { return static_cast<cudaStream_t>(e.stream); }

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
  // The index is sized for twice the largest budget (no slots; fit_capacity resizes it once
  // slots come): the HBM tier never grows, and the erased slots of demoted rows fill the spare
  // room over several passes before a rehash (at the same capacity, a device sync) drops them.
  // The rows live in a pool of the budget's rows (GpuTableOptions::pool_rows), so that spare
  // room costs index entries only.
  TableConfig hot = config;
  const int64_t max_rows = config.hbm_bytes / tier_row_bytes(config.dim, 0);
  if (max_rows > std::numeric_limits<int32_t>::max()) {
    return Status::Invalid(where + "the HBM budget of " + std::to_string(config.hbm_bytes) +
                           " bytes holds " + std::to_string(max_rows) +
                           " rows, more than the 2^31 - 1 a GPU tier's row pool can number");
  }
  hot.initial_capacity = 2 * max_rows;
  GpuTableOptions pooled = options;
  pooled.pool_rows = max_rows;
  pooled.grow_pool = false;  // the budget is the pool
  SOK_RETURN_IF_ERROR(GpuEmbeddingTable<K>::Create(hot, pooled, &t->hot_));
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
  host.row_storage =
      options.host_row_storage ? options.host_row_storage : pinned_host_storage_allocator();
  host.grow_pool = true;  // host memory bounds the table: rows for its keys, not its index
  host.pool_rows = 0;
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
  return find(keys, n, out, stream_of(e), nullptr);
}

template <typename K>
Status GpuTieredTable<K>::find(const K* keys, int64_t n, float* out, cudaStream_t s,
                               const int64_t* d_n) {
  std::lock_guard<std::mutex> l(mu_);
  if (!hot_) return cold_->find(keys, n, out, s, d_n);
  // Keys of the lower tiers read as absent here (their initial value), then get their row.
  SOK_RETURN_IF_ERROR(hot_->find(keys, n, out, s, d_n));
  const Span span{keys, n, d_n};
  if (!cold_empty_) {
    auto& c = *cold_->impl_;
    DeviceGuard g(c.device);
    std::lock_guard<std::mutex> cl(c.mu);
    c.note_stream(s);
    SOK_RETURN_IF_ERROR(detail::find_present(c.t, c.row_init(), span, out, s));
  }
  return find_ssd(span, out, s);
}

// Which tier inserts this call's new keys: the HBM tier while its row bound leaves room for
// every key of the call, else the host tier; the other one is probed first. Host-only: the host
// tier alone.
template <typename K>
Status GpuTieredTable<K>::route(const Span& keys, cudaStream_t s, Keys* call) {
  const int64_t n = keys.n;
  call->keys = keys.keys;
  call->n = n;
  call->d_n = keys.d_n;
  if (!hot_) {
    call->table = cold_.get();
    return Status::OK();
  }
  int64_t cap = 0;
  SOK_RETURN_IF_ERROR(budget_rows(hot_->num_slots(), &cap));
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

// Moves rows between the tiers, one part per table (parts[i] from from[i] to to[i]): room in
// each destination first (growth may sync), then the parts' launches.
template <typename K>
Status GpuTieredTable<K>::move_many(const std::vector<GpuEmbeddingTable<K>*>& from,
                                    const std::vector<GpuEmbeddingTable<K>*>& to,
                                    std::vector<detail::MovePart<K>> parts, cudaStream_t s) {
  if (parts.empty()) return Status::OK();
  using Impl = typename GpuEmbeddingTable<K>::Impl;
  std::vector<Impl*> dst, all;
  std::vector<int64_t> ns;
  for (size_t i = 0; i < parts.size(); ++i) {
    dst.push_back(to[i]->impl_.get());
    all.push_back(from[i]->impl_.get());
    all.push_back(to[i]->impl_.get());
    ns.push_back(parts[i].keys.n);
  }
  DeviceGuard g(dst[0]->device);
  detail::TablesLock<Impl> lock(all);
  for (Impl* m : all) m->note_stream(s);
  std::vector<Impl*> snap;
  SOK_RETURN_IF_ERROR(detail::prepare_inserts<Impl>(dst, ns, s, &snap));
  for (size_t i = 0; i < parts.size(); ++i) {  // the arrays as they are after any growth
    const Impl& a = *from[i]->impl_;
    const Impl& b = *to[i]->impl_;
    parts[i].src = a.t;
    parts[i].dst = b.t;
    parts[i].src_counters = a.d_counters;
    parts[i].dst_counters = b.d_counters;
    parts[i].dst_fail = b.d_fail;
  }
  SOK_RETURN_IF_ERROR(detail::move_rows_many<K>(parts, s));
  return detail::snapshot_counters(snap, s);
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

// One placement pass per table over its call's keys (the header comment): plan, demote the
// victims, promote into the room left and the swapped-in rows. Every table's pass runs in the
// same few launches (9 for up to 32 tables). No host sync.
template <typename K>
Status GpuTieredTable<K>::place_many(const std::vector<GpuTieredTable*>& tables,
                                     const std::vector<Span>& keys, cudaStream_t s) {
  std::vector<GpuTieredTable*> placed;
  std::vector<int64_t> rooms;
  std::vector<detail::PlanPart<K>> plans;
  for (size_t i = 0; i < tables.size(); ++i) {
    GpuTieredTable& t = *tables[i];
    if (!t.hot_ || t.cold_empty_ || keys[i].n <= 0) continue;
    detail::PlanPart<K> q;
    SOK_RETURN_IF_ERROR(t.budget_rows(t.hot_->num_slots(), &q.rule.budget));
    q.rule.lfu = t.cfg_.cache_strategy == CacheStrategy::kLFU;
    q.rule.now = t.now_;
    q.rule.max_up = t.max_up_;
    q.rule.max_swaps = t.max_swaps_;
    t.refresh_floor();
    const auto& h = *t.hot_->impl_;
    const auto& c = *t.cold_->impl_;
    q.hot = h.t;
    q.hot_capacity = h.capacity;
    q.hot_counters = h.d_counters;
    q.cold = c.t;
    q.keys = keys[i];
    q.ps = t.d_plan_;
    q.up = t.d_up_;
    q.swap_in = t.d_swap_in_;
    q.victims = t.d_victims_;
    plans.push_back(q);
    placed.push_back(&t);
    rooms.push_back(std::min({q.rule.budget - t.hot_floor_, t.max_up_, keys[i].n}));
    ++t.stats_.placement_passes;
  }
  if (placed.empty()) return Status::OK();
  DeviceGuard g(placed[0]->hot_->impl_->device);
  {
    using Impl = typename GpuEmbeddingTable<K>::Impl;
    std::vector<Impl*> impls;
    for (GpuTieredTable* t : placed) {
      impls.push_back(t->hot_->impl_.get());
      impls.push_back(t->cold_->impl_.get());
    }
    detail::TablesLock<Impl> lock(impls);
    for (Impl* m : impls) m->note_stream(s);
    SOK_RETURN_IF_ERROR(detail::plan_moves_many<K>(plans, s));
  }
  // Victims down first, then the room's rows and the swapped-in rows up.
  std::vector<GpuEmbeddingTable<K>*> hots, colds, up_from, up_to;
  std::vector<detail::MovePart<K>> down, up, swap_in;
  for (size_t j = 0; j < placed.size(); ++j) {
    GpuTieredTable& t = *placed[j];
    const int64_t* swaps = &t.d_plan_->num_swaps;
    detail::MovePart<K> m;
    hots.push_back(t.hot_.get());
    colds.push_back(t.cold_.get());
    m.keys = Span{t.d_victims_, t.max_swaps_, swaps};
    m.moved = t.d_counts_ + kDemoted;
    down.push_back(m);
    m.keys = Span{t.d_swap_in_, t.max_swaps_, swaps};
    m.moved = t.d_counts_ + kPromoted;
    swap_in.push_back(m);
    if (rooms[j] <= 0) continue;
    m.keys = Span{t.d_up_, rooms[j], &t.d_plan_->num_up};
    up.push_back(m);
    up_from.push_back(t.cold_.get());
    up_to.push_back(t.hot_.get());
  }
  SOK_RETURN_IF_ERROR(move_many(hots, colds, std::move(down), s));
  SOK_RETURN_IF_ERROR(move_many(up_from, up_to, std::move(up), s));
  SOK_RETURN_IF_ERROR(move_many(colds, hots, std::move(swap_in), s));
  for (size_t j = 0; j < placed.size(); ++j) {
    GpuTieredTable& t = *placed[j];
    if (rooms[j] <= 0) continue;
    t.hot_bound_ = std::min(plans[j].rule.budget, t.hot_bound_ + rooms[j]);
    // While the tier fills, a copy of its row count tightens the room the next pass reserves.
    SOK_CUDA_RETURN(cudaMemcpyAsync(t.h_live_, t.hot_->impl_->d_counters, sizeof(int64_t),
                                    cudaMemcpyDeviceToHost, s));
    SOK_CUDA_RETURN(cudaEventRecord(t.snap_event_, s));
    t.snap_pending_ = true;
  }
  return Status::OK();
}

// Before the first optimizer step adds num_slots slots (fewer rows fit the budget): the coldest
// rows over it move down. Reads the row count (a host sync).
template <typename K>
Status GpuTieredTable<K>::fit_budget(int num_slots, const Span& keys, cudaStream_t s) {
  int64_t cap = 0, live = 0;
  SOK_RETURN_IF_ERROR(budget_rows(num_slots, &cap));
  ++stats_.size_syncs;
  SOK_RETURN_IF_ERROR(hot_->size(&live, s));
  if (live > cap) SOK_RETURN_IF_ERROR(demote(live, live - cap, keys, s));
  hot_bound_ = std::min(live, cap);
  hot_floor_ = hot_bound_;
  snap_pending_ = false;
  return fit_capacity(cap, s);
}

// The HBM tier's hash table, sized at creation for the budget in rows without slots, down to
// twice the budget in rows of the new layout, and its row pool to the budget; the swaps per
// pass follow the budget.
template <typename K>
Status GpuTieredTable<K>::fit_capacity(int64_t cap, cudaStream_t s) {
  max_swaps_ = std::max<int64_t>(1, cap / kSwapShare);
  auto& h = *hot_->impl_;
  h.next_pool_rows = cap;  // the slot relayout that follows sizes the row pool for the budget
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
Status GpuTieredTable<K>::select_victims(int64_t live, int64_t count, const Span& keys, K* victims,
                                         cudaStream_t s) {
  auto& h = *hot_->impl_;
  DeviceGuard g(h.device);
  std::lock_guard<std::mutex> l(h.mu);
  h.note_stream(s);
  const bool lfu = cfg_.cache_strategy == CacheStrategy::kLFU;
  return detail::coldest_keys<K>(h.t, h.capacity, live, lfu, keys, count, victims, h.alloc, s);
}

// Moves `count` of the HBM tier's `live` rows down, the coldest first; the rows of keys[0, n)
// last.
template <typename K>
Status GpuTieredTable<K>::demote(int64_t live, int64_t count, const Span& keys, cudaStream_t s) {
  detail::Temp victims;
  SOK_RETURN_IF_ERROR(victims.alloc(hot_->impl_->alloc, count * sizeof(K), s));
  SOK_RETURN_IF_ERROR(select_victims(live, count, keys, victims.as<K>(), s));
  detail::MovePart<K> m;
  m.keys = Span{victims.as<K>(), count, nullptr};
  m.moved = d_counts_ + kDemoted;
  SOK_RETURN_IF_ERROR(move_many({hot_.get()}, {cold_.get()}, {m}, s));
  ++stats_.budget_demotions;
  cold_empty_ = false;
  cold_bound_ += count;
  return Status::OK();
}

template <typename K>
template <typename Fn>
Status GpuTieredTable<K>::for_each_group(const std::vector<Call>& calls, Fn&& fn) {
  size_t begin = 0;
  while (begin < calls.size()) {
    std::vector<GpuTieredTable*> tables{calls[begin].table};
    size_t end = begin + 1;
    for (; end < calls.size(); ++end) {
      if (std::find(tables.begin(), tables.end(), calls[end].table) != tables.end()) break;
      tables.push_back(calls[end].table);
    }
    for (const GpuTieredTable* t : tables) {  // one stream: every table on its device
      if (t->cold_->impl_->device != tables[0]->cold_->impl_->device) {
        return Status::Invalid("tables '" + tables[0]->cfg_.name + "' and '" + t->cfg_.name +
                               "' live on different GPUs but share one call");
      }
    }
    std::sort(tables.begin(), tables.end());
    std::vector<std::unique_lock<std::mutex>> locks;
    for (GpuTieredTable* t : tables) locks.emplace_back(t->mu_);
    SOK_RETURN_IF_ERROR(fn(begin, end));
    begin = end;
  }
  return Status::OK();
}

// from_ssd_many over calls[begin, end) (tables with keys; nothing without a file).
template <typename K>
Status GpuTieredTable<K>::from_ssd_calls(const std::vector<Call>& calls, size_t begin, size_t end,
                                         cudaStream_t s) {
  std::vector<GpuTieredTable*> tables;
  std::vector<Span> keys;
  for (size_t i = begin; i < end; ++i) {
    if (!calls[i].table->ssd_ || calls[i].n <= 0) continue;
    tables.push_back(calls[i].table);
    keys.push_back(Span{calls[i].keys, calls[i].n, calls[i].d_n});
  }
  return from_ssd_many(tables, keys, s);
}

// After the calls' kernels: the placement passes (inference_only: only on tables that have seen
// no apply_gradients), then the tables' demotions to the file. After a lookup of a trained table
// (inference_only), the host tier may keep the lookup's keys over its budget: the update that
// follows needs them, and demoting them in between moved them through the file twice a step.
template <typename K>
Status GpuTieredTable<K>::after_update(const std::vector<Call>& calls, size_t begin, size_t end,
                                       bool inference_only, cudaStream_t s) {
  std::vector<GpuTieredTable*> placed, filed;
  std::vector<Span> placed_keys, filed_keys;
  std::vector<int64_t> slack;
  for (size_t i = begin; i < end; ++i) {
    const Call& c = calls[i];
    if (!c.table->hot_ || c.n <= 0) continue;
    const Span span{c.keys, c.n, c.d_n};
    const bool lookup_of_trained = inference_only && c.table->trained_;
    if (!lookup_of_trained) {
      placed.push_back(c.table);
      placed_keys.push_back(span);
    }
    if (!c.table->ssd_) continue;
    filed.push_back(c.table);
    filed_keys.push_back(span);
    slack.push_back(lookup_of_trained ? c.n : 0);
  }
  SOK_RETURN_IF_ERROR(place_many(placed, placed_keys, s));
  return to_ssd_many(filed, filed_keys, slack, s);
}

template <typename K>
Status GpuTieredTable<K>::find_or_insert(const ExecContext& e, const K* keys, int64_t n, float* out,
                                         const int64_t* counts) {
  Call c;
  c.table = this;
  c.keys = keys;
  c.n = n;
  c.out = out;
  c.counts = counts;
  return find_or_insert_many({c}, stream_of(e));
}

template <typename K>
Status GpuTieredTable<K>::find_or_insert_many(const std::vector<Call>& calls, cudaStream_t s) {
  return for_each_group(calls, [&](size_t begin, size_t end) -> Status {
    SOK_RETURN_IF_ERROR(from_ssd_calls(calls, begin, end, s));
    std::vector<Keys> launch;
    for (size_t i = begin; i < end; ++i) {
      const Call& c = calls[i];
      GpuTieredTable& t = *c.table;
      if (c.n <= 0) continue;
      const Span span{c.keys, c.n, c.d_n};
      Keys k;
      SOK_RETURN_IF_ERROR(t.route(span, s, &k));
      k.out = c.out;
      k.counts = c.counts;
      launch.push_back(k);
    }
    SOK_RETURN_IF_ERROR(GpuEmbeddingTable<K>::find_or_insert_many(launch, s));
    return after_update(calls, begin, end, /*inference_only=*/true, s);
  });
}

template <typename K>
Status GpuTieredTable<K>::insert_or_assign(const ExecContext& e, const K* keys, int64_t n,
                                           const float* values) {
  std::lock_guard<std::mutex> l(mu_);
  const cudaStream_t s = stream_of(e);
  if (!hot_) return cold_->insert_or_assign(keys, n, values, s);
  if (n <= 0) return Status::OK();
  const Span span{keys, n, nullptr};
  SOK_RETURN_IF_ERROR(from_ssd_many({this}, {span}, s));
  Keys call;
  SOK_RETURN_IF_ERROR(route(span, s, &call));
  SOK_RETURN_IF_ERROR(call.table->insert_or_assign(keys, n, values, s, call.probe_first));
  if (!trained_) SOK_RETURN_IF_ERROR(place_many({this}, {span}, s));
  return to_ssd_many({this}, {span}, {0}, s);
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

// Before an update: slots to come lower the budget in rows, so the coldest rows over it move down
// and the HBM tier's hash table shrinks BEFORE the relayout widens the rows, whose old and new
// arrays coexist while it copies (sized for the old budget, they need not fit the GPU together).
template <typename K>
Status GpuTieredTable<K>::prepare_update(const OptimizerParams& p, int64_t global_step,
                                         const Span& keys, cudaStream_t s) {
  const int slots = std::max(hot_->num_slots(), sok::num_slots(p.kind));
  int64_t dram = 0;  // checked before the update: no row changes on this error
  if (ssd_) SOK_RETURN_IF_ERROR(dram_rows(slots, &dram));
  if (slots != hot_->num_slots()) SOK_RETURN_IF_ERROR(fit_budget(slots, keys, s));
  SOK_RETURN_IF_ERROR(ensure_same_slots(p, s));
  trained_ = true;
  now_ = std::max(now_, global_step);
  return Status::OK();
}

template <typename K>
Status GpuTieredTable<K>::apply_gradients(const ExecContext& e, const K* keys, int64_t n,
                                          const float* grads, const OptimizerParams& p,
                                          int64_t global_step, bool keys_unique) {
  Call c;
  c.table = this;
  c.keys = keys;
  c.n = n;
  c.grads = grads;
  return apply_gradients_many({c}, p, global_step, stream_of(e), keys_unique);
}

template <typename K>
Status GpuTieredTable<K>::apply_gradients_many(const std::vector<Call>& calls,
                                               const OptimizerParams& p, int64_t global_step,
                                               cudaStream_t s, bool keys_unique,
                                               bool keys_present) {
  return for_each_group(calls, [&](size_t begin, size_t end) -> Status {
    for (size_t i = begin; i < end; ++i) {
      const Call& c = calls[i];
      GpuTieredTable& t = *c.table;
      const Span span{c.keys, std::max<int64_t>(c.n, 0), c.d_n};
      if (t.hot_) SOK_RETURN_IF_ERROR(t.prepare_update(p, global_step, span, s));
    }
    // After the relayouts: rows on file get their slots.
    SOK_RETURN_IF_ERROR(from_ssd_calls(calls, begin, end, s));
    std::vector<Keys> launch;
    for (size_t i = begin; i < end; ++i) {
      const Call& c = calls[i];
      GpuTieredTable& t = *c.table;
      const Span span{c.keys, std::max<int64_t>(c.n, 0), c.d_n};
      if (t.hot_ && c.n <= 0) continue;  // host-only: its slots come with the launch
      Keys k;
      SOK_RETURN_IF_ERROR(t.route(span, s, &k));
      k.grads = c.grads;
      launch.push_back(k);
    }
    SOK_RETURN_IF_ERROR(GpuEmbeddingTable<K>::apply_gradients_many(launch, p, global_step, s,
                                                                   keys_unique, keys_present));
    return after_update(calls, begin, end, /*inference_only=*/false, s);
  });
}

template <typename K>
Status GpuTieredTable<K>::erase(const K* keys, int64_t n, cudaStream_t s, int64_t* removed) {
  std::lock_guard<std::mutex> l(mu_);
  int64_t a = 0, b = 0, c = 0;
  if (hot_) SOK_RETURN_IF_ERROR(hot_->erase(keys, n, s, removed ? &a : nullptr));
  SOK_RETURN_IF_ERROR(cold_->erase(keys, n, s, removed ? &b : nullptr));
  if (ssd_ && ssd_->size() > 0 && n > 0) {
    std::vector<K> h;
    SOK_RETURN_IF_ERROR(keys_on_host(Span{keys, n, nullptr}, s, &h));
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

// The HBM tier's rows, then the host tier's (each in slot order), then the file's (file order),
// into room reserved for all of them: the snapshot, which can be most of the host's memory, is
// never copied to grow.
template <typename K>
Status GpuTieredTable<K>::export_rows(const ExecContext& e, TableSnapshot<K>* out) {
  int64_t hbm = 0, host = 0, on_file = 0;
  SOK_RETURN_IF_ERROR(tier_sizes(stream_of(e), &hbm, &host, &on_file));
  std::lock_guard<std::mutex> l(mu_);
  *out = TableSnapshot<K>();
  out->dim = cfg_.dim;
  out->num_slots = cold_->num_slots();
  out->reserve(hbm + host + on_file);
  if (hot_) SOK_RETURN_IF_ERROR(hot_->export_rows(out, stream_of(e)));
  SOK_RETURN_IF_ERROR(cold_->export_rows(out, stream_of(e), /*append=*/true));
  return ssd_ ? ssd_->export_rows(out) : Status::OK();
}

// The same rows straight into the caller's arrays (the export op's outputs): the GPU tiers copy
// theirs in place; the file's rows pass through a snapshot of that tier alone.
template <typename K>
Status GpuTieredTable<K>::export_into(const ExecContext& e, const AllocateField& allocate) {
  int64_t hbm = 0, host = 0, on_file = 0;
  SOK_RETURN_IF_ERROR(tier_sizes(stream_of(e), &hbm, &host, &on_file));
  std::lock_guard<std::mutex> l(mu_);
  SnapshotArrays<K> a;
  SOK_RETURN_IF_ERROR(allocate_snapshot(allocate, hbm + host + on_file, cfg_.dim,
                                        cold_->num_slots(), cold_->slot_kind(), cold_->slot_init(),
                                        &a));
  int64_t at = 0, count = 0;
  if (hot_) {
    SOK_RETURN_IF_ERROR(hot_->export_to(a, at, &count, stream_of(e)));
    at += count;
  }
  SOK_RETURN_IF_ERROR(cold_->export_to(a, at, &count, stream_of(e)));
  at += count;
  if (ssd_) {
    TableSnapshot<K> file;
    file.dim = cfg_.dim;
    file.num_slots = a.num_slots;
    file.slot_init = cold_->slot_init();  // for rows written before the slots existed
    SOK_RETURN_IF_ERROR(ssd_->export_rows(&file));
    const int64_t n = static_cast<int64_t>(file.keys.size()), d = a.dim, st = a.num_slots * d;
    if (at + n > a.n || static_cast<int64_t>(file.slots.size()) != n * st)
      return Status::Invalid("table '" + cfg_.name + "': its file's rows do not fit the export");
    std::copy(file.keys.begin(), file.keys.end(), a.keys + at);
    std::copy(file.values.begin(), file.values.end(), a.values + at * d);
    std::copy(file.slots.begin(), file.slots.end(), a.slots + at * st);
    std::copy(file.freqs.begin(), file.freqs.end(), a.freqs + at);
    std::copy(file.versions.begin(), file.versions.end(), a.versions + at);
    at += n;
  }
  if (at != a.n)
    return Status::Invalid("table '" + cfg_.name + "' lost rows while it was exported");
  return Status::OK();
}

// The hottest `keep` rows go to HBM (tier_policy.h's hottest_first), the next `keep_host` to host
// memory, the rest to the file. Both GPU tiers take the snapshot's slot layout, even when one
// gets no row.
template <typename K>
Status GpuTieredTable<K>::import_split(const SnapshotView<K>& s, int64_t keep, int64_t keep_host,
                                       cudaStream_t stream) {
  const std::vector<int64_t> order = hottest_first(s, cfg_.cache_strategy);
  const int64_t n = static_cast<int64_t>(order.size());
  keep = std::min(n, keep);
  keep_host = std::min(n - keep, keep_host);
  const auto part = [&](int64_t from, int64_t to) {
    return std::vector<int64_t>(order.begin() + from, order.begin() + to);
  };
  // The GPU tiers gather their rows from the snapshot a chunk at a time (no copy of a tier).
  const std::vector<int64_t> hot = part(0, keep), host = part(keep, keep + keep_host);
  SOK_RETURN_IF_ERROR(hot_->import_rows(s, stream, &hot));
  SOK_RETURN_IF_ERROR(cold_->import_rows(s, stream, &host));
  if (ssd_) {
    SOK_RETURN_IF_ERROR(ssd_->clear());
    SOK_RETURN_IF_ERROR(ssd_->put(snapshot_rows(s, part(keep + keep_host, n))));
  }
  note_exact(keep, keep_host);
  return Status::OK();
}

template <typename K>
Status GpuTieredTable<K>::import_rows(const ExecContext& e, const SnapshotView<K>& s) {
  std::lock_guard<std::mutex> l(mu_);
  if (!hot_) return cold_->import_rows(s, stream_of(e));
  SOK_RETURN_IF_ERROR(check_snapshot(cfg_.name, cfg_.dim, s));
  int64_t cap = 0;
  SOK_RETURN_IF_ERROR(budget_rows(s.num_slots, &cap));
  std::unordered_set<K> seen;  // the tiers' imports only see their own part's repeats
  for (int64_t i = 0; i < s.n; ++i) {
    const K key = s.keys[i];
    if (!seen.insert(key).second) return key_twice_in_checkpoint(cfg_.name, key);
  }
  // Without an SSD tier every row below HBM stays in host memory.
  int64_t host = s.n;
  if (ssd_) {
    SOK_RETURN_IF_ERROR(dram_rows(s.num_slots, &host));
    host = tier_low_watermark(host);
  }
  // The HBM tier's import allocates its arrays afresh: for the checkpoint's slot layout.
  hot_->impl_->cfg.initial_capacity = 2 * cap;
  hot_->impl_->next_pool_rows = cap;
  max_swaps_ = std::max<int64_t>(1, cap / kSwapShare);
  return import_split(s, cap, host, stream_of(e));
}

template <typename K>
Status GpuTieredTable<K>::append_rows(const ExecContext& e, const SnapshotView<K>& s) {
  std::lock_guard<std::mutex> l(mu_);
  const cudaStream_t stream = stream_of(e);
  SOK_RETURN_IF_ERROR(check_snapshot(cfg_.name, cfg_.dim, s));
  if (s.n == 0) return Status::OK();
  if (s.num_slots != cold_->num_slots())
    return Status::Invalid("table '" + cfg_.name + "': rows of " + std::to_string(s.num_slots) +
                           " slots cannot join rows of " + std::to_string(cold_->num_slots()));
  std::unordered_set<K> seen;  // a chunk split between two tiers: each tier sees its part only
  for (int64_t i = 0; i < s.n; ++i) {
    if (!seen.insert(s.keys[i]).second) return key_twice_in_checkpoint(cfg_.name, s.keys[i]);
  }
  // No tier may hold a key yet: each is asked (the file would replace a row silently, and the
  // host tier's put_rows sees only its own keys).
  detail::Temp keys;
  SOK_RETURN_IF_ERROR(keys.alloc(cold_->impl_->alloc, s.n * sizeof(K), stream));
  SOK_CUDA_RETURN(
      cudaMemcpyAsync(keys.as<K>(), s.keys, s.n * sizeof(K), cudaMemcpyHostToDevice, stream));
  TableSnapshot<K> found;
  for (GpuEmbeddingTable<K>* tier : {hot_.get(), cold_.get()}) {
    if (tier != nullptr && found.keys.empty())
      SOK_RETURN_IF_ERROR(tier->export_keys(keys.as<K>(), s.n, &found, stream));
  }
  if (ssd_ && found.keys.empty()) {
    found.dim = cfg_.dim;
    found.num_slots = cold_->num_slots();
    found.slot_init = cold_->slot_init();
    SOK_RETURN_IF_ERROR(ssd_->read(s.keys, s.n, &found));
  }
  if (!found.keys.empty()) return key_twice_in_checkpoint(cfg_.name, found.keys[0]);
  int64_t hbm = 0, host = 0;
  if (hot_) SOK_RETURN_IF_ERROR(hot_->size(&hbm, stream));
  SOK_RETURN_IF_ERROR(cold_->size(&host, stream));
  int64_t room = s.n;
  if (ssd_) {
    int64_t cap = 0;
    SOK_RETURN_IF_ERROR(dram_rows(s.num_slots, &cap));
    room = std::min(s.n, std::max<int64_t>(0, tier_low_watermark(cap) - host));
  }
  Status st;
  if (room == s.n) {
    st = cold_->put_rows(s, stream);
  } else {
    std::vector<int64_t> up(room), down(s.n - room);
    std::iota(up.begin(), up.end(), 0);
    std::iota(down.begin(), down.end(), room);
    st = ssd_->put(snapshot_rows(s, down));
    if (st.ok() && room > 0) st = cold_->put_rows(snapshot_rows(s, up), stream);
  }
  // The tiers' bounds from the host tier's size, also after a failed put (rows may have gone in).
  Status sized = cold_->size(&host, stream);
  if (sized.ok()) note_exact(hbm, host);
  return st.ok() ? sized : st;
}

template <typename K>
Status GpuTieredTable<K>::reserve(const ExecContext& e, int64_t rows) {
  std::lock_guard<std::mutex> l(mu_);
  return ssd_ ? Status::OK() : cold_->reserve(rows, stream_of(e));
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
