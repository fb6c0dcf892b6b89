// The whole single-GPU training step (unique_keys, find_or_insert, pooled forward / backward,
// apply_gradients with device counts) vs the CPU core's steps.
// Usage: test_pipeline [seed (0: from the clock)] [name filter]; see test_util.cuh.
#include <cstdint>
#include <string>
#include <vector>

#include "tests/gpu/test_util.cuh"

using namespace sok_gpu_test;  // NOLINT

namespace {

// The whole single-GPU training step with device counts (no host round trip) vs the CPU steps.
template <typename K>
bool test_pipeline(Combiner comb) {
  const int64_t dim = 32, batch = 512;
  TableConfig cfg = make_cfg(dim, InitKind::kNormal);
  EmbeddingTable<K> cpu(cfg);
  auto gpu = make_gpu<K>(cfg);
  const std::vector<K> pool = key_pool<K>(4000);
  OptimizerParams p;
  p.kind = OptimizerKind::kAdagrad;
  p.lr = 0.05f;
  bool ok = true;
  for (int s = 1; s <= 5 && ok; ++s) {
    LookupCase c = make_case(batch, 1, dim, 30);
    const std::vector<K> ids = draw(pool, c.n);
    const int64_t n = c.n;
    // CPU.
    std::vector<K> cu;
    std::vector<int32_t> cinv(n);
    std::vector<int64_t> ccnt;
    unique_keys(ids.data(), n, &cu, cinv.data(), &ccnt);
    const int64_t u = cu.size();
    std::vector<float> crows(u * dim), cout(batch * dim), cgrad(u * dim);
    cpu.find_or_insert(cu.data(), u, crows.data(), ccnt.data());
    pooled_forward(crows.data(), dim, cinv.data(), c.seg.data(), c.weights.data(), n, batch, comb,
                   cout.data());
    const std::vector<float> gout = randn(batch * dim, 1.f);
    pooled_backward(gout.data(), dim, cinv.data(), c.seg.data(), c.weights.data(), n, batch, comb,
                    u, cgrad.data());
    SOK_OK(cpu.apply_gradients(cu.data(), u, cgrad.data(), p, s));
    // GPU.
    DevBuf<K> dids = to_device(ids), du(n);
    DevBuf<int32_t> dinv(n);
    DevBuf<int64_t> dcnt(n), dnum(1), dsp = to_device(c.splits);
    DevBuf<float> drows(n * dim), dout(batch * dim), dgo = to_device(gout), dgrad(n * dim),
                                                     dw = to_device(c.weights);
    drows.poison();
    dout.poison();
    dgrad.poison();
    Segments sg;
    sg.row_splits = dsp.get();
    SOK_OK(unique_keys<K>(dids.get(), n, du.get(), dinv.get(), dcnt.get(), dnum.get(), nullptr));
    SOK_OK(gpu->find_or_insert(du.get(), n, drows.get(), dcnt.get(), nullptr, dnum.get()));
    SOK_OK(pooled_forward(drows.get(), dim, n, dinv.get(), sg, dw.get(), n, batch, comb, dout.get(),
                          nullptr));
    SOK_OK(pooled_backward(dgo.get(), dim, dinv.get(), sg, dw.get(), n, batch, comb, n, dnum.get(),
                           dgrad.get(), nullptr));
    SOK_OK(gpu->apply_gradients(du.get(), n, dgrad.get(), p, s, nullptr, true, dnum.get()));
    ok &= sok_test::expect_near("forward", dout.download(), cout, 1e-5, 1e-5);
    ok &= sok_test::expect_near("row grads", dgrad.download(u * dim), cgrad, 1e-5, 1e-5);
  }
  ok &= expect_same_table(gpu_export(*gpu), cpu.export_rows(), 1e-5, 1e-6);
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  return sok_gpu_test::gpu_test_main(argc, argv, "test_pipeline", [] {
    for (Combiner c : {Combiner::kSum, Combiner::kMean, Combiner::kSqrtn}) {
      run(std::string("training step pipeline vs CPU int64 ") + cname(c),
          [c] { return test_pipeline<int64_t>(c); });
      run(std::string("training step pipeline vs CPU int32 ") + cname(c),
          [c] { return test_pipeline<int32_t>(c); });
    }
  });
}
