// pooled_forward / pooled_backward of one table (segment ids sorted or shuffled, row splits,
// long samples on a hot row) vs the CPU core, and the bad ids, segments and row splits they and
// the dense lookups report.
// Usage: test_pooled [seed (0: from the clock)] [name filter]; see test_util.cuh.
#include <cmath>
#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "harness/gpu/dense_lookup.h"
#include "tests/gpu/test_util.cuh"

using namespace sok_gpu_test;  // NOLINT
using namespace sok::harness;  // NOLINT

namespace {

// layout: 0 sorted segment ids, 1 shuffled segment ids, 2 row splits.
// hot: long samples (up to 300 ids) and 70% of the ids on one row (power-law-like backward).
bool test_pooled(int64_t dim, Combiner comb, bool weighted, int layout, bool hot = false) {
  LookupCase c = hot ? make_case(700, 517, dim, 300) : make_case(301, 517, dim, 24);
  if (hot)
    for (auto& r : c.inverse)
      if (g_rng() % 10 < 7) r = 3;
  if (layout == 1) {
    std::vector<size_t> p(c.n);
    std::iota(p.begin(), p.end(), 0);
    std::shuffle(p.begin(), p.end(), g_rng);
    LookupCase d = c;
    for (int64_t i = 0; i < c.n; ++i) {
      d.seg[i] = c.seg[p[i]];
      d.inverse[i] = c.inverse[p[i]];
      d.weights[i] = c.weights[p[i]];
    }
    c = d;
  }
  const float* wts = weighted ? c.weights.data() : nullptr;
  std::vector<float> cout(c.batch * dim), cgrad(c.num_rows * dim);
  pooled_forward(c.rows.data(), dim, c.inverse.data(), c.seg.data(), wts, c.n, c.batch, comb,
                 cout.data());
  const std::vector<float> gout = randn(c.batch * dim, 1.f);
  pooled_backward(gout.data(), dim, c.inverse.data(), c.seg.data(), wts, c.n, c.batch, comb,
                  c.num_rows, cgrad.data());
  DevBuf<float> drows = to_device(c.rows), dw = to_device(c.weights), dout(c.batch * dim),
                dgo = to_device(gout), dgrad(c.num_rows * dim);
  DevBuf<int32_t> dinv = to_device(c.inverse);
  DevBuf<int64_t> dseg = to_device(c.seg), dsplits = to_device(c.splits);
  DevBuf<GpuLookupError> derr(1);
  Segments s;
  if (layout == 2) s.row_splits = dsplits.get();
  else s.segment_ids = dseg.get();
  dout.poison();
  dgrad.poison();
  SOK_OK(reset_lookup_error(derr.get(), nullptr));
  SOK_OK(pooled_forward(drows.get(), dim, c.num_rows, dinv.get(), s, weighted ? dw.get() : nullptr,
                        c.n, c.batch, comb, dout.get(), nullptr, derr.get()));
  Status st = check_lookup_errors(derr.get(), {"pooled"}, nullptr);
  if (!st.ok()) return FAIL("unexpected error: %s", st.message().c_str());
  SOK_OK(pooled_backward(dgo.get(), dim, dinv.get(), s, weighted ? dw.get() : nullptr, c.n, c.batch,
                         comb, c.num_rows, nullptr, dgrad.get(), nullptr));
  if (!hot) {
    bool ok = sok_test::expect_near("forward", dout.download(), cout, 1e-5, 1e-5);
    ok &= sok_test::expect_near("backward", dgrad.download(), cgrad, 1e-5, 1e-5);
    return ok;
  }
  // Long float sums (~70K terms on the hot row) round differently in the CPU's sequential order
  // and the GPU's chunked order, and both drift from the exact sum: check the GPU against a
  // float64 reference with a bound scaled by the sum of |terms| (the sum's condition).
  std::vector<double> scale(c.batch, 1.0), fref(c.batch * dim, 0.0), fabs_(c.batch * dim, 0.0),
      bref(c.num_rows * dim, 0.0), babs(c.num_rows * dim, 0.0);
  if (comb != Combiner::kSum) {
    std::vector<double> acc(c.batch, 0.0);
    for (int64_t i = 0; i < c.n; ++i) {
      const double w = wts ? wts[i] : 1.0;
      acc[c.seg[i]] += comb == Combiner::kMean ? w : w * w;
    }
    for (int64_t b = 0; b < c.batch; ++b) {
      const double d = comb == Combiner::kMean ? acc[b] : std::sqrt(acc[b]);
      scale[b] = d == 0.0 ? 0.0 : 1.0 / d;
    }
  }
  for (int64_t i = 0; i < c.n; ++i) {
    const int64_t sgi = c.seg[i], r = c.inverse[i];
    const double w = (wts ? wts[i] : 1.0) * scale[sgi];
    for (int64_t k = 0; k < dim; ++k) {
      const double f = w * c.rows[r * dim + k], g = w * gout[sgi * dim + k];
      fref[sgi * dim + k] += f;
      fabs_[sgi * dim + k] += std::fabs(f);
      bref[r * dim + k] += g;
      babs[r * dim + k] += std::fabs(g);
    }
  }
  const std::vector<float> fo = dout.download(), bo = dgrad.download();
  size_t bad = 0;
  for (size_t k = 0; k < fo.size(); ++k)
    if (!(std::fabs(fo[k] - fref[k]) <= 1e-6 * fabs_[k] + 1e-6) && bad++ < 3)
      FAIL("forward[%zu]: got %.9g want %.9g (sum|terms| %.3g)", k, fo[k], fref[k], fabs_[k]);
  for (size_t k = 0; k < bo.size(); ++k)
    if (!(std::fabs(bo[k] - bref[k]) <= 1e-6 * babs[k] + 1e-6) && bad++ < 3)
      FAIL("backward[%zu]: got %.9g want %.9g (sum|terms| %.3g, CPU core %.9g)", k, bo[k], bref[k],
           babs[k], cgrad[k]);
  return bad == 0;
}

bool test_bad_indices() {
  bool ok = true;
  LookupCase c = make_case(64, 100, 8, 10);
  const int64_t bad_pos = c.n / 2;
  c.inverse[bad_pos] = 100 + 5;  // out of range
  DevBuf<float> drows = to_device(c.rows), dout(c.batch * 8);
  DevBuf<int32_t> dinv = to_device(c.inverse);
  DevBuf<int64_t> dseg = to_device(c.seg);
  DevBuf<GpuLookupError> derr(1);
  Segments s;
  s.segment_ids = dseg.get();
  SOK_OK(reset_lookup_error(derr.get(), nullptr));
  SOK_OK(pooled_forward(drows.get(), 8, c.num_rows, dinv.get(), s, nullptr, c.n, c.batch,
                        Combiner::kSum, dout.get(), nullptr, derr.get()));
  Status st = check_lookup_errors(derr.get(), {"lookup of table 'x'"}, nullptr);
  const std::string want_id = "id 105 at position " + std::to_string(bad_pos);
  if (st.ok() || st.message().find(want_id) == std::string::npos)
    ok = FAIL("bad inverse: got '%s'", st.message().c_str());
  // Bad segment id.
  std::vector<int64_t> seg = c.seg;
  seg[3] = c.batch;
  c.inverse[bad_pos] = 1;
  dseg.upload(seg);
  dinv.upload(c.inverse);
  SOK_OK(reset_lookup_error(derr.get(), nullptr));
  SOK_OK(pooled_forward(drows.get(), 8, c.num_rows, dinv.get(), s, nullptr, c.n, c.batch,
                        Combiner::kSum, dout.get(), nullptr, derr.get()));
  st = check_lookup_errors(derr.get(), {"lookup"}, nullptr);
  if (st.ok() || st.message().find("id 3 belongs to sample 64") == std::string::npos)
    ok = FAIL("bad segment: got '%s'", st.message().c_str());
  // Dense gather: ids -1 at 5 and num_rows at 9 (the first position is reported), rows zeroed.
  const int64_t rows = 1000, dim = 12;
  std::vector<float> table = randn(rows * dim, 1.f);
  std::vector<int64_t> ids(50);
  for (auto& x : ids) x = static_cast<int64_t>(g_rng() % rows);
  ids[5] = -1;
  ids[9] = rows;
  DevBuf<float> dt = to_device(table), dg(50 * dim);
  DevBuf<int64_t> di = to_device(ids);
  dg.poison();
  SOK_OK(reset_lookup_error(derr.get(), nullptr));
  SOK_OK(gather_static<int64_t>(dt.get(), rows, dim, di.get(), 50, dg.get(), derr.get(), nullptr));
  st = check_lookup_errors(derr.get(), {"dense"}, nullptr);
  if (st.ok() || st.message().find("id -1 at position 5") == std::string::npos)
    ok = FAIL("gather_static: got '%s'", st.message().c_str());
  std::vector<float> want(50 * dim, 0.f);
  for (int i = 0; i < 50; ++i)
    if (ids[i] >= 0 && ids[i] < rows)
      std::copy(table.begin() + ids[i] * dim, table.begin() + (ids[i] + 1) * dim,
                want.begin() + i * dim);
  ok &= sok_test::expect_near("gather_static rows", dg.download(), want, 0, 0);
  // Fused dense pooled lookup with a bad id.
  std::vector<int64_t> splits = {0, 10, 20, 30, 40, 50};
  DevBuf<int64_t> ds = to_device(splits);
  DevBuf<float> dpo(5 * dim);
  Segments s2;
  s2.row_splits = ds.get();
  SOK_OK(reset_lookup_error(derr.get(), nullptr));
  SOK_OK(static_pooled_forward<int64_t>(dt.get(), rows, dim, di.get(), s2, nullptr, 50, 5,
                                        Combiner::kSum, dpo.get(), derr.get(), nullptr));
  st = check_lookup_errors(derr.get(), {"dense"}, nullptr);
  if (st.ok() || st.message().find("position 5") == std::string::npos)
    ok = FAIL("static_pooled_forward: got '%s'", st.message().c_str());
  // Bad row splits.
  splits[2] = 5;  // decreasing
  ds.upload(splits);
  ids[5] = 1;
  ids[9] = 2;
  di.upload(ids);
  SOK_OK(reset_lookup_error(derr.get(), nullptr));
  SOK_OK(static_pooled_forward<int64_t>(dt.get(), rows, dim, di.get(), s2, nullptr, 50, 5,
                                        Combiner::kSum, dpo.get(), derr.get(), nullptr));
  st = check_lookup_errors(derr.get(), {"dense"}, nullptr);
  if (st.ok() || st.message().find("row_splits[2] = 5") == std::string::npos)
    ok = FAIL("row splits: got '%s'", st.message().c_str());
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  return sok_gpu_test::gpu_test_main(argc, argv, "test_pooled", [] {
    for (int64_t dim : {1, 7, 32, 128})
      for (Combiner c : {Combiner::kSum, Combiner::kMean, Combiner::kSqrtn})
        for (bool w : {false, true})
          for (int layout : {0, 1, 2}) {
            const char* ln[] = {"sorted segment_ids", "shuffled segment_ids", "row_splits"};
            run(std::string("pooled fwd+bwd ") + cname(c) + (w ? " weighted" : "") + " dim " +
                    std::to_string(dim) + " " + ln[layout],
                [=] { return test_pooled(dim, c, w, layout); });
          }
    for (int64_t dim : {8, 32, 64, 128, 7})
      for (Combiner c : {Combiner::kSum, Combiner::kMean})
        run(std::string("pooled fwd+bwd long samples + hot row ") + cname(c) + " weighted dim " +
                std::to_string(dim),
            [=] { return test_pooled(dim, c, true, 0, true); });
    run("bad ids / segments / row splits are reported, never read",
        [] { return test_bad_indices(); });
  });
}
