// The tiered table (DRAM over an SSD store) against one EmbeddingTable holding every row: same
// lookups, updates, exports, shrinks and erases, to the bit, with a DRAM budget of a few rows.
#include "addons/sparse_operation_kit/core/tiered_table.h"

#include <sys/stat.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"

namespace {

using sok::CacheStrategy;
using sok::TableSnapshot;

constexpr int64_t kDim = 3;

std::string temp_root() {
  const char* t = std::getenv("TEST_TMPDIR");
  return t ? t : "/tmp";
}

sok::TableConfig base_config() {
  sok::TableConfig c;
  c.name = "tiered";
  c.dim = kDim;
  c.init.kind = sok::InitKind::kUniform;
  c.init.a = -1.f;
  c.init.b = 1.f;
  c.init.seed = 11;
  c.initial_capacity = 4;
  return c;
}

sok::TableConfig tiered_config(sok::TableConfig c, CacheStrategy strategy, int num_slots,
                               int64_t rows) {
  c.storage = sok::StorageKind::kDramSsdHash;
  c.storage_path = temp_root();
  c.cache_strategy = strategy;
  c.dram_bytes = rows * sok::tier_row_bytes(c.dim, num_slots);
  c.ssd_compact_min_bytes = 0;  // compact as soon as garbage is half the file
  return c;
}

struct Pair {
  std::unique_ptr<sok::Table<int64_t>> one;  // every row in memory
  std::unique_ptr<sok::TieredTable<int64_t>> two;
  sok::ExecContext exec;
};

Pair make_pair(const sok::TableConfig& base, CacheStrategy strategy, int num_slots, int64_t rows) {
  Pair p;
  EXPECT_TRUE(sok::new_cpu_table<int64_t>(base, &p.one).ok());
  sok::Status s =
      sok::TieredTable<int64_t>::Create(tiered_config(base, strategy, num_slots, rows), &p.two);
  EXPECT_TRUE(s.ok()) << s.message();
  return p;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// key -> (values, slots, freq, version), so that tier order does not matter.
using Rows =
    std::map<int64_t, std::tuple<std::vector<float>, std::vector<float>, int64_t, int64_t>>;
Rows by_key(const TableSnapshot<int64_t>& s) {
  Rows out;
  const int64_t d = s.dim, st = s.num_slots * d;
  for (size_t i = 0; i < s.keys.size(); ++i) {
    out[s.keys[i]] = {std::vector<float>(s.values.begin() + i * d, s.values.begin() + (i + 1) * d),
                      std::vector<float>(s.slots.begin() + i * st, s.slots.begin() + (i + 1) * st),
                      s.freqs[i], s.versions[i]};
  }
  return out;
}

void expect_same_content(Pair& p) {
  TableSnapshot<int64_t> a, b;
  ASSERT_TRUE(p.one->export_rows(p.exec, &a).ok());
  sok::Status s = p.two->export_rows(p.exec, &b);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(a.num_slots, b.num_slots);
  EXPECT_EQ(a.slot_kind, b.slot_kind);
  const Rows ra = by_key(a), rb = by_key(b);
  ASSERT_EQ(ra.size(), rb.size());
  for (const auto& kv : ra) {
    auto it = rb.find(kv.first);
    ASSERT_TRUE(it != rb.end()) << kv.first;
    EXPECT_TRUE(same_bits(std::get<0>(kv.second), std::get<0>(it->second))) << kv.first;
    EXPECT_TRUE(same_bits(std::get<1>(kv.second), std::get<1>(it->second))) << kv.first;
    EXPECT_EQ(std::get<2>(kv.second), std::get<2>(it->second)) << kv.first;
    EXPECT_EQ(std::get<3>(kv.second), std::get<3>(it->second)) << kv.first;
  }
  int64_t na = 0, nb = 0;
  ASSERT_TRUE(p.one->size(p.exec, &na).ok());
  ASSERT_TRUE(p.two->size(p.exec, &nb).ok());
  EXPECT_EQ(na, nb);
}

// Lookups (training and evaluation) and optimizer steps over random keys, compared each step.
void train(Pair& p, const sok::OptimizerParams& base, int steps, int64_t key_range, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int64_t> key(-key_range, key_range);
  std::normal_distribution<float> grad(0.f, 1.f);
  for (int step = 0; step < steps; ++step) {
    const int64_t n = 1 + static_cast<int64_t>(rng() % 9);
    std::vector<int64_t> keys(n);
    for (auto& k : keys) k = key(rng);
    std::vector<float> a(n * kDim), b(n * kDim), g(n * kDim);
    ASSERT_TRUE(p.one->find_or_insert(p.exec, keys.data(), n, a.data(), nullptr).ok());
    sok::Status s = p.two->find_or_insert(p.exec, keys.data(), n, b.data(), nullptr);
    ASSERT_TRUE(s.ok()) << s.message();
    ASSERT_TRUE(same_bits(a, b)) << "training lookup, step " << step;
    for (auto& x : g) x = grad(rng);
    sok::OptimizerParams o = base;
    o.step = step + 1;
    ASSERT_TRUE(p.one->apply_gradients(p.exec, keys.data(), n, g.data(), o, step, false).ok());
    s = p.two->apply_gradients(p.exec, keys.data(), n, g.data(), o, step, false);
    ASSERT_TRUE(s.ok()) << s.message();
    keys.push_back(key_range * 3);  // never inserted
    std::vector<float> ea((n + 1) * kDim), eb((n + 1) * kDim);
    ASSERT_TRUE(p.one->find(p.exec, keys.data(), n + 1, ea.data()).ok());
    ASSERT_TRUE(p.two->find(p.exec, keys.data(), n + 1, eb.data()).ok());
    ASSERT_TRUE(same_bits(ea, eb)) << "evaluation lookup, step " << step;
  }
}

sok::OptimizerParams adagrad() {
  sok::OptimizerParams o;
  o.kind = sok::OptimizerKind::kAdagrad;
  o.lr = 0.1f;
  return o;
}

sok::OptimizerParams adam() {
  sok::OptimizerParams o;
  o.kind = sok::OptimizerKind::kAdam;
  o.lr = 0.01f;
  o.epsilon = 1e-7f;
  return o;
}

// export_into's fields, each in its own byte buffer, with the shape it was asked for.
struct Exported {
  std::vector<std::vector<char>> bytes = std::vector<std::vector<char>>(7);
  std::vector<std::vector<int64_t>> shapes = std::vector<std::vector<int64_t>>(7);
};

void expect_export_into_equals_export_rows(sok::Table<int64_t>* t, const sok::ExecContext& e) {
  TableSnapshot<int64_t> want;
  ASSERT_TRUE(t->export_rows(e, &want).ok());
  Exported got;
  const sok::AllocateField allocate = [&got](sok::SnapshotField f,
                                             const std::vector<int64_t>& shape, void** data) {
    const int i = static_cast<int>(f);
    int64_t count = 1;
    for (int64_t d : shape) count *= d;
    const size_t elem = f == sok::SnapshotField::kSlotKind ? 4 : 8;  // int32; int64 keys
    const size_t size = f == sok::SnapshotField::kValues || f == sok::SnapshotField::kSlots ||
                                f == sok::SnapshotField::kSlotInit
                            ? 4
                            : elem;
    got.shapes[i] = shape;
    got.bytes[i].assign(count * size + 1, 0);  // +1: never a null pointer
    *data = got.bytes[i].data();
    return sok::Status::OK();
  };
  ASSERT_TRUE(t->export_into(e, allocate).ok());
  const int64_t n = static_cast<int64_t>(want.keys.size());
  const auto same = [&](sok::SnapshotField f, std::vector<int64_t> shape, const void* data,
                        size_t bytes) {
    const int i = static_cast<int>(f);
    EXPECT_EQ(got.shapes[i], shape) << sok::snapshot_field_name(f);
    EXPECT_EQ(std::memcmp(got.bytes[i].data(), data, bytes), 0) << sok::snapshot_field_name(f);
  };
  same(sok::SnapshotField::kKeys, {n}, want.keys.data(), n * 8);
  same(sok::SnapshotField::kValues, {n, want.dim}, want.values.data(), want.values.size() * 4);
  same(sok::SnapshotField::kSlots, {n, want.num_slots, want.dim}, want.slots.data(),
       want.slots.size() * 4);
  same(sok::SnapshotField::kFreqs, {n}, want.freqs.data(), n * 8);
  same(sok::SnapshotField::kVersions, {n}, want.versions.data(), n * 8);
  const int32_t kind = want.slot_kind;
  same(sok::SnapshotField::kSlotKind, {}, &kind, 4);
  same(sok::SnapshotField::kSlotInit, {static_cast<int64_t>(want.slot_init.size())},
       want.slot_init.data(), want.slot_init.size() * 4);
}

class TieredTableTest : public ::testing::TestWithParam<CacheStrategy> {};

}  // namespace

TEST_P(TieredTableTest, training_matches_one_tier_bit_for_bit) {
  for (const sok::OptimizerParams& o : {adagrad(), adam()}) {
    Pair p = make_pair(base_config(), GetParam(), 2, 4);
    train(p, o, 150, 20, 5);
    expect_same_content(p);
    EXPECT_LE(p.two->memory_rows(), 4);  // the budget holds between operations
    EXPECT_GT(p.two->ssd_rows(), 10);    // most rows went down and came back
  }
}

TEST_P(TieredTableTest, filter_counts_travel_with_the_rows) {
  sok::TableConfig c = base_config();
  c.filter_freq = 3;
  c.default_value_no_permission = 0.5f;
  Pair p = make_pair(c, GetParam(), 1, 3);
  train(p, adagrad(), 120, 12, 9);
  expect_same_content(p);
}

TEST_P(TieredTableTest, shrink_and_erase_cover_both_tiers) {
  sok::TableConfig c = base_config();
  c.steps_to_live = 20;
  Pair p = make_pair(c, GetParam(), 1, 5);
  train(p, adagrad(), 100, 40, 3);
  ASSERT_GT(p.two->ssd_rows(), 0);
  int64_t ra = 0, rb = 0;
  ASSERT_TRUE(p.one->shrink(p.exec, 100, &ra).ok());
  ASSERT_TRUE(p.two->shrink(p.exec, 100, &rb).ok());
  EXPECT_GT(ra, 0);
  EXPECT_EQ(ra, rb);
  expect_same_content(p);
  // Erase every other key of what is left, wherever it lives.
  TableSnapshot<int64_t> snap;
  ASSERT_TRUE(p.two->export_rows(p.exec, &snap).ok());
  std::vector<int64_t> gone;
  for (size_t i = 0; i < snap.keys.size(); i += 2) gone.push_back(snap.keys[i]);
  gone.push_back(1LL << 50);  // absent
  int64_t removed = 0;
  ASSERT_TRUE(p.two->erase(gone.data(), gone.size(), &removed).ok());
  EXPECT_EQ(removed, static_cast<int64_t>(gone.size()) - 1);
  int64_t n = 0;
  ASSERT_TRUE(p.two->size(p.exec, &n).ok());
  EXPECT_EQ(n, static_cast<int64_t>(snap.keys.size() - gone.size() + 1));
}

// The one-tier table writes the export op's outputs from its rows directly, the tiered one
// through its snapshot (table.h's default): both give export_rows' fields, shapes and bytes.
TEST_P(TieredTableTest, export_into_gives_export_rows_fields) {
  Pair p = make_pair(base_config(), GetParam(), 2, 4);
  expect_export_into_equals_export_rows(p.one.get(), p.exec);  // empty, no slots yet
  train(p, adam(), 40, 15, 13);
  expect_export_into_equals_export_rows(p.one.get(), p.exec);
  expect_export_into_equals_export_rows(p.two.get(), p.exec);
}

TEST_P(TieredTableTest, export_import_round_trip_then_training_continues_equal) {
  Pair p = make_pair(base_config(), GetParam(), 2, 4);
  train(p, adam(), 60, 15, 21);
  TableSnapshot<int64_t> snap;
  ASSERT_TRUE(p.one->export_rows(p.exec, &snap).ok());
  // A fresh tiered table restored from the one-tier table's checkpoint.
  Pair q;
  q.one = std::move(p.one);
  sok::Status s =
      sok::TieredTable<int64_t>::Create(tiered_config(base_config(), GetParam(), 2, 4), &q.two);
  ASSERT_TRUE(s.ok());
  s = q.two->import_rows(q.exec, snap);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_LE(q.two->memory_rows(), 4);
  expect_same_content(q);
  train(q, adam(), 60, 15, 22);
  expect_same_content(q);
  TableSnapshot<int64_t> dup = snap;  // a duplicate key is refused, table unchanged
  dup.keys[1] = dup.keys[0];
  s = q.two->import_rows(q.exec, dup);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("appears twice"), std::string::npos);
  expect_same_content(q);
}

// sok.load restores a CPU table a chunk at a time: import_rows of the first chunk and
// append_rows of the others give the rows of one import, in both table kinds, and training goes
// on equal; a key the table holds, on file or in memory, or one met twice in a chunk, is refused.
TEST_P(TieredTableTest, chunked_import_equals_one_import) {
  Pair p = make_pair(base_config(), GetParam(), 2, 4);
  train(p, adam(), 60, 15, 31);
  TableSnapshot<int64_t> snap;
  ASSERT_TRUE(p.one->export_rows(p.exec, &snap).ok());
  const int64_t n = static_cast<int64_t>(snap.keys.size());
  ASSERT_GT(n, 14);
  Pair q = make_pair(base_config(), GetParam(), 2, 4);
  const std::vector<sok::Table<int64_t>*> both = {q.one.get(), q.two.get()};
  for (int64_t a = 0; a < n; a += 7) {
    std::vector<int64_t> pick;
    for (int64_t i = a; i < std::min(n, a + 7); ++i) pick.push_back(i);
    const TableSnapshot<int64_t> chunk = sok::snapshot_rows(snap, pick);
    for (sok::Table<int64_t>* t : both) {
      sok::Status s = a == 0 ? t->import_rows(q.exec, chunk) : t->append_rows(q.exec, chunk);
      ASSERT_TRUE(s.ok()) << s.message();
    }
  }
  // Placed as one import places them: as many rows in memory, none colder than a row on file.
  Pair whole = make_pair(base_config(), GetParam(), 2, 4);
  ASSERT_TRUE(whole.two->import_rows(whole.exec, snap).ok());
  EXPECT_EQ(q.two->memory_rows(), whole.two->memory_rows());
  std::map<int64_t, int64_t> heat;
  for (int64_t i = 0; i < n; ++i)
    heat[snap.keys[i]] = GetParam() == CacheStrategy::kLFU ? snap.freqs[i] : snap.versions[i];
  int64_t coldest_in_memory = INT64_MAX, hottest_on_file = INT64_MIN;
  const std::vector<int64_t> in_memory = q.two->memory_keys();
  for (const int64_t k : in_memory) coldest_in_memory = std::min(coldest_in_memory, heat[k]);
  for (const auto& kv : heat) {
    if (std::find(in_memory.begin(), in_memory.end(), kv.first) == in_memory.end())
      hottest_on_file = std::max(hottest_on_file, kv.second);
  }
  EXPECT_GE(coldest_in_memory, hottest_on_file);
  TableSnapshot<int64_t> restored;
  ASSERT_TRUE(q.one->export_rows(q.exec, &restored).ok());
  EXPECT_EQ(by_key(restored), by_key(snap));
  expect_same_content(q);
  train(q, adam(), 40, 15, 32);
  expect_same_content(q);
  for (int64_t i = 0; i < n; ++i) {  // every key, wherever the tiered table keeps it
    const TableSnapshot<int64_t> again = sok::snapshot_rows(snap, {i});
    for (sok::Table<int64_t>* t : both) {
      sok::Status s = t->append_rows(q.exec, again);
      ASSERT_FALSE(s.ok()) << snap.keys[i];
      EXPECT_NE(s.message().find("appears twice in the checkpoint"), std::string::npos);
    }
  }
  TableSnapshot<int64_t> twice = sok::snapshot_rows(snap, {0, 1});
  twice.keys = {1LL << 40, 1LL << 40};  // a new key, twice in one chunk
  for (sok::Table<int64_t>* t : both) EXPECT_FALSE(t->append_rows(q.exec, twice).ok());
}

TEST_P(TieredTableTest, assign_reaches_rows_in_the_ssd_tier) {
  Pair p = make_pair(base_config(), GetParam(), 0, 2);
  std::vector<int64_t> keys = {1, 2, 3, 4, 5, 6};
  std::vector<float> out(keys.size() * kDim), vals(keys.size() * kDim);
  ASSERT_TRUE(p.one->find_or_insert(p.exec, keys.data(), 6, out.data(), nullptr).ok());
  ASSERT_TRUE(p.two->find_or_insert(p.exec, keys.data(), 6, out.data(), nullptr).ok());
  ASSERT_GE(p.two->ssd_rows(), 4);
  for (size_t i = 0; i < vals.size(); ++i) vals[i] = 0.125f * i;
  ASSERT_TRUE(p.one->insert_or_assign(p.exec, keys.data(), 6, vals.data()).ok());
  ASSERT_TRUE(p.two->insert_or_assign(p.exec, keys.data(), 6, vals.data()).ok());
  expect_same_content(p);
}

INSTANTIATE_TEST_SUITE_P(Strategies, TieredTableTest,
                         ::testing::Values(CacheStrategy::kLFU, CacheStrategy::kLRU));

TEST(TieredTableChecks, budget_below_one_row_with_slots_is_an_error_before_updating) {
  Pair p = make_pair(base_config(), CacheStrategy::kLFU, 0, 1);  // one slotless row
  std::vector<int64_t> keys = {7};
  std::vector<float> out(kDim), g(kDim, 1.f);
  ASSERT_TRUE(p.two->find_or_insert(p.exec, keys.data(), 1, out.data(), nullptr).ok());
  sok::Status s = p.two->apply_gradients(p.exec, keys.data(), 1, g.data(), adam(), 0, false);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("table 'tiered': the DRAM budget"), std::string::npos) << s.message();
  std::vector<float> again(kDim);
  ASSERT_TRUE(p.two->find(p.exec, keys.data(), 1, again.data()).ok());
  EXPECT_TRUE(same_bits(out, again));
}

TEST(TieredTableChecks, files_live_under_the_path_until_the_table_goes) {
  std::unique_ptr<sok::Table<int64_t>> t;
  ASSERT_TRUE(
      sok::new_cpu_table<int64_t>(tiered_config(base_config(), CacheStrategy::kLRU, 0, 1), &t)
          .ok());
  const std::string dir = static_cast<sok::TieredTable<int64_t>*>(t.get())->ssd_dir();
  EXPECT_EQ(dir.rfind(temp_root() + "/sok_ev_tiered.", 0), 0u) << dir;
  struct stat st;
  EXPECT_EQ(::stat(dir.c_str(), &st), 0);
  t.reset();
  EXPECT_NE(::stat(dir.c_str(), &st), 0);
  sok::TableConfig bad = tiered_config(base_config(), CacheStrategy::kLFU, 0, 1);
  bad.dram_bytes -= 1;
  sok::Status s = sok::new_cpu_table<int64_t>(bad, &t);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("smaller than one row"), std::string::npos);
}

TEST(TieredTableChecks, concurrent_lookups_and_updates_lose_no_row_or_count) {
  Pair p = make_pair(base_config(), CacheStrategy::kLRU, 1, 4);
  constexpr int kThreads = 4, kIters = 300;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t]() {
      sok::ExecContext exec;
      std::mt19937 rng(t);
      for (int i = 0; i < kIters; ++i) {
        std::vector<int64_t> keys = {static_cast<int64_t>(rng() % 40), 40 + t};
        std::vector<float> out(2 * kDim), g(2 * kDim, 0.5f);
        EXPECT_TRUE(p.two->find_or_insert(exec, keys.data(), 2, out.data(), nullptr).ok());
        if (i % 3 == 0) {
          EXPECT_TRUE(
              p.two->apply_gradients(exec, keys.data(), 2, g.data(), adagrad(), i, false).ok());
        }
        if (i % 7 == 0) EXPECT_TRUE(p.two->find(exec, keys.data(), 2, out.data()).ok());
      }
    });
  }
  for (auto& th : threads) th.join();
  TableSnapshot<int64_t> s;
  ASSERT_TRUE(p.two->export_rows(p.exec, &s).ok());
  int64_t total = 0;
  for (int64_t f : s.freqs) total += f;
  EXPECT_EQ(total, 2 * kThreads * kIters);  // every lookup counted once, in one tier
  const Rows rows = by_key(s);
  EXPECT_EQ(rows.size(), s.keys.size());  // no key in two tiers
  EXPECT_EQ(rows.count(40 + kThreads - 1), 1u);
  EXPECT_LE(p.two->memory_rows(), 4);
}
