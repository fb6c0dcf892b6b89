// HBM_DRAM tiered tables vs all-HBM vs host-resident rows, framework-free, on one GPU: the shape
// of the TF embedding benchmark (26 tables of vocab 200,000, dim 16, Adagrad, per-GPU batch
// 65,536 with 2 ids per field on average, so about 96K distinct uniform ids per table and step;
// HBM cache 10% of the vocabulary). One step = find_or_insert of every table, then
// apply_gradients of the step's distinct keys of every table, each one fused call over the 26
// tables, as lookup_sparse's ops make them (GpuEmbeddingTable's and GpuTieredTable's _many calls).
// Impls:
//   hbm           GpuEmbeddingTable, every row in HBM (the target)
//   host_only     GpuTieredTable::CreateHostOnly: every row in pinned host memory, no cache
//   hbm_dram_lfu  GpuTieredTable (HBM_DRAM), LFU; hbm_dram_lru the same with LRU
//   hbm_dram_ssd_lfu  HBM_DRAM_SSDHASH, LFU: the same HBM cache over a DRAM budget of
//                 TIER_DRAM_FRACTION (0.3) of the vocabulary, the rest in files under
//                 TIER_SSD_PATH (/tmp); only when TIER_IMPLS names it (seconds a step)
// for uniform ids and power-law ids (Zipf 1.15 over the vocabulary). Also the pinned
// host<->device copy bandwidth and, for the tiered impls, the PCIe time of the bytes the rows
// served from host memory must cross (find reads the value, the update reads and writes value
// and slot), which bounds them from below. Each line parseable as key=value:
//   COPY h2d_gbs=.. d2h_gbs=..
//   TIER impl=.. dist=.. tables=.. ms=.. ratio_vs_hbm=.. find_ms=.. apply_ms=.. issue_ms=..
//        [speedup_vs_host_only=.. hbm_share=..
//        host_keys_per_step=.. pcie_ms=.. ratio_vs_pcie=.. promoted_per_step=..
//        demoted_per_step=..] [ssd_up_per_step=.. ssd_down_per_step=.. ssd_host_ms=..
//        ssd_file_ms=..]
// Usage: tier_bench [tables=26] [steps=8] [vocab=200000] [ids_per_sample=2]
//   TIER_IMPLS=hbm,hbm_dram_lfu (a subset of the impls; the ratios need hbm, and host_only for
//   speedup_vs_host_only), TIER_DISTS=zipf1.15 (uniform, zipf1.15): fewer runs, e.g. under ncu.
// Build and run (a GPU machine, from the repo root; sized to run in under 90 s on an H100):
// clang-format off
//   cmake -G Ninja -S benchmarks/gpu -B /tmp/tb -DCMAKE_BUILD_TYPE=Release && ninja -C /tmp/tb tier_bench && /tmp/tb/tier_bench
// clang-format on
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "addons/sparse_operation_kit/core/cuda/gpu_api.h"
#include "addons/sparse_operation_kit/core/cuda/gpu_tiered_table.h"
#include "addons/sparse_operation_kit/core/tier_policy.h"
#include "harness/gpu/cuda_util.h"

using namespace sok;       // NOLINT
using namespace sok::gpu;  // NOLINT

namespace {

using Key = int64_t;
constexpr int64_t kDim = 16;
constexpr int64_t kBatch = 65536;
constexpr int kBatches = 6;  // distinct batches, cycled (warm-up then timed steps)

struct Shape {
  int tables = 26;
  int steps = 8;
  int64_t vocab = 200000;
  double ids_per_sample = 2;
};

// One batch of one table: its distinct keys on the device.
struct Batch {
  DevBuf<Key> keys;
  int64_t n = 0;
};

// Keys drawn from [0, vocab): uniform, or Zipf(s) by rank through the inverse CDF.
class KeyDraw {
 public:
  KeyDraw(int64_t vocab, double zipf_s) : vocab_(vocab) {
    if (zipf_s <= 0) return;
    cdf_.resize(vocab);
    double sum = 0;
    for (int64_t r = 0; r < vocab; ++r)
      cdf_[r] = sum += std::pow(static_cast<double>(r + 1), -zipf_s);
    for (double& c : cdf_) c /= sum;
  }
  Key operator()(std::mt19937_64& rng) const {
    if (cdf_.empty()) return static_cast<Key>(rng() % static_cast<uint64_t>(vocab_));
    const double u = std::uniform_real_distribution<double>(0.0, 1.0)(rng);
    return static_cast<Key>(std::lower_bound(cdf_.begin(), cdf_.end(), u) - cdf_.begin());
  }

 private:
  int64_t vocab_;
  std::vector<double> cdf_;
};

// batches[b][t]: the distinct keys of table t in batch b (ranks spread over the key space, so
// the hot keys do not sit in neighbouring buckets).
std::vector<std::vector<Batch>> make_batches(const Shape& sh, double zipf_s, int64_t* max_n) {
  const KeyDraw draw(sh.vocab, zipf_s);
  const int64_t ids = static_cast<int64_t>(kBatch * sh.ids_per_sample);
  std::vector<std::vector<Batch>> out(kBatches);
  std::mt19937_64 rng(1234);
  *max_n = 0;
  for (int b = 0; b < kBatches; ++b) {
    out[b].resize(sh.tables);
    for (int t = 0; t < sh.tables; ++t) {
      std::vector<Key> k(ids);
      for (Key& x : k) x = draw(rng) * 2654435761LL + t;
      std::sort(k.begin(), k.end());
      k.erase(std::unique(k.begin(), k.end()), k.end());
      std::shuffle(k.begin(), k.end(), rng);
      out[b][t].keys.upload(k);
      out[b][t].n = static_cast<int64_t>(k.size());
      *max_n = std::max(*max_n, out[b][t].n);
    }
  }
  return out;
}

enum class Impl { kHbm, kHostOnly, kLfu, kLru, kSsd };
const char* impl_name(Impl i) {
  switch (i) {
    case Impl::kHbm: return "hbm";
    case Impl::kHostOnly: return "host_only";
    case Impl::kLfu: return "hbm_dram_lfu";
    case Impl::kLru: return "hbm_dram_lru";
    case Impl::kSsd: return "hbm_dram_ssd_lfu";
  }
  return "?";
}

TableConfig table_cfg(const Shape& sh, Impl impl, int t) {
  TableConfig c;
  c.name = "t" + std::to_string(t);
  c.dim = kDim;
  c.init.kind = InitKind::kUniform;
  c.init.a = -0.05f;
  c.init.b = 0.05f;
  c.init.seed = 7 + t;
  c.initial_capacity = sh.vocab;  // no growth while timing
  if (impl == Impl::kHbm) return c;
  c.storage = StorageKind::kHbmDram;
  c.cache_strategy = impl == Impl::kLru ? CacheStrategy::kLRU : CacheStrategy::kLFU;
  c.hbm_bytes = sh.vocab / 10 * tier_row_bytes(kDim, 1);  // 10% of the rows, Adagrad's layout
  if (impl == Impl::kSsd) {
    const char* f = std::getenv("TIER_DRAM_FRACTION");
    const char* path = std::getenv("TIER_SSD_PATH");
    c.storage = StorageKind::kHbmDramSsdHash;
    c.dram_bytes =
        static_cast<int64_t>(sh.vocab * (f ? std::atof(f) : 0.3)) * tier_row_bytes(kDim, 1);
    c.storage_path = path ? path : "/tmp";
  }
  return c;
}

struct Tables {
  std::vector<std::unique_ptr<Table<Key>>> all;
  std::vector<GpuEmbeddingTable<Key>*> plain;  // hbm: the same tables, for the fused calls
  std::vector<GpuTieredTable<Key>*> tiered;    // the others: likewise, and their stats
};

Tables make_tables(const Shape& sh, Impl impl) {
  Tables ts;
  for (int t = 0; t < sh.tables; ++t) {
    const TableConfig c = table_cfg(sh, impl, t);
    if (impl == Impl::kHbm) {
      std::unique_ptr<GpuEmbeddingTable<Key>> g;
      SOK_OK(GpuEmbeddingTable<Key>::Create(c, GpuTableOptions(), &g));
      ts.plain.push_back(g.get());
      ts.all.emplace_back(new GpuTable<Key>(std::move(g)));
      continue;
    }
    std::unique_ptr<GpuTieredTable<Key>> g;
    SOK_OK(impl == Impl::kHostOnly ? GpuTieredTable<Key>::CreateHostOnly(c, GpuTableOptions(), &g)
                                   : GpuTieredTable<Key>::Create(c, GpuTableOptions(), &g));
    ts.tiered.push_back(g.get());
    ts.all.push_back(std::move(g));
  }
  return ts;
}

// The tiered tables' stats summed.
GpuTieredTable<Key>::Stats total_stats(const Tables& ts) {
  GpuTieredTable<Key>::Stats sum;
  for (const auto* t : ts.tiered) {
    const auto s = t->stats();
    sum.hbm_keys += s.hbm_keys;
    sum.host_keys += s.host_keys;
    sum.promoted_rows += s.promoted_rows;
    sum.demoted_rows += s.demoted_rows;
    sum.ssd_promoted_rows += s.ssd_promoted_rows;
    sum.ssd_demoted_rows += s.ssd_demoted_rows;
    sum.ssd_host_us += s.ssd_host_us;
    sum.ssd_file_us += s.ssd_file_us;
  }
  return sum;
}

struct StepBuffers {
  DevBuf<float> out, grads;
  cudaStream_t stream = nullptr;
};

// One fused find_or_insert over the tables, then one fused apply_gradients: Table is
// GpuEmbeddingTable<Key> or GpuTieredTable<Key>, Call its call struct. `mid`, if given, is
// recorded between the lookups and the updates (with their placement).
template <typename Table, typename Call>
void fused_step(const std::vector<Table*>& tables, const std::vector<Batch>& batch,
                const OptimizerParams& p, StepBuffers* b, cudaEvent_t mid) {
  // Every table writes the same output buffer: the step's cost, not its values, is measured.
  std::vector<Call> calls(tables.size());
  for (size_t t = 0; t < calls.size(); ++t) {
    calls[t].table = tables[t];
    calls[t].keys = batch[t].keys.get();
    calls[t].n = batch[t].n;
    calls[t].out = b->out.get();
  }
  SOK_OK(Table::find_or_insert_many(calls, b->stream));
  if (mid != nullptr) CUDA_OK(cudaEventRecord(mid, b->stream));
  for (Call& c : calls) c.grads = b->grads.get();
  SOK_OK(Table::apply_gradients_many(calls, p, p.step, b->stream, true, true));
}

void run_step(const Tables& ts, const std::vector<Batch>& batch, int64_t step, StepBuffers* b,
              cudaEvent_t mid = nullptr) {
  OptimizerParams p;
  p.kind = OptimizerKind::kAdagrad;
  p.lr = 0.05f;
  p.initial_accumulator = 0.1f;
  p.step = step;
  if (!ts.plain.empty())
    fused_step<GpuEmbeddingTable<Key>, GpuEmbeddingTable<Key>::Keys>(ts.plain, batch, p, b, mid);
  else fused_step<GpuTieredTable<Key>, GpuTieredTable<Key>::Call>(ts.tiered, batch, p, b, mid);
}

struct Result {
  double ms = 0;
  // Medians: the lookups' and the updates' GPU time, and the host's time to issue a step (above
  // the GPU time when launches or host work bound the step).
  double find_ms = 0, apply_ms = 0, issue_ms = 0;
  double hbm_share = 1, host_keys = 0, promoted = 0, demoted = 0;     // per step
  double ssd_up = 0, ssd_down = 0, ssd_host_ms = 0, ssd_file_ms = 0;  // per step
};

// Warm-up (the cache fills and settles) then the timed steps; the median step time.
Result time_impl(const Shape& sh, Impl impl, const std::vector<std::vector<Batch>>& batches,
                 StepBuffers* b) {
  Tables ts = make_tables(sh, impl);
  int64_t step = 0;
  for (; step < 2 * kBatches; ++step) run_step(ts, batches[step % kBatches], step + 1, b);
  CUDA_OK(cudaStreamSynchronize(b->stream));
  const auto before = total_stats(ts);
  cudaEvent_t e0, em, e1;
  for (cudaEvent_t* e : {&e0, &em, &e1}) CUDA_OK(cudaEventCreate(e));
  std::vector<double> v, find, apply, issue;
  auto between = [](cudaEvent_t a, cudaEvent_t z) {
    float ms = 0;
    CUDA_OK(cudaEventElapsedTime(&ms, a, z));
    return static_cast<double>(ms);
  };
  for (int i = 0; i < sh.steps; ++i, ++step) {
    const auto t0 = std::chrono::steady_clock::now();
    CUDA_OK(cudaEventRecord(e0, b->stream));
    run_step(ts, batches[step % kBatches], step + 1, b, em);
    CUDA_OK(cudaEventRecord(e1, b->stream));
    issue.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    CUDA_OK(cudaEventSynchronize(e1));
    v.push_back(between(e0, e1));
    find.push_back(between(e0, em));
    apply.push_back(between(em, e1));
  }
  for (cudaEvent_t e : {e0, em, e1}) CUDA_OK(cudaEventDestroy(e));
  Result r;
  r.ms = median(v);
  r.find_ms = median(find);
  r.apply_ms = median(apply);
  r.issue_ms = median(issue);
  const auto after = total_stats(ts);
  const double hbm = static_cast<double>(after.hbm_keys - before.hbm_keys);
  const double host = static_cast<double>(after.host_keys - before.host_keys);
  if (hbm + host > 0) r.hbm_share = hbm / (hbm + host);
  r.host_keys = host / sh.steps;
  r.promoted = static_cast<double>(after.promoted_rows - before.promoted_rows) / sh.steps;
  r.demoted = static_cast<double>(after.demoted_rows - before.demoted_rows) / sh.steps;
  auto per_step = [&](int64_t a, int64_t b) { return static_cast<double>(a - b) / sh.steps; };
  r.ssd_up = per_step(after.ssd_promoted_rows, before.ssd_promoted_rows);
  r.ssd_down = per_step(after.ssd_demoted_rows, before.ssd_demoted_rows);
  r.ssd_host_ms = per_step(after.ssd_host_us, before.ssd_host_us) / 1e3;
  r.ssd_file_ms = per_step(after.ssd_file_us, before.ssd_file_us) / 1e3;
  if (impl == Impl::kHostOnly) r.hbm_share = 0;
  return r;
}

// Pinned host <-> device copy bandwidth (GB/s), 256 MiB each way.
void copy_bandwidth(double* h2d, double* d2h) {
  const size_t bytes = size_t{256} << 20;
  void* host = nullptr;
  CUDA_OK(cudaMallocHost(&host, bytes));
  DevBuf<char> dev(bytes);
  *h2d = pinned_copy_gbs(true, host, dev.get(), bytes);
  *d2h = pinned_copy_gbs(false, host, dev.get(), bytes);
  CUDA_OK(cudaFreeHost(host));
}

// The PCIe lower bound (ms) of one step's host-served keys: half are find_or_insert's (the value
// read), half apply_gradients' (value and slot read, then written); reads and writes overlap.
double pcie_ms(double host_keys, double h2d, double d2h) {
  const double per_op = host_keys / 2;
  const double read = per_op * kDim * 4 + per_op * 2 * kDim * 4;
  const double write = per_op * 2 * kDim * 4;
  return std::max(read / (h2d * 1e6), write / (d2h * 1e6));
}

// Distinct keys of one step over every table, averaged over the batches.
double mean_keys(const std::vector<std::vector<Batch>>& batches) {
  double sum = 0;
  for (const auto& batch : batches)
    for (const Batch& t : batch) sum += static_cast<double>(t.n);
  return sum / static_cast<double>(batches.size());
}

// Whether `name` is in the comma-separated list of environment variable `var` (unset: all).
bool selected(const char* var, const std::string& name) {
  const char* v = std::getenv(var);
  if (v == nullptr || *v == '\0') return true;
  return ("," + std::string(v) + ",").find("," + name + ",") != std::string::npos;
}

}  // namespace

int main(int argc, char** argv) {
  Shape sh;
  if (argc > 1) sh.tables = std::atoi(argv[1]);
  if (argc > 2) sh.steps = std::atoi(argv[2]);
  if (argc > 3) sh.vocab = std::atoll(argv[3]);
  if (argc > 4) sh.ids_per_sample = std::atof(argv[4]);
  cudaDeviceProp prop;
  CUDA_OK(cudaGetDeviceProperties(&prop, 0));
  std::printf(
      "DEVICE name=\"%s\" tables=%d vocab=%lld dim=%lld batch=%lld ids_per_sample=%.2f "
      "cache_rows=%lld steps=%d\n",
      prop.name, sh.tables, (long long)sh.vocab, (long long)kDim, (long long)kBatch,
      sh.ids_per_sample, (long long)(sh.vocab / 10), sh.steps);
  double h2d = 0, d2h = 0;
  copy_bandwidth(&h2d, &d2h);
  std::printf("COPY h2d_gbs=%.1f d2h_gbs=%.1f\n", h2d, d2h);
  StepBuffers b;
  CUDA_OK(cudaStreamCreateWithFlags(&b.stream, cudaStreamNonBlocking));
  for (const double zipf : {0.0, 1.15}) {
    const char* dist = zipf > 0 ? "zipf1.15" : "uniform";
    if (!selected("TIER_DISTS", dist)) continue;
    int64_t max_n = 0;
    const auto batches = make_batches(sh, zipf, &max_n);
    b.out.resize(max_n * kDim);
    std::vector<float> g(max_n * kDim);
    std::mt19937 rng(5);
    std::normal_distribution<float> nd(0.f, 0.01f);
    for (float& x : g) x = nd(rng);
    b.grads.upload(g);
    std::printf("KEYS dist=%s distinct_per_table_step=%lld\n", dist, (long long)batches[0][0].n);
    double hbm_ms = 0, host_only_ms = 0;
    for (Impl impl : {Impl::kHbm, Impl::kHostOnly, Impl::kLfu, Impl::kLru, Impl::kSsd}) {
      if (!selected("TIER_IMPLS", impl_name(impl))) continue;
      if (impl == Impl::kSsd && std::getenv("TIER_IMPLS") == nullptr) continue;  // opt-in
      const Result r = time_impl(sh, impl, batches, &b);
      if (impl == Impl::kHbm) hbm_ms = r.ms;
      if (impl == Impl::kHostOnly) host_only_ms = r.ms;
      std::printf(
          "TIER impl=%s dist=%s tables=%d ms=%.3f ratio_vs_hbm=%.2f find_ms=%.3f apply_ms=%.3f "
          "issue_ms=%.3f",
          impl_name(impl), dist, sh.tables, r.ms, r.ms / hbm_ms, r.find_ms, r.apply_ms, r.issue_ms);
      if (impl == Impl::kHostOnly) {
        const double keys = 2.0 * mean_keys(batches);
        std::printf(" host_keys_per_step=%.0f pcie_ms=%.3f", keys, pcie_ms(keys, h2d, d2h));
      }
      if (impl == Impl::kSsd) {
        std::printf(
            " ssd_up_per_step=%.0f ssd_down_per_step=%.0f ssd_host_ms=%.1f ssd_file_ms=%.1f",
            r.ssd_up, r.ssd_down, r.ssd_host_ms, r.ssd_file_ms);
      }
      if (impl == Impl::kLfu || impl == Impl::kLru || impl == Impl::kSsd) {
        const double pcie = pcie_ms(r.host_keys, h2d, d2h);
        std::printf(
            " speedup_vs_host_only=%.2f hbm_share=%.3f host_keys_per_step=%.0f "
            "pcie_ms=%.3f ratio_vs_pcie=%.2f promoted_per_step=%.0f demoted_per_step=%.0f",
            host_only_ms / r.ms, r.hbm_share, r.host_keys, pcie, r.ms / pcie, r.promoted,
            r.demoted);
      }
      std::printf("\n");
      std::fflush(stdout);
    }
  }
  CUDA_OK(cudaStreamDestroy(b.stream));
  return 0;
}
