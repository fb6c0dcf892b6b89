#include "addons/sparse_operation_kit/core/parallel.h"

#include <gtest/gtest.h>

#include <atomic>
#include <vector>

namespace {

TEST(ParallelEach, CallsEveryIndexOnce) {
  for (int threads : {0, 1, 3, 64}) {
    for (int64_t n : {0, 1, 2, 5, 100}) {
      std::vector<std::atomic<int>> hits(n);
      for (auto& h : hits) h = 0;
      sok::parallel_each(n, [&](int64_t i) { ++hits[i]; }, threads);
      for (int64_t i = 0; i < n; ++i) EXPECT_EQ(hits[i], 1) << "n " << n << " threads " << threads;
    }
  }
}

TEST(ParallelEach, RunsPiecesAtOnce) {
  // Two pieces that each wait for the other finish only when they run on two threads.
  std::atomic<int> arrived{0};
  sok::parallel_each(
      2,
      [&](int64_t) {
        ++arrived;
        while (arrived < 2) {
        }
      },
      2);
  EXPECT_EQ(arrived, 2);
}

}  // namespace
