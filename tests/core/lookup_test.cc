#include "addons/sparse_operation_kit/core/lookup.h"

#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"

TEST(LookupTest, unique_keeps_first_appearance_order) {
  const int64_t keys[] = {5, -3, 5, 7, -3, 5};
  std::vector<int64_t> uniq, counts;
  std::vector<int32_t> inverse(6);
  sok::unique_keys(keys, 6, &uniq, inverse.data(), &counts);
  EXPECT_TRUE((uniq == std::vector<int64_t>{5, -3, 7}));
  EXPECT_TRUE((inverse == std::vector<int32_t>{0, 1, 0, 2, 1, 0}));
  EXPECT_TRUE((counts == std::vector<int64_t>{3, 2, 1}));
}

TEST(LookupTest, unique_into_buffers_returns_the_distinct_count_and_grows_its_set) {
  // 5,000 ids over 1,500 values: the open-addressing set doubles several times mid-call.
  std::mt19937 rng(11);
  std::vector<int64_t> keys(5000);
  for (int64_t& k : keys) k = static_cast<int64_t>(rng() % 1500) * 7919 - 3000000;
  std::vector<int64_t> uniq(keys.size(), -1), counts(keys.size(), -1);
  std::vector<int32_t> inverse(keys.size());
  const int64_t u = sok::unique_keys(keys.data(), static_cast<int64_t>(keys.size()), uniq.data(),
                                     inverse.data(), counts.data());
  std::vector<int64_t> want_uniq, want_counts;
  std::vector<int32_t> want_inverse(keys.size());
  sok::unique_keys(keys.data(), static_cast<int64_t>(keys.size()), &want_uniq, want_inverse.data(),
                   &want_counts);
  EXPECT_TRUE(u == static_cast<int64_t>(want_uniq.size()));
  EXPECT_TRUE((std::vector<int64_t>(uniq.begin(), uniq.begin() + u) == want_uniq));
  EXPECT_TRUE((std::vector<int64_t>(counts.begin(), counts.begin() + u) == want_counts));
  EXPECT_TRUE(inverse == want_inverse);
  EXPECT_TRUE(uniq[u] == -1 && counts[u] == -1);  // nothing written past the distinct keys
  int64_t total = 0;
  for (int64_t i = 0; i < u; ++i) total += counts[i];
  EXPECT_TRUE(total == static_cast<int64_t>(keys.size()));
  for (size_t i = 0; i < keys.size(); ++i) EXPECT_TRUE(uniq[inverse[i]] == keys[i]);
}

TEST(LookupTest, bucketize_by_owner_uses_floor_mod) {
  const int64_t keys[] = {4, -1, 3, 0, 5, -4};
  std::vector<int64_t> order(6), counts(3);
  sok::bucketize_by_owner(keys, 6, 3, order.data(), counts.data());
  // owners: 4->1, -1->2, 3->0, 0->0, 5->2, -4->2
  EXPECT_TRUE((counts == std::vector<int64_t>{2, 1, 3}));
  EXPECT_TRUE((order == std::vector<int64_t>{2, 3, 0, 1, 4, 5}));
}

TEST(LookupTest, pooled_forward_and_backward_match_naive) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  const int64_t dim = 3, rows_n = 4, batch = 4;
  std::vector<float> rows(rows_n * dim);
  for (float& v : rows) v = u(rng);
  const std::vector<int32_t> inverse = {0, 1, 1, 3, 2};
  const std::vector<int64_t> seg = {0, 0, 2, 2, 3};  // sample 1 is empty
  const std::vector<float> w = {0.5f, 2.f, 1.f, -0.5f, 3.f};
  for (auto comb : {sok::Combiner::kSum, sok::Combiner::kMean, sok::Combiner::kSqrtn}) {
    std::vector<float> out(batch * dim), want(batch * dim, 0.f), denom(batch, 0.f);
    sok::pooled_forward(rows.data(), dim, inverse.data(), seg.data(), w.data(), 5, batch, comb,
                        out.data());
    for (int i = 0; i < 5; ++i) denom[seg[i]] += comb == sok::Combiner::kMean ? w[i] : w[i] * w[i];
    for (int i = 0; i < 5; ++i) {
      float scale = comb == sok::Combiner::kSum    ? 1.f
                    : comb == sok::Combiner::kMean ? 1.f / denom[seg[i]]
                                                   : 1.f / std::sqrt(denom[seg[i]]);
      for (int c = 0; c < dim; ++c)
        want[seg[i] * dim + c] += w[i] * scale * rows[inverse[i] * dim + c];
    }
    for (int k = 0; k < batch * dim; ++k) EXPECT_NEAR(out[k], want[k], 1e-5);
    for (int c = 0; c < dim; ++c) EXPECT_TRUE(out[dim + c] == 0.f);
    // Backward: finite differences of <g, forward(rows)> w.r.t. rows.
    std::vector<float> g(batch * dim), grad_rows(rows_n * dim);
    for (float& v : g) v = u(rng);
    sok::pooled_backward(g.data(), dim, inverse.data(), seg.data(), w.data(), 5, batch, comb,
                         rows_n, grad_rows.data());
    for (int k = 0; k < rows_n * dim; ++k) {
      auto f = [&](float delta) {
        std::vector<float> r = rows;
        r[k] += delta;
        std::vector<float> o(batch * dim);
        sok::pooled_forward(r.data(), dim, inverse.data(), seg.data(), w.data(), 5, batch, comb,
                            o.data());
        double s = 0;
        for (int j = 0; j < batch * dim; ++j) s += g[j] * o[j];
        return s;
      };
      EXPECT_NEAR(grad_rows[k], (f(1e-2f) - f(-1e-2f)) / 2e-2, 2e-3);
    }
  }
}

TEST(LookupTest, pooled_reads_samples_from_indices_with_a_stride) {
  // Sorted and unsorted samples, as [n] and as column 0 of indices [n, 2]: the same results.
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  const int64_t dim = 4, rows_n = 3, batch = 3, n = 5;
  std::vector<float> rows(rows_n * dim), g(batch * dim);
  for (float& v : rows) v = u(rng);
  for (float& v : g) v = u(rng);
  const std::vector<int32_t> inverse = {0, 2, 1, 1, 0};
  const std::vector<float> w = {0.5f, 2.f, 1.f, -0.5f, 3.f};
  for (const std::vector<int64_t>& seg :
       {std::vector<int64_t>{0, 0, 1, 2, 2}, std::vector<int64_t>{2, 0, 1, 0, 2}}) {
    std::vector<int64_t> indices;
    for (int64_t s : seg) indices.insert(indices.end(), {s, 7});
    for (auto comb : {sok::Combiner::kSum, sok::Combiner::kMean}) {
      std::vector<float> out1(batch * dim), out2(batch * dim), gr1(rows_n * dim), gr2(rows_n * dim);
      sok::pooled_forward(rows.data(), dim, inverse.data(), seg.data(), w.data(), n, batch, comb,
                          out1.data());
      sok::pooled_forward(rows.data(), dim, inverse.data(), indices.data(), w.data(), n, batch,
                          comb, out2.data(), sok::serial_for, 2);
      sok::pooled_backward(g.data(), dim, inverse.data(), seg.data(), w.data(), n, batch, comb,
                           rows_n, gr1.data());
      sok::pooled_backward(g.data(), dim, inverse.data(), indices.data(), w.data(), n, batch, comb,
                           rows_n, gr2.data(), sok::serial_for, 2);
      EXPECT_TRUE(out1 == out2);
      EXPECT_TRUE(gr1 == gr2);
    }
  }
  const int64_t bad[] = {0, 7, 3, 7};  // sample 3 outside a batch of 3
  const int32_t inv[] = {0, 0};
  EXPECT_TRUE(sok::check_lookup_indices("t", inv, bad, 2, 1, 3, 2).message().find("sample 3") !=
              std::string::npos);
}

TEST(LookupTest, lookup_index_check_names_the_table) {
  const int32_t inverse[] = {0, 5};
  const int64_t seg[] = {0, 0};
  sok::Status s = sok::check_lookup_indices("user_id", inverse, seg, 2, 2, 1);
  EXPECT_TRUE(!s.ok() && s.message().find("user_id") != std::string::npos);
}

TEST(LookupTest, check_positions_finds_the_first_bad_and_unordered_ids) {
  // [n, 2] positions within dense_shape [3, 4]; id 2 has a column beyond, id 4 a negative sample.
  const int64_t positions[] = {0, 0, 2, 1, 1, 4, 1, 3, -1, 0};
  const int64_t dense_shape[] = {3, 4};
  sok::PositionsCheck c = sok::check_positions(positions, 5, 2, dense_shape);
  EXPECT_TRUE(c.first_outside == 2);
  EXPECT_TRUE(c.first_unordered == 2);  // sample 1 after sample 2
  c = sok::check_positions(positions, 2, 2, dense_shape);
  EXPECT_TRUE(c.first_outside == -1 && c.first_unordered == -1);
  c = sok::check_positions(positions, 0, 2, dense_shape);
  EXPECT_TRUE(c.first_outside == -1 && c.first_unordered == -1);
  const int64_t rows[] = {0, 3};  // rank 1 (a RaggedTensor's row ids) within [3]
  const int64_t nrows[] = {3};
  EXPECT_TRUE(sok::check_positions(rows, 2, 1, nrows).first_outside == 1);
  // Rank 3, every index within its shape, samples out of order from id 2 on.
  const int64_t cube[] = {0, 1, 1, 1, 0, 2, 0, 1, 0, 1, 1, 2};
  const int64_t cube_shape[] = {2, 2, 3};
  c = sok::check_positions(cube, 4, 3, cube_shape);
  EXPECT_TRUE(c.first_outside == -1 && c.first_unordered == 2);
  // A negative dimension: every index lies outside it.
  const int64_t negative[] = {3, -1};
  c = sok::check_positions(positions, 2, 2, negative);
  EXPECT_TRUE(c.first_outside == 0 && c.first_unordered == -1);
}

TEST(LookupTest, stable_sample_order_keeps_the_id_order_of_a_sample) {
  const int64_t positions[] = {2, 0, 0, 1, 2, 2, 0, 0, 1, 9};  // samples 2, 0, 2, 0, 1
  std::vector<int32_t> order(5);
  sok::stable_sample_order(positions, 5, 2, order.data());
  EXPECT_TRUE((order == std::vector<int32_t>{1, 3, 4, 0, 2}));
  std::mt19937 rng(5);
  std::vector<int64_t> samples(1000);
  for (int64_t& s : samples) s = rng() % 37;
  std::vector<int32_t> big(samples.size());
  sok::stable_sample_order(samples.data(), 1000, 1, big.data());
  for (size_t j = 1; j < big.size(); ++j) {
    const int64_t a = samples[big[j - 1]], b = samples[big[j]];
    EXPECT_TRUE(a < b || (a == b && big[j - 1] < big[j]));
  }
}

TEST(LookupTest, first_id_outside_finds_the_first_id_beyond_either_end) {
  const int64_t ids[] = {0, 4, 5, -1, 2};
  EXPECT_EQ(sok::first_id_outside(ids, 5, 6), 3);  // -1
  EXPECT_EQ(sok::first_id_outside(ids, 5, 5), 2);  // 5 with rows 0..4
  EXPECT_EQ(sok::first_id_outside(ids, 3, 6), -1);
  EXPECT_EQ(sok::first_id_outside(ids, 0, 0), -1);
  const int32_t narrow[] = {7, 0};
  EXPECT_EQ(sok::first_id_outside(narrow, 2, 7), 0);
}
