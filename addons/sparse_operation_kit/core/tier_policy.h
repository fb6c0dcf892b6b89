// The cache policy of a tiered table (tiered_table.h): what a row costs in a tier's byte budget,
// and which rows leave the memory tier when it is over budget.
//
// LFU keeps the most frequently looked-up rows (the table's frequencies, which travel with the
// rows); LRU the most recently used ones (a stamp per operation that looked a row up, updated
// or assigned it). Ties go to the older stamp, then the smaller key, so the choice is
// deterministic.
#pragma once

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <numeric>
#include <string>
#include <unordered_map>
#include <vector>

#include "addons/sparse_operation_kit/core/table_config.h"

namespace sok {

// Per-row metadata a tier's budget counts besides values and slots: the key (8), its
// frequency (4) and version (4), its index slot (8) and its recency stamp (8).
// sparse_operation_kit/tables/storage.py's ROW_META_BYTES is the same number.
inline constexpr int64_t kTierRowMetaBytes = 32;

inline int64_t tier_row_bytes(int64_t dim, int num_slots) {
  return static_cast<int64_t>(sizeof(float)) * dim * (1 + num_slots) + kTierRowMetaBytes;
}

// A tier's budget of `bytes` in rows of num_slots slots; an error naming the table and the tier
// (`tier`: "HBM", "DRAM") when not even one row fits.
inline Status tier_budget_rows(const TableConfig& c, const char* tier, int64_t bytes, int num_slots,
                               int64_t* rows) {
  const int64_t row = tier_row_bytes(c.dim, num_slots);
  *rows = bytes / row;
  if (*rows > 0) return Status::OK();
  return Status::Invalid("table '" + c.name + "': the " + tier + " budget of " +
                         std::to_string(bytes) + " bytes is smaller than one row (" +
                         std::to_string(row) + " bytes with " + std::to_string(num_slots) +
                         " optimizer slots)");
}

// Demotion empties a tier down to this share of its budget in rows, so that it runs once per many
// new keys rather than after every operation.
inline int64_t tier_low_watermark(int64_t cap) { return cap - cap / 16; }

// The positions of a snapshot's rows, hottest first: LFU the most frequent, LRU the most recently
// updated (a checkpoint keeps no lookup stamps); ties by checkpoint order. A tiered import puts
// the first ones in its upper tiers.
template <typename K>
std::vector<int64_t> hottest_first(const SnapshotView<K>& s, CacheStrategy strategy) {
  std::vector<int64_t> order(s.n);
  std::iota(order.begin(), order.end(), 0);
  const int64_t* rank = strategy == CacheStrategy::kLFU ? s.freqs : s.versions;
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return rank[a] > rank[b]; });
  return order;
}
template <typename K>
std::vector<int64_t> hottest_first(const TableSnapshot<K>& s, CacheStrategy strategy) {
  return hottest_first(SnapshotView<K>(s), strategy);
}

template <typename K>
class TierPolicy {
 public:
  explicit TierPolicy(CacheStrategy strategy) : strategy_(strategy) {}

  // Stamps the keys as used now (one stamp per call). Thread-safe.
  void touch(const K* keys, int64_t n) {
    std::lock_guard<std::mutex> l(mu_);
    ++clock_;
    for (int64_t i = 0; i < n; ++i) stamps_[keys[i]] = clock_;
  }

  // Of the memory tier's rows (keys, freqs), the `count` to move down, coldest first; the rows of
  // the latest operation go last (a training step's update follows its lookup with the same
  // keys: a freshly promoted row, rarely counted yet, would otherwise go straight back down and
  // be read again). Forgets the stamps of the victims (and, now and then, of keys no longer in
  // the tier).
  std::vector<K> victims(const std::vector<K>& keys, const std::vector<int64_t>& freqs,
                         int64_t count) {
    std::lock_guard<std::mutex> l(mu_);
    const int64_t n = static_cast<int64_t>(keys.size());
    std::vector<uint64_t> stamp(n);
    for (int64_t i = 0; i < n; ++i) {
      auto it = stamps_.find(keys[i]);
      stamp[i] = it == stamps_.end() ? 0 : it->second;
    }
    std::vector<int64_t> order(n);
    std::iota(order.begin(), order.end(), 0);
    const bool lfu = strategy_ == CacheStrategy::kLFU;
    const uint64_t latest = clock_;
    auto colder = [&](int64_t a, int64_t b) {
      const bool a_latest = stamp[a] == latest, b_latest = stamp[b] == latest;
      if (a_latest != b_latest) return b_latest;
      if (lfu && freqs[a] != freqs[b]) return freqs[a] < freqs[b];
      if (stamp[a] != stamp[b]) return stamp[a] < stamp[b];
      return keys[a] < keys[b];
    };
    count = std::min(count, n);
    std::nth_element(order.begin(), order.begin() + count, order.end(), colder);
    std::vector<K> out(count);
    for (int64_t j = 0; j < count; ++j) {
      out[j] = keys[order[j]];
      stamps_.erase(out[j]);
    }
    // Stamps of keys that left the tier otherwise (shrink, erase) only cost memory: a key that
    // comes back is stamped by the operation that brings it. Rebuilt from the tier's keys once
    // they outnumber those twice over, instead of on every call.
    if (static_cast<int64_t>(stamps_.size()) > 2 * (n - count) + 1024) {
      std::unordered_map<K, uint64_t> kept;
      for (int64_t j = count; j < n; ++j) {
        if (stamp[order[j]] != 0) kept[keys[order[j]]] = stamp[order[j]];
      }
      stamps_.swap(kept);
    }
    return out;
  }

  // Forgets every stamp (the table's content was replaced).
  void reset() {
    std::lock_guard<std::mutex> l(mu_);
    stamps_.clear();
  }

 private:
  const CacheStrategy strategy_;
  std::mutex mu_;
  uint64_t clock_ = 0;
  std::unordered_map<K, uint64_t> stamps_;  // keys of the memory tier -> last use
};

}  // namespace sok
