// Model-parallel lookup on every visible GPU (2 or more; at most 8) against the one-GPU pipeline
// on the concatenated batch: same forward values every step, and the same table (keys, values,
// Adagrad slots, frequencies, versions) after the training steps. Ends with "N passed, M failed".
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <unordered_set>
#include <vector>

#include "addons/sparse_operation_kit/core/common.h"
#include "harness/check.h"
#include "harness/gpu/model_parallel.h"

namespace {

// The checks below run as one sequence: each result is reported as a case of the shared harness.
void report(bool ok, const std::string& name) {
  sok_test::run_case(name, [ok] { return ok; });
}

}  // namespace

int main(int argc, char** argv) {
  int ndev = 0;
  CUDA_OK(cudaGetDeviceCount(&ndev));
  const uint64_t seed =
      argc > 1 ? std::strtoull(argv[1], nullptr, 10)
               : static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  std::mt19937_64 rng(seed);
  const int world = std::min(ndev, 8);
  std::printf("test_multi_gpu: seed %llu, %d GPUs visible, world %d\n", (unsigned long long)seed,
              ndev, world);
  if (world < 2) {
    std::printf("needs at least 2 GPUs\n0 passed, 1 failed\n");
    return 1;
  }
  for (int a = 0; a < world; ++a)
    for (int b = 0; b < world; ++b)
      if (a != b) {
        int can = 0;
        CUDA_OK(cudaDeviceCanAccessPeer(&can, a, b));
        if (a == 0 && b == 1) std::printf("peer access 0->1: %d\n", can);
      }

  sok::TableConfig cfg;
  cfg.name = "mp";
  cfg.dim = 16;
  cfg.init.kind = sok::InitKind::kUniform;
  cfg.init.a = -0.05f;
  cfg.init.b = 0.05f;
  cfg.init.seed = rng();
  cfg.initial_capacity = 1000;  // grows during the test
  sok::OptimizerParams p;
  p.kind = sok::OptimizerKind::kAdagrad;
  p.lr = 0.05f;
  p.initial_accumulator = 0.1f;

  const int64_t batch = 2048, max_per = 24, n_max = batch * max_per, dim = cfg.dim;
  mp::ModelParallel mpar(world, n_max, batch, cfg, 0);
  mp::ModelParallel ref(1, n_max * world, batch * world, cfg, 0, /*no_comm_single=*/true);

  // Key pool: extremes, negatives, and a hot set shared by the ranks.
  std::vector<int64_t> pool = {std::numeric_limits<int64_t>::min(),
                               std::numeric_limits<int64_t>::max(),
                               -1,
                               0,
                               1,
                               -2,
                               -3,
                               5};
  std::unordered_set<int64_t> seen(pool.begin(), pool.end());
  while (pool.size() < 200000) {
    int64_t k = pool.size() % 2 ? static_cast<int64_t>(rng())
                                : static_cast<int64_t>(rng() % 2000000) - 1000000;
    if (seen.insert(k).second) pool.push_back(k);
  }
  std::normal_distribution<float> nd(0.f, 1.f);
  bool all_fwd = true;
  for (int step = 1; step <= 6; ++step) {
    std::vector<int64_t> all_ids, all_splits = {0};
    std::vector<float> all_gout;
    for (int r = 0; r < world; ++r) {
      std::vector<int64_t> ids, splits = {0};
      for (int64_t b = 0; b < batch; ++b) {
        const int64_t k = static_cast<int64_t>(rng() % (max_per + 1));
        for (int64_t j = 0; j < k; ++j)
          ids.push_back(rng() % 2 ? pool[rng() % 500] : pool[rng() % pool.size()]);
        splits.push_back(static_cast<int64_t>(ids.size()));
      }
      std::vector<float> gout(batch * dim);
      for (auto& x : gout) x = nd(rng);
      mp::Rank& k = mpar.rank(r);
      CUDA_OK(cudaSetDevice(k.dev));
      k.ids.upload(ids);
      k.splits.upload(splits);
      k.grad_out.upload(gout);
      k.out.poison();
      mpar.set_batch(r, static_cast<int64_t>(ids.size()));
      const int64_t base = all_ids.size();
      all_ids.insert(all_ids.end(), ids.begin(), ids.end());
      for (size_t b = 1; b < splits.size(); ++b) all_splits.push_back(base + splits[b]);
      all_gout.insert(all_gout.end(), gout.begin(), gout.end());
    }
    CUDA_OK(cudaSetDevice(0));
    mp::Rank& rk = ref.rank(0);
    rk.ids.upload(all_ids);
    rk.splits.upload(all_splits);
    rk.grad_out.upload(all_gout);
    rk.out.poison();
    ref.set_batch(0, static_cast<int64_t>(all_ids.size()));
    mpar.forward();
    ref.forward();
    mpar.sync();
    ref.sync();
    const std::vector<float> want = rk.out.download(batch * world * dim);
    bool ok = true;
    for (int r = 0; r < world; ++r) {
      CUDA_OK(cudaSetDevice(r));
      const std::vector<float> got = mpar.rank(r).out.download(batch * dim);
      std::vector<float> w(want.begin() + r * batch * dim, want.begin() + (r + 1) * batch * dim);
      // A hot key's gradient sums ~100 N(0, 1) terms in another order than on one GPU, and
      // Adagrad carries that rounding into the row (up to ~1e-7 per step); a pooled value
      // sums up to 24 such rows, so a value near zero gets an absolute tolerance of 1e-5.
      ok &= sok_test::expect_near("forward", got, w, 1e-5, 1e-5);
    }
    CUDA_OK(cudaSetDevice(0));
    all_fwd &= ok;
    report(ok, "step " + std::to_string(step) + ": " + std::to_string(world) +
                   "-GPU forward == 1-GPU forward (" + std::to_string(all_ids.size()) + " ids)");
    mpar.backward(p, step);
    ref.backward(p, step);
    mpar.sync();
    ref.sync();
  }
  // Tables: the union of the shards equals the reference table; each key lives on its owner.
  sok::TableSnapshot<int64_t> want;
  SOK_OK(ref.rank(0).table->export_rows(&want, ref.rank(0).s));
  std::vector<std::pair<int64_t, size_t>> wi;
  for (size_t i = 0; i < want.keys.size(); ++i) wi.push_back({want.keys[i], i});
  std::sort(wi.begin(), wi.end());
  std::vector<std::pair<int64_t, std::pair<int, size_t>>> gi;
  std::vector<sok::TableSnapshot<int64_t>> shards(world);
  bool owner_ok = true;
  for (int r = 0; r < world; ++r) {
    CUDA_OK(cudaSetDevice(r));
    SOK_OK(mpar.rank(r).table->export_rows(&shards[r], mpar.rank(r).s));
    for (size_t i = 0; i < shards[r].keys.size(); ++i) {
      gi.push_back({shards[r].keys[i], {r, i}});
      if (sok::floor_mod(shards[r].keys[i], world) != r) owner_ok = false;
    }
    std::printf("    rank %d holds %zu keys\n", r, shards[r].keys.size());
  }
  CUDA_OK(cudaSetDevice(0));
  std::sort(gi.begin(), gi.end());
  report(owner_ok, "every key lives on rank floor_mod(key, world)");
  bool tab_ok = gi.size() == wi.size();
  if (!tab_ok) std::printf("    %zu keys vs %zu in the reference\n", gi.size(), wi.size());
  std::vector<float> gv, wv, gs, ws;
  size_t meta_bad = 0;
  for (size_t j = 0; tab_ok && j < gi.size(); ++j) {
    const int r = gi[j].second.first;
    const size_t i = gi[j].second.second, w = wi[j].second;
    if (gi[j].first != wi[j].first || shards[r].freqs[i] != want.freqs[w] ||
        shards[r].versions[i] != want.versions[w]) {
      if (meta_bad++ < 3)
        std::printf("    key %lld/%lld freq %lld/%lld version %lld/%lld\n", (long long)gi[j].first,
                    (long long)wi[j].first, (long long)shards[r].freqs[i], (long long)want.freqs[w],
                    (long long)shards[r].versions[i], (long long)want.versions[w]);
    }
    gv.insert(gv.end(), shards[r].values.begin() + i * dim,
              shards[r].values.begin() + (i + 1) * dim);
    wv.insert(wv.end(), want.values.begin() + w * dim, want.values.begin() + (w + 1) * dim);
    gs.insert(gs.end(), shards[r].slots.begin() + i * dim, shards[r].slots.begin() + (i + 1) * dim);
    ws.insert(ws.end(), want.slots.begin() + w * dim, want.slots.begin() + (w + 1) * dim);
  }
  tab_ok = tab_ok && meta_bad == 0;
  tab_ok = tab_ok && sok_test::expect_near("values", gv, wv, 1e-5, 1e-6) &&
           sok_test::expect_near("adagrad slots", gs, ws, 1e-5, 1e-6);
  report(tab_ok, "after 6 Adagrad steps the sharded table == the 1-GPU table (" +
                     std::to_string(wi.size()) + " keys)");
  return sok_test::summary();
}
