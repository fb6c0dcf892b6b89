// Kernel time of the fused multi-table pooled combine (pooled_forward_multi and
// pooled_backward_multi_unordered) on the shape of the 26-field profile: 26 tables, batch 8192,
// 1-8 ids per sample, dim 16. Prints the mean of 50 timed calls (cudaEvent) after 5 warm-up
// calls, for sorted segment ids, shuffled ones with their sample order, and dense tables
// (4 ids per sample; reported as unsupported by a core without them); then, at the TF step's
// batch of 65,536, rows drawn uniformly and with Zipf 1.15 (hot rows: the backward's atomics
// meet on them).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "addons/sparse_operation_kit/core/cuda/gpu_api.h"
#include "harness/gpu/cuda_util.h"

using namespace sok;       // NOLINT
using namespace sok::gpu;  // NOLINT

namespace {

constexpr int kTables = 26;
constexpr int64_t kDim = 16, kRows = 20000;

struct BenchTable {
  DevBuf<float> rows, out, gout, grad, w;
  DevBuf<int32_t> inv, order;
  DevBuf<int64_t> seg;
};

enum class Layout { kSorted, kShuffled, kDense };

// Times fn over 50 calls on the default stream; -1 when it fails.
template <typename Fn>
float time_ms(Fn&& fn) {
  for (int i = 0; i < 5; ++i)
    if (!fn().ok()) return -1.f;
  cudaEvent_t a, b;
  CUDA_OK(cudaEventCreate(&a));
  CUDA_OK(cudaEventCreate(&b));
  CUDA_OK(cudaEventRecord(a));
  constexpr int kCalls = 50;
  for (int i = 0; i < kCalls; ++i) SOK_OK(fn());
  CUDA_OK(cudaEventRecord(b));
  CUDA_OK(cudaEventSynchronize(b));
  float ms = 0.f;
  CUDA_OK(cudaEventElapsedTime(&ms, a, b));
  CUDA_OK(cudaEventDestroy(a));
  CUDA_OK(cudaEventDestroy(b));
  return ms / kCalls;
}

// Row draws: uniform, or Zipf with exponent `zipf` over the rows (row 0 the hottest).
struct RowDraw {
  std::vector<double> cdf;
  RowDraw(int64_t rows, double zipf) {
    if (zipf <= 0) return;
    cdf.resize(rows);
    double sum = 0;
    for (int64_t r = 0; r < rows; ++r) cdf[r] = sum += std::pow(static_cast<double>(r + 1), -zipf);
    for (double& c : cdf) c /= sum;
  }
  int32_t operator()(std::mt19937_64* rng) const {
    if (cdf.empty()) return std::uniform_int_distribution<int32_t>(0, kRows - 1)(*rng);
    const double u = std::uniform_real_distribution<double>(0, 1)(*rng);
    return static_cast<int32_t>(std::lower_bound(cdf.begin(), cdf.end(), u) - cdf.begin());
  }
};

void bench(Layout layout, bool weighted, Combiner comb, std::mt19937_64* rng, int64_t batch = 8192,
           double zipf = 0) {
  std::vector<BenchTable> t(kTables);
  std::vector<PooledTable> fwd(kTables), bwd(kTables);
  int64_t total = 0;
  std::uniform_int_distribution<int> per(1, 8);
  const RowDraw row(kRows, zipf);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (int k = 0; k < kTables; ++k) {
    std::vector<int64_t> seg;
    for (int64_t b = 0; b < batch; ++b) {
      const int c = layout == Layout::kDense ? 4 : per(*rng);
      for (int j = 0; j < c; ++j) seg.push_back(b);
    }
    const int64_t n = static_cast<int64_t>(seg.size());
    total += n;
    std::vector<int32_t> inv(n), order;
    for (auto& x : inv) x = row(rng);
    if (layout == Layout::kShuffled) {
      std::shuffle(seg.begin(), seg.end(), *rng);
      order.resize(n);
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(),
                       [&](int32_t x, int32_t y) { return seg[x] < seg[y]; });
    }
    std::vector<float> rows(kRows * kDim), gout(batch * kDim), w(n);
    for (auto& x : rows) x = nd(*rng);
    for (auto& x : gout) x = nd(*rng);
    for (auto& x : w) x = std::abs(nd(*rng));
    BenchTable& b = t[k];
    b.rows.upload(rows);
    b.gout.upload(gout);
    b.w.upload(w);
    b.inv.upload(inv);
    b.seg.upload(seg);
    b.order.upload(order);
    b.out.resize(batch * kDim);
    b.grad.resize(kRows * kDim);
    PooledTable d;
    d.inverse = b.inv.get();
    d.segment_ids = layout == Layout::kDense ? nullptr : b.seg.get();
    d.order = layout == Layout::kShuffled ? b.order.get() : nullptr;
    d.weights = weighted ? b.w.get() : nullptr;
    d.n = n;
    d.batch = batch;
    d.num_rows = kRows;
    d.dim = kDim;
    d.combiner = comb;
    fwd[k] = bwd[k] = d;
    fwd[k].src = b.rows.get();
    fwd[k].out = b.out.get();
    bwd[k].src = b.gout.get();
    bwd[k].out = b.grad.get();
  }
  const float f = time_ms([&] { return pooled_forward_multi(fwd.data(), kTables, nullptr); });
  const float g =
      time_ms([&] { return pooled_backward_multi_unordered(bwd.data(), kTables, nullptr); });
  const char* names[] = {"sorted", "shuffled+order", "dense k=4"};
  const char* cn[] = {"sum", "mean", "sqrtn"};
  auto ms = [](float x) { return x < 0 ? std::string("unsupported") : std::to_string(x) + " ms"; };
  std::printf(
      "bench_pooled_multi %-15s %-5s %-10s batch %lld rows %s %lld ids: forward %s, "
      "backward %s\n",
      names[static_cast<int>(layout)], cn[static_cast<int>(comb)],
      weighted ? "weighted" : "unweighted", static_cast<long long>(batch),
      zipf > 0 ? "zipf1.15" : "uniform", static_cast<long long>(total), ms(f).c_str(),
      ms(g).c_str());
}

}  // namespace

int main() {
  std::mt19937_64 rng(7);
  std::printf("bench_pooled_multi: %d tables, dim %lld, %lld rows\n", kTables,
              static_cast<long long>(kDim), static_cast<long long>(kRows));
  bench(Layout::kSorted, false, Combiner::kSum, &rng);
  bench(Layout::kSorted, true, Combiner::kMean, &rng);
  bench(Layout::kShuffled, false, Combiner::kSum, &rng);
  bench(Layout::kDense, false, Combiner::kSum, &rng);
  bench(Layout::kSorted, false, Combiner::kSum, &rng, 65536, 0);
  bench(Layout::kSorted, false, Combiner::kSum, &rng, 65536, 1.15);
  return 0;
}
