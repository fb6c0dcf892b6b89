#include "addons/sparse_operation_kit/core/embedding_table.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include "addons/sparse_operation_kit/core/lookup.h"
#include "addons/sparse_operation_kit/core/prefetch.h"

namespace sok {
namespace {

// How many keys ahead the batched loops prefetch (enough to cover a DRAM miss).
constexpr int64_t kPrefetchAhead = 8;

// The order in which to visit rows[0, m): positions by ascending row (a counting sort on
// row >> shift with about one bucket per position; absent keys, row < 0, first). The row passes
// then walk the arena forward, which the hardware prefetcher streams, instead of jumping around
// it in key order: several times faster once the table outgrows the caches.
void row_order(const int64_t* rows, int64_t m, int64_t num_rows, std::vector<int32_t>* order) {
  order->resize(m);
  int bits = 0, row_bits = 0;
  while ((int64_t{1} << bits) < m) ++bits;
  while ((int64_t{1} << row_bits) < num_rows) ++row_bits;
  const int shift = std::max(0, row_bits - bits);
  const int64_t buckets = ((std::max<int64_t>(num_rows, 1) - 1) >> shift) + 2;  // 0: absent
  std::vector<int32_t> start(buckets + 1, 0);
  auto bucket = [shift](int64_t row) { return row < 0 ? 0 : (row >> shift) + 1; };
  for (int64_t j = 0; j < m; ++j) ++start[bucket(rows[j]) + 1];
  for (int64_t k = 0; k < buckets; ++k) start[k + 1] += start[k];
  for (int64_t j = 0; j < m; ++j) (*order)[start[bucket(rows[j])]++] = static_cast<int32_t>(j);
}

// Calls visit(j, row) for the m keys whose rows probe(rows) writes (kEmpty: absent), in row
// order; per_key[j * d, (j + 1) * d) is key j's output (kWrite) or input, prefetched ahead since
// row order visits it out of order.
template <bool kWrite, typename Probe, typename Visit>
void visit_in_row_order(int64_t m, int64_t num_rows, const float* per_key, int64_t d,
                        const Probe& probe, const Visit& visit) {
  std::vector<int64_t> rows(m);
  std::vector<int32_t> order;
  probe(rows.data());
  row_order(rows.data(), m, num_rows, &order);
  for (int64_t jj = 0; jj < m; ++jj) {
    if (jj + kPrefetchAhead < m)
      prefetch_floats<kWrite>(per_key + order[jj + kPrefetchAhead] * d, d);
    visit(order[jj], rows[order[jj]]);
  }
}

// The distinct keys of an update and their gradients, repeated keys' summed (TensorFlow's
// optimizers sum them too); the caller's own arrays when its keys are distinct already.
template <typename K>
struct DistinctGradients {
  const K* keys = nullptr;
  int64_t n = 0;
  const float* grads = nullptr;
  std::vector<K> key_storage;
  std::vector<float> grad_storage;
};

template <typename K>
void distinct_gradients(const K* keys, int64_t n, const float* grads, int64_t d, bool keys_unique,
                        DistinctGradients<K>* out) {
  out->keys = keys;
  out->n = n;
  out->grads = grads;
  if (keys_unique) return;
  std::vector<int32_t> inverse(n);
  unique_keys(keys, n, &out->key_storage, inverse.data(), nullptr);
  out->keys = out->key_storage.data();
  out->n = static_cast<int64_t>(out->key_storage.size());
  if (out->n == n) return;
  out->grad_storage.assign(out->n * d, 0.f);
  for (int64_t i = 0; i < n; ++i) {
    float* dst = out->grad_storage.data() + static_cast<int64_t>(inverse[i]) * d;
    const float* src = grads + i * d;
    for (int64_t c = 0; c < d; ++c) dst[c] += src[c];
  }
  out->grads = out->grad_storage.data();
}

// The keys (and their gradients) marked missing.
template <typename K>
void missing_only(const K* keys, const float* grads, int64_t d, const std::vector<uint8_t>& missing,
                  std::vector<K>* rest_keys, std::vector<float>* rest_grads) {
  for (size_t i = 0; i < missing.size(); ++i) {
    if (!missing[i]) continue;
    rest_keys->push_back(keys[i]);
    rest_grads->insert(rest_grads->end(), grads + i * d, grads + (i + 1) * d);
  }
}

}  // namespace

template <typename K>
EmbeddingTable<K>::EmbeddingTable(TableConfig config)
    : config_(std::move(config)),
      index_(std::max<int64_t>(8, config_.initial_capacity)),
      arena_(config_.dim) {
  if (config_.init.kind == InitKind::kMatrix) config_.init.matrix = config_.init_matrix.data();
}

template <typename K>
int64_t EmbeddingTable<K>::size() const {
  std::shared_lock<std::shared_mutex> l(mu_);
  return static_cast<int64_t>(row_keys_.size());
}

template <typename K>
int EmbeddingTable<K>::num_slots() const {
  std::shared_lock<std::shared_mutex> l(mu_);
  return num_slots_;
}

template <typename K>
int64_t EmbeddingTable<K>::probe(K key) const {
  return index_.find(hash_key(key), [&](int64_t row) { return row_keys_[row] == key; });
}

template <typename K>
void EmbeddingTable<K>::probe_many(const K* keys, int64_t n, int64_t* rows) const {
  // A pipeline, kPrefetchAhead keys between stages, so that the two misses of a key (its
  // bucket, then its candidate row's key) overlap with other keys': hash and prefetch the
  // bucket; read the candidate and prefetch its key; compare the key. rows[i] holds the hash,
  // then the candidate, then the row.
  const int64_t a = kPrefetchAhead;
  for (int64_t i = 0; i < n + 2 * a; ++i) {
    if (i < n) {
      const uint64_t h = hash_key(keys[i]);
      index_.prefetch(h);
      rows[i] = static_cast<int64_t>(h);
    }
    if (i >= a && i - a < n) {
      int64_t& row = rows[i - a];
      row = index_.candidate(static_cast<uint64_t>(row));
      if (row != kEmpty) prefetch_read(&row_keys_[row]);
    }
    if (i >= 2 * a && i - 2 * a < n) rows[i - 2 * a] = confirm(keys[i - 2 * a], rows[i - 2 * a]);
  }
}

template <typename K>
void EmbeddingTable<K>::rehash(int64_t min_rows) {
  index_.reset(min_rows);
  for (int64_t row = 0; row < static_cast<int64_t>(row_keys_.size()); ++row) {
    index_.insert(hash_key(row_keys_[row]), row);
  }
}

template <typename K>
void EmbeddingTable<K>::init_row_values(K key, float* row, bool draw_values) const {
  if (draw_values) initialize_row(config_.init, key, row, config_.dim);
  for (int s = 0; s < num_slots_; ++s)
    std::fill(row + (s + 1) * config_.dim, row + (s + 2) * config_.dim, slot_init_[s]);
}

template <typename K>
int64_t EmbeddingTable<K>::insert_new(K key, bool draw_values) {
  const int64_t row = static_cast<int64_t>(row_keys_.size());
  if (row >= RowIndex::kMaxRows) {  // 2^40 rows: out of reach of any CPU memory
    std::fprintf(stderr, "sok: table '%s' cannot hold more than %lld rows\n", config_.name.c_str(),
                 static_cast<long long>(RowIndex::kMaxRows));
    std::abort();
  }
  // Grow by 3/2: the index stays between 8/15 and 4/5 full.
  if (row + 1 > index_.max_rows()) rehash(index_.max_rows() * 3 / 2 + 8);
  index_.insert(hash_key(key), row);
  row_keys_.push_back(key);
  init_row_values(key, arena_.append(), draw_values);
  freqs_.push_back(0);
  versions_.push_back(0);
  return row;
}

template <typename K>
bool EmbeddingTable<K>::admitted(int64_t row) const {
  return config_.filter_freq <= 0 || freqs_.get(row) >= config_.filter_freq;
}

template <typename K>
void EmbeddingTable<K>::read_row(int64_t row, K key, bool present, float* out) const {
  const int64_t d = config_.dim;
  if (config_.filter_freq > 0 && (!present || !admitted(row))) {
    std::fill(out, out + d, config_.default_value_no_permission);
  } else if (!present) {
    initialize_row(config_.init, key, out, d);
  } else {
    std::memcpy(out, arena_.row(row), sizeof(float) * d);
  }
}

template <typename K>
void EmbeddingTable<K>::find(const K* keys, int64_t n, float* out, const ParallelFor& pf) const {
  std::shared_lock<std::shared_mutex> l(mu_);
  const int64_t d = config_.dim;
  const int64_t num_rows = static_cast<int64_t>(row_keys_.size());
  pf(n, 4 * d + 40, [&](int64_t b, int64_t e) {
    visit_in_row_order<true>(
        e - b, num_rows, out + b * d, d, [&](int64_t* rows) { probe_many(keys + b, e - b, rows); },
        [&](int64_t j, int64_t row) {
          read_row(row, keys[b + j], row != kEmpty, out + (b + j) * d);
        });
  });
}

template <typename K>
void EmbeddingTable<K>::find_or_insert(const K* keys, int64_t n, float* out, const int64_t* counts,
                                       const ParallelFor& pf) {
  const int64_t d = config_.dim;
  std::vector<uint8_t> missing(n, 0);
  std::atomic<int64_t> num_missing{0};
  {
    std::shared_lock<std::shared_mutex> l(mu_);
    const int64_t num_rows = static_cast<int64_t>(row_keys_.size());
    pf(n, 4 * d + 40, [&](int64_t b, int64_t e) {
      int64_t local_missing = 0;
      visit_in_row_order<true>(
          e - b, num_rows, out + b * d, d,
          [&](int64_t* rows) { probe_many(keys + b, e - b, rows); },
          [&](int64_t j, int64_t row) {
            const int64_t i = b + j;
            // Missing, or its count does not fit the narrow frequency: the exclusive pass adds it.
            if (row == kEmpty || !freqs_.try_add(row, counts ? counts[i] : 1)) {
              missing[i] = 1;
              ++local_missing;
              return;
            }
            read_row(row, keys[i], true, out + i * d);
          });
      num_missing += local_missing;
    });
  }
  if (num_missing.load() == 0) return;
  std::unique_lock<std::shared_mutex> l(mu_);
  for (int64_t i = 0; i < n; ++i) {
    if (!missing[i]) continue;
    int64_t row = probe(keys[i]);  // another thread (or an earlier duplicate) may have added it
    if (row == kEmpty) row = insert_new(keys[i]);
    freqs_.add(row, counts ? counts[i] : 1);
    read_row(row, keys[i], true, out + i * d);
  }
}

template <typename K>
void EmbeddingTable<K>::insert_or_assign(const K* keys, int64_t n, const float* values) {
  std::unique_lock<std::shared_mutex> l(mu_);
  const int64_t d = config_.dim;
  for (int64_t i = 0; i < n; ++i) {
    int64_t row = probe(keys[i]);
    if (row == kEmpty) row = insert_new(keys[i]);
    std::memcpy(arena_.row(row), values + i * d, sizeof(float) * d);
  }
}

template <typename K>
int64_t EmbeddingTable<K>::erase(const K* keys, int64_t n) {
  std::unique_lock<std::shared_mutex> l(mu_);
  std::vector<uint8_t> drop(row_keys_.size(), 0);
  int64_t removed = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t row = probe(keys[i]);
    if (row != kEmpty && !drop[row]) {
      drop[row] = 1;
      ++removed;
    }
  }
  if (removed == 0) return 0;
  // Compact the rows (keeping insertion order) and rebuild the index.
  const int64_t st = stride();
  int64_t out = 0;
  for (int64_t row = 0; row < static_cast<int64_t>(row_keys_.size()); ++row) {
    if (drop[row]) continue;
    if (out != row) {
      row_keys_[out] = row_keys_[row];
      std::memcpy(arena_.row(out), arena_.row(row), sizeof(float) * st);
      freqs_.set(out, freqs_.get(row));
      versions_.set(out, versions_.get(row));
    }
    ++out;
  }
  row_keys_.resize(out);
  arena_.truncate(out);
  freqs_.resize(out);
  versions_.resize(out);
  // The freed tail of the columns goes back (to the OS when they are mapped).
  row_keys_.shrink_to_fit();
  freqs_.shrink_to_fit();
  versions_.shrink_to_fit();
  rehash(index_.max_rows());
  return removed;
}

template <typename K>
Status EmbeddingTable<K>::ensure_slots(const OptimizerParams& p) {
  SlotPlan plan;
  std::string error;
  if (!plan_slots(config_.name, slot_kind_, num_slots_, p.kind, &plan, &error))
    return Status::Invalid(error);
  const int want = sok::num_slots(p.kind);
  const int kind = static_cast<int>(p.kind);
  if (plan != SlotPlan::kRelayout) {
    slot_kind_ = kind;
    return Status::OK();
  }
  // Relayout every row once: [value] -> [value | slots].
  const int64_t d = config_.dim;
  const int64_t new_stride = d * (1 + want);
  std::vector<float> init(want);
  for (int s = 0; s < want; ++s) init[s] = slot_initial_value(p, s);
  RowArena arena(new_stride);
  for (int64_t row = 0; row < static_cast<int64_t>(row_keys_.size()); ++row) {
    float* dst = arena.append();
    std::memcpy(dst, arena_.row(row), sizeof(float) * d);
    for (int s = 0; s < want; ++s) std::fill(dst + (s + 1) * d, dst + (s + 2) * d, init[s]);
  }
  arena_.swap(arena);
  num_slots_ = want;
  slot_kind_ = kind;
  slot_init_ = init;
  return Status::OK();
}

template <typename K>
Status EmbeddingTable<K>::apply_gradients(const K* keys, int64_t n, const float* grads,
                                          const OptimizerParams& p, int64_t global_step,
                                          const ParallelFor& pf, bool keys_unique) {
  const int64_t d = config_.dim;
  DistinctGradients<K> distinct;
  distinct_gradients(keys, n, grads, d, keys_unique, &distinct);
  const K* uniq = distinct.keys;
  const int64_t u = distinct.n;
  const float* g = distinct.grads;
  std::lock_guard<std::mutex> one_update_at_a_time(update_mu_);
  const float alpha = p.kind == OptimizerKind::kAdam ? adam_step_size(p) : 0.f;
  // Probes keys [b, e) and updates the present, admitted rows in row order; caller holds mu_
  // shared with the slot layout in place. Returns whether every key was present.
  auto update = [&](int64_t b, int64_t e, std::vector<uint8_t>* missing) {
    bool all_present = true;
    visit_in_row_order<false>(
        e - b, static_cast<int64_t>(row_keys_.size()), g + b * d, d,
        [&](int64_t* rows) { probe_many(uniq + b, e - b, rows); },
        [&](int64_t j, int64_t row) {
          if (row == kEmpty) {  // not inserted yet (first pass) / evicted meanwhile (second pass)
            if (missing) (*missing)[b + j] = 1;
            all_present = false;
            return;
          }
          if (!admitted(row)) return;
          apply_row(p, alpha, arena_.row(row), d, g + (b + j) * d);
          versions_.set(row, global_step);
        });
    return all_present;
  };
  // One pass under the shared lock updates every present key; the missing ones (or all of them,
  // before the first update made room for the slots or when the versions must widen to hold
  // global_step) are inserted, then updated.
  std::vector<uint8_t> missing(u, 0);
  {
    std::shared_lock<std::shared_mutex> l(mu_);
    if (slot_kind_ == static_cast<int>(p.kind) && num_slots_ == sok::num_slots(p.kind) &&
        versions_.can_hold(global_step)) {
      std::atomic<bool> all_present{true};
      pf(u, 12 * d + 60, [&](int64_t b, int64_t e) {
        if (!update(b, e, &missing)) all_present = false;
      });
      if (all_present.load()) return Status::OK();
    } else {
      std::fill(missing.begin(), missing.end(), 1);
    }
  }
  std::vector<K> rest_keys;
  std::vector<float> rest_grads;
  missing_only(uniq, g, d, missing, &rest_keys, &rest_grads);
  {
    std::unique_lock<std::shared_mutex> l(mu_);
    Status s = ensure_slots(p);
    if (!s.ok()) return s;
    if (!versions_.can_hold(global_step)) versions_.widen();
    for (const K key : rest_keys) {
      if (probe(key) == kEmpty) insert_new(key);
    }
  }
  uniq = rest_keys.data();
  g = rest_grads.data();
  std::shared_lock<std::shared_mutex> l(mu_);
  pf(static_cast<int64_t>(rest_keys.size()), 12 * d + 60,
     [&](int64_t b, int64_t e) { update(b, e, nullptr); });
  return Status::OK();
}

template <typename K>
int64_t EmbeddingTable<K>::shrink(int64_t global_step) {
  std::vector<K> victims;
  {
    std::shared_lock<std::shared_mutex> l(mu_);
    for (int64_t row = 0; row < static_cast<int64_t>(row_keys_.size()); ++row) {
      if (should_evict(config_, global_step, versions_.get(row), arena_.row(row))) {
        victims.push_back(row_keys_[row]);
      }
    }
  }
  return erase(victims.data(), static_cast<int64_t>(victims.size()));
}

template <typename K>
TableSnapshot<K> EmbeddingTable<K>::export_rows() const {
  TableSnapshot<K> s;
  Status st = export_into(allocate_into(&s));  // sizing vectors cannot fail
  (void)st;
  return s;
}

template <typename K>
Status EmbeddingTable<K>::export_into(const AllocateField& allocate) const {
  std::shared_lock<std::shared_mutex> l(mu_);
  SnapshotArrays<K> a;
  Status st = allocate_snapshot(allocate, static_cast<int64_t>(row_keys_.size()), config_.dim,
                                num_slots_, slot_kind_, slot_init_, &a);
  int64_t count = 0;
  return st.ok() ? write_rows(a, 0, &count) : st;
}

template <typename K>
Status EmbeddingTable<K>::export_to(const SnapshotArrays<K>& a, int64_t at, int64_t* count) const {
  std::shared_lock<std::shared_mutex> l(mu_);
  return write_rows(a, at, count);
}

template <typename K>
Status EmbeddingTable<K>::write_rows(const SnapshotArrays<K>& a, int64_t at, int64_t* count) const {
  const int64_t n = static_cast<int64_t>(row_keys_.size()), d = config_.dim;
  if (at + n > a.n || a.num_slots != num_slots_ || a.dim != d)
    return Status::Invalid("table '" + config_.name + "': its rows do not fit the export");
  const int64_t st_floats = num_slots_ * d;
  for (int64_t row = 0; row < n; ++row) {
    const float* src = arena_.row(row);
    a.keys[at + row] = row_keys_[row];
    a.freqs[at + row] = freqs_.get(row);
    a.versions[at + row] = versions_.get(row);
    std::memcpy(a.values + (at + row) * d, src, sizeof(float) * d);
    std::memcpy(a.slots + (at + row) * st_floats, src + d, sizeof(float) * st_floats);
  }
  *count = n;
  return Status::OK();
}

template <typename K>
Status EmbeddingTable<K>::import_rows(const SnapshotView<K>& s) {
  const int64_t n = s.n, d = config_.dim;
  Status valid = check_snapshot(config_.name, d, s);
  if (!valid.ok()) return valid;
  std::unique_lock<std::shared_mutex> l(mu_);
  row_keys_.release();
  row_keys_.reserve(n);
  num_slots_ = s.num_slots;
  slot_kind_ = s.num_slots > 0 ? s.slot_kind : -1;
  slot_init_ = s.slot_init;
  RowArena(stride()).swap(arena_);
  index_.reset(std::max<int64_t>(8, n));
  for (int64_t i = 0; i < n; ++i) {
    if (probe(s.keys[i]) != kEmpty) return key_twice_in_checkpoint(config_.name, s.keys[i]);
    index_.insert(hash_key(s.keys[i]), i);
    row_keys_.push_back(s.keys[i]);
    float* dst = arena_.append();
    std::memcpy(dst, s.values + i * d, sizeof(float) * d);
    std::memcpy(dst + d, s.slots + i * s.num_slots * d, sizeof(float) * s.num_slots * d);
  }
  freqs_.assign(s.freqs, n);
  versions_.assign(s.versions, n);
  return Status::OK();
}

template <typename K>
void EmbeddingTable<K>::keys_and_freqs(std::vector<K>* keys, std::vector<int64_t>* freqs,
                                       std::vector<int64_t>* versions) const {
  std::shared_lock<std::shared_mutex> l(mu_);
  *keys = row_keys_.to_vector();
  *freqs = freqs_.to_vector();
  if (versions != nullptr) *versions = versions_.to_vector();
}

template <typename K>
TableSnapshot<K> EmbeddingTable<K>::rows_of(const K* keys, int64_t n) const {
  std::shared_lock<std::shared_mutex> l(mu_);
  TableSnapshot<K> s;
  const int64_t d = config_.dim;
  s.dim = d;
  s.num_slots = num_slots_;
  s.slot_kind = slot_kind_;
  s.slot_init = slot_init_;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t row = probe(keys[i]);
    if (row == kEmpty) continue;
    const float* src = arena_.row(row);
    s.keys.push_back(keys[i]);
    s.values.insert(s.values.end(), src, src + d);
    s.slots.insert(s.slots.end(), src + d, src + stride());
    s.freqs.push_back(freqs_.get(row));
    s.versions.push_back(versions_.get(row));
  }
  return s;
}

template <typename K>
Status EmbeddingTable<K>::put_rows(const SnapshotView<K>& s, RepeatedKeyError repeated) {
  const int64_t n = s.n, d = config_.dim;
  Status valid = check_snapshot(config_.name, d, s);
  if (!valid.ok()) return valid;
  std::unique_lock<std::shared_mutex> l(mu_);
  if (s.num_slots > num_slots_) {
    return Status::Invalid("table '" + config_.name + "': rows with " +
                           std::to_string(s.num_slots) + " optimizer slots cannot join rows with " +
                           std::to_string(num_slots_));
  }
  for (int64_t i = 0; i < n; ++i) {
    if (probe(s.keys[i]) != kEmpty) return repeated(config_.name, s.keys[i]);
    // The values come from the snapshot; slots it lacks start at their initial value.
    const int64_t row = insert_new(s.keys[i], /*draw_values=*/false);
    float* dst = arena_.row(row);
    std::memcpy(dst, s.values + i * d, sizeof(float) * d);
    std::memcpy(dst + d, s.slots + i * s.num_slots * d, sizeof(float) * s.num_slots * d);
    freqs_.add(row, s.freqs[i]);
    if (!versions_.can_hold(s.versions[i])) versions_.widen();
    versions_.set(row, s.versions[i]);
  }
  return Status::OK();
}

template class EmbeddingTable<int32_t>;
template class EmbeddingTable<int64_t>;

}  // namespace sok
