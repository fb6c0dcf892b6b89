// How the core asks for parallel work without knowing the framework's thread pool:
// fn(begin, end) is called over disjoint ranges covering [0, total).
#pragma once

#include <cstdint>
#include <functional>

namespace sok {

using RangeFn = std::function<void(int64_t begin, int64_t end)>;
using ParallelFor = std::function<void(int64_t total, int64_t cost_per_unit, const RangeFn& fn)>;

inline void serial_for(int64_t total, int64_t /*cost_per_unit*/, const RangeFn& fn) {
  if (total > 0) fn(0, total);
}

}  // namespace sok
