// Table<K>: what the framework glue needs of an embedding table, wherever its rows live. One
// interface over the CPU table (EmbeddingTable) and the GPU table (cuda/gpu_api.h's GpuTable), so
// that each TensorFlow kernel is written once for both devices.
//
// Pointers are in the table's memory space (host for the CPU table, device for the GPU table),
// except TableSnapshot, which is always host memory. Every call is ordered on `exec`: the CPU
// table runs on exec.parallel_for, the GPU table enqueues on exec.stream.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "addons/sparse_operation_kit/core/embedding_table.h"
#include "addons/sparse_operation_kit/core/parallel.h"
#include "addons/sparse_operation_kit/core/status.h"
#include "addons/sparse_operation_kit/core/table_config.h"

namespace sok {

struct ExecContext {
  ParallelFor parallel_for = serial_for;  // CPU: the framework's worker pool
  void* stream = nullptr;                 // GPU: the cudaStream_t to enqueue on
};

template <typename K>
class Table {
 public:
  virtual ~Table() = default;
  virtual const TableConfig& config() const = 0;
  int64_t dim() const { return config().dim; }
  const std::string& name() const { return config().name; }

  virtual Status size(const ExecContext& exec, int64_t* out) = 0;
  // Evaluation read: never inserts (embedding_table.h's find).
  virtual Status find(const ExecContext& exec, const K* keys, int64_t n, float* out) = 0;
  // Training read: inserts missing keys, counts frequencies; counts may be null (1 each).
  virtual Status find_or_insert(const ExecContext& exec, const K* keys, int64_t n, float* out,
                                const int64_t* counts) = 0;
  virtual Status insert_or_assign(const ExecContext& exec, const K* keys, int64_t n,
                                  const float* values) = 0;
  virtual Status apply_gradients(const ExecContext& exec, const K* keys, int64_t n,
                                 const float* grads, const OptimizerParams& p, int64_t global_step,
                                 bool keys_unique) = 0;
  // Evicts the rows should_evict() selects; *removed = how many.
  virtual Status shrink(const ExecContext& exec, int64_t global_step, int64_t* removed) = 0;
  virtual Status export_rows(const ExecContext& exec, TableSnapshot<K>* out) = 0;
  // The same rows into arrays the caller allocates a field at a time (the export op's outputs).
  // By default through export_rows (the snapshot, then one field at a time); a table that can
  // fill them from its rows directly overrides it.
  virtual Status export_into(const ExecContext& exec, const AllocateField& allocate) {
    TableSnapshot<K> s;
    Status st = export_rows(exec, &s);
    return st.ok() ? write_snapshot(&s, allocate) : st;
  }
  // Replaces the table's rows with the snapshot's.
  virtual Status import_rows(const ExecContext& exec, const SnapshotView<K>& snapshot) = 0;
  // Adds more rows of the checkpoint that import_rows began: sok.load restores a large table a
  // chunk at a time, so the whole dump never sits in memory beside the table. A key the table
  // holds is an error; the rows take the table's slot layout.
  virtual Status append_rows(const ExecContext& exec, const SnapshotView<K>& snapshot) = 0;
  // Room for `rows` rows without growing (the GPU tables, whose growth holds the old and the new
  // arrays at once); the CPU tables grow in place.
  virtual Status reserve(const ExecContext&, int64_t) { return Status::OK(); }
};

// The CPU table behind the interface.
template <typename K>
class CpuTable final : public Table<K> {
 public:
  explicit CpuTable(TableConfig config) : table_(std::move(config)) {}
  const TableConfig& config() const override { return table_.config(); }
  Status size(const ExecContext&, int64_t* out) override {
    *out = table_.size();
    return Status::OK();
  }
  Status find(const ExecContext& exec, const K* keys, int64_t n, float* out) override {
    table_.find(keys, n, out, exec.parallel_for);
    return Status::OK();
  }
  Status find_or_insert(const ExecContext& exec, const K* keys, int64_t n, float* out,
                        const int64_t* counts) override {
    table_.find_or_insert(keys, n, out, counts, exec.parallel_for);
    return Status::OK();
  }
  Status insert_or_assign(const ExecContext&, const K* keys, int64_t n,
                          const float* values) override {
    table_.insert_or_assign(keys, n, values);
    return Status::OK();
  }
  Status apply_gradients(const ExecContext& exec, const K* keys, int64_t n, const float* grads,
                         const OptimizerParams& p, int64_t global_step, bool keys_unique) override {
    return table_.apply_gradients(keys, n, grads, p, global_step, exec.parallel_for, keys_unique);
  }
  Status shrink(const ExecContext&, int64_t global_step, int64_t* removed) override {
    *removed = table_.shrink(global_step);
    return Status::OK();
  }
  Status export_rows(const ExecContext&, TableSnapshot<K>* out) override {
    *out = table_.export_rows();
    return Status::OK();
  }
  Status export_into(const ExecContext&, const AllocateField& allocate) override {
    return table_.export_into(allocate);
  }
  Status import_rows(const ExecContext&, const SnapshotView<K>& snapshot) override {
    return table_.import_rows(snapshot);
  }
  Status append_rows(const ExecContext&, const SnapshotView<K>& snapshot) override {
    return table_.put_rows(snapshot, key_twice_in_checkpoint);
  }

 private:
  EmbeddingTable<K> table_;
};

}  // namespace sok
