#include "addons/sparse_operation_kit/core/row_arena.h"

#include <cstdint>
#include <cstring>

#include "gtest/gtest.h"

namespace {

using sok::RowArena;

void fill(float* row, int64_t stride, int64_t r) {
  for (int64_t c = 0; c < stride; ++c) row[c] = static_cast<float>(r * 1000 + c);
}

bool holds(const RowArena& a, int64_t r) {
  for (int64_t c = 0; c < a.stride(); ++c) {
    if (a.row(r)[c] != static_cast<float>(r * 1000 + c)) return false;
  }
  return true;
}

TEST(RowArenaTest, blocks_are_a_power_of_two_rows_of_about_a_mebibyte) {
  EXPECT_TRUE(RowArena(32).rows_per_block() == 32768);  // 128-byte rows
  EXPECT_TRUE(RowArena(33).rows_per_block() == 16384);
  EXPECT_TRUE(RowArena(1 << 22).rows_per_block() == 1);  // a row larger than a block
}

TEST(RowArenaTest, rows_never_move_while_it_grows) {
  RowArena a(300);  // 512 rows a block: several blocks
  const int64_t n = 3 * a.rows_per_block() + 5;
  float* first = a.append();
  fill(first, a.stride(), 0);
  for (int64_t r = 1; r < n; ++r) fill(a.append(), a.stride(), r);
  EXPECT_TRUE(a.size() == n);
  EXPECT_TRUE(a.row(0) == first);
  for (int64_t r = 0; r < n; ++r) EXPECT_TRUE(holds(a, r));
  // Rows are disjoint: each one's stride floats are its own.
  EXPECT_TRUE(a.row(1) - a.row(0) == a.stride());
}

TEST(RowArenaTest, truncate_keeps_the_first_rows_and_appends_after_them) {
  RowArena a(16);
  const int64_t n = 2 * a.rows_per_block() + 3;
  for (int64_t r = 0; r < n; ++r) fill(a.append(), a.stride(), r);
  a.truncate(a.rows_per_block() + 1);
  EXPECT_TRUE(a.size() == a.rows_per_block() + 1);
  for (int64_t r = 0; r < a.size(); ++r) EXPECT_TRUE(holds(a, r));
  float* last = a.append();
  fill(last, a.stride(), a.size() - 1);
  EXPECT_TRUE(holds(a, a.size() - 1));
  a.truncate(0);
  EXPECT_TRUE(a.size() == 0);
  fill(a.append(), a.stride(), 0);
  EXPECT_TRUE(holds(a, 0));
}

TEST(RowArenaTest, swap_exchanges_layouts) {
  RowArena a(4), b(8);
  fill(a.append(), 4, 0);
  a.swap(b);
  EXPECT_TRUE(a.stride() == 8 && a.size() == 0);
  EXPECT_TRUE(b.stride() == 4 && b.size() == 1 && holds(b, 0));
}

}  // namespace
