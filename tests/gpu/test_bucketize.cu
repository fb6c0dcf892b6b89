// bucketize_by_owner (harness/gpu/key_routing.h: which rank owns each key) vs the CPU reference.
// Usage: test_bucketize [seed (0: from the clock)] [name filter]; see test_util.cuh.
#include <cstdint>
#include <string>
#include <vector>

#include "harness/gpu/key_routing.h"
#include "tests/gpu/test_util.cuh"

using namespace sok_gpu_test;  // NOLINT
using namespace sok::harness;  // NOLINT

namespace {

template <typename K>
bool test_bucketize(int world, size_t n, size_t valid) {
  const std::vector<K> keys = draw(key_pool<K>(n), n);
  std::vector<int64_t> corder(valid), ccnt(world);
  bucketize_by_owner(keys.data(), static_cast<int64_t>(valid), world, corder.data(), ccnt.data());
  DevBuf<K> dk = to_device(keys);
  DevBuf<int64_t> dorder(n), dcnt(world), dn(1);
  dn.upload({static_cast<int64_t>(valid)});
  dorder.poison();
  dcnt.poison();
  SOK_OK(bucketize_by_owner<K>(dk.get(), n, valid == n ? nullptr : dn.get(), world, dorder.get(),
                               dcnt.get(), nullptr));
  bool ok = sok_test::expect_eq("order", dorder.download(valid), corder);
  ok &= sok_test::expect_eq("counts", dcnt.download(world), ccnt);
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  return sok_gpu_test::gpu_test_main(argc, argv, "test_bucketize", [] {
    for (int w : {1, 2, 3, 4, 8}) {
      run("bucketize_by_owner int64 world " + std::to_string(w),
          [w] { return test_bucketize<int64_t>(w, 100000, 100000); });
      run("bucketize_by_owner int32 world " + std::to_string(w) + " (device count)",
          [w] { return test_bucketize<int32_t>(w, 100000, 77777); });
    }
  });
}
