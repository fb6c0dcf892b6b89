// GpuEmbeddingTable::apply_gradients (SGD, Adagrad, Adam, FTRL) vs the CPU core's.
// Usage: test_optimizer [seed (0: from the clock)] [name filter]; see test_util.cuh.
#include <cstdint>
#include <string>
#include <vector>

#include "tests/gpu/test_util.cuh"

using namespace sok_gpu_test;  // NOLINT

namespace {

template <typename K>
bool test_optimizer(OptimizerKind kind, int64_t dim, bool unique_ids) {
  TableConfig cfg = make_cfg(dim, InitKind::kUniform);
  EmbeddingTable<K> cpu(cfg);
  auto gpu = make_gpu<K>(cfg);
  const std::vector<K> pool = key_pool<K>(3000);
  OptimizerParams p = test_params(kind);
  // The GPU sums a repeated id's gradients in fixed chunks, the CPU in id order: the sums round
  // apart by an ulp or so. FTRL subtracts two powf() values (CUDA's and glibc's differ by an ulp)
  // and keeps the running 'linear' slot: ~1e-6 absolute after 20 steps (1.6e-6 on a slot of
  // 0.0106, once in 5 runs). Adam divides by sqrt(v) of such sums: 2.7e-5 relative on a value of
  // 0.139, once in many runs of repeated ids. Wider bounds there.
  const double rtol = kind == OptimizerKind::kAdam && !unique_ids ? 1e-4 : 1e-5;
  const double atol = kind == OptimizerKind::kFtrl ? 1e-5 : 1e-6;
  for (int s = 1; s <= 20; ++s) {
    std::vector<K> keys = draw(pool, 4096);
    if (unique_ids) {
      std::unordered_set<K> seen;
      std::vector<K> u;
      for (K k : keys)
        if (seen.insert(k).second) u.push_back(k);
      keys = u;
    }
    const std::vector<float> g = randn(keys.size() * dim, 0.5f);
    p.step = s;
    SOK_OK(cpu.apply_gradients(keys.data(), keys.size(), g.data(), p, 100 + s));
    DevBuf<K> dk = to_device(keys);
    DevBuf<float> dg = to_device(g);
    SOK_OK(gpu->apply_gradients(dk.get(), keys.size(), dg.get(), p, 100 + s, nullptr, unique_ids));
    if (s % 5 == 0) {  // lookups in between read the trained rows
      std::vector<float> want(keys.size() * dim);
      cpu.find_or_insert(keys.data(), keys.size(), want.data());
      DevBuf<float> dout(keys.size() * dim);
      dout.poison();
      SOK_OK(gpu->find_or_insert(dk.get(), keys.size(), dout.get(), nullptr, nullptr));
      if (!sok_test::expect_near("lookup during training", dout.download(), want, rtol, atol))
        return false;
    }
  }
  return expect_same_table(gpu_export(*gpu), cpu.export_rows(), rtol, atol);
}

}  // namespace

int main(int argc, char** argv) {
  return sok_gpu_test::gpu_test_main(argc, argv, "test_optimizer", [] {
    for (OptimizerKind o : {OptimizerKind::kSGD, OptimizerKind::kAdagrad, OptimizerKind::kAdam,
                            OptimizerKind::kFtrl}) {
      for (bool u : {false, true}) {
        run(std::string("optimizer ") + oname(o) + " 20 steps int64 dim 32 " +
                (u ? "unique ids" : "repeated ids"),
            [=] { return test_optimizer<int64_t>(o, 32, u); });
        run(std::string("optimizer ") + oname(o) + " 20 steps int32 dim 5 " +
                (u ? "unique ids" : "repeated ids"),
            [=] { return test_optimizer<int32_t>(o, 5, u); });
      }
      // Rows of at most 32 floats with their slots: the whole-row update (apply_row_packed).
      for (int64_t dim : {4, 8, 16})
        run(std::string("optimizer ") + oname(o) + " 20 steps int64 dim " + std::to_string(dim) +
                " repeated ids",
            [=] { return test_optimizer<int64_t>(o, dim, false); });
    }
  });
}
