#include "addons/sparse_operation_kit/core/ssd_rows.h"

#include <algorithm>
#include <cstring>
#include <utility>

namespace sok {
namespace {

// The keys seen so far in one read: open addressing over positions into a key array (a call
// repeats few keys, but must meet each row once; std::unordered_set cost an allocation a key).
class SeenKeys {
 public:
  explicit SeenKeys(int64_t n) {
    int64_t cap = 16;
    while (cap < 2 * n) cap *= 2;
    slots_.assign(cap, -1);
    mask_ = cap - 1;
  }
  // Whether keys[i]'s key is new (then remembered); keys must outlive the set.
  bool insert(const int64_t* keys, int64_t i) {
    const int64_t key = keys[i];
    uint64_t h = static_cast<uint64_t>(key) * 0x9E3779B97F4A7C15ull;
    for (int64_t at = static_cast<int64_t>(h >> 20) & mask_;; at = (at + 1) & mask_) {
      if (slots_[at] < 0) {
        slots_[at] = i;
        return true;
      }
      if (keys[slots_[at]] == key) return false;
    }
  }

 private:
  std::vector<int64_t> slots_;
  int64_t mask_ = 0;
};

}  // namespace

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

namespace {
// The record's slot count, or an error when it does not fit rows of num_slots slots.
Status record_slots(const SsdStore::Record& r, const std::string& table, int64_t d,
                    int64_t num_slots, int64_t* slots) {
  *slots = static_cast<int64_t>(r.row.size()) / d - 1;
  if (*slots < 0 || *slots > num_slots) {
    return Status::Invalid("table '" + table + "': an SSD row of " + std::to_string(r.row.size()) +
                           " floats does not fit rows of " + std::to_string(num_slots) + " slots");
  }
  return Status::OK();
}
}  // namespace

template <typename K>
Status append_record(const SsdStore::Record& r, const std::string& table, TableSnapshot<K>* s) {
  const int64_t d = s->dim;
  int64_t slots = 0;
  Status st = record_slots(r, table, d, s->num_slots, &slots);
  if (!st.ok()) return st;
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
Status write_record(const SsdStore::Record& r, const std::string& table,
                    const std::vector<float>& slot_init, const SnapshotArrays<K>& a, int64_t at) {
  const int64_t d = a.dim, num_slots = a.num_slots;
  int64_t slots = 0;
  Status st = record_slots(r, table, d, num_slots, &slots);
  if (!st.ok()) return st;
  if (at >= a.n) return Status::Invalid("table '" + table + "' gained rows while it was exported");
  a.keys[at] = static_cast<K>(r.key);
  a.freqs[at] = r.freq;
  a.versions[at] = r.version;
  std::copy(r.row.begin(), r.row.begin() + d, a.values + at * d);
  float* dst = std::copy(r.row.begin() + d, r.row.end(), a.slots + at * num_slots * d);
  for (int64_t k = slots; k < num_slots; ++k) dst = std::fill_n(dst, d, slot_init[k]);
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
Status read_snapshot(const SsdStore& store, const K* keys, int64_t n, const std::string& table,
                     TableSnapshot<K>* out) {
  std::vector<int64_t> found;  // the keys on file, in call order
  for (int64_t i = 0; i < n; ++i) {
    const int64_t key = static_cast<int64_t>(keys[i]);
    if (store.contains(key)) found.push_back(key);
  }
  const int64_t m = static_cast<int64_t>(found.size());
  SeenKeys seen(m);
  const size_t d = static_cast<size_t>(out->dim), rows = out->keys.size() + m;
  out->keys.reserve(rows);
  out->freqs.reserve(rows);
  out->versions.reserve(rows);
  out->values.reserve(rows * d);
  out->slots.reserve(rows * d * out->num_slots);
  SsdStore::Record r;
  for (int64_t i = 0; i < m; ++i) {
    if (!seen.insert(found.data(), i)) continue;
    Status s = store.read(found[i], &r);
    if (s.ok()) s = append_record(r, table, out);
    if (!s.ok()) return s;
  }
  return Status::OK();
}

template <typename K>
Status SsdRows<K>::read(const K* keys, int64_t n, TableSnapshot<K>* out) const {
  return read_snapshot(*store_, keys, n, cfg_.name, out);
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
  out->reserve(static_cast<int64_t>(out->keys.size()) + store_->size());
  Status inner;
  Status s = store_->for_each([&](const SsdStore::Record& r) {
    if (inner.ok()) inner = append_record(r, cfg_.name, out);
  });
  return s.ok() ? inner : s;
}

template Status append_snapshot<int32_t>(const TableSnapshot<int32_t>&, SsdStore*);
template Status append_snapshot<int64_t>(const TableSnapshot<int64_t>&, SsdStore*);
template Status write_record<int32_t>(const SsdStore::Record&, const std::string&,
                                      const std::vector<float>&, const SnapshotArrays<int32_t>&,
                                      int64_t);
template Status write_record<int64_t>(const SsdStore::Record&, const std::string&,
                                      const std::vector<float>&, const SnapshotArrays<int64_t>&,
                                      int64_t);
template Status append_record<int32_t>(const SsdStore::Record&, const std::string&,
                                       TableSnapshot<int32_t>*);
template Status append_record<int64_t>(const SsdStore::Record&, const std::string&,
                                       TableSnapshot<int64_t>*);
template Status read_snapshot<int32_t>(const SsdStore&, const int32_t*, int64_t, const std::string&,
                                       TableSnapshot<int32_t>*);
template Status read_snapshot<int64_t>(const SsdStore&, const int64_t*, int64_t, const std::string&,
                                       TableSnapshot<int64_t>*);
template class SsdRows<int32_t>;
template class SsdRows<int64_t>;

}  // namespace sok
