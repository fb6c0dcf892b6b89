// SsdRows<K>: the SSD tier under a GPU tiered table (StorageKind::kHbmDramSsdHash,
// cuda/gpu_tiered_table.h): whole rows (values, slots, frequency, version) of a table snapshot's
// layout in an SsdStore (ssd_tier.h). It has no CUDA in it, so the CPU tests cover it; the GPU
// table moves rows through it in host batches:
//  - read() gives the rows of a call's keys that are on file, and remove() forgets them once the
//    host tier holds them (a failed move loses no row);
//  - put() writes the host tier's coldest rows in one write;
//  - find() reads rows for a read-only lookup and moves nothing.
// A row written before the optimizer's first step has fewer slots than the table now has: reads
// give it the layout's slot_init, as a table's own slot relayout does.
// Not thread-safe: the GPU table's lock serialises the calls.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "addons/sparse_operation_kit/core/ssd_tier.h"
#include "addons/sparse_operation_kit/core/table_config.h"

namespace sok {

// Writes a snapshot's rows to the store in one write.
template <typename K>
Status append_snapshot(const TableSnapshot<K>& s, SsdStore* store);

// Appends a record to *s in its layout (slots the record lacks at slot_init); an error naming
// `table` when the record has more slots than the layout.
template <typename K>
Status append_record(const SsdStore::Record& r, const std::string& table, TableSnapshot<K>* s);

// Writes a record as row `at` of arrays of `slot_init.size()` slots a row (slots the record
// lacks at slot_init); the same error as append_record.
template <typename K>
Status write_record(const SsdStore::Record& r, const std::string& table,
                    const std::vector<float>& slot_init, const SnapshotArrays<K>& a, int64_t at);

// Appends to *out (in its layout) the rows on file of keys[0, n), each key once, in the order
// of the keys' first occurrence; `table` names the table in errors. The file is unchanged.
template <typename K>
Status read_snapshot(const SsdStore& store, const K* keys, int64_t n, const std::string& table,
                     TableSnapshot<K>* out);

template <typename K>
class SsdRows {
 public:
  // A store in a new directory below config.storage_path, removed with the store.
  static Status Open(const TableConfig& config, std::unique_ptr<SsdRows>* out);

  int64_t size() const { return store_->size(); }
  const std::string& dir() const { return store_->dir(); }

  // Appends to *out (in its layout) the rows of the keys on file, each key once. The file is
  // unchanged.
  Status read(const K* keys, int64_t n, TableSnapshot<K>* out) const;
  // The rows of keys[0, n) on file as a read-only lookup reads them (a row the counter filter has
  // not admitted reads default_value_no_permission): *pos their positions in keys, *rows dim
  // floats each.
  Status find(const K* keys, int64_t n, std::vector<int64_t>* pos, std::vector<float>* rows) const;
  // Writes the rows in one write (a key already on file is replaced).
  Status put(const TableSnapshot<K>& rows);
  // Forgets the keys; *removed (optional) = how many were on file.
  Status remove(const K* keys, int64_t n, int64_t* removed = nullptr);
  // Removes the rows should_evict() selects (table_config.h).
  Status shrink(int64_t global_step, int64_t* removed);
  // Appends every row to *out (in its layout), in file order.
  Status export_rows(TableSnapshot<K>* out) const;
  Status clear() { return store_->clear(); }

 private:
  SsdRows(TableConfig config, std::unique_ptr<SsdStore> store)
      : cfg_(std::move(config)), store_(std::move(store)) {}
  Status compact() { return store_->maybe_compact(cfg_.ssd_compact_min_bytes); }

  TableConfig cfg_;
  std::unique_ptr<SsdStore> store_;
};

}  // namespace sok
