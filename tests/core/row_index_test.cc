#include "addons/sparse_operation_kit/core/row_index.h"

#include <cstdint>
#include <vector>

#include "addons/sparse_operation_kit/core/common.h"
#include "gtest/gtest.h"

namespace {

using sok::RowIndex;

TEST(RowIndexTest, room_is_at_least_what_was_asked_and_at_most_four_fifths) {
  for (int64_t rows = 0; rows < 2000; ++rows) {
    RowIndex index(rows);
    EXPECT_TRUE(index.max_rows() >= rows);
    EXPECT_TRUE(index.max_rows() * 5 <= index.num_slots() * 4);
  }
}

TEST(RowIndexTest, finds_every_row_when_full_and_nothing_else) {
  const int64_t n = 10000;
  RowIndex index(n);
  const int64_t rows = index.max_rows();  // fill it to the brim
  for (int64_t r = 0; r < rows; ++r) index.insert(sok::mix64(r), r);
  for (int64_t r = 0; r < rows; ++r) {
    EXPECT_TRUE(index.find(sok::mix64(r), [&](int64_t row) { return row == r; }) == r);
  }
  for (int64_t r = rows; r < rows + 10000; ++r) {
    EXPECT_TRUE(index.find(sok::mix64(r), [](int64_t) { return true; }) == RowIndex::kNone);
  }
}

TEST(RowIndexTest, equal_hashes_are_told_apart_by_the_callers_comparison) {
  RowIndex index(16);
  const uint64_t h = 12345;  // same bucket and tag for every row
  for (int64_t r = 0; r < 12; ++r) index.insert(h, r);
  for (int64_t r = 0; r < 12; ++r) {
    EXPECT_TRUE(index.find(h, [&](int64_t row) { return row == r; }) == r);
  }
  EXPECT_TRUE(index.candidate(h) == 0);  // the first tag match, not compared
  EXPECT_TRUE(index.find(h, [](int64_t) { return false; }) == RowIndex::kNone);
}

TEST(RowIndexTest, candidate_is_none_only_when_no_row_has_the_tag) {
  RowIndex index(100);
  for (int64_t r = 0; r < 80; ++r) index.insert(sok::mix64(r), r);
  for (int64_t r = 0; r < 80; ++r) EXPECT_TRUE(index.candidate(sok::mix64(r)) != RowIndex::kNone);
  // A hash in the last bucket wraps around to the first.
  RowIndex small(6);
  for (int64_t r = 0; r < 6; ++r) small.insert(~uint64_t{0} - r, r);
  for (int64_t r = 0; r < 6; ++r) {
    EXPECT_TRUE(small.find(~uint64_t{0} - r, [&](int64_t row) { return row == r; }) == r);
  }
}

TEST(RowIndexTest, large_rows_keep_their_bits) {
  RowIndex index(8);
  const int64_t big = RowIndex::kMaxRows - 1;
  index.insert(sok::mix64(1), big);
  index.insert(sok::mix64(2), 0);
  EXPECT_TRUE(index.find(sok::mix64(1), [&](int64_t row) { return row == big; }) == big);
  EXPECT_TRUE(index.find(sok::mix64(2), [](int64_t row) { return row == 0; }) == 0);
}

TEST(RowIndexTest, reset_empties_it) {
  RowIndex index(8);
  index.insert(sok::mix64(5), 3);
  index.reset(8);
  EXPECT_TRUE(index.candidate(sok::mix64(5)) == RowIndex::kNone);
}

}  // namespace
