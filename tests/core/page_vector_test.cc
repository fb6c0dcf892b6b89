#include "addons/sparse_operation_kit/core/page_vector.h"

#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <utility>

#include "gtest/gtest.h"

namespace {

using sok::PageVector;

int64_t rss_bytes() {
  std::ifstream f("/proc/self/status");
  for (std::string line; std::getline(f, line);) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  }
  return 0;
}

TEST(PageVectorTest, push_back_grows_and_keeps_values_across_both_kinds_of_buffer) {
  PageVector<int64_t> v;
  EXPECT_TRUE(v.empty());
  // Crosses kMapBytes: from malloc to mapped buffers, then mremap growth.
  const int64_t n = 3 * static_cast<int64_t>(sok::kMapBytes / sizeof(int64_t)) + 7;
  for (int64_t i = 0; i < n; ++i) v.push_back(i * 3 - 1);
  ASSERT_EQ(v.size(), n);
  EXPECT_GE(v.capacity(), n);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(v[i], i * 3 - 1) << i;
  v.shrink_to_fit();
  EXPECT_EQ(v.capacity(), n);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(v[i], i * 3 - 1) << i;
  v.resize(5);  // back under kMapBytes once shrunk: copied into a malloc buffer
  v.shrink_to_fit();
  ASSERT_EQ(v.size(), 5);
  for (int64_t i = 0; i < 5; ++i) EXPECT_EQ(v[i], i * 3 - 1);
  v.release();
  EXPECT_EQ(v.size(), 0);
  EXPECT_EQ(v.capacity(), 0);
}

TEST(PageVectorTest, resize_fills_new_elements_and_assign_converts) {
  PageVector<uint32_t> v;
  v.resize(4, 9);
  v.resize(2);
  v.resize(6);  // the two new elements are value-initialised, not the old 9s
  const uint32_t want[] = {9, 9, 0, 0, 0, 0};
  for (int i = 0; i < 6; ++i) EXPECT_EQ(v[i], want[i]);
  const int64_t src[] = {1, 2, 3};
  v.assign(src, src + 3);
  ASSERT_EQ(v.size(), 3);
  EXPECT_EQ(v.to_vector(), (std::vector<uint32_t>{1, 2, 3}));
}

TEST(PageVectorTest, assign_zeroed_is_zero_at_every_size) {
  for (int64_t n : {int64_t{1}, int64_t{100}, int64_t{1} << 20}) {
    PageVector<uint64_t> v;
    v.resize(n, ~uint64_t{0});
    v.assign_zeroed(n);
    ASSERT_EQ(v.size(), n);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(v[i], 0u) << n << " " << i;
  }
}

TEST(PageVectorTest, moves_hand_over_the_buffer) {
  PageVector<int> a;
  for (int i = 0; i < 100; ++i) a.push_back(i);
  const int* data = a.data();
  PageVector<int> b(std::move(a));
  EXPECT_EQ(b.data(), data);
  EXPECT_EQ(b.size(), 100);
  EXPECT_EQ(a.size(), 0);  // NOLINT(bugprone-use-after-move): a moved-from vector is empty
  PageVector<int> c;
  c.push_back(1);
  c = std::move(b);
  EXPECT_EQ(c.size(), 100);
  EXPECT_EQ(c[99], 99);
}

TEST(PageVectorTest, mapped_buffers_cost_memory_only_where_written_and_return_it_when_freed) {
  const int64_t mib = 1 << 20;
  const int64_t n = 256 * mib / 8;  // 256 MiB of int64
  const int64_t rss0 = rss_bytes();
  {
    PageVector<int64_t> v;
    v.reserve(n);  // address space only
    EXPECT_LT(rss_bytes() - rss0, 16 * mib);
    for (int64_t i = 0; i < n / 4; ++i) v.push_back(i);  // a quarter written
    const int64_t used = rss_bytes() - rss0;
    EXPECT_GT(used, 60 * mib);
    EXPECT_LT(used, 80 * mib);
    v.reserve(2 * n);  // grows by moving pages: nothing copied, nothing more resident
    EXPECT_LT(rss_bytes() - rss0, 80 * mib);
    EXPECT_EQ(v[n / 4 - 1], n / 4 - 1);
  }
  EXPECT_LT(rss_bytes() - rss0, 16 * mib);  // freed: back to the OS at once
}

}  // namespace
