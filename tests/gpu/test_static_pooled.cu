// The dense-table lookups (harness/gpu/dense_lookup.h: static_pooled_forward, gather_static) vs
// the CPU core's pooled_forward.
// Usage: test_static_pooled [seed (0: from the clock)] [name filter]; see test_util.cuh.
#include <cstdint>
#include <string>
#include <vector>

#include "harness/gpu/dense_lookup.h"
#include "tests/gpu/test_util.cuh"

using namespace sok_gpu_test;  // NOLINT
using namespace sok::harness;  // NOLINT

namespace {

template <typename I>
bool test_static(int64_t dim, Combiner comb, bool weighted, bool ragged) {
  const int64_t rows = 20000;
  LookupCase c = make_case(257, rows, dim, 40);
  std::vector<I> ids(c.n);
  for (int64_t i = 0; i < c.n; ++i) ids[i] = static_cast<I>(c.inverse[i]);
  std::vector<float> cout(c.batch * dim);
  const float* wts = weighted ? c.weights.data() : nullptr;
  pooled_forward(c.rows.data(), dim, c.inverse.data(), c.seg.data(), wts, c.n, c.batch, comb,
                 cout.data());
  DevBuf<float> dt = to_device(c.rows), dw = to_device(c.weights), dout(c.batch * dim),
                dg(c.n * dim);
  DevBuf<I> di = to_device(ids);
  DevBuf<int64_t> dseg = to_device(c.seg), dsp = to_device(c.splits);
  DevBuf<GpuLookupError> derr(1);
  Segments s;
  if (ragged) s.row_splits = dsp.get();
  else s.segment_ids = dseg.get();
  dout.poison();
  dg.poison();
  SOK_OK(reset_lookup_error(derr.get(), nullptr));
  SOK_OK(static_pooled_forward<I>(dt.get(), rows, dim, di.get(), s, weighted ? dw.get() : nullptr,
                                  c.n, c.batch, comb, dout.get(), derr.get(), nullptr));
  SOK_OK(gather_static<I>(dt.get(), rows, dim, di.get(), c.n, dg.get(), derr.get(), nullptr));
  Status st = check_lookup_errors(derr.get(), {"static"}, nullptr);
  if (!st.ok()) return FAIL("unexpected: %s", st.message().c_str());
  std::vector<float> want(c.n * dim);
  for (int64_t i = 0; i < c.n; ++i)
    std::copy(c.rows.begin() + ids[i] * dim, c.rows.begin() + (ids[i] + 1) * dim,
              want.begin() + i * dim);
  bool ok = sok_test::expect_near("pooled", dout.download(), cout, 1e-5, 1e-5);
  ok &= sok_test::expect_near("gather", dg.download(), want, 0, 0);
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  return sok_gpu_test::gpu_test_main(argc, argv, "test_static_pooled", [] {
    for (int64_t dim : {32, 64, 128, 13})
      for (Combiner c : {Combiner::kSum, Combiner::kMean, Combiner::kSqrtn}) {
        run(std::string("static pooled + gather int64 ") + cname(c) + " dim " + std::to_string(dim),
            [=] { return test_static<int64_t>(dim, c, c != Combiner::kSum, dim != 13); });
      }
    run("static pooled + gather int32 sum weighted segment_ids",
        [] { return test_static<int32_t>(32, Combiner::kSum, true, false); });
  });
}
