// GpuTieredTable<K>: a GPU table over two tiers (StorageKind::kHbmDram, DeepRec's HBM_DRAM), or
// three with a file under them (kHbmDramSsdHash, HBM_DRAM_SSDHASH: the end of this comment); the
// GPU mirror of core/tiered_table.h. Two GpuEmbeddingTables with the same layout:
//   - the HBM tier caches the most used rows within config.hbm_bytes (rows counted as
//     tier_policy.h's tier_row_bytes: values, slots and 32 bytes of metadata). Its rows live in
//     a pool of exactly the budget's rows (GpuTableOptions::pool_rows); its index, sized for
//     twice the budget and never grown, has 2.7 to 5.3 slots a row of 29 bytes each (digest,
//     key, frequency, version, pool row);
//   - the host tier holds the rest; its index (digests, keys, frequencies, versions, pool rows)
//     and its pool's free list are in GPU memory, its rows in pinned, mapped host memory
//     (pinned_host_storage_allocator()), which kernels read and write directly. The rows live in
//     a pool that grows by half as keys arrive (GpuTableOptions::grow_pool): 1 to 1.5 rows a
//     key, however many slots the index has; a growth adds a block and moves no row.
// Every row is in exactly one tier and travels whole (values, slots, frequency, version), by one
// kernel per batch that probes the source, claims the slot in the destination and erases the
// source slot.
//
// Rows are served IN PLACE, in whichever tier holds them: a step's working set can be many times
// the cache (uniform ids), and moving every touched row up and the coldest back down each call
// cost more PCIe traffic and host syncs than reading the missing rows over PCIe once. The table's
// own kernels do every op (so results equal one GpuEmbeddingTable's to the bit), with the other
// tier probed first (GpuEmbeddingTable::Keys::probe_first: served in place, never inserted into):
//  - find reads the HBM tier, then overwrites the rows the host tier holds; it inserts nothing;
//  - find_or_insert, insert_or_assign and apply_gradients: one launch, shared by every table of
//    a fused call (find_or_insert_many, apply_gradients_many). While the HBM tier surely has
//    room for every key of the call (a host-side upper bound of its rows), new keys go there
//    (host tier probed first); else to the host tier (HBM tier probed first). One tier inserts
//    per call, so a key repeated in a call meets one slot. apply_gradients updates the rows in
//    host memory in a second launch that does nothing else (host_row_jobs.cuh): more of those
//    PCIe round trips are in flight.
// Placement is a separate, bounded pass after each apply_gradients (after find_or_insert and
// insert_or_assign only while the table has seen no apply_gradients: inference), over that
// call's keys, planned and run on the device with no host sync, every table of a fused call in
// the same 9 launches (tier_moves.cuh, plan_moves_many and move_rows_many):
//  - promotion into room: the call's host-tier rows move up while the HBM tier is under budget;
//  - swaps: a histogram of the HBM rows' heat (LFU: frequency; LRU: recency, now - version, with
//    now the latest global step; log scale, 4 bins an octave) gives the threshold under which
//    max_swaps HBM rows lie; up to max_swaps of the call's host-tier rows hotter than it swap
//    with as many HBM rows at or below it (those go down first). A row comes up only when
//    strictly hotter than each row it replaces, so a working set larger than the cache cannot
//    thrash: at most max_swaps (an eighth of the budget) rows each way per pass.
// Budget rule: after every call the HBM tier holds at most hbm_budget_rows() rows (the tier
// inserts only under the bound above, promotion takes device-side tokens of the room left, swaps
// are one for one). When the first optimizer step adds slots and so lowers the budget in rows,
// the coldest rows over it move down in one sorted batch (a host sync; once per table) and the
// HBM tier's hash table shrinks, both before the rows widen.
// shrink, erase, export, import and size cover both tiers.
// Host syncs: that relayout demotion, and whatever the two tables sync for themselves (growth,
// slot relayout, export/import/shrink, a rehash that drops erased slots).
//
// StorageKind::kHbmDramSsdHash (HBM_DRAM_SSDHASH) adds an SSD tier under the host tier: an
// SsdRows (core/ssd_rows.h, no CUDA) in a directory of its own below config.storage_path, removed
// with the table. Kernels cannot read a file, so rows on file move, whole, in host batches:
//  - before find_or_insert, insert_or_assign and apply_gradients, while the file holds rows, the
//    call's keys are copied to the host (one sync) and their rows on file move into the host
//    tier (slots, frequency, version); the call then runs as above;
//  - find overwrites the output rows of keys on file with their rows (counter filter applied)
//    and moves and inserts nothing;
//  - after such a call, once an upper bound of the host tier's rows passes its budget
//    (config.dram_bytes, rows as tier_row_bytes()), its row count is read (a sync) and, when
//    over, its coldest rows (LFU: frequency; LRU: version; the call's keys last) go to the file
//    in one batch (exported, written, then erased: a failed write loses no row), down to
//    tier_low_watermark() of the budget, so the batches are rare. After a find_or_insert of a
//    trained table the limit and the watermark are raised by the call's keys: the update that
//    follows needs those rows, which would otherwise cross the file twice a step whenever a
//    step's keys outnumber the budget; the update's demotion then brings the tier within it;
//  - the tables of a fused call do their file work (reads, writes, removals; each table has its
//    own file) on parallel host threads (parallel.h's parallel_each).
// shrink, erase, export (HBM rows, host rows, then the file's), import (the hottest rows into
// HBM, the next ones into host memory, the rest on file) and size cover the file too.
// Calls on one table are serialised by a mutex (the TF glue's resource lock does that anyway);
// the device work of two calls must also be ordered (one stream, or the caller's events): the
// placement passes share their device buffers.
#pragma once

#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "addons/sparse_operation_kit/core/cuda/gpu_api.h"
#include "addons/sparse_operation_kit/core/ssd_rows.h"
#include "addons/sparse_operation_kit/core/table.h"

namespace sok {
namespace gpu {
namespace detail {
struct PlanRule;
struct PlanScratch;
template <typename K>
struct KeySpan;
template <typename K>
struct MovePart;
}  // namespace detail

template <typename K>
class GpuTieredTable final : public Table<K> {
 public:
  // config.storage must be kHbmDram or kHbmDramSsdHash, config.hbm_bytes (and for the SSD tier
  // config.dram_bytes) hold at least one row. options give the HBM tier's allocators and the
  // host tier's temporaries and index; the host tier's rows come from
  // options.host_row_storage (default pinned_host_storage_allocator()).
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
  Status export_into(const ExecContext& exec, const AllocateField& allocate) override;
  Status import_rows(const ExecContext& exec, const SnapshotView<K>& snapshot) override;
  // Into the host tier (the HBM tier keeps the first chunk's hottest rows; placement passes
  // promote later), past its budget to the file.
  Status append_rows(const ExecContext& exec, const SnapshotView<K>& snapshot) override;
  // The host tier's index, for every row (without an SSD tier, which bounds the host tier).
  Status reserve(const ExecContext& exec, int64_t rows) override;

  // One table's keys in a call over several tiered tables, as GpuEmbeddingTable<K>::Keys.
  struct Call {
    GpuTieredTable* table = nullptr;
    const K* keys = nullptr;
    int64_t n = 0;
    float* out = nullptr;             // find_or_insert: [n, dim] or null
    const int64_t* counts = nullptr;  // find_or_insert: or null (1 each)
    const float* grads = nullptr;     // apply_gradients: [n, dim]
    const int64_t* d_n = nullptr;     // optional device count <= n (no host sync to read it)
  };
  // find_or_insert / apply_gradients of every call: the tiers' kernels of all calls in the
  // fused launches of GpuEmbeddingTable<K>'s _many calls, then each table's placement pass. A
  // TF op of 26 tables thus costs a few launches plus the passes, not 26 separate calls.
  // keys_present: as in GpuEmbeddingTable<K>::apply_gradients_many.
  static Status find_or_insert_many(const std::vector<Call>& calls, cudaStream_t stream);
  static Status apply_gradients_many(const std::vector<Call>& calls, const OptimizerParams& p,
                                     int64_t global_step, cudaStream_t stream, bool keys_unique,
                                     bool keys_present = false);
  // find with an optional device count of the keys (d_n, as in Call).
  Status find(const K* keys, int64_t n, float* out, cudaStream_t stream, const int64_t* d_n);

  // Removes the keys from whichever tier holds them; *removed (optional) = how many were present
  // (then it synchronises the stream).
  Status erase(const K* keys, int64_t n, cudaStream_t stream, int64_t* removed = nullptr);

  // Rows per tier (synchronises). hbm_rows is 0 without an HBM tier, ssd_rows (optional) 0
  // without an SSD tier.
  Status tier_sizes(cudaStream_t stream, int64_t* hbm_rows, int64_t* host_rows,
                    int64_t* ssd_rows = nullptr);
  // The HBM tier's budget in rows of the current slot layout (0 without an HBM tier).
  int64_t hbm_budget_rows() const;
  // The host tier's budget in rows of the current slot layout (0 without an SSD tier: unbounded).
  int64_t dram_budget_rows() const;
  // The SSD tier's directory ("" without one).
  std::string ssd_dir() const { return ssd_ ? ssd_->dir() : std::string(); }
  // What the tiers did so far (tests, benchmarks). Reads device counters: synchronises the
  // device; not while a call runs.
  struct Stats {
    int64_t placement_passes = 0;  // placement passes launched (plan, then moves)
    int64_t promoted_rows = 0;     // rows moved up (into room or by swaps)
    int64_t demoted_rows = 0;      // rows moved down (swaps and over-budget demotions)
    int64_t budget_demotions = 0;  // over-budget demotions (slot relayout; a host sync each)
    int64_t size_syncs = 0;        // host syncs to read the HBM tier's row count
    // Keys of find_or_insert and apply_gradients, by the tier that served them in place.
    int64_t hbm_keys = 0;
    int64_t host_keys = 0;
    // The SSD tier: host copies of a call's keys, rows moved up from the file into the host
    // tier and down to it, batches written.
    int64_t ssd_key_syncs = 0;
    int64_t ssd_promoted_rows = 0;
    int64_t ssd_demoted_rows = 0;
    int64_t ssd_batches = 0;
    // Host time (microseconds) in the SSD tier's moves, and in their file work alone (the
    // tables' reads, writes and removals, run in parallel).
    int64_t ssd_host_us = 0;
    int64_t ssd_file_us = 0;
  };
  Stats stats() const;

 private:
  using Keys = typename GpuEmbeddingTable<K>::Keys;
  using Span = detail::KeySpan<K>;
  // d_counts_: [0, 2) tier_counts while the HBM tier inserts (host tier probed first),
  // [2, 4) while the host tier inserts, then rows promoted, rows demoted.
  enum Count { kFillCounts = 0, kSpillCounts = 2, kPromoted = 4, kDemoted = 5, kNumCounts = 6 };

  GpuTieredTable() = default;
  // Runs fn(begin, end) on consecutive groups of calls in which each table appears once, holding
  // the group's table mutexes (taken in address order: overlapping calls cannot deadlock).
  template <typename Fn>
  static Status for_each_group(const std::vector<Call>& calls, Fn&& fn);
  Status budget_rows(int num_slots, int64_t* rows) const;
  Status alloc_policy_buffers();
  Status route(const Span& keys, cudaStream_t s, Keys* call);
  static Status after_update(const std::vector<Call>& calls, size_t begin, size_t end,
                             bool inference_only, cudaStream_t s);
  static Status place_many(const std::vector<GpuTieredTable*>& tables,
                           const std::vector<Span>& keys, cudaStream_t s);
  void refresh_floor();
  Status prepare_update(const OptimizerParams& p, int64_t global_step, const Span& keys,
                        cudaStream_t s);
  Status fit_budget(int num_slots, const Span& keys, cudaStream_t s);
  Status fit_capacity(int64_t cap, cudaStream_t s);
  Status demote(int64_t live, int64_t count, const Span& keys, cudaStream_t s);
  static Status move_many(const std::vector<GpuEmbeddingTable<K>*>& from,
                          const std::vector<GpuEmbeddingTable<K>*>& to,
                          std::vector<detail::MovePart<K>> parts, cudaStream_t s);
  Status select_victims(int64_t live, int64_t count, const Span& keys, K* victims, cudaStream_t s);
  Status ensure_same_slots(const OptimizerParams& p, cudaStream_t s);
  void note_exact(int64_t hbm_rows, int64_t host_rows);
  Status import_split(const SnapshotView<K>& s, int64_t keep, int64_t keep_host,
                      cudaStream_t stream);
  // The SSD tier (the header comment's end).
  Status dram_rows(int num_slots, int64_t* rows) const;
  Status keys_on_host(const Span& keys, cudaStream_t s, std::vector<K>* out);
  static Status from_ssd_calls(const std::vector<Call>& calls, size_t begin, size_t end,
                               cudaStream_t s);
  static Status from_ssd_many(const std::vector<GpuTieredTable*>& tables,
                              const std::vector<Span>& keys, cudaStream_t s);
  Status find_ssd(const Span& keys, float* out, cudaStream_t s);
  static Status to_ssd_many(const std::vector<GpuTieredTable*>& tables,
                            const std::vector<Span>& keys, const std::vector<int64_t>& slack,
                            cudaStream_t s);
  using Clock = std::chrono::steady_clock;
  static void note_ssd_time(GpuTieredTable* t, Clock::time_point t0, Clock::time_point t1,
                            Clock::time_point t2);
  Status select_cold_victims(int64_t live, int64_t count, const Span& keys, K* victims,
                             cudaStream_t s);

  TableConfig cfg_;
  std::unique_ptr<GpuEmbeddingTable<K>> hot_;   // null: host-only
  std::unique_ptr<GpuEmbeddingTable<K>> cold_;  // rows in pinned host memory
  std::unique_ptr<SsdRows<K>> ssd_;             // null: no SSD tier
  std::mutex mu_;
  bool cold_empty_ = true;  // the host knows the host tier holds no row (nothing to move up)
  int64_t hot_bound_ = 0;   // upper bound of the HBM tier's rows
  // Lower bound of the HBM tier's rows (its row count only falls by erase, shrink and demotion
  // to the budget, which reset this): the room promotion may take is at most budget - it.
  int64_t hot_floor_ = 0;
  // Upper bound of the host tier's rows (SSD tier only): past the DRAM budget, the exact count is
  // read and the coldest rows go to the file.
  int64_t cold_bound_ = 0;
  int64_t* h_live_ = nullptr;  // pinned: an asynchronous copy of the HBM tier's row count
  cudaEvent_t snap_event_ = nullptr;
  bool snap_pending_ = false;
  bool trained_ = false;  // an apply_gradients ran: placement follows apply_gradients only
  int64_t now_ = 0;       // the latest global step (LRU recency)
  // The placement pass's device buffers (from the HBM tier's storage allocator).
  DeviceAllocator* storage_ = nullptr;
  detail::PlanScratch* d_plan_ = nullptr;
  K* d_up_ = nullptr;  // max_up_ keys
  K* d_swap_in_ = nullptr;
  K* d_victims_ = nullptr;  // max_swaps_ keys each
  int64_t max_up_ = 0, max_swaps_ = 1;
  int64_t* d_counts_ = nullptr;  // kNumCounts
  Stats stats_;
};

// The GPU table that config.storage asks for: GpuTable (DRAM, HBM) or GpuTieredTable (HBM_DRAM,
// HBM_DRAM_SSDHASH).
template <typename K>
Status new_gpu_table(const TableConfig& config, const GpuTableOptions& options,
                     std::unique_ptr<Table<K>>* out);

}  // namespace gpu
}  // namespace sok
