#include "addons/sparse_operation_kit/core/tiered_table.h"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_set>
#include <utility>

namespace sok {

template <typename K>
TieredTable<K>::TieredTable(TableConfig config, std::unique_ptr<SsdStore> cold)
    : hot_(std::move(config)), cold_(std::move(cold)), policy_(hot_.config().cache_strategy) {}

template <typename K>
Status TieredTable<K>::Create(TableConfig config, std::unique_ptr<TieredTable<K>>* out) {
  const std::string where = "table '" + config.name + "': ";
  if (config.storage != StorageKind::kDramSsdHash) {
    return Status::Invalid(where + "a tiered table needs storage DRAM_SSDHASH");
  }
  if (config.storage_path.empty()) {
    return Status::Invalid(where + "DRAM_SSDHASH needs storage_path, an existing directory");
  }
  if (config.dram_bytes < tier_row_bytes(config.dim, 0)) {
    return Status::Invalid(where + "the DRAM budget of " + std::to_string(config.dram_bytes) +
                           " bytes is smaller than one row (" +
                           std::to_string(tier_row_bytes(config.dim, 0)) + " bytes)");
  }
  std::unique_ptr<SsdStore> cold;
  Status s = SsdStore::Open(config.storage_path, config.name, &cold);
  if (!s.ok()) return s;
  out->reset(new TieredTable<K>(std::move(config), std::move(cold)));
  return Status::OK();
}

template <typename K>
Status TieredTable<K>::capacity(int num_slots, int64_t* rows) const {
  return tier_budget_rows(config(), "DRAM", config().dram_bytes, num_slots, rows);
}

template <typename K>
int64_t TieredTable<K>::ssd_rows() const {
  std::shared_lock<std::shared_mutex> l(mu_);
  return cold_->size();
}

template <typename K>
Status TieredTable<K>::size(const ExecContext&, int64_t* out) {
  std::shared_lock<std::shared_mutex> l(mu_);
  *out = hot_.size() + cold_->size();
  return Status::OK();
}

template <typename K>
bool TieredTable<K>::any_cold(const K* keys, int64_t n) const {
  if (cold_->size() == 0) return false;
  for (int64_t i = 0; i < n; ++i) {
    if (cold_->contains(static_cast<int64_t>(keys[i]))) return true;
  }
  return false;
}

template <typename K>
void TieredTable<K>::read_cold(const SsdStore::Record& r, float* out) const {
  // A present row as EmbeddingTable::read_row gives it: not yet admitted reads the default.
  const TableConfig& c = config();
  if (c.filter_freq > 0 && r.freq < c.filter_freq) {
    std::fill(out, out + c.dim, c.default_value_no_permission);
  } else {
    std::memcpy(out, r.row.data(), sizeof(float) * c.dim);
  }
}

template <typename K>
Status TieredTable<K>::find(const ExecContext& exec, const K* keys, int64_t n, float* out) {
  std::shared_lock<std::shared_mutex> l(mu_);
  hot_.find(keys, n, out, exec.parallel_for);  // cold keys read as absent, then overwritten
  if (cold_->size() == 0) return Status::OK();
  SsdStore::Record r;
  for (int64_t i = 0; i < n; ++i) {
    if (!cold_->contains(static_cast<int64_t>(keys[i]))) continue;
    Status s = cold_->read(static_cast<int64_t>(keys[i]), &r);
    if (!s.ok()) return s;
    read_cold(r, out + i * config().dim);
  }
  return Status::OK();
}

template <typename K>
Status TieredTable<K>::promote(const K* keys, int64_t n) {
  TableSnapshot<K> rows;
  rows.dim = config().dim;
  rows.num_slots = hot_.num_slots();
  TableSnapshot<K> shape = hot_.rows_of(nullptr, 0);  // the memory tier's slot layout
  rows.slot_kind = shape.slot_kind;
  rows.slot_init = shape.slot_init;
  Status s = read_snapshot(*cold_, keys, n, config().name, &rows);
  if (s.ok()) s = hot_.put_rows(rows);
  if (!s.ok()) return s;
  for (const K key : rows.keys) cold_->remove(static_cast<int64_t>(key));
  return cold_->maybe_compact(config().ssd_compact_min_bytes);
}

template <typename K>
Status TieredTable<K>::demote() {
  int64_t cap = 0;
  Status s = capacity(hot_.num_slots(), &cap);
  if (!s.ok()) return s;
  if (hot_.size() <= cap) return Status::OK();
  std::unique_lock<std::shared_mutex> l(mu_);
  const int64_t n = hot_.size();
  if (n <= cap) return Status::OK();
  std::vector<K> keys;
  std::vector<int64_t> freqs;
  hot_.keys_and_freqs(&keys, &freqs);
  return move_to_file(policy_.victims(keys, freqs, n - tier_low_watermark(cap)));
}

template <typename K>
Status TieredTable<K>::move_to_file(const std::vector<K>& keys) {
  const int64_t m = static_cast<int64_t>(keys.size());
  // Written to the file first, removed from memory after: a failed write loses no row.
  Status s = append_snapshot(hot_.rows_of(keys.data(), m), cold_.get());
  if (!s.ok()) return s;
  hot_.erase(keys.data(), m);
  return cold_->maybe_compact(config().ssd_compact_min_bytes);
}

template <typename K>
template <typename Op>
Status TieredTable<K>::with_keys_in_memory(const K* keys, int64_t n, const Op& op) {
  Status s;
  bool done = false;
  {
    std::shared_lock<std::shared_mutex> l(mu_);
    if (!any_cold(keys, n)) {
      s = op();
      done = true;
    }
  }
  if (!done) {
    std::unique_lock<std::shared_mutex> l(mu_);
    s = promote(keys, n);
    if (s.ok()) s = op();
  }
  if (!s.ok()) return s;
  policy_.touch(keys, n);
  return demote();
}

template <typename K>
Status TieredTable<K>::find_or_insert(const ExecContext& exec, const K* keys, int64_t n, float* out,
                                      const int64_t* counts) {
  return with_keys_in_memory(keys, n, [&]() {
    hot_.find_or_insert(keys, n, out, counts, exec.parallel_for);
    return Status::OK();
  });
}

template <typename K>
Status TieredTable<K>::insert_or_assign(const ExecContext&, const K* keys, int64_t n,
                                        const float* values) {
  return with_keys_in_memory(keys, n, [&]() {
    hot_.insert_or_assign(keys, n, values);
    return Status::OK();
  });
}

template <typename K>
Status TieredTable<K>::apply_gradients(const ExecContext& exec, const K* keys, int64_t n,
                                       const float* grads, const OptimizerParams& p,
                                       int64_t global_step, bool keys_unique) {
  int64_t cap = 0;
  Status s = capacity(std::max(hot_.num_slots(), sok::num_slots(p.kind)), &cap);
  if (!s.ok()) return s;  // checked before the update: no row changes on this error
  return with_keys_in_memory(keys, n, [&]() {
    return hot_.apply_gradients(keys, n, grads, p, global_step, exec.parallel_for, keys_unique);
  });
}

template <typename K>
Status TieredTable<K>::erase(const K* keys, int64_t n, int64_t* removed) {
  std::unique_lock<std::shared_mutex> l(mu_);
  *removed = hot_.erase(keys, n);
  for (int64_t i = 0; i < n; ++i) *removed += cold_->remove(static_cast<int64_t>(keys[i])) ? 1 : 0;
  return cold_->maybe_compact(config().ssd_compact_min_bytes);
}

template <typename K>
Status TieredTable<K>::shrink(const ExecContext&, int64_t global_step, int64_t* removed) {
  std::unique_lock<std::shared_mutex> l(mu_);
  *removed = hot_.shrink(global_step);
  std::vector<int64_t> victims;
  Status s = cold_->for_each([&](const SsdStore::Record& r) {
    if (should_evict(config(), global_step, r.version, r.row.data())) victims.push_back(r.key);
  });
  if (!s.ok()) return s;
  for (int64_t key : victims) cold_->remove(key);
  *removed += static_cast<int64_t>(victims.size());
  return cold_->maybe_compact(config().ssd_compact_min_bytes);
}

template <typename K>
Status TieredTable<K>::export_rows(const ExecContext&, TableSnapshot<K>* out) {
  std::shared_lock<std::shared_mutex> l(mu_);
  *out = hot_.export_rows();
  out->reserve(static_cast<int64_t>(out->keys.size()) + cold_->size());
  Status inner;
  Status s = cold_->for_each([&](const SsdStore::Record& r) {
    if (inner.ok()) inner = append_record(r, config().name, out);
  });
  return s.ok() ? inner : s;
}

template <typename K>
Status TieredTable<K>::export_into(const ExecContext&, const AllocateField& allocate) {
  std::unique_lock<std::shared_mutex> l(mu_);  // no insert between sizing and filling
  const TableSnapshot<K> layout = hot_.rows_of(nullptr, 0);
  const int64_t n = hot_.size() + cold_->size();
  SnapshotArrays<K> a;
  Status st = allocate_snapshot(allocate, n, config().dim, layout.num_slots, layout.slot_kind,
                                layout.slot_init, &a);
  int64_t at = 0;
  if (st.ok()) st = hot_.export_to(a, 0, &at);
  Status inner;
  if (st.ok()) {
    st = cold_->for_each([&](const SsdStore::Record& r) {
      if (inner.ok()) inner = write_record(r, config().name, layout.slot_init, a, at++);
    });
  }
  if (st.ok()) st = inner;
  if (st.ok() && at != n)
    st = Status::Invalid("table '" + config().name + "' lost rows while it was exported");
  return st;
}

template <typename K>
Status TieredTable<K>::import_split(const SnapshotView<K>& s, int64_t cap) {
  // The rows that stay in memory: the hottest (tier_policy.h).
  const int64_t n = s.n;
  const std::vector<int64_t> order = hottest_first(s, config().cache_strategy);
  const int64_t keep = std::min(n, tier_low_watermark(cap));
  std::vector<int64_t> hot(order.begin(), order.begin() + keep);
  std::vector<int64_t> cold(order.begin() + keep, order.end());
  Status st = cold_->clear();
  if (st.ok()) st = append_snapshot(snapshot_rows(s, cold), cold_.get());
  if (st.ok()) st = hot_.import_rows(snapshot_rows(s, hot));
  return st;
}

template <typename K>
Status TieredTable<K>::import_rows(const ExecContext&, const SnapshotView<K>& s) {
  Status st = check_snapshot(config().name, config().dim, s);
  if (!st.ok()) return st;
  int64_t cap = 0;
  st = capacity(s.num_slots, &cap);
  if (!st.ok()) return st;
  std::unordered_set<int64_t> keys;
  for (int64_t i = 0; i < s.n; ++i) {
    const K key = s.keys[i];
    if (!keys.insert(static_cast<int64_t>(key)).second)
      return key_twice_in_checkpoint(config().name, key);
  }
  std::unique_lock<std::shared_mutex> l(mu_);
  policy_.reset();
  if (s.n <= cap) {
    st = cold_->clear();
    return st.ok() ? hot_.import_rows(s) : st;
  }
  return import_split(s, cap);
}

// A checkpoint's later chunk: into memory; then, once memory is over budget or the file holds
// rows, memory keeps the hottest rows seen so far, as many as import_split keeps of the whole
// checkpoint (tier_policy.h's hottest_first: a restored table has no lookup stamps), and the rest
// move to the file. After the last chunk the tiers hold what one import gives (ties aside).
template <typename K>
Status TieredTable<K>::append_rows(const ExecContext&, const SnapshotView<K>& s) {
  Status st = check_snapshot(config().name, config().dim, s);
  if (!st.ok()) return st;
  std::unique_lock<std::shared_mutex> l(mu_);
  for (int64_t i = 0; i < s.n; ++i) {
    if (cold_->contains(static_cast<int64_t>(s.keys[i])))
      return key_twice_in_checkpoint(config().name, s.keys[i]);
  }
  st = hot_.put_rows(s, key_twice_in_checkpoint);
  int64_t cap = 0;
  if (st.ok()) st = capacity(hot_.num_slots(), &cap);
  if (!st.ok()) return st;
  const int64_t keep = tier_low_watermark(cap);
  if (hot_.size() <= (cold_->size() == 0 ? cap : keep)) return st;
  SnapshotView<K> rows;
  std::vector<K> keys;
  std::vector<int64_t> freqs, versions;
  hot_.keys_and_freqs(&keys, &freqs, &versions);
  rows.n = static_cast<int64_t>(keys.size());
  rows.freqs = freqs.data();
  rows.versions = versions.data();
  const std::vector<int64_t> order = hottest_first(rows, config().cache_strategy);
  std::vector<K> down;
  for (int64_t i = keep; i < rows.n; ++i) down.push_back(keys[order[i]]);
  return move_to_file(down);
}

template <typename K>
Status new_cpu_table(const TableConfig& config, std::unique_ptr<Table<K>>* out) {
  if (config.storage == StorageKind::kDram) {
    out->reset(new CpuTable<K>(config));
    return Status::OK();
  }
  if (config.storage != StorageKind::kDramSsdHash) {  // never placed elsewhere silently
    const char* what = config.storage == StorageKind::kHbm       ? "HBM keeps its rows"
                       : config.storage == StorageKind::kHbmDram ? "HBM_DRAM caches rows"
                                                                 : "HBM_DRAM_SSDHASH caches rows";
    return Status::Invalid("table '" + config.name + "': storage " + what +
                           " in GPU memory; place the table on a GPU (on the CPU use DRAM or "
                           "DRAM_SSDHASH)");
  }
  std::unique_ptr<TieredTable<K>> tiered;
  Status s = TieredTable<K>::Create(config, &tiered);
  if (s.ok()) *out = std::move(tiered);
  return s;
}

template class TieredTable<int32_t>;
template class TieredTable<int64_t>;
template Status new_cpu_table<int32_t>(const TableConfig&, std::unique_ptr<Table<int32_t>>*);
template Status new_cpu_table<int64_t>(const TableConfig&, std::unique_ptr<Table<int64_t>>*);

}  // namespace sok
