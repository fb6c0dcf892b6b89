#include "addons/sparse_operation_kit/core/key_offsets.h"

#include <cstdint>
#include <limits>
#include <random>
#include <unordered_map>

#include "gtest/gtest.h"

namespace {

using sok::KeyOffsets;

// Random assigns and erases (keys from a small range, so they repeat, plus the extremes), checked
// against std::unordered_map after every operation's return value and at the end entry by entry.
TEST(KeyOffsetsTest, matches_a_hash_map_through_inserts_replacements_and_erases) {
  KeyOffsets index;
  std::unordered_map<int64_t, std::pair<int64_t, int64_t>> want;
  std::mt19937_64 rng(7);
  const int64_t extremes[] = {std::numeric_limits<int64_t>::min(),
                              std::numeric_limits<int64_t>::max(), -1, 0};
  for (int step = 0; step < 200000; ++step) {
    const int64_t key =
        step % 97 == 0 ? extremes[(step / 97) % 4] : static_cast<int64_t>(rng() % 5000) - 2500;
    if (rng() % 3 == 0) {
      auto it = want.find(key);
      const int64_t had = it == want.end() ? 0 : it->second.second;
      ASSERT_EQ(index.erase(key), had);
      if (it != want.end()) want.erase(it);
    } else {
      const int64_t offset = static_cast<int64_t>(rng() % 1000000), bytes = 32 + step % 64;
      auto it = want.find(key);
      const int64_t had = it == want.end() ? 0 : it->second.second;
      ASSERT_EQ(index.assign(key, offset, bytes), had);
      want[key] = {offset, bytes};
    }
    ASSERT_EQ(index.size(), static_cast<int64_t>(want.size()));
  }
  int64_t seen = 0;
  index.for_each([&](const KeyOffsets::Entry& e) {
    ++seen;
    auto it = want.find(e.key);
    ASSERT_NE(it, want.end());
    EXPECT_EQ(e.offset(), it->second.first);
    EXPECT_EQ(e.bytes(), it->second.second);
  });
  EXPECT_EQ(seen, static_cast<int64_t>(want.size()));
  for (const auto& [key, loc] : want) {
    const KeyOffsets::Entry* e = index.find(key);
    ASSERT_NE(e, nullptr);
    EXPECT_EQ(e->offset(), loc.first);
    EXPECT_EQ(e->bytes(), loc.second);
  }
  EXPECT_EQ(index.find(123456789), nullptr);
}

TEST(KeyOffsetsTest, clear_and_swap) {
  KeyOffsets a, b;
  for (int64_t k = 0; k < 1000; ++k) a.assign(k, k * 10, 40);
  b.assign(-7, 3, 33);
  a.swap(b);
  EXPECT_EQ(a.size(), 1);
  EXPECT_EQ(b.size(), 1000);
  EXPECT_EQ(b.find(999)->offset(), 9990);
  EXPECT_EQ(a.find(999), nullptr);
  b.clear();
  EXPECT_EQ(b.size(), 0);
  EXPECT_EQ(b.find(5), nullptr);
  EXPECT_EQ(b.assign(5, 1, 32), 0);
  EXPECT_EQ(b.find(5)->bytes(), 32);
}

// The extremes of a location survive the packing into 8 bytes; past them fits() says no.
TEST(KeyOffsetsTest, packs_the_largest_offset_and_record) {
  KeyOffsets index;
  const int64_t off = KeyOffsets::kMaxOffset, bytes = KeyOffsets::kMaxRecordBytes;
  EXPECT_TRUE(KeyOffsets::fits(off, bytes));
  EXPECT_TRUE(KeyOffsets::fits(0, 1));
  EXPECT_FALSE(KeyOffsets::fits(off + 1, bytes));
  EXPECT_FALSE(KeyOffsets::fits(0, bytes + 1));
  EXPECT_FALSE(KeyOffsets::fits(0, 0));
  EXPECT_FALSE(KeyOffsets::fits(-1, 8));
  EXPECT_EQ(index.assign(7, off, bytes), 0);
  EXPECT_EQ(index.assign(8, 0, 1), 0);
  EXPECT_EQ(index.find(7)->offset(), off);
  EXPECT_EQ(index.find(7)->bytes(), bytes);
  EXPECT_EQ(index.find(8)->offset(), 0);
  EXPECT_EQ(index.find(8)->bytes(), 1);
  EXPECT_EQ(index.erase(7), bytes);
  EXPECT_EQ(index.find(7), nullptr);
}

// The budget for a tier's overhead is 32 bytes a key: the index stays within it at every
// size as keys are added (keys fill 1/2 to 3/4 of the slots once past the first allocation).
TEST(KeyOffsetsTest, holds_at_most_32_bytes_a_key) {
  KeyOffsets index;
  for (int64_t k = 1; k <= 300000; ++k) {
    index.assign(k * 7919, k, 40);
    if (k >= 100) {
      ASSERT_LE(index.memory_bytes(), 32 * k) << k << " keys";
    }
  }
  EXPECT_GE(index.memory_bytes(), 21 * 300000);
}

}  // namespace
