// TieredTable<K>: a CPU table over two tiers (StorageKind::kDramSsdHash): an EmbeddingTable in
// memory caches the most used rows within config.dram_bytes (tier_policy.h), and an SsdStore
// (ssd_tier.h) holds the rest. Every row is in exactly one tier; a row travels whole (values,
// slots, frequency, version). Results equal those of one EmbeddingTable holding every row:
//  - find reads a cold row from the file and changes nothing;
//  - find_or_insert, insert_or_assign and apply_gradients first move their cold keys into memory
//    (promotion), then run the memory table's own code; afterwards, if the memory tier is over
//    budget, its coldest rows move down in one batch (demotion);
//  - shrink, export, import and size cover both tiers.
// export_rows gives the memory tier's rows, then the file's; the order differs from a one-tier
// table's (insertion order), the rows do not.
//
// Concurrency: mu_ shared for operations whose keys are all in memory (the memory table then
// locks as usual) and for find; exclusive for promotion, demotion, shrink and import.
#pragma once

#include <memory>
#include <shared_mutex>
#include <vector>

#include "addons/sparse_operation_kit/core/ssd_rows.h"
#include "addons/sparse_operation_kit/core/ssd_tier.h"
#include "addons/sparse_operation_kit/core/table.h"
#include "addons/sparse_operation_kit/core/tier_policy.h"

namespace sok {

template <typename K>
class TieredTable final : public Table<K> {
 public:
  // Checks the storage settings and makes the table's directory below config.storage_path.
  static Status Create(TableConfig config, std::unique_ptr<TieredTable<K>>* out);

  const TableConfig& config() const override { return hot_.config(); }
  Status size(const ExecContext& exec, int64_t* out) override;
  Status find(const ExecContext& exec, const K* keys, int64_t n, float* out) override;
  Status find_or_insert(const ExecContext& exec, const K* keys, int64_t n, float* out,
                        const int64_t* counts) override;
  Status insert_or_assign(const ExecContext& exec, const K* keys, int64_t n,
                          const float* values) override;
  Status apply_gradients(const ExecContext& exec, const K* keys, int64_t n, const float* grads,
                         const OptimizerParams& p, int64_t global_step, bool keys_unique) override;
  Status shrink(const ExecContext& exec, int64_t global_step, int64_t* removed) override;
  Status export_rows(const ExecContext& exec, TableSnapshot<K>* out) override;
  // The memory tier's rows, then the file's, straight into the outputs (no snapshot).
  Status export_into(const ExecContext& exec, const AllocateField& allocate) override;
  Status import_rows(const ExecContext& exec, const SnapshotView<K>& snapshot) override;
  // Into memory, then the memory tier's coldest rows move to the file as after any insert.
  Status append_rows(const ExecContext& exec, const SnapshotView<K>& snapshot) override;

  // Removes the keys from whichever tier holds them; *removed = how many were present.
  Status erase(const K* keys, int64_t n, int64_t* removed);
  // Rows per tier (tests, debugging).
  int64_t memory_rows() const { return hot_.size(); }
  std::vector<K> memory_keys() const {
    std::vector<K> keys;
    std::vector<int64_t> freqs;
    hot_.keys_and_freqs(&keys, &freqs);
    return keys;
  }
  int64_t ssd_rows() const;
  const std::string& ssd_dir() const { return cold_->dir(); }

 private:
  TieredTable(TableConfig config, std::unique_ptr<SsdStore> cold);
  // The memory tier's budget in rows of `num_slots` slots; an error when not even one fits.
  Status capacity(int num_slots, int64_t* rows) const;
  bool any_cold(const K* keys, int64_t n) const;  // caller holds mu_
  Status promote(const K* keys, int64_t n);       // caller holds mu_ exclusively
  Status demote();
  Status move_to_file(const std::vector<K>& keys);  // those memory rows; caller holds mu_
  // Runs op (which returns a Status) with every key in memory, then demotes.
  template <typename Op>
  Status with_keys_in_memory(const K* keys, int64_t n, const Op& op);
  void read_cold(const SsdStore::Record& r, float* out) const;
  Status import_split(const SnapshotView<K>& s, int64_t cap);  // caller holds mu_ exclusively

  EmbeddingTable<K> hot_;
  std::unique_ptr<SsdStore> cold_;
  TierPolicy<K> policy_;
  mutable std::shared_mutex mu_;
};

// The CPU table that config.storage asks for: a CpuTable (DRAM) or a TieredTable.
template <typename K>
Status new_cpu_table(const TableConfig& config, std::unique_ptr<Table<K>>* out);

}  // namespace sok
