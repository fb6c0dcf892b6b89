#include "addons/sparse_operation_kit/core/ssd_rows.h"

#include <algorithm>
#include <cstring>
#include <unordered_set>
#include <utility>

namespace sok {

template <typename K>
Status append_snapshot(const TableSnapshot<K>& s, SsdStore* store) {
  const std::vector<int64_t> keys(s.keys.begin(), s.keys.end());
  SsdStore::Rows rows;
  rows.keys = keys.data();
  rows.freqs = s.freqs.data();
  rows.versions = s.versions.data();
  rows.values = s.values.data();
  rows.slots = s.slots.data();
  rows.n = static_cast<int64_t>(keys.size());
  rows.dim = s.dim;
  rows.slot_floats = s.num_slots * s.dim;
  return store->append(rows);
}

template <typename K>
Status append_record(const SsdStore::Record& r, const std::string& table, TableSnapshot<K>* s) {
  const int64_t d = s->dim;
  const int64_t slots = static_cast<int64_t>(r.row.size()) / d - 1;
  if (slots < 0 || slots > s->num_slots) {
    return Status::Invalid("table '" + table + "': an SSD row of " + std::to_string(r.row.size()) +
                           " floats does not fit rows of " + std::to_string(s->num_slots) +
                           " slots");
  }
  s->keys.push_back(static_cast<K>(r.key));
  s->freqs.push_back(r.freq);
  s->versions.push_back(r.version);
  s->values.insert(s->values.end(), r.row.begin(), r.row.begin() + d);
  s->slots.insert(s->slots.end(), r.row.begin() + d, r.row.end());
  for (int64_t k = slots; k < s->num_slots; ++k)
    s->slots.insert(s->slots.end(), d, s->slot_init[k]);
  return Status::OK();
}

template <typename K>
Status SsdRows<K>::Open(const TableConfig& config, std::unique_ptr<SsdRows>* out) {
  if (config.storage_path.empty()) {
    return Status::Invalid("table '" + config.name +
                           "': an SSD tier needs storage_path, an existing directory");
  }
  std::unique_ptr<SsdStore> store;
  Status s = SsdStore::Open(config.storage_path, config.name, &store);
  if (s.ok()) out->reset(new SsdRows(config, std::move(store)));
  return s;
}

template <typename K>
Status SsdRows<K>::read(const K* keys, int64_t n, TableSnapshot<K>* out) const {
  std::unordered_set<int64_t> seen;
  SsdStore::Record r;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t key = static_cast<int64_t>(keys[i]);
    bool found = false;
    Status s = store_->read_if_present(key, &r, &found);
    if (s.ok() && found && seen.insert(key).second) s = append_record(r, cfg_.name, out);
    if (!s.ok()) return s;
  }
  return Status::OK();
}

template <typename K>
Status SsdRows<K>::find(const K* keys, int64_t n, std::vector<int64_t>* pos,
                        std::vector<float>* rows) const {
  const int64_t d = cfg_.dim;
  SsdStore::Record r;
  for (int64_t i = 0; i < n; ++i) {
    bool found = false;
    Status s = store_->read_if_present(static_cast<int64_t>(keys[i]), &r, &found);
    if (!s.ok()) return s;
    if (!found) continue;
    pos->push_back(i);
    // As a table reads a present row: not yet admitted reads the default.
    if (cfg_.filter_freq > 0 && r.freq < cfg_.filter_freq) {
      rows->insert(rows->end(), d, cfg_.default_value_no_permission);
    } else {
      rows->insert(rows->end(), r.row.begin(), r.row.begin() + d);
    }
  }
  return Status::OK();
}

template <typename K>
Status SsdRows<K>::put(const TableSnapshot<K>& rows) {
  if (rows.keys.empty()) return Status::OK();
  Status s = append_snapshot(rows, store_.get());
  return s.ok() ? compact() : s;
}

template <typename K>
Status SsdRows<K>::remove(const K* keys, int64_t n, int64_t* removed) {
  int64_t count = 0;
  for (int64_t i = 0; i < n; ++i) count += store_->remove(static_cast<int64_t>(keys[i])) ? 1 : 0;
  if (removed != nullptr) *removed = count;
  return count > 0 ? compact() : Status::OK();
}

template <typename K>
Status SsdRows<K>::shrink(int64_t global_step, int64_t* removed) {
  *removed = 0;
  if (!evicts_anything(cfg_) || size() == 0) return Status::OK();
  std::vector<K> victims;
  Status s = store_->for_each([&](const SsdStore::Record& r) {
    if (should_evict(cfg_, global_step, r.version, r.row.data()))
      victims.push_back(static_cast<K>(r.key));
  });
  if (!s.ok()) return s;
  return remove(victims.data(), static_cast<int64_t>(victims.size()), removed);
}

template <typename K>
Status SsdRows<K>::export_rows(TableSnapshot<K>* out) const {
  Status inner;
  Status s = store_->for_each([&](const SsdStore::Record& r) {
    if (inner.ok()) inner = append_record(r, cfg_.name, out);
  });
  return s.ok() ? inner : s;
}

template Status append_snapshot<int32_t>(const TableSnapshot<int32_t>&, SsdStore*);
template Status append_snapshot<int64_t>(const TableSnapshot<int64_t>&, SsdStore*);
template Status append_record<int32_t>(const SsdStore::Record&, const std::string&,
                                       TableSnapshot<int32_t>*);
template Status append_record<int64_t>(const SsdStore::Record&, const std::string&,
                                       TableSnapshot<int64_t>*);
template class SsdRows<int32_t>;
template class SsdRows<int64_t>;

}  // namespace sok
