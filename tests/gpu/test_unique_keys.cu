// unique_keys (one table) and unique_keys_multi + stable_sample_order_multi (every table of a
// lookup at once) vs the CPU core's unique_keys / check_positions / stable_sample_order.
// Usage: test_unique_keys [seed (0: from the clock)] [name filter]; see test_util.cuh.
#include <cstdint>
#include <string>
#include <vector>

#include "tests/gpu/test_util.cuh"

using namespace sok_gpu_test;  // NOLINT

namespace {

template <typename K>
bool test_unique(size_t n, size_t pool_n) {
  const std::vector<K> keys = draw(key_pool<K>(pool_n), n);
  std::vector<K> cu;
  std::vector<int32_t> cinv(n);
  std::vector<int64_t> ccnt;
  unique_keys(keys.data(), static_cast<int64_t>(n), &cu, cinv.data(), &ccnt);
  DevBuf<K> dk = to_device(keys), du(n);
  DevBuf<int32_t> dinv(n);
  DevBuf<int64_t> dcnt(n), dnum(1);
  du.poison();
  dinv.poison();
  dcnt.poison();
  dnum.poison();
  SOK_OK(unique_keys<K>(dk.get(), n, du.get(), dinv.get(), dcnt.get(), dnum.get(), nullptr));
  const int64_t u = dnum.download(1)[0];
  bool ok = true;
  if (u != static_cast<int64_t>(cu.size()))
    return FAIL("num_unique %lld want %zu", (long long)u, cu.size());
  ok &= sok_test::expect_eq("unique", du.download(u), cu);
  ok &= sok_test::expect_eq("inverse", dinv.download(n), cinv);
  ok &= sok_test::expect_eq("counts", dcnt.download(u), ccnt);
  return ok;
}

// One table of unique_keys_multi: keys (int32 tables hold int32 values), positions [n, rank].
struct MultiTable {
  bool int64 = true;
  std::vector<int64_t> keys, positions, dense_shape;
};

// Random ids of table t: a few tables per dtype, sizes from empty to 200K, samples in order or
// shuffled, everything within dense_shape [batch, 50].
std::vector<MultiTable> random_tables(int count) {
  const int64_t sizes[] = {0, 1, 37, 1000, 20000, 200000};
  std::vector<MultiTable> tables(count);
  for (int t = 0; t < count; ++t) {
    MultiTable& m = tables[t];
    m.int64 = t % 3 != 1;
    const int64_t n = sizes[g_rng() % 6];
    const size_t pool = 1 + g_rng() % (n + 1);
    if (m.int64) {
      m.keys = draw(key_pool<int64_t>(pool), n);
    } else {
      const std::vector<int32_t> k = draw(key_pool<int32_t>(pool), n);
      m.keys.assign(k.begin(), k.end());
    }
    const int64_t batch = 1 + n / 4;
    m.dense_shape = {batch, 50};
    std::vector<int64_t> samples(n);
    for (auto& x : samples) x = static_cast<int64_t>(g_rng() % batch);
    if (g_rng() % 2) std::sort(samples.begin(), samples.end());
    for (int64_t i = 0; i < n; ++i) {
      m.positions.push_back(samples[i]);
      m.positions.push_back(static_cast<int64_t>(g_rng() % 50));
    }
  }
  return tables;
}

// unique_valid_counts: what the exchange's plan takes from the dedup's reports (the distinct
// count, -1 for a table with bad positions), against the reports read back.
bool check_valid_counts(DevBuf<int64_t>& reports, size_t nt) {
  const auto* d_reports = reinterpret_cast<const UniqueTableReport*>(reports.get());
  DevBuf<int64_t> valid(nt);
  valid.poison();
  SOK_OK(unique_valid_counts(d_reports, static_cast<int>(nt), valid.get(), nullptr));
  const std::vector<int64_t> rep = reports.download();
  std::vector<int64_t> want(nt);
  for (size_t t = 0; t < nt; ++t) want[t] = rep[3 * t + 1] >= 0 ? -1 : rep[3 * t];
  return sok_test::expect_eq("valid counts", valid.download(nt), want);
}

// unique_keys_multi (then stable_sample_order_multi for the unordered tables without errors)
// against the CPU core's unique_keys / check_positions / stable_sample_order, table by table.
bool check_unique_multi(const std::vector<MultiTable>& tables) {
  const size_t nt = tables.size();
  std::vector<DevBuf<int64_t>> k64(nt), u64(nt), pos(nt), cnt(nt);
  std::vector<DevBuf<int32_t>> k32(nt), u32(nt), inv(nt), order(nt);
  std::vector<UniqueTable> spans(nt);
  for (size_t t = 0; t < nt; ++t) {
    const MultiTable& m = tables[t];
    const size_t n = m.keys.size();
    UniqueTable& s = spans[t];
    s.keys_int64 = m.int64;
    s.n = static_cast<int64_t>(n);
    if (m.int64) {
      k64[t].upload(m.keys);
      u64[t].resize(n);
      u64[t].poison();
      s.keys = k64[t].get();
      s.unique = u64[t].get();
    } else {
      k32[t].upload(std::vector<int32_t>(m.keys.begin(), m.keys.end()));
      u32[t].resize(n);
      u32[t].poison();
      s.keys = k32[t].get();
      s.unique = u32[t].get();
    }
    inv[t].resize(n);
    inv[t].poison();
    cnt[t].resize(n);
    cnt[t].poison();
    pos[t].upload(m.positions);
    s.inverse = inv[t].get();
    s.counts = cnt[t].get();
    s.positions = pos[t].get();
    s.rank = static_cast<int>(m.dense_shape.size());
    s.dense_shape = m.dense_shape.data();
  }
  DevBuf<int64_t> reports(3 * nt);
  reports.poison();
  SOK_OK(unique_keys_multi(spans, reinterpret_cast<UniqueTableReport*>(reports.get()), nullptr));
  const std::vector<int64_t> rep = reports.download();
  bool ok = true;
  std::vector<SampleOrderTable> unordered;
  std::vector<size_t> unordered_ids;
  for (size_t t = 0; t < nt; ++t) {
    const MultiTable& m = tables[t];
    const int64_t n = static_cast<int64_t>(m.keys.size());
    std::vector<int64_t> cu, ccnt;
    std::vector<int32_t> cinv(n);
    if (m.int64) {
      unique_keys(m.keys.data(), n, &cu, cinv.data(), &ccnt);
    } else {
      const std::vector<int32_t> k(m.keys.begin(), m.keys.end());
      std::vector<int32_t> u;
      unique_keys(k.data(), n, &u, cinv.data(), &ccnt);
      cu.assign(u.begin(), u.end());
    }
    const PositionsCheck c = check_positions(
        m.positions.data(), n, static_cast<int>(m.dense_shape.size()), m.dense_shape.data());
    const std::string name = "table " + std::to_string(t);
    ok &= sok_test::expect_eq(
        (name + " report").c_str(),
        std::vector<int64_t>(rep.begin() + 3 * t, rep.begin() + 3 * t + 3),
        std::vector<int64_t>{static_cast<int64_t>(cu.size()), c.first_outside, c.first_unordered});
    if (rep[3 * t] != static_cast<int64_t>(cu.size())) continue;
    std::vector<int64_t> gu;
    if (m.int64) {
      gu = u64[t].download(cu.size());
    } else {
      const std::vector<int32_t> u = u32[t].download(cu.size());
      gu.assign(u.begin(), u.end());
    }
    ok &= sok_test::expect_eq((name + " unique").c_str(), gu, cu);
    ok &= sok_test::expect_eq((name + " inverse").c_str(), inv[t].download(n), cinv);
    ok &= sok_test::expect_eq((name + " counts").c_str(), cnt[t].download(cu.size()), ccnt);
    if (c.first_outside < 0 && c.first_unordered >= 0) {
      order[t].resize(n);
      order[t].poison();
      unordered.push_back(SampleOrderTable{pos[t].get(), n, static_cast<int>(m.dense_shape.size()),
                                           m.dense_shape[0], order[t].get()});
      unordered_ids.push_back(t);
    }
  }
  SOK_OK(stable_sample_order_multi(unordered, nullptr));
  for (size_t t : unordered_ids) {
    const MultiTable& m = tables[t];
    const int64_t n = static_cast<int64_t>(m.keys.size());
    std::vector<int32_t> want(n);
    stable_sample_order(m.positions.data(), n, static_cast<int>(m.dense_shape.size()), want.data());
    ok &= sok_test::expect_eq(("table " + std::to_string(t) + " order").c_str(),
                              order[t].download(n), want);
  }
  return ok && check_valid_counts(reports, nt);
}

bool test_unique_multi(int count) { return check_unique_multi(random_tables(count)); }

// Bad indices in several tables (a negative column, a sample beyond the batch, a column beyond):
// each table reports its first bad id.
bool test_unique_multi_bad_positions() {
  std::vector<MultiTable> tables = random_tables(9);
  for (size_t t = 0; t < tables.size(); t += 2) {
    MultiTable& m = tables[t];
    const int64_t n = static_cast<int64_t>(m.keys.size());
    if (n == 0) continue;
    for (int bad = 0; bad < 3; ++bad) {
      const int64_t i = static_cast<int64_t>(g_rng() % n);
      if (bad == 0) m.positions[2 * i + 1] = -1;
      if (bad == 1) m.positions[2 * i] = m.dense_shape[0];
      if (bad == 2) m.positions[2 * i + 1] = m.dense_shape[1] + 7;
    }
  }
  return check_unique_multi(tables);
}

// Samples near 2^62 (dense_shape[0] = 2^62): the (table, sample) keys of 7 tables do not fit 64
// bits, so the order is sorted in several batches; rank-1 positions (RaggedTensor row ids).
bool test_sample_order_wide() {
  std::vector<MultiTable> tables(7);
  for (size_t t = 0; t < tables.size(); ++t) {
    MultiTable& m = tables[t];
    const bool wide = t % 2 == 0;
    const int64_t n = 3000 + static_cast<int64_t>(t);
    const int64_t batch = wide ? (int64_t{1} << 62) : 100;
    m.dense_shape = {batch};
    for (int64_t i = 0; i < n; ++i) {
      m.keys.push_back(static_cast<int64_t>(g_rng() % 500));
      m.positions.push_back(wide ? batch - 1 - static_cast<int64_t>(g_rng() % 64)
                                 : static_cast<int64_t>(g_rng() % batch));
    }
  }
  return check_unique_multi(tables);
}

}  // namespace

int main(int argc, char** argv) {
  return sok_gpu_test::gpu_test_main(argc, argv, "test_unique_keys", [] {
    run("unique_keys int32 (1M ids, 100K distinct, extremes)",
        [] { return test_unique<int32_t>(1 << 20, 100000); });
    run("unique_keys int64 (1M ids, 100K distinct, extremes)",
        [] { return test_unique<int64_t>(1 << 20, 100000); });
    run("unique_keys int64 (all distinct)", [] { return test_unique<int64_t>(300000, 300000); });
    run("unique_keys int64 (one key)", [] { return test_unique<int64_t>(1000, 1); });
    run("unique_keys_multi 1 table", [] { return test_unique_multi(1); });
    run("unique_keys_multi 26 tables int32+int64, empty ones, shuffled samples",
        [] { return test_unique_multi(26); });
    run("unique_keys_multi 200 tables", [] { return test_unique_multi(200); });
    run("unique_keys_multi: first bad position per table",
        [] { return test_unique_multi_bad_positions(); });
    run("stable_sample_order_multi: samples near 2^62, split batches",
        [] { return test_sample_order_wide(); });
  });
}
