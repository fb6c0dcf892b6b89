// GpuTieredTable (HBM_DRAM: a small GPU cache over rows in pinned host memory) vs one
// GpuEmbeddingTable holding every row: lookups, every fused optimizer, erase, shrink and
// export/import must agree to the bit, whichever tier a row is in; the cache must stay within its
// budget while rows really live in both tiers, also when a step's keys are several times the
// cache (placement moves a bounded number of rows) and over many steps (the hot keys settle in
// HBM). Also the host-only table (no cache), and HBM_DRAM_SSDHASH: the same with a host tier of a
// few hundred rows over a file (rows in all three tiers, the host tier within its budget, the
// file's directory gone with the table).
// Usage: test_tiered_table [seed (0: from the clock)] [name filter]; see test_util.cuh.
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <iterator>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "addons/sparse_operation_kit/core/cuda/gpu_tiered_table.h"
#include "addons/sparse_operation_kit/core/tier_policy.h"
#include "tests/gpu/test_util.cuh"

using namespace sok_gpu_test;  // NOLINT

namespace {

constexpr int64_t kCacheRows = 300;
const ExecContext kExec;  // the default stream

// Keys of a step: uniform over the pool, or power-law (a few keys most of the time).
template <typename K>
std::vector<K> step_keys(const std::vector<K>& pool, size_t n, bool power_law) {
  if (!power_law) return draw(pool, n);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::vector<K> v(n);
  for (auto& x : v) x = pool[static_cast<size_t>(pool.size() * std::pow(u(g_rng), 3.0))];
  return v;
}

TableConfig tiered_cfg(int64_t dim, CacheStrategy strategy, int slots, int64_t filter = 0) {
  TableConfig c = make_cfg(dim, InitKind::kUniform, filter);
  c.storage = StorageKind::kHbmDram;
  c.cache_strategy = strategy;
  c.hbm_bytes = kCacheRows * tier_row_bytes(dim, slots);
  c.steps_to_live = 12;
  return c;
}

template <typename K>
std::unique_ptr<GpuTieredTable<K>> make_tiered(const TableConfig& c, bool host_only = false) {
  std::unique_ptr<GpuTieredTable<K>> t;
  GpuTableOptions o;
  SOK_OK(host_only ? GpuTieredTable<K>::CreateHostOnly(c, o, &t)
                   : GpuTieredTable<K>::Create(c, o, &t));
  return t;
}

// The reference (every row in one table) and the table under test, driven alike.
template <typename K>
struct Pair {
  std::unique_ptr<GpuEmbeddingTable<K>> ref;
  std::unique_ptr<GpuTieredTable<K>> got;
  int64_t dim;

  bool lookup(const std::vector<K>& keys, bool train,
              const std::vector<int64_t>* counts = nullptr) {
    const size_t n = keys.size();
    DevBuf<K> dk = to_device(keys);
    DevBuf<float> a(n * dim), b(n * dim);
    a.poison();
    b.poison();
    DevBuf<int64_t> dc = to_device(counts ? *counts : std::vector<int64_t>(1, 1));
    const int64_t* cp = counts ? dc.get() : nullptr;
    if (train) {
      SOK_OK(ref->find_or_insert(dk.get(), n, a.get(), cp, nullptr));
      SOK_OK(got->find_or_insert(kExec, dk.get(), n, b.get(), cp));
    } else {
      SOK_OK(ref->find(dk.get(), n, a.get(), nullptr));
      SOK_OK(got->find(kExec, dk.get(), n, b.get()));
    }
    return sok_test::expect_near(train ? "find_or_insert" : "find", b.download(), a.download(), 0,
                                 0);
  }
  void apply(const std::vector<K>& keys, const OptimizerParams& p, int64_t step, bool unique) {
    const std::vector<float> g = randn(keys.size() * dim, 0.5f);
    DevBuf<K> dk = to_device(keys);
    DevBuf<float> dg = to_device(g);
    SOK_OK(ref->apply_gradients(dk.get(), keys.size(), dg.get(), p, step, nullptr, unique));
    SOK_OK(got->apply_gradients(kExec, dk.get(), keys.size(), dg.get(), p, step, unique));
  }
  bool same_size() {
    int64_t a = 0, b = 0;
    SOK_OK(ref->size(&a, nullptr));
    SOK_OK(got->size(kExec, &b));
    return a == b || FAIL("size %lld, want %lld", (long long)b, (long long)a);
  }
  // export_rows against the reference, and each table's export_into (the export op's path:
  // rows straight into its outputs) against its export_rows.
  bool same_export() {
    TableSnapshot<K> s, into, ref_into;
    SOK_OK(got->export_rows(kExec, &s));
    const TableSnapshot<K> want = gpu_export(*ref);
    SOK_OK(got->export_into(kExec, sok::allocate_into(&into)));
    int64_t n = 0, count = 0;
    SOK_OK(ref->size(&n, nullptr));
    sok::SnapshotArrays<K> a;
    SOK_OK(sok::allocate_snapshot(sok::allocate_into(&ref_into), n, ref->dim(), ref->num_slots(),
                                  ref->slot_kind(), ref->slot_init(), &a));
    SOK_OK(ref->export_to(a, 0, &count, nullptr));
    return expect_same_table(s, want, 0, 0) && expect_same_table(into, s, 0, 0) &&
           expect_same_table(ref_into, want, 0, 0) &&
           (count == n ||
            FAIL("export_to wrote %lld rows of %lld", (long long)count, (long long)n));
  }
  // Rows in both tiers, the cache within its budget.
  bool tiers_ok(bool expect_both) {
    int64_t hbm = 0, host = 0;
    SOK_OK(got->tier_sizes(nullptr, &hbm, &host));
    const int64_t budget = got->hbm_budget_rows();
    bool ok = hbm <= budget ||
              FAIL("HBM tier %lld rows over its budget %lld", (long long)hbm, (long long)budget);
    if (expect_both && (hbm == 0 || host == 0))
      ok = FAIL("rows not in both tiers: HBM %lld, host %lld", (long long)hbm, (long long)host);
    return ok;
  }
};

template <typename K>
Pair<K> make_pair(const TableConfig& c, bool host_only = false) {
  TableConfig one = c;
  one.storage = StorageKind::kDram;
  return Pair<K>{make_gpu<K>(one), make_tiered<K>(c, host_only), c.dim};
}

template <typename Stats>
void print_stats(const Stats& st, int steps) {
  std::printf(
      "    %d steps: %lld placement passes, rows %lld up / %lld down, %lld budget demotions, "
      "%lld size syncs; keys served %lld HBM / %lld host\n",
      steps, (long long)st.placement_passes, (long long)st.promoted_rows,
      (long long)st.demoted_rows, (long long)st.budget_demotions, (long long)st.size_syncs,
      (long long)st.hbm_keys, (long long)st.host_keys);
}

template <typename K>
std::vector<K> distinct(std::vector<K> keys) {
  std::sort(keys.begin(), keys.end());
  keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
  std::shuffle(keys.begin(), keys.end(), g_rng);
  return keys;
}

// At least the rows a placement pass may move each way (gpu_tiered_table.cu: the budget / 8).
int64_t max_swaps(const TableConfig& c) {
  return std::max<int64_t>(1, c.hbm_bytes / tier_row_bytes(c.dim, 0) / 8);
}

// Training steps (lookup then update of the same keys, as lookup_sparse does) and evaluation
// reads of present and missing keys; then shrink and erase over both tiers.
template <typename K>
bool test_training(OptimizerKind kind, CacheStrategy strategy, bool power_law, bool host_only) {
  const int64_t dim = sizeof(K) == 8 ? 8 : 5;
  Pair<K> t = make_pair<K>(tiered_cfg(dim, strategy, num_slots(kind)), host_only);
  const std::vector<K> pool = key_pool<K>(4000);
  OptimizerParams p = test_params(kind);
  bool ok = true;
  for (int s = 1; s <= 30 && ok; ++s) {
    const std::vector<K> keys = step_keys(pool, 256, power_law);
    p.step = s;
    ok &= t.lookup(keys, true);
    t.apply(keys, p, 100 + s, false);
    if (s % 5 == 0) {
      ok &= t.lookup(draw(key_pool<K>(6000), 2000), false);  // many absent: inserts nothing
      ok &= t.same_size();
    }
    if (!host_only) ok &= t.tiers_ok(s > 3);
  }
  ok &= t.same_export();
  if (!host_only) {
    const auto st = t.got->stats();
    if (st.promoted_rows == 0 || st.demoted_rows == 0 || st.host_keys == 0 || st.hbm_keys == 0)
      ok = FAIL("tiers unused: %lld rows up, %lld down, keys served %lld HBM / %lld host",
                (long long)st.promoted_rows, (long long)st.demoted_rows, (long long)st.hbm_keys,
                (long long)st.host_keys);
    print_stats(st, 30);
  }
  int64_t a = 0, b = 0;
  SOK_OK(t.ref->shrink(118, nullptr, &a));
  SOK_OK(t.got->shrink(kExec, 118, &b));
  if (a != b || a == 0)
    ok = FAIL("shrink removed %lld, want %lld (> 0)", (long long)b, (long long)a);
  const std::vector<K> gone = draw(pool, 1500);
  DevBuf<K> dg = to_device(gone);
  SOK_OK(t.ref->erase(dg.get(), gone.size(), nullptr, &a));
  SOK_OK(t.got->erase(dg.get(), gone.size(), nullptr, &b));
  if (a != b) ok = FAIL("erase removed %lld, want %lld", (long long)b, (long long)a);
  ok &= t.same_export();
  return ok && t.lookup(step_keys(pool, 1024, power_law), true) && t.same_export();
}

// Counter filter (counts per key) and insert_or_assign over both tiers.
template <typename K>
bool test_filter_and_assign() {
  Pair<K> t = make_pair<K>(tiered_cfg(16, CacheStrategy::kLRU, 1, /*filter=*/3));
  const std::vector<K> pool = key_pool<K>(3000);
  bool ok = true;
  for (int s = 1; s <= 12 && ok; ++s) {
    std::vector<K> keys = draw(pool, 800);
    std::sort(keys.begin(), keys.end());
    keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
    std::vector<int64_t> counts(keys.size());
    for (auto& c : counts) c = 1 + static_cast<int64_t>(g_rng() % 2);
    ok &= t.lookup(keys, true, &counts);
    OptimizerParams p = test_params(OptimizerKind::kAdagrad);
    p.step = s;
    t.apply(keys, p, s, true);
    // Distinct keys: with repeats the value kept is either one's.
    const std::vector<float> v = randn(keys.size() / 2 * 16, 1.f);
    DevBuf<K> dk = to_device(std::vector<K>(keys.begin(), keys.begin() + keys.size() / 2));
    DevBuf<float> dv = to_device(v);
    SOK_OK(t.ref->insert_or_assign(dk.get(), keys.size() / 2, dv.get(), nullptr));
    SOK_OK(t.got->insert_or_assign(kExec, dk.get(), keys.size() / 2, dv.get()));
    ok &= t.lookup(draw(pool, 1000), false) && t.tiers_ok(s > 3);
  }
  return ok && t.same_export();
}

// Steps first..last of training on 1,024 draws of `pool` (lookup, then p's update) on both
// tables; true if every lookup gave both the same rows and `check` held after every step.
template <typename K, typename Check>
bool train_steps(Pair<K>& t, const std::vector<K>& pool, OptimizerParams& p, int first, int last,
                 Check check) {
  bool ok = true;
  for (int s = first; s <= last; ++s) {
    const std::vector<K> keys = draw(pool, 1024);
    p.step = s;
    ok &= t.lookup(keys, true);
    t.apply(keys, p, s, false);
    ok &= check();
  }
  return ok;
}

template <typename K>
bool train_steps(Pair<K>& t, const std::vector<K>& pool, OptimizerParams& p, int first, int last) {
  return train_steps(t, pool, p, first, last, [] { return true; });
}

// export -> import into a fresh tiered table (split over the tiers) and into a host-only one;
// both then train on like the reference.
template <typename K>
bool test_export_import(CacheStrategy strategy) {
  const TableConfig cfg = tiered_cfg(8, strategy, 2);
  Pair<K> t = make_pair<K>(cfg);
  const std::vector<K> pool = key_pool<K>(3000);
  OptimizerParams p = test_params(OptimizerKind::kAdam);
  bool ok = train_steps(t, pool, p, 1, 8);
  TableSnapshot<K> snap;
  SOK_OK(t.got->export_rows(kExec, &snap));
  ok &= expect_same_table(snap, gpu_export(*t.ref), 0, 0);
  for (bool host_only : {false, true}) {
    Pair<K> u{make_gpu<K>(cfg), make_tiered<K>(cfg, host_only), cfg.dim};
    SOK_OK(u.ref->import_rows(snap, nullptr));
    SOK_OK(u.got->import_rows(kExec, snap));
    ok &= u.same_export();
    if (!host_only) ok &= u.tiers_ok(true);
    ok &= train_steps(u, pool, p, 9, 14);
    ok &= u.same_export();
  }
  snap.keys.push_back(snap.keys[0]);  // a repeated key, one copy per tier
  snap.values.insert(snap.values.end(), snap.values.begin(), snap.values.begin() + 8);
  snap.slots.insert(snap.slots.end(), snap.slots.begin(), snap.slots.begin() + 16);
  snap.freqs.push_back(0);
  snap.versions.push_back(0);
  const Status s = t.got->import_rows(kExec, snap);
  if (s.ok() || s.message().find("appears twice") == std::string::npos)
    ok = FAIL("a repeated key was not refused: '%s'", s.message().c_str());
  return ok;
}

// sok.load's chunked restore: import_rows of the first chunk (room reserved for all), append_rows
// of the others, into a one-tier GPU table, a tiered one and a host-only one; each equals the
// source, trains on like it, and refuses a key it holds (the first chunk's in the HBM tier, the
// last one's in the host tier) or one twice in a chunk. The first chunk fits the HBM budget, so
// the host tier is empty until the appends (its bounds must follow them).
template <typename K>
bool test_chunked_import(CacheStrategy strategy) {
  const TableConfig cfg = tiered_cfg(8, strategy, 2);
  Pair<K> t = make_pair<K>(cfg);
  const std::vector<K> pool = key_pool<K>(3000);
  OptimizerParams p = test_params(OptimizerKind::kAdam);
  bool ok = train_steps(t, pool, p, 1, 8);
  TableSnapshot<K> snap;
  SOK_OK(t.got->export_rows(kExec, &snap));
  const int64_t n = static_cast<int64_t>(snap.keys.size());
  for (bool host_only : {false, true}) {
    Pair<K> u{make_gpu<K>(cfg), make_tiered<K>(cfg, host_only), cfg.dim};
    GpuTable<K> one(make_gpu<K>(cfg));
    for (int64_t at = 0; at < n; at += 200) {
      std::vector<int64_t> pick;
      for (int64_t i = at; i < std::min(n, at + 200); ++i) pick.push_back(i);
      const TableSnapshot<K> chunk = sok::snapshot_rows(snap, pick);
      for (Table<K>* table : {static_cast<Table<K>*>(u.got.get()), static_cast<Table<K>*>(&one)}) {
        SOK_OK(at == 0 ? table->import_rows(kExec, chunk) : table->append_rows(kExec, chunk));
        if (at == 0) SOK_OK(table->reserve(kExec, n));
      }
    }
    SOK_OK(u.ref->import_rows(snap, nullptr));
    ok &= u.same_export() &&
          expect_same_table(gpu_export(*one.gpu_table()), gpu_export(*u.ref), 0, 0);
    if (!host_only) ok &= u.tiers_ok(true);
    ok &= train_steps(u, pool, p, 9, 14);
    ok &= u.same_export();
    std::vector<int64_t> twice = {0, 0};
    for (const std::vector<int64_t>& pick :
         {std::vector<int64_t>{0}, std::vector<int64_t>{n - 1}, twice}) {
      TableSnapshot<K> again = sok::snapshot_rows(snap, pick);
      if (pick.size() == 2) again.keys = {K(1) << 29, K(1) << 29};  // new, twice in one chunk
      for (Table<K>* table : {static_cast<Table<K>*>(u.got.get()), static_cast<Table<K>*>(&one)}) {
        const Status st = table->append_rows(kExec, again);
        if (st.ok() || st.message().find("appears twice") == std::string::npos)
          ok = FAIL("append_rows took a repeated key: '%s'", st.message().c_str());
      }
    }
  }
  return ok;
}

// Device (or pinned, mapped host) memory by pointer: what a table still holds from it, and the
// most it held at once.
class CountingAllocator final : public DeviceAllocator {
 public:
  explicit CountingAllocator(bool host = false) : host_(host) {}
  void* allocate(size_t bytes, cudaStream_t) override {
    void* p = nullptr;
    const cudaError_t e =
        host_ ? cudaHostAlloc(&p, bytes, cudaHostAllocMapped | cudaHostAllocPortable)
              : cudaMalloc(&p, bytes);
    if (e != cudaSuccess) return nullptr;
    sizes_.push_back({p, bytes});
    peak_ = std::max(peak_, held());
    return p;
  }
  void deallocate(void* p, size_t, cudaStream_t) override {
    cudaDeviceSynchronize();
    for (auto it = sizes_.begin(); it != sizes_.end(); ++it) {
      if (it->first != p) continue;
      sizes_.erase(it);
      if (host_) cudaFreeHost(p);
      else cudaFree(p);
      return;
    }
  }
  int64_t held() const {
    int64_t b = 0;
    for (const auto& x : sizes_) b += static_cast<int64_t>(x.second);
    return b;
  }
  int64_t peak() const { return peak_; }

 private:
  bool host_;
  std::vector<std::pair<void*, size_t>> sizes_;
  int64_t peak_ = 0;
};

// The HBM tier's rows take the budget's rows, not a row per slot of its index: its row memory
// (GpuTableOptions::row_storage, which the host tier does not use) is the budget's rows through
// the first optimizer step's relayout, placement, eviction and an import (the pool's free list
// is in the device storage).
template <typename K>
bool test_hbm_row_memory() {
  const int64_t dim = 16;
  const TableConfig cfg = tiered_cfg(dim, CacheStrategy::kLFU, 1);
  CountingAllocator rows;
  GpuTableOptions o;
  o.row_storage = &rows;
  std::unique_ptr<GpuTieredTable<K>> got;
  SOK_OK(GpuTieredTable<K>::Create(cfg, o, &got));
  TableConfig one = cfg;
  one.storage = StorageKind::kDram;
  Pair<K> t{make_gpu<K>(one), std::move(got), dim};
  const std::vector<K> pool = key_pool<K>(4000);
  OptimizerParams p = test_params(OptimizerKind::kAdagrad);
  bool ok = true;
  const auto within = [&](const char* when) {
    const int64_t budget = t.got->hbm_budget_rows();
    const int64_t stride = 2 * dim;  // value and Adagrad's accumulator
    const int64_t want = budget * stride * static_cast<int64_t>(sizeof(float));
    return rows.held() == want ||
           FAIL("%s: HBM rows hold %lld bytes, want %lld for %lld budget rows; budget %lld bytes",
                when, (long long)rows.held(), (long long)want, (long long)budget,
                (long long)cfg.hbm_bytes);
  };
  for (int s = 1; s <= 12 && ok; ++s) {
    const std::vector<K> keys = step_keys(pool, 512, s % 2 == 0);
    p.step = s;
    ok &= t.lookup(keys, true);
    t.apply(keys, p, s, false);
    ok &= t.tiers_ok(s > 2) && within("training");
  }
  int64_t a = 0, b = 0;
  SOK_OK(t.ref->shrink(8, nullptr, &a));
  SOK_OK(t.got->shrink(kExec, 8, &b));
  if (a != b) ok = FAIL("shrink removed %lld, want %lld", (long long)b, (long long)a);
  ok &= t.same_export() && within("after shrink");
  TableSnapshot<K> snap;
  SOK_OK(t.got->export_rows(kExec, &snap));
  SOK_OK(t.got->import_rows(kExec, snap));
  ok &= t.tiers_ok(true) && t.same_export() && within("after import");
  for (int s = 13; s <= 16 && ok; ++s) {
    const std::vector<K> keys = step_keys(pool, 512, true);
    p.step = s;
    ok &= t.lookup(keys, true);
    t.apply(keys, p, s, false);
  }
  return ok && t.same_export() && within("after more steps");
}

// The host tier's rows take about its keys' rows (a pool growing by half), not a row per slot of
// its index (1.3 to 2.7 a key): its row memory (GpuTableOptions::host_row_storage) holds every
// host row and, after a growth, at most 1.5 times the most rows it held plus three calls' keys
// (a call of n keys grows a pool of fewer than live + 2n rows to at most 1.5 times that),
// through growth, the first optimizer step's relayout, eviction (the pool keeps its rows) and
// an import (its rows and a quarter); a growth adds a block and frees nothing (no copy: the
// memory held never exceeds what is held after it); results stay those of a one-tier table.
template <typename K>
bool test_host_row_memory(bool host_only) {
  const int64_t dim = 16, batch = 1000;
  const TableConfig cfg = tiered_cfg(dim, CacheStrategy::kLFU, 1);
  CountingAllocator host(true);
  GpuTableOptions o;
  o.host_row_storage = &host;
  std::unique_ptr<GpuTieredTable<K>> got;
  SOK_OK(host_only ? GpuTieredTable<K>::CreateHostOnly(cfg, o, &got)
                   : GpuTieredTable<K>::Create(cfg, o, &got));
  TableConfig one = cfg;
  one.storage = StorageKind::kDram;
  Pair<K> t{make_gpu<K>(one), std::move(got), dim};
  const std::vector<K> pool =
      key_pool<K>(13000);  // an index of 32,768 slots: a row each would fail
  OptimizerParams p = test_params(OptimizerKind::kAdagrad);
  bool ok = true;
  int64_t peak = 0;
  const auto within = [&](const char* when, int64_t stride, int64_t call) {
    int64_t hbm = 0, rows = 0;
    SOK_OK(t.got->tier_sizes(nullptr, &hbm, &rows));
    peak = std::max(peak, rows);
    const int64_t row = stride * static_cast<int64_t>(sizeof(float));
    const int64_t most = std::max(cfg.initial_capacity, peak * 3 / 2 + 3 * call) * row;
    return (host.held() >= rows * row && host.held() <= most) ||
           FAIL("%s: host rows hold %lld bytes for %lld rows of %lld bytes, want at most %lld",
                when, (long long)host.held(), (long long)rows, (long long)row, (long long)most);
  };
  const int64_t first = host.held();
  for (size_t b = 0; b < pool.size() && ok; b += batch) {  // every key new: the pool grows
    const std::vector<K> keys(pool.begin() + b, pool.begin() + std::min(pool.size(), b + batch));
    ok &= t.lookup(keys, true) && within("inserting", dim, batch);
    if (host.peak() != host.held())
      ok = FAIL("a growth held %lld bytes of host rows at once, %lld after it",
                (long long)host.peak(), (long long)host.held());
  }
  if (host.held() <= first) ok = FAIL("the host pool never grew (%lld bytes)", (long long)first);
  for (int s = 1; s <= 6 && ok; ++s) {
    const std::vector<K> keys = step_keys(pool, 2 * batch, s % 2 == 0);
    p.step = s;
    ok &= t.lookup(keys, true);
    t.apply(keys, p, s, false);
    ok &= within("training", 2 * dim, 2 * batch);
  }
  const int64_t before = host.held();
  int64_t a = 0, b = 0;
  SOK_OK(t.ref->shrink(14, nullptr, &a));  // keys not updated since step 2 go
  SOK_OK(t.got->shrink(kExec, 14, &b));
  if (a != b || a == 0)
    ok = FAIL("shrink removed %lld, want %lld (> 0)", (long long)b, (long long)a);
  if (host.held() != before)
    ok = FAIL("shrink changed the host rows' memory from %lld to %lld bytes", (long long)before,
              (long long)host.held());
  ok &= t.same_export();
  TableSnapshot<K> snap;
  SOK_OK(t.got->export_rows(kExec, &snap));
  SOK_OK(t.got->import_rows(kExec, snap));
  peak = 0;  // the import's pool: its rows and a quarter
  ok &= t.same_export() && within("after import", 2 * dim, 0);
  for (int s = 7; s <= 9 && ok; ++s) {
    const std::vector<K> keys = step_keys(pool, 2 * batch, true);
    p.step = s;
    ok &= t.lookup(keys, true);
    t.apply(keys, p, s, false);
    ok &= within("after more steps", 2 * dim, 2 * batch);
  }
  return ok && t.same_export();
}

// Every step's working set is several times the cache (uniform keys): rows are served in place
// in both tiers, each call leaves the cache within its budget, and placement moves a bounded
// number of rows per pass instead of the whole working set.
template <typename K>
bool test_thrashing(CacheStrategy strategy) {
  const TableConfig cfg = tiered_cfg(16, strategy, 1);
  Pair<K> t = make_pair<K>(cfg);
  const std::vector<K> pool = key_pool<K>(5000);
  OptimizerParams p = test_params(OptimizerKind::kAdagrad);
  bool ok = true;
  int64_t served = 0;
  const int steps = 20;
  for (int s = 1; s <= steps && ok; ++s) {
    const std::vector<K> keys = distinct(draw(pool, 1500));  // ~4x the cache
    p.step = s;
    ok &= t.lookup(keys, true) && t.tiers_ok(false);
    t.apply(keys, p, s, true);
    ok &= t.tiers_ok(s > 1);
    served += 2 * static_cast<int64_t>(keys.size());
  }
  ok &= t.same_export() && t.same_size();
  const auto st = t.got->stats();
  print_stats(st, steps);
  const int64_t bound = st.placement_passes * max_swaps(cfg) + kCacheRows * 2;
  if (st.demoted_rows > bound)
    ok = FAIL("%lld rows demoted in %lld passes: over the bound %lld", (long long)st.demoted_rows,
              (long long)st.placement_passes, (long long)bound);
  if (st.hbm_keys + st.host_keys != served)
    ok = FAIL("keys served %lld HBM + %lld host, want %lld", (long long)st.hbm_keys,
              (long long)st.host_keys, (long long)served);
  if (st.host_keys < served / 2)
    ok = FAIL("only %lld of %lld keys served from the host tier", (long long)st.host_keys,
              (long long)served);
  return ok;
}

// Many calls with power-law keys: the cache never passes its budget after any call, stays bit
// for bit equal to one table, and the hot keys end up in HBM (a higher share of the keys served
// there than the cache's share of the keys).
template <typename K>
bool test_many_calls(CacheStrategy strategy) {
  const TableConfig cfg = tiered_cfg(8, strategy, 2);
  Pair<K> t = make_pair<K>(cfg);
  const std::vector<K> pool = key_pool<K>(4000);
  OptimizerParams p = test_params(OptimizerKind::kAdam);
  bool ok = true;
  const int steps = 200;
  int64_t hbm_before = 0, host_before = 0;
  for (int s = 1; s <= steps && ok; ++s) {
    const std::vector<K> keys = distinct(step_keys(pool, 256, true));
    p.step = s;
    ok &= t.lookup(keys, true) && t.tiers_ok(false);
    t.apply(keys, p, s, true);
    ok &= t.tiers_ok(s > 3);
    if (s % 25 == 0) ok &= t.lookup(draw(pool, 500), false) && t.same_size();
    if (s == steps / 2) {
      const auto st = t.got->stats();
      hbm_before = st.hbm_keys;
      host_before = st.host_keys;
    }
  }
  ok &= t.same_export();
  const auto st = t.got->stats();
  print_stats(st, steps);
  const double hbm = static_cast<double>(st.hbm_keys - hbm_before);
  const double share = hbm / (hbm + static_cast<double>(st.host_keys - host_before));
  const double cache_share = static_cast<double>(kCacheRows) / static_cast<double>(pool.size());
  std::printf("    second half: %.1f%% of the keys served from HBM (cache: %.1f%% of the keys)\n",
              100 * share, 100 * cache_share);
  if (share < 2 * cache_share) ok = FAIL("the hot keys did not settle in HBM");
  return ok;
}

// ---- HBM_DRAM_SSDHASH ----

constexpr int64_t kDramRows = 400;

TableConfig ssd_cfg(int64_t dim, CacheStrategy strategy, int slots, int64_t filter = 0) {
  TableConfig c = tiered_cfg(dim, strategy, slots, filter);
  c.storage = StorageKind::kHbmDramSsdHash;
  c.dram_bytes = kDramRows * tier_row_bytes(dim, slots);
  const char* tmp = std::getenv("TEST_TMPDIR");
  c.storage_path = tmp ? tmp : "/tmp";
  c.ssd_compact_min_bytes = 0;  // compact as soon as garbage is half the file
  return c;
}

bool dir_exists(const std::string& dir) {
  struct stat st;
  return ::stat(dir.c_str(), &st) == 0;
}

// Every tier within its budget; with expect_ssd, rows in all three.
template <typename K>
bool ssd_tiers_ok(Pair<K>& t, bool expect_ssd) {
  int64_t hbm = 0, host = 0, ssd = 0;
  SOK_OK(t.got->tier_sizes(nullptr, &hbm, &host, &ssd));
  bool ok = t.tiers_ok(false);
  if (host > t.got->dram_budget_rows())
    ok = FAIL("host tier %lld rows over its budget %lld", (long long)host,
              (long long)t.got->dram_budget_rows());
  if (expect_ssd && (hbm == 0 || host == 0 || ssd == 0))
    ok = FAIL("rows not in all tiers: HBM %lld, host %lld, SSD %lld", (long long)hbm,
              (long long)host, (long long)ssd);
  return ok;
}

// The fused calls over several tables (find_or_insert_many, apply_gradients_many: what the TF
// ops call): LFU, LRU, host-only and HBM_DRAM_SSDHASH tables with different dims (the tables'
// file work runs in parallel), one table twice in a call, and
// keys padded past a device count (a dedup's output: the padding holds present and absent keys,
// which must be neither read, counted, updated nor inserted). Each table bit for bit against its
// own one-tier table driven with the counted keys alone, call by call.
template <typename K>
bool test_fused_calls(int tables) {
  struct Spec {
    int64_t dim;
    CacheStrategy strategy;
    bool host_only, ssd;
  };
  const Spec specs[] = {{8, CacheStrategy::kLFU, false, false},
                        {5, CacheStrategy::kLRU, false, false},
                        {16, CacheStrategy::kLFU, true, false},
                        {4, CacheStrategy::kLFU, false, false},
                        {6, CacheStrategy::kLRU, false, true}};
  const int num_specs = static_cast<int>(std::size(specs));
  std::vector<Pair<K>> t;
  for (int i = 0; i < tables; ++i) {
    const Spec& sp = specs[i % num_specs];
    const TableConfig c =
        sp.ssd ? ssd_cfg(sp.dim, sp.strategy, 1) : tiered_cfg(sp.dim, sp.strategy, 1);
    t.push_back(make_pair<K>(c, sp.host_only));
  }
  const std::vector<K> pool = key_pool<K>(3000);
  const std::vector<K> fresh = key_pool<K>(6000);  // mostly keys no table ever gets
  OptimizerParams p = test_params(OptimizerKind::kAdagrad);
  bool ok = true;
  for (int s = 1; s <= 40 && ok; ++s) {
    p.step = s;
    // Call j is on table j % tables: table 0 comes twice.
    const int calls = tables + 1;
    std::vector<std::vector<K>> keys(calls);
    std::vector<DevBuf<K>> dk;
    std::vector<DevBuf<float>> out, grads;
    std::vector<DevBuf<int64_t>> count;
    std::vector<typename GpuTieredTable<K>::Call> fused(calls);
    for (int j = 0; j < calls; ++j) {
      keys[j] = distinct(step_keys(pool, 200 + 40 * j, true));
      std::vector<K> padded = keys[j];
      for (int x = 0; x < 30; ++x)
        padded.push_back(x % 2 ? pool[g_rng() % pool.size()] : fresh[g_rng() % fresh.size()]);
      const int64_t dim = t[j % tables].dim;
      dk.push_back(to_device(padded));
      out.emplace_back(padded.size() * dim);
      out.back().poison();
      grads.push_back(to_device(randn(padded.size() * dim, 0.5f)));
      count.push_back(to_device(std::vector<int64_t>{static_cast<int64_t>(keys[j].size())}));
      fused[j].table = t[j % tables].got.get();
      fused[j].keys = dk[j].get();
      fused[j].n = static_cast<int64_t>(padded.size());
      fused[j].out = out[j].get();
      fused[j].d_n = count[j].get();
    }
    SOK_OK(GpuTieredTable<K>::find_or_insert_many(fused, nullptr));
    for (int j = 0; j < calls && ok; ++j) {
      Pair<K>& q = t[j % tables];
      const size_t n = keys[j].size();
      DevBuf<K> exact = to_device(keys[j]);
      DevBuf<float> want(n * q.dim);
      SOK_OK(q.ref->find_or_insert(exact.get(), n, want.get(), nullptr, nullptr));
      const std::vector<float> got = out[j].download();
      ok &= sok_test::expect_near("fused find_or_insert",
                                  std::vector<float>(got.begin(), got.begin() + n * q.dim),
                                  want.download(), 0, 0);
      for (size_t x = n * q.dim; x < got.size() && ok; ++x)
        if (!std::isnan(got[x])) ok = FAIL("a padded key's row was written (call %d)", j);
    }
    for (int j = 0; j < calls; ++j) {
      if (j == tables) continue;  // table 0 updates once per step: its first call's keys
      fused[j].out = nullptr;
      fused[j].grads = grads[j].get();
    }
    fused.pop_back();
    SOK_OK(GpuTieredTable<K>::apply_gradients_many(fused, p, s, nullptr, true, true));
    for (int j = 0; j < tables; ++j) {
      DevBuf<K> exact = to_device(keys[j]);
      SOK_OK(t[j].ref->apply_gradients(exact.get(), keys[j].size(), grads[j].get(), p, s, nullptr,
                                       true));
      if (specs[j % num_specs].ssd) ok &= ssd_tiers_ok(t[j], false);
      else if (!specs[j % num_specs].host_only) ok &= t[j].tiers_ok(s > 3);
    }
    if (s % 10 == 0) {
      for (int j = 0; j < tables && ok; ++j) {
        // An evaluation read through a device count, then sizes: nothing padded got in.
        Pair<K>& q = t[j];
        const std::vector<K> probe = draw(pool, 300);
        std::vector<K> padded = probe;
        padded.insert(padded.end(), fresh.begin(), fresh.begin() + 20);
        DevBuf<K> dp = to_device(padded), exact = to_device(probe);
        DevBuf<int64_t> c = to_device(std::vector<int64_t>{static_cast<int64_t>(probe.size())});
        DevBuf<float> a(probe.size() * q.dim), b(padded.size() * q.dim);
        b.poison();
        SOK_OK(q.ref->find(exact.get(), probe.size(), a.get(), nullptr));
        SOK_OK(q.got->find(dp.get(), padded.size(), b.get(), nullptr, c.get()));
        const std::vector<float> got = b.download();
        ok &= sok_test::expect_near("fused find",
                                    std::vector<float>(got.begin(), got.begin() + a.size()),
                                    a.download(), 0, 0) &&
              q.same_size();
      }
    }
  }
  for (int j = 0; j < tables; ++j) {
    ok &= t[j].same_export();
    if (specs[j % num_specs].host_only) continue;
    const auto st = t[j].got->stats();
    if (st.promoted_rows == 0 || st.host_keys == 0 || st.hbm_keys == 0)
      ok = FAIL("table %d: tiers unused (%lld rows up, keys served %lld HBM / %lld host)", j,
                (long long)st.promoted_rows, (long long)st.hbm_keys, (long long)st.host_keys);
  }
  return ok;
}

// A find reads like the reference and changes no tier's rows.
template <typename K>
bool ssd_find_moves_nothing(Pair<K>& t, const std::vector<K>& keys) {
  int64_t a[3], b[3];
  SOK_OK(t.got->tier_sizes(nullptr, &a[0], &a[1], &a[2]));
  bool ok = t.lookup(keys, false);
  SOK_OK(t.got->tier_sizes(nullptr, &b[0], &b[1], &b[2]));
  if (a[0] != b[0] || a[1] != b[1] || a[2] != b[2])
    ok = FAIL("find moved rows: tiers %lld/%lld/%lld -> %lld/%lld/%lld", (long long)a[0],
              (long long)a[1], (long long)a[2], (long long)b[0], (long long)b[1], (long long)b[2]);
  return ok && t.same_size();
}

// Training over keys far more than both budgets (lookup, then update), reads, shrink with
// eviction and erase, all against one table; then the directory goes with the table.
template <typename K>
bool test_ssd_training(OptimizerKind kind, CacheStrategy strategy, bool power_law) {
  const int64_t dim = sizeof(K) == 8 ? 8 : 5;
  Pair<K> t = make_pair<K>(ssd_cfg(dim, strategy, num_slots(kind)));
  const std::vector<K> pool = key_pool<K>(4000);
  OptimizerParams p = test_params(kind);
  bool ok = true;
  for (int s = 1; s <= 24 && ok; ++s) {
    const std::vector<K> keys = step_keys(pool, 512, power_law);
    p.step = s;
    ok &= t.lookup(keys, true);
    // A trained table's lookup keeps its keys off the file (over the budget by at most the
    // call's keys), so the update that follows moves nothing up.
    int64_t hbm = 0, host = 0;
    SOK_OK(t.got->tier_sizes(nullptr, &hbm, &host));
    const int64_t up = t.got->stats().ssd_promoted_rows;
    if (s > 1 && host > t.got->dram_budget_rows() + static_cast<int64_t>(keys.size()))
      ok = FAIL("step %d: host tier %lld rows after a lookup, budget %lld + %zu keys", s,
                (long long)host, (long long)t.got->dram_budget_rows(), keys.size());
    t.apply(keys, p, 100 + s, false);
    if (s > 1 && t.got->stats().ssd_promoted_rows != up)
      ok = FAIL("step %d: the update moved %lld rows up from the file", s,
                (long long)(t.got->stats().ssd_promoted_rows - up));
    if (s % 6 == 0) ok &= ssd_find_moves_nothing(t, draw(key_pool<K>(6000), 2000));
    ok &= ssd_tiers_ok(t, s > 6);
  }
  ok &= t.same_export();
  const auto st = t.got->stats();
  if (st.ssd_promoted_rows == 0 || st.ssd_demoted_rows == 0)
    ok = FAIL("SSD tier unused: %lld rows up, %lld down", (long long)st.ssd_promoted_rows,
              (long long)st.ssd_demoted_rows);
  std::printf("    SSD: %lld key syncs, %lld rows up, %lld down in %lld batches\n",
              (long long)st.ssd_key_syncs, (long long)st.ssd_promoted_rows,
              (long long)st.ssd_demoted_rows, (long long)st.ssd_batches);
  int64_t a = 0, b = 0;
  SOK_OK(t.ref->shrink(118, nullptr, &a));
  SOK_OK(t.got->shrink(kExec, 118, &b));
  if (a != b || a == 0)
    ok = FAIL("shrink removed %lld, want %lld (> 0)", (long long)b, (long long)a);
  const std::vector<K> gone = draw(pool, 1500);
  DevBuf<K> dg = to_device(gone);
  SOK_OK(t.ref->erase(dg.get(), gone.size(), nullptr, &a));
  SOK_OK(t.got->erase(dg.get(), gone.size(), nullptr, &b));
  if (a != b) ok = FAIL("erase removed %lld, want %lld", (long long)b, (long long)a);
  ok &= t.same_export() && t.same_size();
  ok &= t.lookup(step_keys(pool, 1024, power_law), true) && t.same_export();
  const std::string dir = t.got->ssd_dir();
  if (dir.empty() || !dir_exists(dir)) ok = FAIL("no SSD directory '%s'", dir.c_str());
  t.got.reset();
  if (dir_exists(dir)) ok = FAIL("the SSD directory '%s' outlived its table", dir.c_str());
  return ok;
}

// Counter filter and insert_or_assign with rows on file.
template <typename K>
bool test_ssd_filter_and_assign() {
  Pair<K> t = make_pair<K>(ssd_cfg(16, CacheStrategy::kLFU, 1, /*filter=*/3));
  const std::vector<K> pool = key_pool<K>(3000);
  bool ok = true;
  for (int s = 1; s <= 10 && ok; ++s) {
    const std::vector<K> keys = distinct(draw(pool, 900));
    std::vector<int64_t> counts(keys.size());
    for (auto& c : counts) c = 1 + static_cast<int64_t>(g_rng() % 2);
    ok &= t.lookup(keys, true, &counts);
    OptimizerParams p = test_params(OptimizerKind::kAdagrad);
    p.step = s;
    t.apply(keys, p, s, true);
    const int64_t half = static_cast<int64_t>(keys.size()) / 2;
    const std::vector<float> v = randn(half * 16, 1.f);
    DevBuf<K> dk = to_device(std::vector<K>(keys.begin(), keys.begin() + half));
    DevBuf<float> dv = to_device(v);
    SOK_OK(t.ref->insert_or_assign(dk.get(), half, dv.get(), nullptr));
    SOK_OK(t.got->insert_or_assign(kExec, dk.get(), half, dv.get()));
    ok &= ssd_find_moves_nothing(t, draw(pool, 1000)) && ssd_tiers_ok(t, s > 3);
  }
  return ok && t.same_export();
}

// export -> import into a fresh table (rows beyond both budgets go on file), which trains on like
// the reference.
template <typename K>
bool test_ssd_export_import(CacheStrategy strategy) {
  const TableConfig cfg = ssd_cfg(8, strategy, 2);
  Pair<K> t = make_pair<K>(cfg);
  const std::vector<K> pool = key_pool<K>(3000);
  OptimizerParams p = test_params(OptimizerKind::kAdam);
  bool ok = train_steps(t, pool, p, 1, 8);
  TableSnapshot<K> snap;
  SOK_OK(t.got->export_rows(kExec, &snap));
  ok &= expect_same_table(snap, gpu_export(*t.ref), 0, 0);
  Pair<K> u{make_gpu<K>(cfg), make_tiered<K>(cfg), cfg.dim};
  SOK_OK(u.ref->import_rows(snap, nullptr));
  SOK_OK(u.got->import_rows(kExec, snap));
  ok &= u.same_export() && ssd_tiers_ok(u, true);
  ok &= train_steps(u, pool, p, 9, 14, [&] { return ssd_tiers_ok(u, true); });
  return ok && u.same_export() && u.same_size();
}

bool test_ssd_refusals() {
  TableConfig c = ssd_cfg(8, CacheStrategy::kLFU, 0);
  c.dram_bytes = 10;
  std::unique_ptr<GpuTieredTable<int64_t>> t;
  Status s = GpuTieredTable<int64_t>::Create(c, GpuTableOptions(), &t);
  bool ok = (!s.ok() && s.message().find("table '") != std::string::npos &&
             s.message().find("DRAM budget of 10 bytes") != std::string::npos) ||
            FAIL("a DRAM budget below one row was accepted: '%s'", s.message().c_str());
  c = ssd_cfg(8, CacheStrategy::kLFU, 0);
  c.storage_path = "/nonexistent/sok";
  s = GpuTieredTable<int64_t>::Create(c, GpuTableOptions(), &t);
  return (ok && !s.ok() && s.message().find("table '") != std::string::npos) ||
         FAIL("a missing storage_path was accepted: '%s'", s.message().c_str());
}

bool test_refusals() {
  TableConfig c = tiered_cfg(8, CacheStrategy::kLFU, 0);
  c.hbm_bytes = 10;
  std::unique_ptr<GpuTieredTable<int64_t>> t;
  const Status s = GpuTieredTable<int64_t>::Create(c, GpuTableOptions(), &t);
  bool ok = (!s.ok() && s.message().find("smaller than one row") != std::string::npos) ||
            FAIL("a budget below one row was accepted: '%s'", s.message().c_str());
  // More rows than a row pool can number: refused before anything of that size is allocated.
  c.hbm_bytes = (int64_t{1} << 31) * tier_row_bytes(c.dim, 0);
  const Status big = GpuTieredTable<int64_t>::Create(c, GpuTableOptions(), &t);
  ok &= (!big.ok() && big.message().find("2^31 - 1") != std::string::npos &&
         big.message().find("table '") != std::string::npos) ||
        FAIL("a budget of 2^31 rows was not refused by name: '%s'", big.message().c_str());
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  return sok_gpu_test::gpu_test_main(argc, argv, "test_tiered_table", [] {
    for (OptimizerKind o : {OptimizerKind::kSGD, OptimizerKind::kAdagrad, OptimizerKind::kAdam,
                            OptimizerKind::kFtrl}) {
      for (CacheStrategy c : {CacheStrategy::kLFU, CacheStrategy::kLRU}) {
        const std::string tag =
            std::string(oname(o)) + (c == CacheStrategy::kLFU ? " lfu" : " lru");
        run("train " + tag + " uniform int64",
            [=] { return test_training<int64_t>(o, c, false, false); });
        run("train " + tag + " power-law int32",
            [=] { return test_training<int32_t>(o, c, true, false); });
      }
      run(std::string("train host-only ") + oname(o) + " int64",
          [=] { return test_training<int64_t>(o, CacheStrategy::kLFU, true, true); });
    }
    run("counter filter + insert_or_assign int64",
        [] { return test_filter_and_assign<int64_t>(); });
    run("export/import lfu int64", [] { return test_export_import<int64_t>(CacheStrategy::kLFU); });
    run("export/import lru int32", [] { return test_export_import<int32_t>(CacheStrategy::kLRU); });
    run("chunked import lfu int64",
        [] { return test_chunked_import<int64_t>(CacheStrategy::kLFU); });
    run("chunked import lru int32",
        [] { return test_chunked_import<int32_t>(CacheStrategy::kLRU); });
    run("thrashing lfu int64", [] { return test_thrashing<int64_t>(CacheStrategy::kLFU); });
    run("thrashing lru int32", [] { return test_thrashing<int32_t>(CacheStrategy::kLRU); });
    run("many calls lfu int32", [] { return test_many_calls<int32_t>(CacheStrategy::kLFU); });
    run("many calls lru int64", [] { return test_many_calls<int64_t>(CacheStrategy::kLRU); });
    run("HBM row memory int64", [] { return test_hbm_row_memory<int64_t>(); });
    run("HBM row memory int32", [] { return test_hbm_row_memory<int32_t>(); });
    run("host row memory int64", [] { return test_host_row_memory<int64_t>(false); });
    run("host row memory host-only int32", [] { return test_host_row_memory<int32_t>(true); });
    run("fused calls int64", [] { return test_fused_calls<int64_t>(5); });
    run("fused calls int32", [] { return test_fused_calls<int32_t>(5); });
    // 35 calls: a launch of 32 parts (every bit of the host-row masks), then one of 3.
    run("fused calls int64, 34 tables", [] { return test_fused_calls<int64_t>(34); });
    run("refusals", [] { return test_refusals(); });
    for (OptimizerKind o : {OptimizerKind::kAdagrad, OptimizerKind::kAdam}) {
      for (CacheStrategy c : {CacheStrategy::kLFU, CacheStrategy::kLRU}) {
        const std::string tag =
            std::string(oname(o)) + (c == CacheStrategy::kLFU ? " lfu" : " lru");
        run("ssd train " + tag + " uniform int64",
            [=] { return test_ssd_training<int64_t>(o, c, false); });
        run("ssd train " + tag + " power-law int32",
            [=] { return test_ssd_training<int32_t>(o, c, true); });
      }
    }
    run("ssd counter filter + insert_or_assign int64",
        [] { return test_ssd_filter_and_assign<int64_t>(); });
    run("ssd export/import lfu int64",
        [] { return test_ssd_export_import<int64_t>(CacheStrategy::kLFU); });
    run("ssd export/import lru int32",
        [] { return test_ssd_export_import<int32_t>(CacheStrategy::kLRU); });
    run("ssd refusals", [] { return test_ssd_refusals(); });
  });
}
