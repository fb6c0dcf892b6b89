// GpuTieredTable<K>: a GPU table over two tiers (StorageKind::kHbmDram, DeepRec's HBM_DRAM), the
// GPU mirror of core/tiered_table.h. Two GpuEmbeddingTables with the same layout:
//   - the HBM tier caches the most used rows within config.hbm_bytes (rows counted as
//     tier_policy.h's tier_row_bytes: values, slots and 32 bytes of metadata; the hash table's
//     spare room is not counted);
//   - the host tier holds the rest; its index (digests, keys, frequencies, versions) is in GPU
//     memory, its rows in pinned, mapped host memory (pinned_host_storage_allocator()), which
//     kernels read and write directly.
// Every row is in exactly one tier and travels whole (values, slots, frequency, version), by one
// kernel per batch that probes the source, claims the slot in the destination and erases the
// source slot. Results equal those of one GpuEmbeddingTable holding every row:
//  - find reads the HBM tier, then overwrites the keys the host tier holds; it inserts and moves
//    nothing;
//  - find_or_insert, insert_or_assign and apply_gradients first move their keys that the host
//    tier holds up (one launch, no host sync), then run the HBM table's own kernels;
//  - afterwards, when the HBM tier may be over budget, the coldest rows move down in one batch
//    to 7/8 of the budget (hysteresis: demotion is rare). LFU: the lowest frequency; LRU: the
//    oldest version (the step of the last update; rows only looked up count as their last update).
//    The keys of the operation just run stay up (a step's update follows its lookup).
//  - shrink, erase, export, import and size cover both tiers.
// Host syncs: size reads (only when a host-side bound of the HBM rows passes the budget; the
// bound is tightened without a sync from an asynchronous copy of the HBM tier's counter), a
// demotion (it needs the exact row count to size its sort), and whatever the two tables sync
// for themselves (growth, slot relayout, export/import/shrink).
// Calls on one table are serialised by a mutex (the TF glue's resource lock does that anyway).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <mutex>

#include "addons/sparse_operation_kit/core/cuda/gpu_api.h"
#include "addons/sparse_operation_kit/core/table.h"

namespace sok {
namespace gpu {

template <typename K>
class GpuTieredTable final : public Table<K> {
 public:
  // config.storage must be kHbmDram and config.hbm_bytes hold at least one row. options give
  // the HBM tier's allocators and the host tier's temporaries and index; the host tier's rows
  // always come from pinned_host_storage_allocator().
  static Status Create(const TableConfig& config, const GpuTableOptions& options,
                       std::unique_ptr<GpuTieredTable>* out);
  // No HBM tier: every row in host memory, every call on the host tier (HierarchicalKV-style
  // host-resident values without a cache; a baseline for tests and benchmarks, no DeepRec type).
  static Status CreateHostOnly(const TableConfig& config, const GpuTableOptions& options,
                               std::unique_ptr<GpuTieredTable>* out);
  ~GpuTieredTable() override;

  const TableConfig& config() const override { return cfg_; }
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
  Status import_rows(const ExecContext& exec, const TableSnapshot<K>& snapshot) override;

  // Removes the keys from whichever tier holds them; *removed (optional) = how many were present
  // (then it synchronises the stream).
  Status erase(const K* keys, int64_t n, cudaStream_t stream, int64_t* removed = nullptr);

  // Rows per tier (synchronises). hbm_rows is 0 without an HBM tier.
  Status tier_sizes(cudaStream_t stream, int64_t* hbm_rows, int64_t* host_rows);
  // The HBM tier's budget in rows of the current slot layout (0 without an HBM tier).
  int64_t hbm_budget_rows() const;
  // What the tiers did so far (tests, benchmarks).
  struct Stats {
    int64_t promote_launches = 0;  // batches moved up (one launch each)
    int64_t demotions = 0;         // batches moved down
    int64_t demoted_rows = 0;
    int64_t size_syncs = 0;  // host syncs to read the HBM tier's row count
  };
  Stats stats() const;

 private:
  GpuTieredTable() = default;
  Status budget_rows(int num_slots, int64_t* rows) const;
  Status promote(const K* keys, int64_t n, cudaStream_t s);
  Status after_inserts(const K* keys, int64_t n, cudaStream_t s);
  Status demote(int64_t count, const K* keys, int64_t n, cudaStream_t s);
  Status move(GpuEmbeddingTable<K>* from, GpuEmbeddingTable<K>* to, const K* keys, int64_t n,
              cudaStream_t s);
  Status select_victims(int64_t live, int64_t count, const K* keys, int64_t n, K* victims,
                        cudaStream_t s);
  Status ensure_same_slots(const OptimizerParams& p, cudaStream_t s);
  void note_exact(int64_t hbm_rows, int64_t host_rows);
  Status import_split(const TableSnapshot<K>& s, int64_t keep, cudaStream_t stream);

  TableConfig cfg_;
  std::unique_ptr<GpuEmbeddingTable<K>> hot_;   // null: host-only
  std::unique_ptr<GpuEmbeddingTable<K>> cold_;  // rows in pinned host memory
  std::mutex mu_;
  bool cold_empty_ = true;     // the host knows the host tier holds no row (promotion is skipped)
  int64_t hot_bound_ = 0;      // upper bound of the HBM tier's rows
  int64_t* h_live_ = nullptr;  // pinned: an asynchronous copy of the HBM tier's row count
  cudaEvent_t snap_event_ = nullptr;
  bool snap_pending_ = false;
  int64_t since_snap_ = 0;  // keys of the calls enqueued after that copy
  Stats stats_;
};

// The GPU table that config.storage asks for: GpuTable (DRAM) or GpuTieredTable (HBM_DRAM).
template <typename K>
Status new_gpu_table(const TableConfig& config, const GpuTableOptions& options,
                     std::unique_ptr<Table<K>>* out);

}  // namespace gpu
}  // namespace sok
