// How the core asks for parallel work without knowing the framework's thread pool:
// fn(begin, end) is called over disjoint ranges covering [0, total).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

namespace sok {

using RangeFn = std::function<void(int64_t begin, int64_t end)>;
using ParallelFor = std::function<void(int64_t total, int64_t cost_per_unit, const RangeFn& fn)>;

inline void serial_for(int64_t total, int64_t /*cost_per_unit*/, const RangeFn& fn) {
  if (total > 0) fn(0, total);
}

// fn(i) for every i in [0, n), on up to `threads` threads (the caller's included; 0: one per
// core). For a few large independent pieces of host work (the tables of a fused call, each
// milliseconds of file work), where starting threads costs little beside the work.
inline void parallel_each(int64_t n, const std::function<void(int64_t)>& fn, int threads = 0) {
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int64_t workers = std::min<int64_t>(n, threads);
  if (workers <= 1) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  std::atomic<int64_t> next{0};
  auto work = [&] {
    for (int64_t i = next++; i < n; i = next++) fn(i);
  };
  std::vector<std::thread> pool;
  for (int64_t w = 1; w < workers; ++w) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
}

}  // namespace sok
