// Helpers shared by the single-GPU tests of the CUDA core (test_*.cu here, one program per part
// of core/cuda/gpu_api.h): random keys and ids, table configs, comparisons of GPU tables with the
// CPU core's, and the programs' main. Each program checks the CUDA core against the CPU core
// (embedding_table.cc, lookup.cc) on fresh random inputs every run (the seed is printed; pass one
// as argv[1] to replay, and a name filter as argv[2]). Outputs are poisoned (NaN) before each GPU
// call; every CUDA call is checked. Each program ends with "N passed, M failed".
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <unordered_set>
#include <vector>

#include "addons/sparse_operation_kit/core/cuda/gpu_api.h"
#include "addons/sparse_operation_kit/core/embedding_table.h"
#include "addons/sparse_operation_kit/core/initializer.h"
#include "addons/sparse_operation_kit/core/lookup.h"
#include "harness/check.h"
#include "harness/gpu/cuda_util.h"

namespace sok_gpu_test {

using namespace sok;       // NOLINT
using namespace sok::gpu;  // NOLINT

inline std::mt19937_64 g_rng;

// One case of the shared harness (harness/check.h); every CUDA error it left is fatal.
template <typename Body>
void run(const std::string& name, Body&& body) {
  sok_test::run_case(name, [&] {
    const bool ok = body();
    CUDA_OK(cudaDeviceSynchronize());
    CUDA_OK(cudaGetLastError());
    return ok;
  });
}

template <typename K>
std::vector<K> key_pool(size_t n) {
  std::unordered_set<K> seen;
  std::vector<K> keys;
  const K extremes[] = {
      std::numeric_limits<K>::min(),        std::numeric_limits<K>::max(),        K(-1), K(0), K(1),
      K(std::numeric_limits<K>::min() + 1), K(std::numeric_limits<K>::max() - 1), K(-7)};
  for (K k : extremes)
    if (seen.insert(k).second) keys.push_back(k);
  // A third of the keys from a small range around 0 (negatives included), wide enough for n.
  const int64_t half =
      static_cast<int64_t>(std::min<uint64_t>(4 * n + 1000, std::numeric_limits<K>::max() / 2));
  std::uniform_int_distribution<int64_t> small(-half, half);
  while (keys.size() < n) {
    K k = (keys.size() % 3 == 0) ? static_cast<K>(small(g_rng)) : static_cast<K>(g_rng());
    if (seen.insert(k).second) keys.push_back(k);
  }
  return keys;
}

template <typename K>
std::vector<K> draw(const std::vector<K>& pool, size_t n) {
  std::uniform_int_distribution<size_t> d(0, pool.size() - 1);
  std::vector<K> v(n);
  for (auto& x : v) x = pool[d(g_rng)];
  return v;
}

inline std::vector<float> randn(size_t n, float scale) {
  std::normal_distribution<float> d(0.f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g_rng);
  return v;
}

inline TableConfig make_cfg(int64_t dim, InitKind kind, int64_t filter = 0, int64_t dvd = 0,
                            int64_t cap = 1024) {
  TableConfig c;
  c.name = "t";
  c.dim = dim;
  c.init.kind = kind;
  c.init.seed = g_rng();
  c.init.default_value_dim = dvd;
  switch (kind) {
    case InitKind::kConstant: c.init.a = 0.125f; break;
    case InitKind::kUniform:
      c.init.a = -0.05f;
      c.init.b = 0.05f;
      break;
    case InitKind::kNormal:
    case InitKind::kTruncatedNormal:
      c.init.a = 0.01f;
      c.init.b = 0.05f;
      break;
    case InitKind::kMatrix:
      c.init.default_value_dim = dvd > 0 ? dvd : 97;
      c.init_matrix = randn(c.init.default_value_dim * dim, 0.1f);
      break;
  }
  c.filter_freq = filter;
  c.default_value_no_permission = -3.5f;
  c.initial_capacity = cap;
  return c;
}

template <typename K>
std::unique_ptr<GpuEmbeddingTable<K>> make_gpu(const TableConfig& c, double max_load = 0.75,
                                               int64_t transfer_chunk_bytes = 0) {
  std::unique_ptr<GpuEmbeddingTable<K>> t;
  GpuTableOptions o;
  o.max_load_factor = max_load;
  if (transfer_chunk_bytes > 0) o.transfer_chunk_bytes = transfer_chunk_bytes;
  SOK_OK(GpuEmbeddingTable<K>::Create(c, o, &t));
  return t;
}

template <typename K>
struct SortedSnap {
  std::vector<K> keys;
  std::vector<float> values, slots;
  std::vector<int64_t> freqs, versions;
};

template <typename K>
SortedSnap<K> sorted(const TableSnapshot<K>& s) {
  const size_t n = s.keys.size();
  std::vector<size_t> idx(n);
  std::iota(idx.begin(), idx.end(), 0);
  std::sort(idx.begin(), idx.end(), [&](size_t a, size_t b) { return s.keys[a] < s.keys[b]; });
  SortedSnap<K> o;
  const int64_t d = s.dim, sd = s.num_slots * s.dim;
  for (size_t i : idx) {
    o.keys.push_back(s.keys[i]);
    o.values.insert(o.values.end(), s.values.begin() + i * d, s.values.begin() + (i + 1) * d);
    o.slots.insert(o.slots.end(), s.slots.begin() + i * sd, s.slots.begin() + (i + 1) * sd);
    o.freqs.push_back(s.freqs[i]);
    o.versions.push_back(s.versions[i]);
  }
  return o;
}

template <typename K>
bool expect_same_table(const TableSnapshot<K>& got, const TableSnapshot<K>& want, double rtol,
                       double atol, bool freqs = true, bool versions = true) {
  bool ok = true;
  if (got.dim != want.dim || got.num_slots != want.num_slots || got.slot_kind != want.slot_kind)
    ok = FAIL("layout differs: dim %lld/%lld slots %d/%d kind %d/%d", (long long)got.dim,
              (long long)want.dim, got.num_slots, want.num_slots, got.slot_kind, want.slot_kind);
  const SortedSnap<K> a = sorted(got), b = sorted(want);
  ok &= sok_test::expect_eq("keys", a.keys, b.keys);
  if (!ok) return false;
  ok &= sok_test::expect_near("values", a.values, b.values, rtol, atol);
  ok &= sok_test::expect_near("slots", a.slots, b.slots, rtol, atol);
  if (freqs) ok &= sok_test::expect_eq("freqs", a.freqs, b.freqs);
  if (versions) ok &= sok_test::expect_eq("versions", a.versions, b.versions);
  return ok;
}

template <typename K>
TableSnapshot<K> gpu_export(GpuEmbeddingTable<K>& t) {
  TableSnapshot<K> s;
  SOK_OK(t.export_rows(&s, nullptr));
  return s;
}

// The optimizer settings the table tests train with (per kind; Adagrad: lr 0.05, accumulator 0.1).
inline OptimizerParams test_params(OptimizerKind kind) {
  OptimizerParams p;
  p.kind = kind;
  p.lr = kind == OptimizerKind::kSGD ? 0.1f : 0.05f;
  p.epsilon = kind == OptimizerKind::kAdam ? 1e-7f : 0.f;
  p.initial_accumulator = 0.1f;
  p.l1 = kind == OptimizerKind::kFtrl ? 0.001f : 0.f;
  p.l2 = kind == OptimizerKind::kFtrl ? 0.01f : 0.f;
  return p;
}

inline const char* kname(InitKind k) {
  switch (k) {
    case InitKind::kConstant: return "constant";
    case InitKind::kUniform: return "uniform";
    case InitKind::kNormal: return "normal";
    case InitKind::kTruncatedNormal: return "truncnormal";
    case InitKind::kMatrix: return "matrix";
  }
  return "?";
}
inline const char* oname(OptimizerKind k) {
  switch (k) {
    case OptimizerKind::kSGD: return "sgd";
    case OptimizerKind::kAdagrad: return "adagrad";
    case OptimizerKind::kAdam: return "adam";
    case OptimizerKind::kFtrl: return "ftrl";
  }
  return "?";
}
inline const char* cname(Combiner c) {
  return c == Combiner::kSum ? "sum" : c == Combiner::kMean ? "mean" : "sqrtn";
}
template <typename K>
const char* tname() {
  return sizeof(K) == 4 ? "int32" : "int64";
}

struct LookupCase {
  int64_t batch = 0, n = 0, num_rows = 0, dim = 0;
  std::vector<int64_t> seg, splits;
  std::vector<int32_t> inverse;
  std::vector<float> weights, rows;
};

inline LookupCase make_case(int64_t batch, int64_t num_rows, int64_t dim, int max_per_sample) {
  LookupCase c;
  c.batch = batch;
  c.num_rows = num_rows;
  c.dim = dim;
  std::uniform_int_distribution<int> per(0, max_per_sample);
  std::uniform_int_distribution<int32_t> row(0, static_cast<int32_t>(num_rows - 1));
  std::uniform_real_distribution<float> w(0.f, 1.f);
  c.splits.push_back(0);
  for (int64_t b = 0; b < batch; ++b) {
    const int k = (b % 17 == 3) ? 0 : per(g_rng);
    for (int j = 0; j < k; ++j) {
      c.seg.push_back(b);
      c.inverse.push_back(row(g_rng));
      // sample 5 has only zero weights (mean / sqrtn must give zeros), some ids weigh 0.
      c.weights.push_back(b == 5 ? 0.f : (j % 7 == 6 ? 0.f : w(g_rng)));
    }
    c.splits.push_back(static_cast<int64_t>(c.seg.size()));
  }
  c.n = static_cast<int64_t>(c.seg.size());
  c.rows = randn(num_rows * dim, 1.f);
  return c;
}

// The main of every test program: seeds g_rng, prints the program, seed and device, runs the
// cases `cases` registers with run() and prints the summary (the exit status).
inline int gpu_test_main(int argc, char** argv, const char* program, void (*cases)()) {
  // Usage: <program> [seed (0: from the clock)] [name filter]
  uint64_t seed = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 0;
  if (seed == 0)
    seed = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  if (argc > 2) sok_test::state().filter = argv[2];
  g_rng.seed(seed);
  int dev = 0;
  cudaDeviceProp prop;
  CUDA_OK(cudaGetDevice(&dev));
  CUDA_OK(cudaGetDeviceProperties(&prop, dev));
  std::printf("%s: seed %llu, device %s (sm_%d%d, %d SMs)\n", program,
              static_cast<unsigned long long>(seed), prop.name, prop.major, prop.minor,
              prop.multiProcessorCount);
  cases();
  return sok_test::summary();
}

}  // namespace sok_gpu_test
