// EmbeddingTable<K>: a growing hash table from key to row, in CPU memory.
// A row holds [value(dim) | optimizer slots (num_slots x dim)] plus the key's frequency and the
// step of its last update. Every key value is legal (emptiness is kept apart from the key).
//
// Memory per key beyond values and slots: the key, a 4-byte frequency and a 4-byte version
// (NarrowColumn: widened losslessly to 8 bytes if a value ever needs it) and 10 to 15 bytes of
// index (RowIndex); rows live in fixed-size blocks (RowArena), so growth copies no rows. The
// index, the columns and the blocks are mapped from the OS when large (PageVector): growth slack
// not yet written is not resident, and what growth frees goes back to the OS at once.
//
// Concurrency (TensorFlow runs several lookups and updates of one table at once):
//  - a shared_mutex guards the index and the row arena's layout: lookups of present keys and
//    updates take it shared; inserting, growing, relayout and shrinking take it exclusively;
//  - the read path takes no per-key lock; updates of one table run one at a time (update_mu_,
//    like TensorFlow's use_locking=True), so two concurrent updates of one key both land. Within
//    one update the keys are distinct, so its parallel workers write disjoint rows unlocked (a
//    per-row atomic would fence every row and stall the overlapped cache misses).
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <shared_mutex>
#include <vector>

#include "addons/sparse_operation_kit/core/narrow_column.h"
#include "addons/sparse_operation_kit/core/page_vector.h"
#include "addons/sparse_operation_kit/core/parallel.h"
#include "addons/sparse_operation_kit/core/row_arena.h"
#include "addons/sparse_operation_kit/core/row_index.h"
#include "addons/sparse_operation_kit/core/status.h"
#include "addons/sparse_operation_kit/core/table_config.h"

namespace sok {

template <typename K>
class EmbeddingTable {
 public:
  explicit EmbeddingTable(TableConfig config);

  const TableConfig& config() const { return config_; }
  int64_t dim() const { return config_.dim; }
  int64_t size() const;
  int num_slots() const;

  // Evaluation/serving read: missing keys read their initial value (or, with a counter filter,
  // the no-permission default); nothing is inserted and no frequency is counted.
  void find(const K* keys, int64_t n, float* out, const ParallelFor& pf = serial_for) const;

  // Training read: inserts missing keys with their initial value and adds counts[i] (1 when
  // counts is null) to each key's frequency. Keys may repeat.
  void find_or_insert(const K* keys, int64_t n, float* out, const int64_t* counts = nullptr,
                      const ParallelFor& pf = serial_for);

  // Overwrites the values of the keys (inserting the missing ones); slots keep/get their init.
  void insert_or_assign(const K* keys, int64_t n, const float* values);

  // Removes the keys; returns how many were present.
  int64_t erase(const K* keys, int64_t n);

  // One optimizer step on the given keys; duplicates are summed first. Missing keys are
  // inserted first (no gradient is dropped); keys not yet admitted by the filter are skipped.
  // keys_unique: the caller guarantees the keys are distinct (e.g. unique_keys' output), which
  // skips the dedup.
  Status apply_gradients(const K* keys, int64_t n, const float* grads, const OptimizerParams& p,
                         int64_t global_step, const ParallelFor& pf = serial_for,
                         bool keys_unique = false);

  // Evicts rows per the config (steps_to_live, l2 threshold); returns how many were removed.
  int64_t shrink(int64_t global_step);

  TableSnapshot<K> export_rows() const;
  // The same rows straight into arrays `allocate` gives (table_config.h), under one lock.
  Status export_into(const AllocateField& allocate) const;
  // The same rows into arrays sized before, from row `at` on; *count: how many.
  Status export_to(const SnapshotArrays<K>& a, int64_t at, int64_t* count) const;
  // Replaces the whole content. The snapshot's dim must equal the table's.
  Status import_rows(const SnapshotView<K>& snapshot);

  // For the tiered table (tiered_table.h), which moves whole rows between its tiers:
  // the key and frequency of every row (and its version, when `versions` is given);
  void keys_and_freqs(std::vector<K>* keys, std::vector<int64_t>* freqs,
                      std::vector<int64_t>* versions = nullptr) const;
  // the whole rows (values, slots, frequency, version) of the present keys among `keys`;
  TableSnapshot<K> rows_of(const K* keys, int64_t n) const;
  // adds whole rows whose keys are absent (a key it holds is the error `repeated` gives); a row
  // with fewer slots than the table (moved out before the optimizer's first update) gets the
  // slots' initial values, as relayout gives.
  Status put_rows(const SnapshotView<K>& rows, RepeatedKeyError repeated = key_in_two_tiers);

 private:
  static constexpr int64_t kEmpty = -1;

  int64_t stride() const { return config_.dim * (1 + num_slots_); }
  bool admitted(int64_t row) const;
  int64_t probe(K key) const;  // row of key or kEmpty; caller holds mu_
  // export_to's copy; caller holds mu_.
  Status write_rows(const SnapshotArrays<K>& a, int64_t at, int64_t* count) const;
  // rows[i] = probe(keys[i]), prefetching a few keys ahead; caller holds mu_.
  void probe_many(const K* keys, int64_t n, int64_t* rows) const;
  // The row of key given the index's candidate (the first row with its tag): a rare tag
  // collision costs a full probe.
  int64_t confirm(K key, int64_t candidate) const {
    return candidate == kEmpty || row_keys_[candidate] == key ? candidate : probe(key);
  }
  // Caller holds mu_ exclusively; key absent. draw_values false: the caller writes the values
  // (a row coming back from another tier), so the initializer is not run for them.
  int64_t insert_new(K key, bool draw_values = true);
  void rehash(int64_t min_rows);  // caller holds mu_ exclusively
  void init_row_values(K key, float* row, bool draw_values = true) const;
  void read_row(int64_t row, K key, bool present, float* out) const;
  Status ensure_slots(const OptimizerParams& p);  // caller holds mu_ exclusively

  TableConfig config_;
  mutable std::shared_mutex mu_;
  RowIndex index_;
  // Rows, in insertion order.
  PageVector<K> row_keys_;
  RowArena arena_;
  NarrowColumn<uint32_t> freqs_;
  NarrowColumn<int32_t> versions_;
  int num_slots_ = 0;
  int slot_kind_ = -1;  // OptimizerKind owning the slots; -1 none/unknown (fresh import)
  std::vector<float> slot_init_;
  std::mutex update_mu_;  // serialises apply_gradients calls
};

}  // namespace sok
