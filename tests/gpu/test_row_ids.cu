// first_id_outside (core/cuda/row_ids.h: a static table's ids checked on the GPU) vs the CPU's
// (core/lookup.h). Usage: test_row_ids [seed (0: from the clock)] [name filter]; test_util.cuh.
#include <cstdint>
#include <string>
#include <vector>

#include "addons/sparse_operation_kit/core/cuda/row_ids.h"
#include "addons/sparse_operation_kit/core/lookup.h"
#include "tests/gpu/test_util.cuh"

using namespace sok_gpu_test;  // NOLINT

namespace {

// n ids in [0, rows), with `bad` written at the given positions.
template <typename K>
bool test_first_outside(size_t n, int64_t rows, const std::vector<std::pair<size_t, K>>& bad) {
  std::vector<K> ids(n);
  for (size_t i = 0; i < n; ++i) ids[i] = static_cast<K>((i * 7919) % rows);
  for (const auto& b : bad) ids[b.first] = b.second;
  const int64_t want = sok::first_id_outside(ids.data(), static_cast<int64_t>(n), rows);
  DevBuf<K> d = to_device(ids);
  DevBuf<int64_t> scratch(1);
  int64_t position = -2;
  K id = 0;
  SOK_OK(sok::gpu::first_id_outside<K>(d.get(), static_cast<int64_t>(n), rows, scratch.get(),
                                       nullptr, &position, &id));
  std::vector<int64_t> got{position}, expected{want};
  if (want >= 0) {
    got.push_back(static_cast<int64_t>(id));
    expected.push_back(static_cast<int64_t>(ids[want]));
  }
  return sok_test::expect_eq("position, id", got, expected);
}

}  // namespace

int main(int argc, char** argv) {
  return gpu_test_main(argc, argv, "test_row_ids", [] {
    run("every id a row", [] { return test_first_outside<int64_t>(1 << 20, 1000, {}); });
    run("no ids", [] { return test_first_outside<int64_t>(0, 10, {}); });
    run("the first of several bad ids, far apart (int64)", [] {
      return test_first_outside<int64_t>(1 << 22, 5000,
                                         {{3000001, -1}, {777777, 5000}, {4000000, 1LL << 40}});
    });
    run("a bad id at the last position (int32)",
        [] { return test_first_outside<int32_t>(123457, 99, {{123456, 99}}); });
    run("a negative id first (int32)",
        [] { return test_first_outside<int32_t>(4096, 64, {{0, -5}, {1, 64}}); });
  });
}
