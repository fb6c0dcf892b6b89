// SsdRows (the SSD tier under a GPU tiered table): reads that leave the file alone, writes of a
// batch, a find's rows under the counter filter, removal, shrink and export; the directory goes
// with the store. Also tier_policy.h's import order.
#include "addons/sparse_operation_kit/core/ssd_rows.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "addons/sparse_operation_kit/core/tier_policy.h"
#include "gtest/gtest.h"

namespace {

using sok::SsdRows;
using sok::TableSnapshot;

constexpr int64_t kDim = 2;

sok::TableConfig config() {
  sok::TableConfig c;
  c.name = "ssd_rows";
  c.dim = kDim;
  c.storage = sok::StorageKind::kHbmDramSsdHash;
  const char* t = std::getenv("TEST_TMPDIR");
  c.storage_path = t ? t : "/tmp";
  c.ssd_compact_min_bytes = 0;
  return c;
}

// A layout of `slots` slots, initial values 0.5 and 0.25.
TableSnapshot<int64_t> layout(int slots) {
  TableSnapshot<int64_t> s;
  s.dim = kDim;
  s.num_slots = slots;
  s.slot_kind = slots > 0 ? 1 : -1;
  for (int k = 0; k < slots; ++k) s.slot_init.push_back(k == 0 ? 0.5f : 0.25f);
  return s;
}

// Rows of keys: value (key, -key), slot k of row = 10 * key + k, freq key, version 100 + key.
TableSnapshot<int64_t> rows(const std::vector<int64_t>& keys, int slots) {
  TableSnapshot<int64_t> s = layout(slots);
  for (int64_t key : keys) {
    s.keys.push_back(key);
    s.values.insert(s.values.end(), {static_cast<float>(key), static_cast<float>(-key)});
    for (int k = 0; k < slots; ++k) s.slots.insert(s.slots.end(), kDim, 10.f * key + k);
    s.freqs.push_back(key);
    s.versions.push_back(100 + key);
  }
  return s;
}

std::unique_ptr<SsdRows<int64_t>> open(const sok::TableConfig& c = config()) {
  std::unique_ptr<SsdRows<int64_t>> r;
  const sok::Status s = SsdRows<int64_t>::Open(c, &r);
  EXPECT_TRUE(s.ok()) << s.message();
  return r;
}

bool exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

TEST(SsdRows, ReadLeavesTheFileAndRemoveCounts) {
  auto r = open();
  ASSERT_TRUE(r->put(rows({1, 2, 3}, 1)).ok());
  EXPECT_EQ(r->size(), 3);
  TableSnapshot<int64_t> got = layout(1);
  const std::vector<int64_t> keys = {3, 9, 1, 3};  // one absent, one repeated
  ASSERT_TRUE(r->read(keys.data(), 4, &got).ok());
  const TableSnapshot<int64_t> want = rows({3, 1}, 1);
  EXPECT_EQ(got.keys, want.keys);
  EXPECT_EQ(got.values, want.values);
  EXPECT_EQ(got.slots, want.slots);
  EXPECT_EQ(got.freqs, want.freqs);
  EXPECT_EQ(got.versions, want.versions);
  EXPECT_EQ(r->size(), 3);  // read moved nothing
  int64_t removed = 0;
  ASSERT_TRUE(r->remove(keys.data(), 4, &removed).ok());
  EXPECT_EQ(removed, 2);
  EXPECT_EQ(r->size(), 1);
}

// Many keys (the reads go in groups): each present key once, in the order of its first
// occurrence; find gives every occurrence's position.
TEST(SsdRows, ReadAndFindKeepTheCallsOrderOverManyKeys) {
  auto r = open();
  std::vector<int64_t> even;
  for (int64_t k = 0; k < 200; k += 2) even.push_back(k);
  ASSERT_TRUE(r->put(rows(even, 1)).ok());
  std::vector<int64_t> keys;
  for (int64_t i = 0; i < 150; ++i) keys.push_back((i * 37) % 120);  // repeats, odd ones absent
  std::vector<int64_t> first, pos;
  std::vector<float> values;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (keys[i] % 2 != 0) continue;
    pos.push_back(static_cast<int64_t>(i));
    values.insert(values.end(), {static_cast<float>(keys[i]), static_cast<float>(-keys[i])});
    if (std::find(first.begin(), first.end(), keys[i]) == first.end()) first.push_back(keys[i]);
  }
  TableSnapshot<int64_t> got = layout(1);
  ASSERT_TRUE(r->read(keys.data(), static_cast<int64_t>(keys.size()), &got).ok());
  const TableSnapshot<int64_t> want = rows(first, 1);
  EXPECT_EQ(got.keys, want.keys);
  EXPECT_EQ(got.values, want.values);
  EXPECT_EQ(got.slots, want.slots);
  EXPECT_EQ(got.freqs, want.freqs);
  EXPECT_EQ(got.versions, want.versions);
  std::vector<int64_t> got_pos;
  std::vector<float> got_values;
  ASSERT_TRUE(r->find(keys.data(), static_cast<int64_t>(keys.size()), &got_pos, &got_values).ok());
  EXPECT_EQ(got_pos, pos);
  EXPECT_EQ(got_values, values);
}

TEST(SsdRows, RowsWithFewerSlotsGetTheLayoutsInitialSlots) {
  auto r = open();
  ASSERT_TRUE(r->put(rows({4}, 0)).ok());  // written before the optimizer's first step
  ASSERT_TRUE(r->put(rows({5}, 2)).ok());
  TableSnapshot<int64_t> got = layout(2);
  const std::vector<int64_t> keys = {4, 5};
  ASSERT_TRUE(r->read(keys.data(), 2, &got).ok());
  EXPECT_EQ(got.slots, (std::vector<float>{0.5f, 0.5f, 0.25f, 0.25f, 50, 50, 51, 51}));
  TableSnapshot<int64_t> narrow = layout(1);  // a row of more slots than the layout: an error
  const sok::Status s = r->read(keys.data() + 1, 1, &narrow);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("table 'ssd_rows'"), std::string::npos) << s.message();
}

TEST(SsdRows, PutReplacesAKeyAndExportListsEveryRow) {
  auto r = open();
  ASSERT_TRUE(r->put(rows({1, 2}, 1)).ok());
  TableSnapshot<int64_t> again = rows({2}, 1);
  again.values = {7, 8};
  ASSERT_TRUE(r->put(again).ok());
  TableSnapshot<int64_t> all = layout(1);
  ASSERT_TRUE(r->export_rows(&all).ok());
  ASSERT_EQ(all.keys, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(all.values, (std::vector<float>{1, -1, 7, 8}));
}

TEST(SsdRows, FindReadsRowsUnderTheCounterFilter) {
  sok::TableConfig c = config();
  c.filter_freq = 3;
  c.default_value_no_permission = -9.f;
  auto r = open(c);
  ASSERT_TRUE(r->put(rows({2, 5}, 0)).ok());  // frequencies 2 (not admitted) and 5
  const std::vector<int64_t> keys = {5, 1, 2, 5};
  std::vector<int64_t> pos;
  std::vector<float> out;
  ASSERT_TRUE(r->find(keys.data(), 4, &pos, &out).ok());
  EXPECT_EQ(pos, (std::vector<int64_t>{0, 2, 3}));
  EXPECT_EQ(out, (std::vector<float>{5, -5, -9, -9, 5, -5}));
  EXPECT_EQ(r->size(), 2);
}

TEST(SsdRows, ShrinkEvictsByTheTablesRule) {
  sok::TableConfig c = config();
  c.steps_to_live = 5;
  auto r = open(c);
  ASSERT_TRUE(r->put(rows({1, 2, 3, 4}, 0)).ok());  // versions 101..104
  int64_t removed = 0;
  ASSERT_TRUE(r->shrink(108, &removed).ok());  // evicts versions older than 103
  EXPECT_EQ(removed, 2);
  TableSnapshot<int64_t> left = layout(0);
  ASSERT_TRUE(r->export_rows(&left).ok());
  EXPECT_EQ(left.keys, (std::vector<int64_t>{3, 4}));
}

TEST(SsdRows, TheDirectoryGoesWithTheStoreAndAPathIsNeeded) {
  auto r = open();
  const std::string dir = r->dir();
  ASSERT_TRUE(r->put(rows({1}, 0)).ok());
  EXPECT_TRUE(exists(dir + "/rows.log"));
  r.reset();
  EXPECT_FALSE(exists(dir));
  sok::TableConfig c = config();
  c.storage_path.clear();
  std::unique_ptr<SsdRows<int64_t>> none;
  const sok::Status s = SsdRows<int64_t>::Open(c, &none);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("table 'ssd_rows': an SSD tier needs storage_path"), std::string::npos)
      << s.message();
}

TEST(TierPolicy, HottestFirstByFrequencyOrVersionTiesInOrder) {
  TableSnapshot<int64_t> s = rows({1, 2, 3, 4}, 0);
  s.freqs = {1, 5, 5, 2};
  s.versions = {9, 1, 7, 9};
  EXPECT_EQ(sok::hottest_first(s, sok::CacheStrategy::kLFU), (std::vector<int64_t>{1, 2, 3, 0}));
  EXPECT_EQ(sok::hottest_first(s, sok::CacheStrategy::kLRU), (std::vector<int64_t>{0, 3, 2, 1}));
  EXPECT_EQ(sok::tier_low_watermark(32), 30);
}

TEST(TableConfig, HbmDramSsdHashHasTwoCachedTiersAndAnSsdTier) {
  sok::StorageKind k;
  ASSERT_TRUE(sok::parse_storage_kind("HBM_DRAM_SSDHASH", &k));
  EXPECT_EQ(k, sok::StorageKind::kHbmDramSsdHash);
  EXPECT_EQ(static_cast<int>(k), 102);
  EXPECT_EQ(sok::cached_tiers(k), 2u);
  EXPECT_TRUE(sok::has_ssd_tier(k));
  EXPECT_FALSE(sok::has_ssd_tier(sok::StorageKind::kHbmDram));
}

}  // namespace
