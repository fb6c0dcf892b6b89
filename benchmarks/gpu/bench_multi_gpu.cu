// Weak scaling of the model-parallel lookup (harness/gpu/model_parallel.h): a fixed batch of
// 16,384 x 64 ids per GPU, a 10M-key hash table sharded by floor_mod(key, world), one training step
// = dedup, bucketize, all-to-all keys, owner find_or_insert, all-to-all rows, pooled forward,
// pooled backward, all-to-all gradients, owner Adagrad. Times (host clock around a synchronised
// step, medians):
//   T1 = the one-GPU pipeline without communication, T1nccl = the same code path at world 1,
//   TN = world N. Weak-scaling efficiency = T1 / TN (target >= 90%).
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "harness/gpu/model_parallel.h"

namespace {

struct Times {
  double fwd_ms, step_ms;
  double remote_mb;  // bytes rank 0 sends to other ranks per step (keys, counts, rows, grads)
};

Times run(int world, bool no_comm, int64_t dim, bool powerlaw) {
  const int64_t rows = 10000000, batch = 16384, hot = 64, n = batch * hot;
  sok::TableConfig cfg;
  cfg.name = "mp";
  cfg.dim = dim;
  cfg.init.kind = sok::InitKind::kUniform;
  cfg.init.a = -0.05f;
  cfg.init.b = 0.05f;
  cfg.initial_capacity = 1000;
  sok::OptimizerParams p;
  p.kind = sok::OptimizerKind::kAdagrad;
  p.lr = 0.01f;
  const int64_t per_rank = rows / world + 1;
  mp::ModelParallel m(world, n, batch, cfg, 2 * per_rank, no_comm);
  // Every key 0..rows-1 pre-inserted on its owner, slots created.
  for (int r = 0; r < world; ++r) {
    mp::Rank& k = m.rank(r);
    CUDA_OK(cudaSetDevice(k.dev));
    std::vector<int64_t> keys;
    for (int64_t x = r; x < rows; x += world) keys.push_back(x);
    DevBuf<int64_t> dk = to_device(keys);
    SOK_OK(k.table->find_or_insert(dk.get(), keys.size(), nullptr, nullptr, k.s));
    DevBuf<float> g0(dim);
    CUDA_OK(cudaMemset(g0.get(), 0, dim * 4));
    SOK_OK(k.table->apply_gradients(dk.get(), 1, g0.get(), p, 0, k.s, true));
    CUDA_OK(cudaStreamSynchronize(k.s));
  }
  // Per rank: 3 id sets to rotate, fixed row splits, random grad_out.
  const int sets = 3;
  std::vector<std::vector<DevBuf<int64_t>>> ids(world);
  std::vector<int64_t> splits(batch + 1);
  for (int64_t b = 0; b <= batch; ++b) splits[b] = b * hot;
  std::mt19937_64 rng(123);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  const double a = 1.05, c = std::pow(static_cast<double>(rows), 1.0 - a) - 1.0;
  for (int r = 0; r < world; ++r) {
    mp::Rank& k = m.rank(r);
    CUDA_OK(cudaSetDevice(k.dev));
    k.splits.upload(splits);
    std::vector<float> g(batch * dim);
    for (auto& x : g) x = static_cast<float>(u(rng) - 0.5);
    k.grad_out.upload(g);
    m.set_batch(r, n);
    for (int s = 0; s < sets; ++s) {
      std::vector<int64_t> h(n);
      for (auto& x : h) {
        if (powerlaw) {
          x = std::min<int64_t>(
              rows - 1, static_cast<int64_t>(std::pow(c * u(rng) + 1.0, 1.0 / (1.0 - a))) - 1);
        } else {
          x = static_cast<int64_t>(rng() % rows);
        }
      }
      ids[r].push_back(to_device(h));
    }
  }
  auto load = [&](int it) {
    for (int r = 0; r < world; ++r) {
      mp::Rank& k = m.rank(r);
      CUDA_OK(cudaSetDevice(k.dev));
      CUDA_OK(cudaMemcpyAsync(k.ids.get(), ids[r][it % sets].get(), n * 8, cudaMemcpyDeviceToDevice,
                              k.s));
    }
  };
  std::vector<double> fw, st;
  int64_t step = 1;
  for (int it = 0; it < 30; ++it) {
    load(it);
    m.sync();
    auto t0 = std::chrono::steady_clock::now();
    m.forward();
    m.sync();
    auto t1 = std::chrono::steady_clock::now();
    m.backward(p, step++);
    m.sync();
    auto t2 = std::chrono::steady_clock::now();
    if (it >= 5) {
      fw.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
      st.push_back(std::chrono::duration<double, std::milli>(t2 - t0).count());
    }
  }
  double remote = 0;
  if (!no_comm) {
    const mp::Rank& k = m.rank(0);
    for (int p = 1; p < world; ++p)
      remote += k.scnt[p] * (16.0 + dim * 4.0) +
                k.rcnt[p] * dim * 4.0;  // keys+counts+grads out, rows back
  }
  return Times{median(fw), median(st), remote / 1e6};
}

}  // namespace

int main() {
  int ndev = 0;
  CUDA_OK(cudaGetDeviceCount(&ndev));
  const int world = std::min(ndev, 8);
  std::printf("bench_multi_gpu: %d GPUs, per-GPU batch 16384 x 64 ids, 10M keys, Adagrad\n", ndev);
  if (world < 2) {
    std::printf("needs at least 2 GPUs\n");
    return 1;
  }
  struct Cfg {
    int64_t dim;
    bool pl;
  };
  for (Cfg cf : {Cfg{32, false}, Cfg{128, false}, Cfg{64, true}}) {
    const char* dist = cf.pl ? "powerlaw" : "uniform";
    const Times t1 = run(1, true, cf.dim, cf.pl);
    const Times t1n = run(1, false, cf.dim, cf.pl);
    const Times tn = run(world, false, cf.dim, cf.pl);
    std::printf("MP dim=%lld dist=%s world=1 (no comm): fwd %.3f ms, step %.3f ms\n",
                (long long)cf.dim, dist, t1.fwd_ms, t1.step_ms);
    std::printf("MP dim=%lld dist=%s world=1 (NCCL path): fwd %.3f ms, step %.3f ms\n",
                (long long)cf.dim, dist, t1n.fwd_ms, t1n.step_ms);
    std::printf(
        "MP dim=%lld dist=%s world=%d: fwd %.3f ms, step %.3f ms; rank 0 sends %.1f MB per step to "
        "the "
        "other ranks (%.0f GB/s if it took the whole step-minus-T1nccl gap)\n",
        (long long)cf.dim, dist, world, tn.fwd_ms, tn.step_ms, tn.remote_mb,
        tn.remote_mb / 1e3 / std::max(1e-6, (tn.step_ms - t1n.step_ms) * 1e-3));
    const double e_step = t1.step_ms / tn.step_ms, e_fwd = t1.fwd_ms / tn.fwd_ms;
    std::printf(
        "WEAK_SCALING dim=%lld dist=%s world=%d: step efficiency %.1f%% (vs NCCL-path world 1: "
        "%.1f%%), "
        "forward efficiency %.1f%% (target >= 90%%: %s)\n",
        (long long)cf.dim, dist, world, 100 * e_step, 100 * t1n.step_ms / tn.step_ms, 100 * e_fwd,
        e_step >= 0.9 ? "MET" : "MISSED");
    std::fflush(stdout);
  }
  return 0;
}
