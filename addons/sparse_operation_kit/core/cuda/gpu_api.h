// Public entry points of the CUDA half of the core (framework-free: no TensorFlow header).
//
// Everything here works on DEVICE pointers and is ordered on the caller's cudaStream_t; nothing
// synchronises the host unless its comment says so. Errors (CUDA errors included) come back as
// sok::Status, which the TF glue turns into errors::InvalidArgument / Internal.
//
// The semantics are the CPU core's (embedding_table.h, lookup.h), with the same shapes:
//   GpuEmbeddingTable<K>      ~ EmbeddingTable<K>      (K = int32_t or int64_t; every key legal)
//   unique_keys / pooled_forward / pooled_backward ~ lookup.h
// Differences, all documented where they apply:
//   - export_rows lists the rows in slot order, not insertion order;
//   - with repeated keys in ONE call, insert_or_assign keeps one of the values (CPU: the last) and
//   a
//     counter-filtered find_or_insert may admit a different occurrence than the CPU's serial order;
//   - apply_gradients calls on one table must be ordered by the caller (TF's resource-variable
//     lock does this); find / find_or_insert / insert_or_assign / erase may run concurrently on
//     several streams (erased slots are never reused before a rehash, so probe chains stay
//     intact). import_rows, reserve, growth and the first optimizer step's slot relayout
//     synchronise the device.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "addons/sparse_operation_kit/core/lookup.h"
#include "addons/sparse_operation_kit/core/status.h"
#include "addons/sparse_operation_kit/core/table.h"
#include "addons/sparse_operation_kit/core/table_config.h"

namespace sok {
namespace gpu {

// ---------------------------------------------------------------------------------------------
// Temporary device memory. The default uses the stream-ordered allocator
// (cudaMallocAsync / cudaFreeAsync on the device's default pool, whose release threshold it
// raises so freed memory stays cached); the TF glue can pass one that wraps its own allocator.
class DeviceAllocator {
 public:
  virtual ~DeviceAllocator() = default;
  virtual void* allocate(size_t bytes, cudaStream_t stream) = 0;  // nullptr on failure
  virtual void deallocate(void* p, size_t bytes, cudaStream_t stream) = 0;
  // For out-of-memory errors: how much memory is free (default: the driver's cudaMemGetInfo).
  virtual std::string describe_free_memory();
};
DeviceAllocator* default_allocator();
// Long-lived memory (a table's arrays) from cudaMalloc; frees synchronise the device first.
DeviceAllocator* default_storage_allocator();
// Long-lived pinned host memory, mapped into the device's address space (cudaHostAlloc with
// cudaHostAllocMapped | cudaHostAllocPortable): under unified addressing kernels read and write
// it through the returned pointer, over PCIe / NVLink-C2C. For rows kept in host DRAM.
DeviceAllocator* pinned_host_storage_allocator();

// Turns a CUDA error code into a Status ("<what>: <cuda error string>").
Status cuda_status(cudaError_t e, const char* what);

// ---------------------------------------------------------------------------------------------
// Bad-index reports written by the device (the first bad position wins), read by the host.
struct GpuLookupError {
  int64_t packed;  // device-side: min over (position << 3 | kind); all ones: none
  int64_t
      position;   // index of the offending id (kinds 1, 2) or row_splits entry (kind 3); -1: none
  int64_t value;  // the offending id / row / segment / row split
  int64_t kind;   // 1: id out of [0, num_rows); 2: segment out of [0, batch); 3: bad row split
  int64_t blocks_done;  // device-side counter of the fused checks (reset_lookup_error sets it)
};
// One record per call in flight: two calls running at once must not share a record.
// Sets `count` consecutive records to "no error" (position = -1), ordered on `stream`.
Status reset_lookup_error(GpuLookupError* d_err, cudaStream_t stream, int count = 1);
// Synchronises `stream` and returns Invalid("<what[i]>: id <v> at position <p> ...") for the
// first of the what.size() consecutive records that holds an error (one copy, one sync).
Status check_lookup_errors(const GpuLookupError* d_err, const std::vector<std::string>& what,
                           cudaStream_t stream);

// ---------------------------------------------------------------------------------------------
// Which sample each id belongs to: exactly one of the two is set.
//   segment_ids[n]     SparseTensor layout (row of each id; sorted or not; sorted is fastest)
//   row_splits[batch+1] RaggedTensor layout (ids of sample b are [row_splits[b], row_splits[b+1]))
struct Segments {
  const int64_t* segment_ids = nullptr;
  const int64_t* row_splits = nullptr;
};

// Counts given on the device: where a function takes `d_n`, it is an optional device scalar
// (nullptr: use n) giving the real count <= n, so stages can follow unique_keys without a host
// round trip. Buffers are sized by the host bound n.

// unique[0..U) = distinct keys in order of first appearance, inverse[i] = their position of
// keys[i], counts[u] = occurrences (counts may be null), *d_num_unique = U (device scalar).
// unique and inverse hold n entries; counts n entries.
template <typename K>
Status unique_keys(const K* keys, int64_t n, K* unique, int32_t* inverse, int64_t* counts,
                   int64_t* d_num_unique, cudaStream_t stream, DeviceAllocator* alloc = nullptr);

// The dedup and input checks of every table of a lookup at once (the per-table unique_keys and
// lookup.h's check_positions, same results), in one set of launches per key dtype: one set over
// (table, key) for all tables of a dtype, one scan. Device pointers; unique, inverse and counts
// hold n entries (counts may be null).
struct UniqueTable {
  bool keys_int64 = true;  // keys and unique are int64_t (else int32_t)
  const void* keys = nullptr;
  int64_t n = 0;
  void* unique = nullptr;
  int32_t* inverse = nullptr;
  int64_t* counts = nullptr;
  // Optional: the ids' positions[n, rank] (device) within dense_shape[rank] (HOST memory);
  // positions == nullptr: no checks.
  const int64_t* positions = nullptr;
  int rank = 0;
  const int64_t* dense_shape = nullptr;
};
// What the host reads back per table (one copy for all tables).
struct UniqueTableReport {
  int64_t num_unique;
  int64_t first_outside;    // lookup.h's PositionsCheck, -1: none
  int64_t first_unordered;  // -1: none
};
// Bytes of the pinned host staging buffer unique_keys_multi may use for its per-table arguments.
size_t unique_keys_multi_staging_bytes(const std::vector<UniqueTable>& tables);
// d_reports[i] gets table i's report. host_staging: pinned host memory of
// unique_keys_multi_staging_bytes(tables) bytes that stays valid until the stream has passed the
// call (then the argument upload is asynchronous), or nullptr (pageable: the driver may wait for
// the stream before copying). Ids beyond 2^31 - 2 in the tables of one dtype are refused.
Status unique_keys_multi(const std::vector<UniqueTable>& tables, UniqueTableReport* d_reports,
                         cudaStream_t stream, DeviceAllocator* alloc = nullptr,
                         void* host_staging = nullptr);

// lookup.h's stable_sample_order for several tables at once: one radix sort of (table, sample)
// keys for all of them (split only when table and sample bits pass 64). Every sample must be in
// [0, num_samples) (check_positions passed). The argument upload is from pageable memory.
struct SampleOrderTable {
  const int64_t* positions = nullptr;  // [n, rank], device
  int64_t n = 0;
  int rank = 1;
  int64_t num_samples = 0;   // dense_shape[0]
  int32_t* order = nullptr;  // [n], device
};
Status stable_sample_order_multi(const std::vector<SampleOrderTable>& tables, cudaStream_t stream,
                                 DeviceAllocator* alloc = nullptr);

// valid[t] = d_reports[t].num_unique, or -1 where table t's positions were outside their dense
// shape (core/exchange.h: the plan then flags the call as bad), for t < n (device).
Status unique_valid_counts(const UniqueTableReport* d_reports, int n, int64_t* valid,
                           cudaStream_t stream);

// out[batch, dim] = combine over the ids of sample b of weights[i] * rows[inverse[i]]
// (lookup.h's pooled_forward). weights may be null. Samples without ids read zeros, a zero weight
// sum gives zeros. Bad segment ids / row splits / inverse entries are reported through d_err
// (optional) and skipped, never read out of bounds; num_rows bounds inverse.
Status pooled_forward(const float* rows, int64_t dim, int64_t num_rows, const int32_t* inverse,
                      Segments seg, const float* weights, int64_t n, int64_t batch,
                      Combiner combiner, float* out, cudaStream_t stream,
                      GpuLookupError* d_err = nullptr, DeviceAllocator* alloc = nullptr);

// grad_rows[num_rows, dim] = d(loss)/d(rows) (lookup.h's pooled_backward), one deterministic
// sum per row (ids in ascending order, long rows split in fixed chunks). Rows no id reads are
// zero. d_num_rows (optional device scalar <= num_rows) limits the rows written.
Status pooled_backward(const float* grad_out, int64_t dim, const int32_t* inverse, Segments seg,
                       const float* weights, int64_t n, int64_t batch, Combiner combiner,
                       int64_t num_rows, const int64_t* d_num_rows, float* grad_rows,
                       cudaStream_t stream, DeviceAllocator* alloc = nullptr);

// The same gradient summed with atomics (segment_ids layout): a few launches instead of a sort,
// but the order of the additions into a row varies between runs, as in TensorFlow's own GPU
// unsorted_segment_sum. The TF glue uses it unless op determinism is required. Bad segment ids or
// rows are skipped.
Status pooled_backward_unordered(const float* grad_out, int64_t dim, const int32_t* inverse,
                                 const int64_t* segment_ids, const float* weights, int64_t n,
                                 int64_t batch, Combiner combiner, int64_t num_rows,
                                 float* grad_rows, cudaStream_t stream,
                                 DeviceAllocator* alloc = nullptr);

// ---------------------------------------------------------------------------------------------
// Many tables in one call, for segment ids the caller has checked to lie in [0, batch) (the TF
// glue's segments_checked) or dense tables: no error record, no host synchronisation. Device
// pointers, host sizes. Entries that are still out of range (an order entry, a row, a segment
// id) are skipped or give a wrong range, never read or written out of bounds.
struct PooledTable {
  const float* src = nullptr;  // forward: rows [num_rows, dim]; backward: grad_out [batch, dim]
  float* out = nullptr;        // forward: [batch, dim]; backward: grad_rows [num_rows, dim]
  const int32_t* inverse = nullptr;  // [n]: row of each id
  // [n]: sample of each id. null: a dense table, k = n / batch ids per sample (id i belongs to
  // sample i / k; n must be a multiple of batch, and there is no order).
  const int64_t* segment_ids = nullptr;
  // Words between the samples of consecutive ids: 1, or the rank of SparseTensor indices
  // [n, rank] passed as they are (column 0 is the sample), which saves a column copy.
  int32_t segment_stride = 1;
  // null: segment_ids are non-decreasing; else [n], the ids listed in sample order (stable).
  const int32_t* order = nullptr;
  const float* weights = nullptr;  // [n] or null (all 1)
  int64_t n = 0, batch = 0, num_rows = 0, dim = 0;
  Combiner combiner = Combiner::kSum;
  // null: row r at src (forward) or out (backward) + r * dim. Else [num_rows]: the float where
  // row r starts in src / out, -1 for none (reads zeros, takes no gradient): the rows as the
  // exchange returned them, every table in one buffer (core/exchange.h's row_at), read in place.
  // The backward leaves zeroing such an out to the caller (the tables share it).
  const int64_t* row_at = nullptr;
  bool row_at_x4 = false;  // every row_at entry is a multiple of 4 (float4 access)
};

// pooled_forward for every table: one launch (per 29 tables) after one that finds where each
// sample's ids start (sparse tables only, into a temporary of alloc; nullptr: the default).
Status pooled_forward_multi(const PooledTable* tables, int count, cudaStream_t stream,
                            DeviceAllocator* alloc = nullptr);

// pooled_backward_unordered for every table (atomics: the order of the additions varies between
// runs): launches as in pooled_forward_multi, plus one zeroing every grad_rows.
Status pooled_backward_multi_unordered(const PooledTable* tables, int count, cudaStream_t stream,
                                       DeviceAllocator* alloc = nullptr);

// row_splits[batch + 1] = b * per_sample: a dense table's samples in the row_splits layout (for
// pooled_backward's deterministic sums).
Status dense_row_splits(int64_t batch, int64_t per_sample, int64_t* row_splits,
                        cudaStream_t stream);

// ---------------------------------------------------------------------------------------------
struct GpuTableOptions {
  // Grow (rehash into twice the capacity) before live + erased slots would pass this fraction.
  // The host keeps an upper bound of the size (+n per call that may insert) and only reads the
  // exact size (a stream sync; a device sync if several streams were used) once that bound
  // passes the threshold, so calls stay asynchronous while the table has headroom.
  double max_load_factor = 0.75;
  DeviceAllocator* allocator = nullptr;  // temporaries; nullptr: default_allocator()
  // The table's own arrays (slots, rows, counters); nullptr: default_storage_allocator(). The
  // TF glue passes TensorFlow's allocator of the device, so tables share its memory reservation.
  DeviceAllocator* storage = nullptr;
  // The rows (values and optimizer slots), the bulk of a table; nullptr: `storage`. With
  // pinned_host_storage_allocator() the rows live in host DRAM while the index (digests, keys,
  // frequencies, versions) stays in GPU memory: HierarchicalKV's host-resident values.
  DeviceAllocator* row_storage = nullptr;
  // export_rows and import_rows move rows through device buffers of at most this many bytes
  // (a table whose rows live in host memory can be larger than the GPU).
  int64_t transfer_chunk_bytes = int64_t{256} << 20;
  // > 0: the rows live in a pool of this many rows apart from the index (a tiered table's HBM
  // tier, whose row budget it is), so the index's spare slots cost no row memory; an insert
  // past the pool fails. At most 2^31 - 1.
  int64_t pool_rows = 0;
  // The rows live in a pool that grows by half before an insert could find it empty, starting
  // at max(pool_rows, initial_capacity) rows: 1 to 1.5 rows a key instead of a row per index
  // slot (1.3 to 2.7 a key). A growth adds a block of rows (a device sync; no row is copied).
  // A tiered table's host tier uses it.
  bool grow_pool = false;
  // The host tier's rows (GpuTieredTable); nullptr: pinned_host_storage_allocator().
  DeviceAllocator* host_row_storage = nullptr;
};

template <typename K>
class GpuTieredTable;
namespace detail {
struct FirstTier;
}  // namespace detail

// A hash table from key to row [value(dim) | optimizer slots (num_slots x dim)] in the memory of
// the device current at Create(). Buckets of 32 slots: one digest byte per slot (0 empty,
// 1 erased, 2 being written, 3..255 hash digest) keeps occupancy apart from the key, so every
// key value is legal; keys, frequencies, versions and rows live in parallel arrays.
template <typename K>
class GpuEmbeddingTable {
 public:
  static Status Create(const TableConfig& config, const GpuTableOptions& options,
                       std::unique_ptr<GpuEmbeddingTable>* out);
  ~GpuEmbeddingTable();
  GpuEmbeddingTable(const GpuEmbeddingTable&) = delete;
  GpuEmbeddingTable& operator=(const GpuEmbeddingTable&) = delete;

  const TableConfig& config() const;
  int64_t dim() const;
  int num_slots() const;
  int64_t capacity() const;  // slots

  // Number of keys; synchronises `stream` (and the device if other streams were used).
  Status size(int64_t* out, cudaStream_t stream);
  // How often the table has waited on a stream to read its counters (size, growth, shrink,
  // export): steady lookups and updates of known keys should not add to it.
  int64_t host_syncs() const;

  // One table's keys in a call over several tables (find_or_insert_many, apply_gradients_many).
  struct Keys {
    GpuEmbeddingTable* table = nullptr;
    const K* keys = nullptr;
    int64_t n = 0;
    float* out = nullptr;             // find_or_insert: [n, dim] or null
    const int64_t* counts = nullptr;  // find_or_insert: or null (1 each)
    const float* grads = nullptr;     // apply_gradients: [n, dim]
    const int64_t* d_n = nullptr;     // optional device count <= n
    // Tiered tables (GpuTieredTable): a table of the same row layout, probed first. The keys it
    // holds are served there in place (read, counted, updated); it never gets a new key. The
    // caller keeps it from changing during the call.
    const GpuEmbeddingTable* probe_first = nullptr;
    // Optional device counters [2]: += the keys served by probe_first / by this table.
    int64_t* tier_counts = nullptr;
  };

  // Read-only lookup: out[n, dim]. Missing keys read their initial value (initializer.h) or,
  // under a counter filter, default_value_no_permission (also for keys not yet admitted).
  Status find(const K* keys, int64_t n, float* out, cudaStream_t stream,
              const int64_t* d_n = nullptr);

  // Training lookup: inserts missing keys (initialised on the device, one row per key even when
  // the batch repeats a key or another stream inserts it at once) and adds counts[i] (1 when
  // counts is null) to each key's frequency. out may be null (insert/count only).
  Status find_or_insert(const K* keys, int64_t n, float* out, const int64_t* counts,
                        cudaStream_t stream, const int64_t* d_n = nullptr);

  // find_or_insert of every entry in few launches (one per 32 tables; an entry whose table is
  // already in the launch starts the next one): the results of one call per entry, in order.
  // All tables on one device.
  static Status find_or_insert_many(const std::vector<Keys>& calls, cudaStream_t stream);

  // Overwrites the values (inserting missing keys, slots at their initial value). probe_first:
  // as in Keys.
  Status insert_or_assign(const K* keys, int64_t n, const float* values, cudaStream_t stream,
                          const GpuEmbeddingTable* probe_first = nullptr);

  // Evicts the rows should_evict() selects (table_config.h); *removed = how many (synchronises).
  Status shrink(int64_t global_step, cudaStream_t stream, int64_t* removed);

  // Removes the keys. *num_erased (host, optional) gets how many were present (then it
  // synchronises `stream`).
  Status erase(const K* keys, int64_t n, cudaStream_t stream, int64_t* num_erased = nullptr);

  // One optimizer step (optimizer.h) on the given keys, grads[n, dim]. Repeated keys are summed
  // first (skipped when keys_unique); missing keys are inserted; keys not admitted by the counter
  // filter are skipped; updated rows get version = global_step. Slots are created on first use.
  Status apply_gradients(const K* keys, int64_t n, const float* grads, const OptimizerParams& p,
                         int64_t global_step, cudaStream_t stream, bool keys_unique = false,
                         const int64_t* d_n = nullptr);

  // apply_gradients of every entry (the same optimizer and step), launched as in
  // find_or_insert_many. keys_present: the caller vouches that an earlier find_or_insert on this
  // stream inserted every key (lookup_sparse's keys of the same step): no room is reserved for
  // them, so the growth bound does not count them twice (a key evicted since is still inserted).
  static Status apply_gradients_many(const std::vector<Keys>& calls, const OptimizerParams& p,
                                     int64_t global_step, cudaStream_t stream,
                                     bool keys_unique = false, bool keys_present = false);

  // Everything, in slot order, to host memory (synchronises); append: after out's rows (the
  // same slot layout; room reserved in out spares a copy of them), else replacing them.
  Status export_rows(TableSnapshot<K>* out, cudaStream_t stream, bool append = false);
  // Everything, in slot order, into out's rows from `at` on (host memory; synchronises);
  // *count: how many. Rows past out.n (the table grew since it was sized) are an error.
  Status export_to(const SnapshotArrays<K>& out, int64_t at, int64_t* count, cudaStream_t stream);
  int slot_kind() const;  // OptimizerKind owning the slots; -1 none
  const std::vector<float>& slot_init() const;
  // Replaces the whole content (synchronises); same checks as the CPU table. pick: only those
  // rows of the snapshot, in that order (a tiered import's split).
  Status import_rows(const SnapshotView<K>& snapshot, cudaStream_t stream,
                     const std::vector<int64_t>* pick = nullptr);
  // Tiered tables' row batches (GpuTieredTable's SSD tier). export_keys: the rows of those of
  // keys[0, n) (device) it holds, to host memory (synchronises). put_rows: adds rows of keys it
  // lacks, whole (slots, frequencies, versions; the table's slot layout), growing as needed
  // (synchronises); a key it holds already is an error.
  Status export_keys(const K* keys, int64_t n, TableSnapshot<K>* out, cudaStream_t stream);
  Status put_rows(const SnapshotView<K>& rows, cudaStream_t stream);

  // Makes room for `num_keys` keys without growing later (synchronises the device if it grows).
  Status reserve(int64_t num_keys, cudaStream_t stream);

  struct Impl;

 private:
  friend class GpuTieredTable<K>;  // moves rows between two tables' arrays
  GpuEmbeddingTable();
  // Each call's probe_first as the kernels see it (checks that the row layouts match).
  static Status first_tiers(const std::vector<Keys>& calls, std::vector<detail::FirstTier>* out);
  std::unique_ptr<Impl> impl_;
};

// The GPU table behind the framework-neutral interface (table.h).
template <typename K>
class GpuTable final : public Table<K> {
 public:
  explicit GpuTable(std::unique_ptr<GpuEmbeddingTable<K>> table) : t_(std::move(table)) {}
  const TableConfig& config() const override { return t_->config(); }
  Status size(const ExecContext& e, int64_t* out) override { return t_->size(out, s(e)); }
  Status find(const ExecContext& e, const K* keys, int64_t n, float* out) override {
    return t_->find(keys, n, out, s(e));
  }
  Status find_or_insert(const ExecContext& e, const K* keys, int64_t n, float* out,
                        const int64_t* counts) override {
    return t_->find_or_insert(keys, n, out, counts, s(e));
  }
  Status insert_or_assign(const ExecContext& e, const K* keys, int64_t n,
                          const float* values) override {
    return t_->insert_or_assign(keys, n, values, s(e));
  }
  Status apply_gradients(const ExecContext& e, const K* keys, int64_t n, const float* grads,
                         const OptimizerParams& p, int64_t global_step, bool keys_unique) override {
    return t_->apply_gradients(keys, n, grads, p, global_step, s(e), keys_unique);
  }
  Status shrink(const ExecContext& e, int64_t global_step, int64_t* removed) override {
    return t_->shrink(global_step, s(e), removed);
  }
  Status export_rows(const ExecContext& e, TableSnapshot<K>* out) override {
    return t_->export_rows(out, s(e));
  }
  // Straight into the caller's arrays (the export op's outputs): no snapshot beside them.
  Status export_into(const ExecContext& e, const AllocateField& allocate) override {
    int64_t n = 0, count = 0;
    Status st = t_->size(&n, s(e));
    SnapshotArrays<K> a;
    if (st.ok())
      st = allocate_snapshot(allocate, n, t_->dim(), t_->num_slots(), t_->slot_kind(),
                             t_->slot_init(), &a);
    if (st.ok()) st = t_->export_to(a, 0, &count, s(e));
    if (st.ok() && count != n)
      st = Status::Invalid("table '" + config().name + "' lost rows while it was exported");
    return st;
  }
  Status import_rows(const ExecContext& e, const SnapshotView<K>& snapshot) override {
    return t_->import_rows(snapshot, s(e));
  }
  Status append_rows(const ExecContext& e, const SnapshotView<K>& snapshot) override {
    return t_->put_rows(snapshot, s(e));
  }
  Status reserve(const ExecContext& e, int64_t rows) override { return t_->reserve(rows, s(e)); }
  GpuEmbeddingTable<K>* gpu_table() const { return t_.get(); }

 private:
  static cudaStream_t s(const ExecContext& e) { return static_cast<cudaStream_t>(e.stream); }
  std::unique_ptr<GpuEmbeddingTable<K>> t_;
};

}  // namespace gpu
}  // namespace sok
