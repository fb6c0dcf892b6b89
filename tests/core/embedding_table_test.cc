#include "addons/sparse_operation_kit/core/embedding_table.h"

#include <cstdint>
#include <limits>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace {

using sok::EmbeddingTable;

sok::TableConfig uniform_config(int64_t dim) {
  sok::TableConfig c;
  c.name = "t";
  c.dim = dim;
  c.init.kind = sok::InitKind::kUniform;
  c.init.a = -1.f;
  c.init.b = 1.f;
  c.init.seed = 7;
  c.initial_capacity = 4;
  return c;
}

}  // namespace

TEST(EmbeddingTableTest, new_keys_get_their_deterministic_initial_value) {
  EmbeddingTable<int64_t> t(uniform_config(5));
  const int64_t keys[] = {std::numeric_limits<int64_t>::min(), -1, 0, 3,
                          std::numeric_limits<int64_t>::max()};
  std::vector<float> out(5 * 5), want(5);
  t.find_or_insert(keys, 5, out.data());
  for (int i = 0; i < 5; ++i) {
    sok::initialize_row(t.config().init, keys[i], want.data(), 5);
    for (int c = 0; c < 5; ++c) EXPECT_TRUE(out[i * 5 + c] == want[c]);
  }
  EXPECT_TRUE(t.size() == 5);
  // Different keys start from different rows.
  EXPECT_TRUE(out[0] != out[5]);
}

TEST(EmbeddingTableTest, find_never_inserts_and_reads_initial_value) {
  EmbeddingTable<int32_t> t(uniform_config(3));
  const int32_t keys[] = {42, -42};
  std::vector<float> out(6), want(3);
  t.find(keys, 2, out.data());
  EXPECT_TRUE(t.size() == 0);
  sok::initialize_row(t.config().init, keys[1], want.data(), 3);
  for (int c = 0; c < 3; ++c) EXPECT_TRUE(out[3 + c] == want[c]);
}

TEST(EmbeddingTableTest, default_value_dim_folds_keys) {
  sok::TableConfig c = uniform_config(4);
  c.init.default_value_dim = 10;
  EmbeddingTable<int64_t> t(c);
  const int64_t keys[] = {3, 13, -7};
  std::vector<float> out(12);
  t.find_or_insert(keys, 3, out.data());
  for (int k = 0; k < 4; ++k) {
    EXPECT_TRUE(out[k] == out[4 + k]);
    EXPECT_TRUE(out[k] == out[8 + k]);  // floor_mod(-7, 10) == 3
  }
}

TEST(EmbeddingTableTest, growth_keeps_every_key_once) {
  EmbeddingTable<int64_t> t(uniform_config(2));
  std::vector<int64_t> keys;
  for (int64_t i = 0; i < 100000; ++i) keys.push_back(i * 7919 - 300000);
  std::vector<float> out(keys.size() * 2);
  t.find_or_insert(keys.data(), keys.size(), out.data());
  t.find_or_insert(keys.data(), keys.size(), out.data());
  EXPECT_TRUE(t.size() == 100000);
  auto snap = t.export_rows();
  EXPECT_TRUE(snap.keys == keys);  // insertion order
}

TEST(EmbeddingTableTest, concurrent_inserts_and_updates_lose_nothing) {
  sok::TableConfig c = uniform_config(4);
  c.init.kind = sok::InitKind::kConstant;
  c.init.a = 0.f;
  EmbeddingTable<int64_t> t(c);
  sok::OptimizerParams sgd;
  sgd.kind = sok::OptimizerKind::kSGD;
  sgd.lr = 1.f;
  const int kThreads = 4, kRounds = 50, kKeys = 257;
  std::vector<std::thread> threads;
  for (int th = 0; th < kThreads; ++th) {
    threads.emplace_back([&, th] {
      std::vector<int64_t> keys(kKeys);
      std::vector<float> rows(kKeys * 4), grads(kKeys * 4, -1.f);
      for (int r = 0; r < kRounds; ++r) {
        for (int i = 0; i < kKeys; ++i) keys[i] = (i * 31 + th * 7 + r) % kKeys;  // overlapping
        t.find_or_insert(keys.data(), kKeys, rows.data());
        EXPECT_TRUE(t.apply_gradients(keys.data(), kKeys, grads.data(), sgd, r).ok());
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_TRUE(t.size() == kKeys);
  auto snap = t.export_rows();
  for (float v : snap.values) EXPECT_TRUE(v == static_cast<float>(kThreads * kRounds));
  for (int64_t f : snap.freqs) EXPECT_TRUE(f == kThreads * kRounds);
}

TEST(EmbeddingTableTest, adagrad_rows_and_slots_follow_the_rule) {
  sok::TableConfig c = uniform_config(2);
  c.init.kind = sok::InitKind::kConstant;
  c.init.a = 1.f;
  EmbeddingTable<int64_t> t(c);
  sok::OptimizerParams p;
  p.kind = sok::OptimizerKind::kAdagrad;
  p.lr = 0.1f;
  p.initial_accumulator = 0.1f;
  const int64_t keys[] = {5, 5, 9};  // repeated key: gradients summed first
  const float grads[] = {1.f, 2.f, 1.f, 2.f, 3.f, 4.f};
  EXPECT_TRUE(t.apply_gradients(keys, 3, grads, p, 0).ok());
  auto s = t.export_rows();
  EXPECT_TRUE(s.num_slots == 1);
  EXPECT_TRUE(s.keys.size() == 2);
  // key 5: g = (2, 4); acc = 0.1 + g^2; v = 1 - 0.1 g / sqrt(acc)
  EXPECT_NEAR(s.slots[0], 4.1, 1e-6);
  EXPECT_NEAR(s.values[0], 1.0 - 0.1 * 2 / std::sqrt(4.1), 1e-6);
  EXPECT_NEAR(s.values[1], 1.0 - 0.1 * 4 / std::sqrt(16.1), 1e-6);
  EXPECT_TRUE(s.versions[0] == 0);
  // Another optimizer's slots are refused.
  p.kind = sok::OptimizerKind::kAdam;
  EXPECT_TRUE(!t.apply_gradients(keys, 1, grads, p, 1).ok());
}

TEST(EmbeddingTableTest, export_import_round_trip_is_exact) {
  EmbeddingTable<int64_t> a(uniform_config(3));
  sok::OptimizerParams p;
  p.kind = sok::OptimizerKind::kAdam;
  std::vector<int64_t> keys = {1, -2, 300};
  std::vector<float> rows(9), grads(9, 0.5f);
  a.find_or_insert(keys.data(), 3, rows.data());
  EXPECT_TRUE(a.apply_gradients(keys.data(), 3, grads.data(), p, 4).ok());
  auto snap = a.export_rows();
  EmbeddingTable<int64_t> b(uniform_config(3));
  EXPECT_TRUE(b.import_rows(snap).ok());
  auto again = b.export_rows();
  EXPECT_TRUE(again.keys == snap.keys && again.values == snap.values && again.slots == snap.slots);
  EXPECT_TRUE(again.freqs == snap.freqs && again.versions == snap.versions &&
              again.slot_init == snap.slot_init);
  EmbeddingTable<int64_t> wrong_dim(uniform_config(4));
  sok::Status s = wrong_dim.import_rows(snap);
  EXPECT_TRUE(!s.ok() && s.message().find("dimension") != std::string::npos);
}

TEST(EmbeddingTableTest, counter_filter_admits_after_threshold) {
  sok::TableConfig c = uniform_config(2);
  c.filter_freq = 3;
  c.default_value_no_permission = 0.25f;
  EmbeddingTable<int64_t> t(c);
  const int64_t key = 11;
  std::vector<float> out(2), want(2);
  sok::initialize_row(c.init, key, want.data(), 2);
  t.find_or_insert(&key, 1, out.data());
  EXPECT_TRUE(out[0] == 0.25f);
  sok::OptimizerParams sgd;
  const float g[] = {1.f, 1.f};
  EXPECT_TRUE(t.apply_gradients(&key, 1, g, sgd, 0).ok());  // not admitted: no update
  t.find_or_insert(&key, 1, out.data());
  EXPECT_TRUE(out[0] == 0.25f);
  t.find_or_insert(&key, 1, out.data());
  EXPECT_TRUE(out[0] == want[0] && out[1] == want[1]);
}

TEST(EmbeddingTableTest, shrink_evicts_stale_rows) {
  sok::TableConfig c = uniform_config(2);
  c.steps_to_live = 5;
  EmbeddingTable<int64_t> t(c);
  sok::OptimizerParams sgd;
  const int64_t old_key = 1, new_key = 2;
  const float g[] = {0.f, 0.f};
  EXPECT_TRUE(t.apply_gradients(&old_key, 1, g, sgd, 1).ok());
  EXPECT_TRUE(t.apply_gradients(&new_key, 1, g, sgd, 9).ok());
  EXPECT_TRUE(t.shrink(10) == 1);
  EXPECT_TRUE(t.size() == 1);
  EXPECT_TRUE(t.export_rows().keys[0] == new_key);
}

TEST(EmbeddingTableTest, frequencies_and_versions_past_32_bits_are_kept_exactly) {
  sok::TableConfig c = uniform_config(2);
  c.filter_freq = int64_t{5} << 32;  // admitted only once the count passes 32 bits
  EmbeddingTable<int64_t> t(c);
  const int64_t keys[] = {1, 2};
  const int64_t big[] = {int64_t{3} << 32, 4000000000};
  std::vector<float> out(4);
  t.find_or_insert(keys, 2, out.data(), big);
  t.find_or_insert(keys, 2, out.data(), big);
  const int64_t one[] = {1, 1};
  t.find_or_insert(keys, 2, out.data(), one);
  sok::OptimizerParams sgd;
  const float g[] = {1.f, 1.f, 1.f, 1.f};
  const int64_t step = (int64_t{1} << 33) + 3;
  EXPECT_TRUE(t.apply_gradients(keys, 2, g, sgd, step).ok());
  auto s = t.export_rows();
  EXPECT_TRUE(s.freqs == (std::vector<int64_t>{(int64_t{6} << 32) + 1, 8000000001}));
  EXPECT_TRUE(s.versions[0] == step);  // admitted: updated
  EXPECT_TRUE(s.versions[1] == 0);     // not admitted: skipped
  EmbeddingTable<int64_t> b(c);
  EXPECT_TRUE(b.import_rows(s).ok());
  auto again = b.export_rows();
  EXPECT_TRUE(again.freqs == s.freqs && again.versions == s.versions);
  EXPECT_TRUE(b.shrink(step) == 0 && b.size() == 2);
}

TEST(EmbeddingTableTest, erase_keeps_the_other_rows_across_blocks) {
  EmbeddingTable<int32_t> t(uniform_config(64));  // 4096 rows a block
  std::vector<int32_t> keys;
  for (int32_t i = 0; i < 20000; ++i) keys.push_back(i * 3 - 7000);
  std::vector<float> out(keys.size() * 64);
  t.find_or_insert(keys.data(), keys.size(), out.data());
  std::vector<int32_t> odd;
  for (size_t i = 1; i < keys.size(); i += 2) odd.push_back(keys[i]);
  EXPECT_TRUE(t.erase(odd.data(), odd.size()) == static_cast<int64_t>(odd.size()));
  std::vector<int32_t> even;
  for (size_t i = 0; i < keys.size(); i += 2) even.push_back(keys[i]);
  std::vector<float> got(even.size() * 64);
  t.find(even.data(), even.size(), got.data());
  for (size_t i = 0; i < even.size(); ++i) {
    for (int c = 0; c < 64; ++c) EXPECT_TRUE(got[i * 64 + c] == out[2 * i * 64 + c]);
  }
  EXPECT_TRUE(t.export_rows().keys == even);
}
