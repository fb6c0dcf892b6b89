#include "addons/sparse_operation_kit/core/ssd_tier.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace {

using sok::SsdStore;

std::string temp_root() {
  const char* t = std::getenv("TEST_TMPDIR");
  return t ? t : "/tmp";
}

bool exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

SsdStore::Record rec(int64_t key, int64_t freq, int64_t version, int floats, float base) {
  SsdStore::Record r{key, freq, version, {}};
  for (int i = 0; i < floats; ++i) r.row.push_back(base + 0.25f * i);
  return r;
}

void expect_same(const SsdStore::Record& a, const SsdStore::Record& b) {
  EXPECT_EQ(a.key, b.key);
  EXPECT_EQ(a.freq, b.freq);
  EXPECT_EQ(a.version, b.version);
  EXPECT_EQ(a.row, b.row);
}

}  // namespace

TEST(SsdStoreTest, round_trips_records_and_replaces_keys) {
  std::unique_ptr<SsdStore> s;
  ASSERT_TRUE(SsdStore::Open(temp_root(), "t/1", &s).ok());
  ASSERT_TRUE(s->append({rec(-5, 3, 7, 4, 1.f), rec(1LL << 40, 1, 2, 8, -3.f)}).ok());
  EXPECT_EQ(s->size(), 2);
  SsdStore::Record r;
  ASSERT_TRUE(s->read(-5, &r).ok());
  expect_same(r, rec(-5, 3, 7, 4, 1.f));
  ASSERT_TRUE(s->append({rec(-5, 9, 8, 12, 0.5f)}).ok());  // replaced, and longer
  EXPECT_EQ(s->size(), 2);
  ASSERT_TRUE(s->read(-5, &r).ok());
  expect_same(r, rec(-5, 9, 8, 12, 0.5f));
  EXPECT_GT(s->garbage_bytes(), 0);
  EXPECT_FALSE(s->read(4, &r).ok());
  EXPECT_TRUE(s->remove(-5));
  EXPECT_FALSE(s->remove(-5));
  EXPECT_FALSE(s->contains(-5));
  EXPECT_TRUE(s->contains(1LL << 40));
}

TEST(SsdStoreTest, compaction_keeps_live_records_and_shrinks_the_file) {
  std::unique_ptr<SsdStore> s;
  ASSERT_TRUE(SsdStore::Open(temp_root(), "compact", &s).ok());
  std::map<int64_t, SsdStore::Record> want;
  for (int round = 0; round < 5; ++round) {
    std::vector<SsdStore::Record> batch;
    for (int64_t k = 0; k < 50; ++k) batch.push_back(rec(k, round, k, 6, k + 0.5f * round));
    ASSERT_TRUE(s->append(batch).ok());
    for (auto& r : batch) want[r.key] = r;
  }
  for (int64_t k = 0; k < 50; k += 3) {
    s->remove(k);
    want.erase(k);
  }
  const int64_t before = s->file_bytes();
  ASSERT_TRUE(s->maybe_compact(1LL << 40).ok());  // file below the minimum: untouched
  EXPECT_EQ(s->file_bytes(), before);
  ASSERT_TRUE(s->maybe_compact(0).ok());
  EXPECT_LT(s->file_bytes(), before / 4);
  EXPECT_EQ(s->garbage_bytes(), 0);
  std::map<int64_t, SsdStore::Record> got;
  ASSERT_TRUE(s->for_each([&](const SsdStore::Record& r) { got[r.key] = r; }).ok());
  ASSERT_EQ(got.size(), want.size());
  for (auto& kv : want) expect_same(got[kv.first], kv.second);
  SsdStore::Record r;
  ASSERT_TRUE(s->read(49, &r).ok());  // the index points into the new file
  expect_same(r, want[49]);
}

// The file is mapped with room to grow: records written into that room, past it (a remap),
// after clear() (file truncated) and from a snapshot's columns all read back.
TEST(SsdStoreTest, reads_records_written_before_and_after_the_file_outgrows_its_mapping) {
  std::unique_ptr<SsdStore> s;
  ASSERT_TRUE(SsdStore::Open(temp_root(), "grow", &s).ok());
  std::map<int64_t, SsdStore::Record> want;
  SsdStore::Record r;
  for (int round = 0; round < 12; ++round) {  // 12 x 2,000 records of 296 bytes: about 7 MB
    std::vector<SsdStore::Record> batch;
    for (int64_t k = 0; k < 2000; ++k) {
      batch.push_back(rec(round * 2000 + k, round, k, 66, 0.5f * k - round));
    }
    ASSERT_TRUE(s->append(batch).ok());
    for (auto& b : batch) want[b.key] = b;
    for (int64_t key : {int64_t{0}, int64_t{round * 2000 + 1999}, int64_t{round * 1000}}) {
      ASSERT_TRUE(s->read(key, &r).ok()) << "round " << round << " key " << key;
      expect_same(r, want[key]);
    }
  }
  for (auto& kv : want) {
    ASSERT_TRUE(s->read(kv.first, &r).ok());
    expect_same(r, kv.second);
  }
  ASSERT_TRUE(s->clear().ok());
  EXPECT_EQ(s->size(), 0);
  const int64_t keys[2] = {7, -9}, freqs[2] = {3, 4}, versions[2] = {5, 6};
  const float values[4] = {1.f, 2.f, 3.f, 4.f}, slots[4] = {-1.f, -2.f, -3.f, -4.f};
  SsdStore::Rows rows;
  rows.keys = keys;
  rows.freqs = freqs;
  rows.versions = versions;
  rows.values = values;
  rows.slots = slots;
  rows.n = 2;
  rows.dim = 2;
  rows.slot_floats = 2;
  ASSERT_TRUE(s->append(rows).ok());
  ASSERT_TRUE(s->read(-9, &r).ok());
  SsdStore::Record w{-9, 4, 6, {3.f, 4.f, -3.f, -4.f}};
  expect_same(r, w);
  bool found = true;
  ASSERT_TRUE(s->read_if_present(12345, &r, &found).ok());
  EXPECT_FALSE(found);
}

TEST(SsdStoreTest, each_store_owns_a_directory_removed_with_it) {
  std::unique_ptr<SsdStore> a, b;
  ASSERT_TRUE(SsdStore::Open(temp_root(), "same", &a).ok());
  ASSERT_TRUE(SsdStore::Open(temp_root(), "same", &b).ok());
  EXPECT_NE(a->dir(), b->dir());
  ASSERT_TRUE(a->append({rec(1, 1, 1, 2, 1.f)}).ok());
  const std::string dir = a->dir();
  EXPECT_TRUE(exists(dir + "/rows.log"));
  a.reset();
  EXPECT_FALSE(exists(dir));
  EXPECT_TRUE(exists(b->dir()));
  ASSERT_TRUE(b->clear().ok());
  EXPECT_EQ(b->size(), 0);
  EXPECT_EQ(b->file_bytes(), 0);
}

TEST(SsdStoreTest, a_missing_root_is_an_error_naming_the_table) {
  std::unique_ptr<SsdStore> s;
  sok::Status st = SsdStore::Open(temp_root() + "/no/such/dir", "emb", &s);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("table 'emb'"), std::string::npos) << st.message();
}

TEST(SsdStoreTest, a_record_past_the_index_limit_is_refused_and_nothing_is_written) {
  std::unique_ptr<SsdStore> s;
  ASSERT_TRUE(SsdStore::Open(temp_root(), "wide", &s).ok());
  ASSERT_TRUE(s->append({rec(1, 1, 1, 4, 0.f)}).ok());
  const int64_t bytes = s->file_bytes();
  // A row of 2^20 floats makes a record of 4 MiB and its header: over the 4 MiB - 1 limit.
  sok::Status st = s->append({rec(2, 1, 1, 4, 0.f), rec(3, 1, 1, 1 << 20, 0.f)});
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("table 'wide'"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("past the tier's limits"), std::string::npos) << st.message();
  EXPECT_EQ(s->size(), 1);  // neither record of the refused batch was indexed or written
  EXPECT_FALSE(s->contains(2));
  EXPECT_EQ(s->file_bytes(), bytes);
}
