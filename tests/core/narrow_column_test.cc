#include "addons/sparse_operation_kit/core/narrow_column.h"

#include <cstdint>
#include <limits>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace {

using sok::NarrowColumn;

TEST(NarrowColumnTest, stays_narrow_while_values_fit) {
  NarrowColumn<uint32_t> c;
  c.push_back(0);
  c.push_back(std::numeric_limits<uint32_t>::max());
  EXPECT_TRUE(!c.wide());
  EXPECT_TRUE(c.get(1) == int64_t{4294967295});
  c.set(0, 7);
  EXPECT_TRUE(c.to_vector() == (std::vector<int64_t>{7, 4294967295}));
}

TEST(NarrowColumnTest, widens_losslessly_for_a_value_that_does_not_fit) {
  NarrowColumn<int32_t> c;
  c.push_back(-5);
  c.push_back(int64_t{1} << 40);
  EXPECT_TRUE(c.wide());
  EXPECT_TRUE(c.to_vector() == (std::vector<int64_t>{-5, int64_t{1} << 40}));
  NarrowColumn<uint32_t> u;
  u.push_back(1);
  EXPECT_TRUE(!u.can_hold(-1) && u.can_hold(1));
  u.widen();
  EXPECT_TRUE(u.can_hold(-1));
  u.set(0, -1);
  EXPECT_TRUE(u.get(0) == -1);
}

TEST(NarrowColumnTest, try_add_refuses_an_overflow_and_add_widens) {
  NarrowColumn<uint32_t> c;
  c.push_back(std::numeric_limits<uint32_t>::max() - 1);
  EXPECT_TRUE(c.try_add(0, 1));
  EXPECT_TRUE(!c.try_add(0, 1));  // unchanged
  EXPECT_TRUE(!c.try_add(0, std::numeric_limits<int64_t>::max()));
  EXPECT_TRUE(c.get(0) == int64_t{4294967295} && !c.wide());
  c.add(0, 1);
  EXPECT_TRUE(c.wide() && c.get(0) == int64_t{4294967296});
  EXPECT_TRUE(c.try_add(0, 10));
  EXPECT_TRUE(c.get(0) == int64_t{4294967306});
}

TEST(NarrowColumnTest, concurrent_try_adds_all_land) {
  NarrowColumn<uint32_t> c;
  c.push_back(0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 10000; ++i) EXPECT_TRUE(c.try_add(0, 3));
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_TRUE(c.get(0) == 120000);
}

TEST(NarrowColumnTest, assign_and_resize) {
  NarrowColumn<int32_t> c;
  c.assign({1, -2, 3});
  EXPECT_TRUE(!c.wide() && c.size() == 3 && c.get(1) == -2);
  c.resize(2);
  EXPECT_TRUE(c.to_vector() == (std::vector<int64_t>{1, -2}));
  c.assign({std::numeric_limits<int64_t>::min()});
  EXPECT_TRUE(c.wide() && c.get(0) == std::numeric_limits<int64_t>::min());
  c.assign({4});  // a new content may be narrow again
  EXPECT_TRUE(!c.wide() && c.get(0) == 4);
}

}  // namespace
