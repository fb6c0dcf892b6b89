// find_or_insert_many / apply_gradients_many (many tables in one call) vs one CPU call per
// table.
// Usage: test_many_tables [seed (0: from the clock)] [name filter]; see test_util.cuh.
#include <cstdint>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "tests/gpu/test_util.cuh"

using namespace sok_gpu_test;  // NOLINT

namespace {

// Many calls of find_or_insert_many / apply_gradients_many whose keys mostly repeat while new
// ones trickle in: the tables' bounds then go through the shared counter snapshots (one copy and
// one event per call) and through growth, updates after a lookup of the same keys reserve no room
// (keys_present); no key is lost or doubled, no table overflows.
bool test_many_tables_snapshots() {
  const int num_tables = 20;
  std::vector<std::unique_ptr<GpuEmbeddingTable<int64_t>>> gpu;
  std::vector<std::vector<int64_t>> pools;
  for (int t = 0; t < num_tables; ++t) {
    TableConfig cfg = make_cfg(4, InitKind::kConstant, 0, 0, /*cap=*/16);
    cfg.name = "s" + std::to_string(t);
    gpu.push_back(make_gpu<int64_t>(cfg));
    pools.push_back(key_pool<int64_t>(600 * (t % 4 + 1) + 50));
  }
  std::vector<int> table_of(num_tables);
  std::iota(table_of.begin(), table_of.end(), 0);
  table_of.push_back(3);  // a table twice in one call
  std::vector<std::unordered_set<int64_t>> seen(num_tables);
  OptimizerParams p;
  p.kind = OptimizerKind::kSGD;
  p.lr = 0.f;  // rows keep their initial value: the finds below check them
  for (int r = 0; r < 60; ++r) {
    std::vector<DevBuf<int64_t>> dkeys;
    std::vector<DevBuf<float>> dgrads;
    std::vector<GpuEmbeddingTable<int64_t>::Keys> calls;
    for (int t : table_of) {
      // Round r draws from the first (r + 1) / 60 of the table's pool.
      const size_t avail = std::max<size_t>(1, pools[t].size() * (r + 1) / 60);
      const std::vector<int64_t> prefix(pools[t].begin(), pools[t].begin() + avail);
      const std::vector<int64_t> keys = draw(prefix, 500);
      seen[t].insert(keys.begin(), keys.end());
      dkeys.push_back(to_device(keys));
      dgrads.push_back(to_device(std::vector<float>(keys.size() * 4, 1.f)));
    }
    for (size_t e = 0; e < table_of.size(); ++e) {
      GpuEmbeddingTable<int64_t>::Keys c;
      c.table = gpu[table_of[e]].get();
      c.keys = dkeys[e].get();
      c.n = 500;
      c.grads = dgrads[e].get();
      calls.push_back(c);
    }
    // Every 4th round the update alone inserts; otherwise a lookup first, then the update of
    // the same keys (keys_present: the lookup inserted them).
    const bool looked_up = r % 4 != 3;
    if (looked_up) SOK_OK(GpuEmbeddingTable<int64_t>::find_or_insert_many(calls, nullptr));
    SOK_OK(
        GpuEmbeddingTable<int64_t>::apply_gradients_many(calls, p, r, nullptr, false, looked_up));
  }
  for (int t = 0; t < num_tables; ++t) {
    int64_t size = 0;
    SOK_OK(gpu[t]->size(&size, nullptr));
    if (size != static_cast<int64_t>(seen[t].size()))
      return FAIL("table %d: size %lld, want %zu", t, (long long)size, seen[t].size());
    // A bound gone wrong grows far past the keys (or overflows the table, an error above).
    if (gpu[t]->capacity() > 4 * 4 * static_cast<int64_t>(seen[t].size()) + 64)
      return FAIL("table %d: capacity %lld for %zu keys", t, (long long)gpu[t]->capacity(),
                  seen[t].size());
    const std::vector<int64_t> all(seen[t].begin(), seen[t].end());
    DevBuf<int64_t> da = to_device(all);
    DevBuf<float> df(all.size() * 4);
    df.poison();
    SOK_OK(gpu[t]->find(da.get(), all.size(), df.get(), nullptr));
    const std::vector<float> f = df.download();
    for (size_t i = 0; i < f.size(); ++i)
      if (f[i] != 0.125f) return FAIL("table %d: key %zu reads %g", t, i / 4, f[i]);
  }
  return true;
}

// An owner's calls: each call's distinct keys with a bound n far above their count (every rank's
// copy of a key; the true count on the device, d_n), n changing from call to call. A table waits
// on its counters only to grow: tables of a fixed set of keys (one named twice a call) stop
// waiting once they have room for the largest n, a table whose keys keep growing waits only when
// it grows. (With the counters copied before each call's launch, table 0 waited 8 times for 2
// growths; with a repeated table prepared per entry, table 1 waited 10 times for 1 growth.)
bool test_owner_calls_wait_only_to_grow() {
  const int num_tables = 3;  // 0: fixed keys; 1: fixed keys, twice a call; 2: growing keys
  std::vector<std::unique_ptr<GpuEmbeddingTable<int64_t>>> gpu;
  for (int t = 0; t < num_tables; ++t) {
    TableConfig cfg = make_cfg(8, InitKind::kConstant, 0, 0, /*cap=*/64);
    cfg.name = "owner" + std::to_string(t);
    gpu.push_back(make_gpu<int64_t>(cfg));
  }
  const std::vector<int64_t> pool = key_pool<int64_t>(20000);
  const std::vector<int> table_of = {0, 1, 2, 1};
  OptimizerParams p;
  p.kind = OptimizerKind::kSGD;
  p.lr = 0.f;
  std::vector<int64_t> growths(num_tables), capacity(num_tables), syncs_at_round10(num_tables);
  for (int t = 0; t < num_tables; ++t) capacity[t] = gpu[t]->capacity();
  for (int r = 0; r < 40; ++r) {
    if (r == 10)  // every n (4,000 to 10,000) has come by now
      for (int t = 0; t < num_tables; ++t) syncs_at_round10[t] = gpu[t]->host_syncs();
    std::vector<DevBuf<int64_t>> dkeys, dns;
    std::vector<DevBuf<float>> dgrads;
    std::vector<GpuEmbeddingTable<int64_t>::Keys> calls;
    for (size_t e = 0; e < table_of.size(); ++e) {
      const int t = table_of[e];
      // Tables 0 and 1: 300 keys of their own each call; table 2: 300 new keys each call.
      const size_t first = t == 2 ? 1000 + 300 * r : 300 * t;
      const std::vector<int64_t> keys(pool.begin() + first, pool.begin() + first + 300);
      const int64_t bound = 4000 + 1500 * ((r * 7 + static_cast<int>(e)) % 5);  // 4,000 to 10,000
      std::vector<int64_t> padded = keys;
      padded.resize(bound, -1);  // past d_n: never read
      dkeys.push_back(to_device(padded));
      dns.push_back(to_device(std::vector<int64_t>{static_cast<int64_t>(keys.size())}));
      dgrads.push_back(to_device(std::vector<float>(bound * 8, 0.f)));
      GpuEmbeddingTable<int64_t>::Keys c;
      c.table = gpu[t].get();
      c.keys = dkeys.back().get();
      c.n = bound;
      c.d_n = dns.back().get();
      c.grads = dgrads.back().get();
      calls.push_back(c);
    }
    SOK_OK(GpuEmbeddingTable<int64_t>::find_or_insert_many(calls, nullptr));
    SOK_OK(GpuEmbeddingTable<int64_t>::apply_gradients_many(calls, p, r, nullptr, true, true));
    CUDA_OK(cudaStreamSynchronize(nullptr));  // the snapshots have landed by the next call
    for (int t = 0; t < num_tables; ++t) {
      if (gpu[t]->capacity() != capacity[t]) ++growths[t];
      capacity[t] = gpu[t]->capacity();
    }
  }
  for (int t = 0; t < num_tables; ++t) {
    const long long syncs = gpu[t]->host_syncs(), late = syncs - syncs_at_round10[t];
    if (syncs > growths[t])
      return FAIL("table %d: %lld waits on its counters for %lld growths", t, syncs,
                  (long long)growths[t]);
    if (t < 2 && late != 0)
      return FAIL("table %d: %lld waits on its counters after the tenth call", t, late);
    int64_t size = 0;
    SOK_OK(gpu[t]->size(&size, nullptr));
    const int64_t want = t < 2 ? 300 : 300 * 40;
    if (size != want)
      return FAIL("table %d: size %lld, want %lld", t, (long long)size, (long long)want);
  }
  return true;
}

// find_or_insert_many / apply_gradients_many over many tables (more than one launch's worth,
// dims with and without float4 rows, a table named twice in one call, an empty entry) vs one
// CPU call per entry in order.
template <typename K>
bool test_many_tables(int num_tables, bool keys_unique) {
  const int64_t dims[] = {16, 5, 32, 1, 33, 8};
  const InitKind inits[] = {InitKind::kUniform, InitKind::kConstant, InitKind::kMatrix};
  std::vector<std::unique_ptr<EmbeddingTable<K>>> cpu;
  std::vector<std::unique_ptr<GpuEmbeddingTable<K>>> gpu;
  for (int t = 0; t < num_tables; ++t) {
    TableConfig cfg = make_cfg(dims[t % 6], inits[t % 3]);
    cfg.name = "t" + std::to_string(t);
    cpu.emplace_back(new EmbeddingTable<K>(cfg));
    gpu.push_back(make_gpu<K>(cfg));
  }
  // Entries: every table once, then table 1 again; the entry of table 2 has no keys.
  std::vector<int> table_of(num_tables);
  std::iota(table_of.begin(), table_of.end(), 0);
  table_of.push_back(1);
  const std::vector<K> pool = key_pool<K>(2000);
  OptimizerParams p = test_params(OptimizerKind::kAdagrad);
  bool ok = true;
  for (int s = 1; s <= 4 && ok; ++s) {
    std::vector<std::vector<K>> keys(table_of.size());
    std::vector<std::vector<float>> grads(table_of.size());
    std::vector<DevBuf<K>> dkeys;
    std::vector<DevBuf<float>> dgrads, douts;
    std::vector<typename GpuEmbeddingTable<K>::Keys> reads, updates;
    for (size_t e = 0; e < table_of.size(); ++e) {
      const int t = table_of[e];
      const int64_t dim = gpu[t]->dim();
      keys[e] = t == 2 ? std::vector<K>() : draw(pool, 100 + 37 * e);
      if (keys_unique) {
        std::unordered_set<K> seen;
        std::vector<K> u;
        for (K k : keys[e])
          if (seen.insert(k).second) u.push_back(k);
        keys[e] = u;
      }
      grads[e] = randn(keys[e].size() * dim, 0.5f);
      dkeys.push_back(to_device(keys[e]));
      dgrads.push_back(to_device(grads[e]));
      douts.emplace_back(std::max<size_t>(keys[e].size() * dim, 1));
      douts.back().poison();
    }
    for (size_t e = 0; e < table_of.size(); ++e) {
      typename GpuEmbeddingTable<K>::Keys c;
      c.table = gpu[table_of[e]].get();
      c.keys = dkeys[e].get();
      c.n = static_cast<int64_t>(keys[e].size());
      c.out = douts[e].get();
      reads.push_back(c);
      c.out = nullptr;
      c.grads = dgrads[e].get();
      updates.push_back(c);
    }
    SOK_OK(GpuEmbeddingTable<K>::find_or_insert_many(reads, nullptr));
    for (size_t e = 0; e < table_of.size() && ok; ++e) {
      const int t = table_of[e];
      std::vector<float> want(keys[e].size() * gpu[t]->dim());
      cpu[t]->find_or_insert(keys[e].data(), keys[e].size(), want.data());
      std::vector<float> got = douts[e].download();
      got.resize(want.size());
      ok &= sok_test::expect_near(("rows of entry " + std::to_string(e)).c_str(), got, want, 1e-6,
                                  1e-7);
    }
    p.step = s;
    SOK_OK(GpuEmbeddingTable<K>::apply_gradients_many(updates, p, 100 + s, nullptr, keys_unique));
    for (size_t e = 0; e < table_of.size(); ++e) {
      SOK_OK(cpu[table_of[e]]->apply_gradients(keys[e].data(), keys[e].size(), grads[e].data(), p,
                                               100 + s));
    }
  }
  for (int t = 0; t < num_tables && ok; ++t)
    ok &= expect_same_table(gpu_export(*gpu[t]), cpu[t]->export_rows(), 1e-5, 1e-6);
  // An empty call does nothing.
  SOK_OK(GpuEmbeddingTable<K>::find_or_insert_many({}, nullptr));
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  return sok_gpu_test::gpu_test_main(argc, argv, "test_many_tables", [] {
    for (bool u : {false, true}) {
      run(std::string("find_or_insert_many / apply_gradients_many 20 tables int64 ") +
              (u ? "unique ids" : "repeated ids"),
          [u] { return test_many_tables<int64_t>(20, u); });
      run(std::string(
              "find_or_insert_many / apply_gradients_many 40 tables int64 (two launches) ") +
              (u ? "unique ids" : "repeated ids"),
          [u] { return test_many_tables<int64_t>(40, u); });
      run(std::string("find_or_insert_many / apply_gradients_many 3 tables int32 ") +
              (u ? "unique ids" : "repeated ids"),
          [u] { return test_many_tables<int32_t>(3, u); });
    }
    run("find_or_insert_many / apply_gradients_many: bounds through shared snapshots, growth",
        [] { return test_many_tables_snapshots(); });
    run("find_or_insert_many: an owner's padded calls wait on the counters only to grow",
        [] { return test_owner_calls_wait_only_to_grow(); });
  });
}
