#include "addons/sparse_operation_kit/core/exchange.h"

#include <vector>

#include "gtest/gtest.h"

namespace ex = sok::exchange;

TEST(ExchangeTest, owner_and_local_key_follow_floor_modulo) {
  EXPECT_EQ(ex::owner_of(-1, -1, 3), 2);
  EXPECT_EQ(ex::owner_of(7, -1, 3), 1);
  EXPECT_EQ(ex::owner_of(7, 2, 3), 2);          // a whole table on rank 2
  EXPECT_EQ(ex::local_key(-1, -1, 30, 3), -1);  // static, spread: floor(-1 / 3)
  EXPECT_EQ(ex::local_key(7, -1, 30, 3), 2);
  EXPECT_EQ(ex::local_key(7, 1, 30, 3), 7);     // static, whole on one rank: its own row
  EXPECT_EQ(ex::local_key(-7, -1, -1, 3), -7);  // Embedding Variable: the key itself
  EXPECT_TRUE(ex::bad_key(30, 30));
  EXPECT_TRUE(ex::bad_key(-1, 30));
  EXPECT_FALSE(ex::bad_key(-1, -1));
}

TEST(ExchangeTest, plan_groups_keys_by_owner_then_table_in_input_order) {
  // Two tables over 2 ranks: an Embedding Variable of dim 2 spread, a static table of dim 3 (5
  // rows) whole on rank 1, with one id out of its rows.
  const std::vector<ex::TableSpec> tables = {{-1, -1, 2}, {1, 5, 3}};
  const std::vector<int64_t> a = {4, 3, 2, 5}, b = {0, 7};
  const std::vector<int64_t> ca = {1, 2, 3, 4}, cb = {5, 6};
  const int64_t* keys[] = {a.data(), b.data()};
  const int64_t* counts[] = {ca.data(), cb.data()};
  const int64_t sizes[] = {4, 2};
  std::vector<int64_t> request(12), matrix(2 * 4), row_at(6);
  ex::plan(tables, 2, keys, counts, sizes, nullptr, 99, request.data(), matrix.data(),
           row_at.data());
  // Owner 0: table 0's 4, 2; owner 1: table 0's 3, 5, then table 1's 0, 7.
  EXPECT_EQ(request, (std::vector<int64_t>{4, 1, 2, 3, 3, 2, 5, 4, 0, 5, 7, 6}));
  EXPECT_EQ(matrix, (std::vector<int64_t>{2, 0, 99, 2, 2, 2, 99, 2}));  // bad id: table 2
  // Rows come back in request order: 2 + 2 + 2 + 2 + 3 + 3 floats.
  EXPECT_EQ(row_at, (std::vector<int64_t>{0, 4, 2, 6, 8, 11}));
}

TEST(ExchangeTest, plan_skips_the_padding_past_valid) {
  // Table 0 holds 4, 3 then padding (9, 9); table 1 holds 0, then padding 7 (out of its rows,
  // but padding is neither sent nor checked).
  const std::vector<ex::TableSpec> tables = {{-1, -1, 2}, {1, 5, 3}};
  const std::vector<int64_t> a = {4, 3, 9, 9}, b = {0, 7};
  const int64_t* keys[] = {a.data(), b.data()};
  const int64_t* counts[] = {nullptr, nullptr};
  const int64_t sizes[] = {4, 2}, valid[] = {2, 1};
  std::vector<int64_t> request(12, -5), matrix(2 * 4), row_at(6);
  ex::plan(tables, 2, keys, counts, sizes, valid, 99, request.data(), matrix.data(), row_at.data());
  EXPECT_EQ(request, (std::vector<int64_t>{4, 1, 3, 1, 0, 1, 0, 0, 0, 0, 0, 0}));
  EXPECT_EQ(matrix, (std::vector<int64_t>{1, 0, 99, 0, 1, 1, 99, 0}));
  EXPECT_EQ(row_at, (std::vector<int64_t>{0, 2, -1, -1, 4, -1}));

  std::vector<float> returned = {1, 2, 3, 4, 5, 6, 7}, t0(8, -1.f), t1(6, -1.f);
  float* out[] = {t0.data(), t1.data()};
  ex::gather_rows({2, 3}, sizes, row_at.data(), returned.data(), out);
  EXPECT_EQ(t0, (std::vector<float>{1, 2, 3, 4, 0, 0, 0, 0}));  // padding reads zeros
  EXPECT_EQ(t1, (std::vector<float>{5, 6, 7, 0, 0, 0}));
  std::vector<float> back(7, -1.f);
  const float* in[] = {t0.data(), t1.data()};
  ex::scatter_rows({2, 3}, sizes, row_at.data(), in, back.data());
  EXPECT_EQ(back, returned);  // padding writes nothing
}

TEST(ExchangeTest, bad_positions_request_nothing_and_name_rank_and_table_in_the_header) {
  // Table 1's ids lay outside their dense shape (valid -1); table 0 has a static id out of its
  // rows too: the positions' flag (n + 1 + t) wins, and check_headers names rank and table.
  const std::vector<ex::TableSpec> tables = {{0, 5, 2}, {-1, -1, 2}};
  const std::vector<int64_t> a = {8}, b = {4, 3};
  const int64_t* keys[] = {a.data(), b.data()};
  const int64_t* counts[] = {nullptr, nullptr};
  const int64_t sizes[] = {1, 2}, valid[] = {1, -1};
  std::vector<int64_t> request(6, -5), matrix(2 * 4), row_at(3);
  ex::plan(tables, 2, keys, counts, sizes, valid, 99, request.data(), matrix.data(), row_at.data());
  EXPECT_EQ(ex::bad_positions_flag(2, 1), 4);
  EXPECT_EQ(matrix, (std::vector<int64_t>{1, 0, 99, 4, 0, 0, 99, 4}));
  EXPECT_EQ(row_at, (std::vector<int64_t>{0, -1, -1}));
  // Rank 0 clean, rank 1 its bad positions, rank 2 a static id out of range.
  const std::vector<int64_t> received = {1, 0, 99, 0, 0, 0, 99, 4, 1, 0, 99, 1};
  const ex::HeaderCheck check = ex::check_headers(received.data(), 3, 2, 99);
  EXPECT_TRUE(check.same_tables);
  EXPECT_FALSE(check.ids_valid);
  EXPECT_EQ(check.bad_positions_rank, 1);
  EXPECT_EQ(check.bad_positions_table, 1);
}

TEST(ExchangeTest, block_layout_refuses_negative_counts) {
  const int64_t counts[] = {1, -2};
  ex::BlockLayout l;
  EXPECT_FALSE(ex::BlockLayout::Of(counts, 2, 1, {1, 1}, &l).ok());
}

TEST(ExchangeTest, owner_keys_dedup_in_rank_order_and_record_each_copy) {
  // One Embedding Variable of dim 2; requester 0 sends keys 8, 6; requester 1 sends 6, 10.
  const std::vector<ex::TableSpec> tables = {{-1, -1, 2}};
  const int64_t counts[] = {2, 2};  // [world, n]
  ex::BlockLayout l;
  ASSERT_TRUE(ex::BlockLayout::Of(counts, 1, 2, {2}, &l).ok());
  const int64_t received[] = {8, 1, 6, 2, 6, 3, 10, 4};
  ex::OwnerKeys out;
  ex::owner_keys(tables, l, received, /*padded=*/false, &out);
  EXPECT_EQ(out.distinct, (std::vector<int64_t>{3}));
  EXPECT_EQ(out.keys[0], (std::vector<int64_t>{8, 6, 10}));
  EXPECT_EQ(out.counts[0], (std::vector<int64_t>{1, 5, 4}));
  // row_pos [distinct, world]: 8 only from rank 0 (floats 0..1), 6 from both, 10 from rank 1.
  EXPECT_EQ(out.row_pos, (std::vector<int64_t>{0, -1, 2, 4, -1, 6}));

  const std::vector<float> rows = {1, 2, 3, 4, 5, 6};
  const float* in[] = {rows.data()};
  std::vector<float> flat(8, -1.f);
  const int64_t distinct[] = {3};
  ex::rows_to_blocks({2}, distinct, 2, out.row_pos.data(), in, flat.data());
  EXPECT_EQ(flat, (std::vector<float>{1, 2, 3, 4, 3, 4, 5, 6}));
  std::vector<float> back(6);
  float* outs[] = {back.data()};
  ex::rows_from_blocks({2}, distinct, 2, out.row_pos.data(), flat.data(), outs);
  EXPECT_EQ(back, (std::vector<float>{1, 2, 6, 8, 5, 6}));  // key 6's two copies summed
}

TEST(ExchangeTest, padded_owner_keys_repeat_the_first_key_and_send_nothing_for_it) {
  // Two requesters send 8, 6 and 6, 10 (4 entries, 3 distinct); a second table gets nothing.
  const std::vector<ex::TableSpec> tables = {{-1, -1, 2}, {-1, -1, 1}};
  const int64_t counts[] = {2, 0, 2, 0};  // [world, n]
  ex::BlockLayout l;
  ASSERT_TRUE(ex::BlockLayout::Of(counts, 2, 2, {2, 1}, &l).ok());
  const int64_t received[] = {8, 1, 6, 2, 6, 3, 10, 4};
  ex::OwnerKeys out;
  ex::owner_keys(tables, l, received, /*padded=*/true, &out);
  EXPECT_EQ(out.distinct, (std::vector<int64_t>{3, 0}));
  EXPECT_EQ(out.keys[0], (std::vector<int64_t>{8, 6, 10, 8}));
  EXPECT_EQ(out.counts[0], (std::vector<int64_t>{1, 5, 4, 0}));
  EXPECT_TRUE(out.keys[1].empty());
  EXPECT_EQ(out.row_pos, (std::vector<int64_t>{0, -1, 2, 4, -1, 6, -1, -1}));

  const std::vector<float> rows = {1, 2, 3, 4, 5, 6, 7, 7};
  const float* in[] = {rows.data(), nullptr};
  std::vector<float> flat(8, -1.f);
  const int64_t entries[] = {4, 0};
  ex::rows_to_blocks({2, 1}, entries, 2, out.row_pos.data(), in, flat.data());
  EXPECT_EQ(flat, (std::vector<float>{1, 2, 3, 4, 3, 4, 5, 6}));  // the padding's row: nowhere
  std::vector<float> back(8, -1.f);
  float* outs[] = {back.data(), nullptr};
  ex::rows_from_blocks({2, 1}, entries, 2, out.row_pos.data(), flat.data(), outs);
  EXPECT_EQ(back, (std::vector<float>{1, 2, 6, 8, 5, 6, 0, 0}));  // the padding's gradient: 0
}

TEST(ExchangeTest, gather_and_scatter_rows_are_inverse) {
  const std::vector<int64_t> dims = {1, 2};
  const int64_t sizes[] = {2, 1};
  const int64_t row_at[] = {3, 0, 1};  // where each key's row starts in `returned`
  const std::vector<float> returned = {7, 8, 9, 6};
  std::vector<float> t0(2), t1(2);
  float* out[] = {t0.data(), t1.data()};
  ex::gather_rows(dims, sizes, row_at, returned.data(), out);
  EXPECT_EQ(t0, (std::vector<float>{6, 7}));
  EXPECT_EQ(t1, (std::vector<float>{8, 9}));
  std::vector<float> again(4, 0.f);
  const float* in[] = {t0.data(), t1.data()};
  ex::scatter_rows(dims, sizes, row_at, in, again.data());
  EXPECT_EQ(again, returned);
}
