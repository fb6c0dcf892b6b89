// What a table is, independent of where it lives (CPU memory or GPU memory).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <type_traits>
#include <vector>

#include "addons/sparse_operation_kit/core/initializer.h"
#include "addons/sparse_operation_kit/core/optimizer.h"
#include "addons/sparse_operation_kit/core/status.h"

namespace sok {

// Where a table's rows live (DeepRec's StorageOption; numbers are DeepRec's StorageType).
// kDram: every row in memory. kDramSsdHash: every row is in memory or in a file-backed hash
// store (ssd_tier.h); the most used rows stay in memory within dram_bytes (tiered_table.h).
// kHbm (GPU only): every row in GPU memory, the GPU's one-tier table.
// kHbmDram (GPU only): every row is in GPU memory or in pinned host memory; the most used stay in
// GPU memory within hbm_bytes (cuda/gpu_tiered_table.h).
// kHbmDramSsdHash (GPU only): kHbmDram over an SSD store: the host tier keeps its most used rows
// within dram_bytes, the rest are on file (cuda/gpu_tiered_table.h, ssd_rows.h).
enum class StorageKind : int {
  kDram = 1,
  kHbm = 6,
  kDramSsdHash = 12,
  kHbmDram = 13,
  kHbmDramSsdHash = 102
};
// Which rows the memory tier keeps (DeepRec's CacheStrategy numbers).
enum class CacheStrategy : int { kLRU = 0, kLFU = 1 };

inline bool parse_storage_kind(const std::string& name, StorageKind* out) {
  if (name == "DRAM") *out = StorageKind::kDram;
  else if (name == "DRAM_SSDHASH") *out = StorageKind::kDramSsdHash;
  else if (name == "HBM") *out = StorageKind::kHbm;
  else if (name == "HBM_DRAM") *out = StorageKind::kHbmDram;
  else if (name == "HBM_DRAM_SSDHASH") *out = StorageKind::kHbmDramSsdHash;
  else return false;
  return true;
}

// Cached tiers over the lowest one: none for DRAM and HBM, two for HBM_DRAM_SSDHASH, else one.
inline size_t cached_tiers(StorageKind kind) {
  if (kind == StorageKind::kDram || kind == StorageKind::kHbm) return 0;
  return kind == StorageKind::kHbmDramSsdHash ? 2 : 1;
}

// Whether the kind's lowest tier is an SSD store (it then needs storage_path).
inline bool has_ssd_tier(StorageKind kind) {
  return kind == StorageKind::kDramSsdHash || kind == StorageKind::kHbmDramSsdHash;
}

inline bool parse_cache_strategy(const std::string& name, CacheStrategy* out) {
  if (name == "LRU") *out = CacheStrategy::kLRU;
  else if (name == "LFU") *out = CacheStrategy::kLFU;
  else return false;
  return true;
}

struct TableConfig {
  std::string name;  // for error messages
  int64_t dim = 0;
  InitializerSpec init;            // initial value of a newly inserted key
  std::vector<float> init_matrix;  // owns InitKind::kMatrix data ([default_value_dim, dim])
  // Counter filter (DeepRec CounterFilter): a key is admitted once it was looked up in training
  // `filter_freq` times; until then lookups read `default_value_no_permission` and updates skip it.
  int64_t filter_freq = 0;
  float default_value_no_permission = 0.f;
  // Eviction (DeepRec GlobalStepEvict / L2WeightEvict), applied by shrink().
  int64_t steps_to_live = 0;         // 0: never evict by age
  float l2_weight_threshold = -1.f;  // < 0: never evict by norm
  int64_t initial_capacity = 1024;
  // Storage tiers (StorageKind). For kDramSsdHash and kHbmDramSsdHash: the host memory tier's
  // byte budget (a row costs tier_row_bytes(), tier_policy.h), and the existing directory below
  // which the table makes its own directory of files.
  StorageKind storage = StorageKind::kDram;
  std::string storage_path;
  int64_t dram_bytes = 0;
  int64_t hbm_bytes = 0;  // kHbmDram*: the GPU tier's byte budget (rows as tier_row_bytes())
  CacheStrategy cache_strategy = CacheStrategy::kLFU;
  // The SSD store compacts its file once garbage is over half of it and the file is at least
  // this big (tests lower it to see compaction on a few rows).
  int64_t ssd_compact_min_bytes = int64_t{1} << 20;
};

// The eviction rule of shrink() (CPU and GPU tables alike): a row goes when it was last updated
// more than steps_to_live steps ago, or when its value's L2 weight, half its squared L2 norm
// (DeepRec's L2WeightEvict), is under the threshold.
inline bool should_evict(const TableConfig& c, int64_t global_step, int64_t version,
                         const float* value) {
  if (c.steps_to_live > 0 && global_step - version > c.steps_to_live) return true;
  if (c.l2_weight_threshold < 0.f) return false;
  double sq = 0;
  for (int64_t i = 0; i < c.dim; ++i) sq += static_cast<double>(value[i]) * value[i];
  return 0.5 * sq < c.l2_weight_threshold;
}

inline bool evicts_anything(const TableConfig& c) {
  return c.steps_to_live > 0 || c.l2_weight_threshold >= 0.f;
}

// The fields of a snapshot as the checkpoint/export schema names them, in the order
// SokEmbeddingVariableExport outputs them and SokEmbeddingVariableImport takes them (after the
// handle). sparse_operation_kit/runtime/schema.py's EXPORT_FIELDS are the same names
// (test_schema.py).
enum class SnapshotField : int { kKeys, kValues, kSlots, kFreqs, kVersions, kSlotKind, kSlotInit };
inline constexpr const char* kSnapshotFieldNames[] = {"keys",     "values",    "slots",    "freqs",
                                                      "versions", "slot_kind", "slot_init"};
inline constexpr int kNumSnapshotFields =
    static_cast<int>(sizeof(kSnapshotFieldNames) / sizeof(kSnapshotFieldNames[0]));
static_assert(kNumSnapshotFields == static_cast<int>(SnapshotField::kSlotInit) + 1,
              "one name per field");

inline const char* snapshot_field_name(SnapshotField f) {
  return kSnapshotFieldNames[static_cast<int>(f)];
}

// Everything a table holds, in insertion order: what export produces and import consumes.
template <typename K>
struct TableSnapshot {
  int64_t dim = 0;
  int num_slots = 0;
  int slot_kind = -1;            // OptimizerKind that owns the slots; -1 none
  std::vector<float> slot_init;  // initial value of each slot for keys inserted later
  std::vector<K> keys;
  std::vector<float> values;  // [n, dim]
  std::vector<float> slots;   // [n, num_slots, dim]
  std::vector<int64_t> freqs;
  std::vector<int64_t> versions;

  // Room for `rows` rows in all, in this layout: rows appended tier by tier then never copy the
  // snapshot to grow it (it can be most of the host's memory).
  void reserve(int64_t rows) {
    keys.reserve(rows);
    values.reserve(rows * dim);
    slots.reserve(rows * num_slots * dim);
    freqs.reserve(rows);
    versions.reserve(rows);
  }
};

// Where an export writes each field when the caller owns the arrays (the export op's outputs):
// called once per field with its shape ([n], [n, dim], [n, num_slots, dim], [] or [num_slots]),
// returning the field's array. An export with its rows in hand fills the arrays directly, so a
// dump holds no second copy of the table.
using AllocateField =
    std::function<Status(SnapshotField field, const std::vector<int64_t>& shape, void** data)>;

// A snapshot's arrays written in place (the export op's outputs), rows [0, n).
template <typename K>
struct SnapshotArrays {
  int64_t n = 0, dim = 0;
  int num_slots = 0;
  K* keys = nullptr;
  float* values = nullptr;  // [n, dim]
  float* slots = nullptr;   // [n, num_slots, dim]
  int64_t* freqs = nullptr;
  int64_t* versions = nullptr;
};

// Allocates every field of an n-row export through `allocate` and writes its slot kind and the
// slots' initial values; the rows are the caller's to fill.
template <typename K>
Status allocate_snapshot(const AllocateField& allocate, int64_t n, int64_t dim, int num_slots,
                         int32_t slot_kind, const std::vector<float>& slot_init,
                         SnapshotArrays<K>* out) {
  void *keys = nullptr, *values = nullptr, *slots = nullptr, *freqs = nullptr, *versions = nullptr,
       *kind = nullptr, *inits = nullptr;
  const int64_t m = static_cast<int64_t>(slot_init.size());
  Status st = allocate(SnapshotField::kKeys, {n}, &keys);
  if (st.ok()) st = allocate(SnapshotField::kValues, {n, dim}, &values);
  if (st.ok()) st = allocate(SnapshotField::kSlots, {n, num_slots, dim}, &slots);
  if (st.ok()) st = allocate(SnapshotField::kFreqs, {n}, &freqs);
  if (st.ok()) st = allocate(SnapshotField::kVersions, {n}, &versions);
  if (st.ok()) st = allocate(SnapshotField::kSlotKind, {}, &kind);
  if (st.ok()) st = allocate(SnapshotField::kSlotInit, {m}, &inits);
  if (!st.ok()) return st;
  *static_cast<int32_t*>(kind) = slot_kind;
  if (m > 0) std::memcpy(inits, slot_init.data(), sizeof(float) * m);
  *out = SnapshotArrays<K>{n,
                           dim,
                           num_slots,
                           static_cast<K*>(keys),
                           static_cast<float*>(values),
                           static_cast<float*>(slots),
                           static_cast<int64_t*>(freqs),
                           static_cast<int64_t*>(versions)};
  return Status::OK();
}

// An AllocateField that sizes `s`'s vectors to each field's shape: export_into a snapshot.
template <typename K>
AllocateField allocate_into(TableSnapshot<K>* s) {
  return [s](SnapshotField f, const std::vector<int64_t>& shape, void** data) {
    int64_t count = 1;
    for (int64_t d : shape) count *= d;
    const auto sized = [&](auto* v) {
      v->resize(count);
      *data = v->data();
    };
    switch (f) {
      case SnapshotField::kKeys: sized(&s->keys); break;
      case SnapshotField::kValues:
        sized(&s->values);
        s->dim = shape[1];
        break;
      case SnapshotField::kSlots:
        sized(&s->slots);
        s->num_slots = static_cast<int>(shape[1]);
        break;
      case SnapshotField::kFreqs: sized(&s->freqs); break;
      case SnapshotField::kVersions: sized(&s->versions); break;
      case SnapshotField::kSlotKind: *data = &s->slot_kind; break;
      case SnapshotField::kSlotInit: sized(&s->slot_init); break;
    }
    return Status::OK();
  };
}

// Moves a snapshot into the arrays `allocate` gives, a field at a time, freeing each field once
// copied: the peak is the snapshot and one field.
template <typename K>
Status write_snapshot(TableSnapshot<K>* s, const AllocateField& allocate) {
  const int64_t n = static_cast<int64_t>(s->keys.size());
  const int32_t slot_kind = s->slot_kind;
  const auto put = [&](SnapshotField f, std::vector<int64_t> shape, const void* src, size_t bytes) {
    void* dst = nullptr;
    Status st = allocate(f, shape, &dst);
    if (st.ok() && bytes > 0) std::memcpy(dst, src, bytes);
    return st;
  };
  const auto field = [&](SnapshotField f, std::vector<int64_t> shape, auto* v) {
    Status st = put(f, std::move(shape), v->data(), v->size() * sizeof((*v)[0]));
    std::remove_reference_t<decltype(*v)>().swap(*v);
    return st;
  };
  Status st = field(SnapshotField::kKeys, {n}, &s->keys);
  if (st.ok()) st = field(SnapshotField::kValues, {n, s->dim}, &s->values);
  if (st.ok()) st = field(SnapshotField::kSlots, {n, s->num_slots, s->dim}, &s->slots);
  if (st.ok()) st = field(SnapshotField::kFreqs, {n}, &s->freqs);
  if (st.ok()) st = field(SnapshotField::kVersions, {n}, &s->versions);
  if (st.ok()) st = put(SnapshotField::kSlotKind, {}, &slot_kind, sizeof(slot_kind));
  const int64_t inits = static_cast<int64_t>(s->slot_init.size());
  if (st.ok()) st = field(SnapshotField::kSlotInit, {inits}, &s->slot_init);
  return st;
}

// A snapshot's arrays, not owned: what an import reads, from a TableSnapshot (it converts) or
// straight from the import op's input tensors (a table's size less at a load's peak).
template <typename K>
struct SnapshotView {
  int64_t n = 0;  // keys
  int64_t dim = 0;
  int num_slots = 0;
  int slot_kind = -1;
  std::vector<float> slot_init;
  const K* keys = nullptr;
  const float* values = nullptr;  // [n, dim]
  const float* slots = nullptr;   // [n, num_slots, dim]
  const int64_t* freqs = nullptr;
  const int64_t* versions = nullptr;
  // The arrays' lengths as given (check_snapshot compares them with n).
  int64_t values_size = 0, slots_size = 0, freqs_size = 0, versions_size = 0;

  SnapshotView() = default;
  SnapshotView(const TableSnapshot<K>& s)  // NOLINT: implicit, so snapshots pass as they are
      : n(static_cast<int64_t>(s.keys.size())),
        dim(s.dim),
        num_slots(s.num_slots),
        slot_kind(s.slot_kind),
        slot_init(s.slot_init),
        keys(s.keys.data()),
        values(s.values.data()),
        slots(s.slots.data()),
        freqs(s.freqs.data()),
        versions(s.versions.data()),
        values_size(static_cast<int64_t>(s.values.size())),
        slots_size(static_cast<int64_t>(s.slots.size())),
        freqs_size(static_cast<int64_t>(s.freqs.size())),
        versions_size(static_cast<int64_t>(s.versions.size())) {}
};

// The rows of `s` at positions `pick`, same layout (a tiered import splits a snapshot by tier).
template <typename K>
TableSnapshot<K> snapshot_rows(const SnapshotView<K>& s, const std::vector<int64_t>& pick) {
  TableSnapshot<K> out;
  out.dim = s.dim;
  out.num_slots = s.num_slots;
  out.slot_kind = s.slot_kind;
  out.slot_init = s.slot_init;
  const int64_t d = s.dim, st = s.num_slots * s.dim;
  const size_t m = pick.size();
  out.keys.reserve(m);
  out.freqs.reserve(m);
  out.versions.reserve(m);
  out.values.reserve(m * d);
  out.slots.reserve(m * st);
  for (int64_t i : pick) {
    out.keys.push_back(s.keys[i]);
    out.freqs.push_back(s.freqs[i]);
    out.versions.push_back(s.versions[i]);
    out.values.insert(out.values.end(), s.values + i * d, s.values + (i + 1) * d);
    out.slots.insert(out.slots.end(), s.slots + i * st, s.slots + (i + 1) * st);
  }
  return out;
}
template <typename K>
TableSnapshot<K> snapshot_rows(const TableSnapshot<K>& s, const std::vector<int64_t>& pick) {
  return snapshot_rows(SnapshotView<K>(s), pick);
}

// Whether a snapshot can be restored into a table of dimension `dim`; an error naming `table`.
template <typename K>
Status check_snapshot(const std::string& table, int64_t dim, const SnapshotView<K>& s) {
  const int64_t n = s.n;
  if (s.dim != dim) {
    return Status::Invalid("cannot restore table '" + table + "': the checkpoint has dimension " +
                           std::to_string(s.dim) + ", the table " + std::to_string(dim));
  }
  if (s.values_size != n * dim || s.slots_size != n * s.num_slots * dim || s.freqs_size != n ||
      s.versions_size != n || static_cast<int64_t>(s.slot_init.size()) != s.num_slots) {
    return Status::Invalid(
        "cannot restore table '" + table +
        "': the checkpoint's keys, values, slots, frequencies and versions disagree in size");
  }
  return Status::OK();
}
template <typename K>
Status check_snapshot(const std::string& table, int64_t dim, const TableSnapshot<K>& s) {
  return check_snapshot(table, dim, SnapshotView<K>(s));
}

// What a key met twice means to the caller that adds rows: a restore's or a tier move's error.
using RepeatedKeyError = Status (*)(const std::string& table, int64_t key);
inline Status key_twice_in_checkpoint(const std::string& table, int64_t key) {
  return Status::Invalid("cannot restore table '" + table + "': key " + std::to_string(key) +
                         " appears twice in the checkpoint");
}
inline Status key_in_two_tiers(const std::string& table, int64_t key) {
  return Status::Invalid("table '" + table + "': key " + std::to_string(key) +
                         " is in two tiers at once");
}

}  // namespace sok
