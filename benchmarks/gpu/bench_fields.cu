// The embedding benchmark's training step (benchmarks/embedding/run.py) on the framework-free CUDA
// core, on the ids run.py wrote (`run.py --dump-ids DIR`, or `run.py --harness THIS_BINARY`):
// per field, one after another on one stream,
//   unique_keys -> GpuEmbeddingTable::find_or_insert (one table per field, uniform init in
//   [init_min, init_max], default_value_dim as sok.get_embedding_variable's) -> pooled_forward
//   (sum, row_splits) -> pooled_backward of a fixed random upstream gradient -> apply_gradients
//   (Adagrad, lr and initial accumulator from the header, epsilon 0 as tf.compat.v1's Adagrad)
//   with keys_unique and the device-side unique count d_n (no host round trip).
// Fresh tables per distribution; warm-up steps, then the median of the timed steps (CUDA events
// around each whole step of all fields), cycling through the batches as run.py does. Then each
// phase alone over all fields (same batches) for a breakdown.
//
// Input (run.py's dump_ids): DIR/header.txt ("key value..." lines: format, fields, batch, dim,
// vocab, optimizer, lr, initial_accumulator, init_min, init_max, default_value_dim, num_batches,
// dists) and per distribution d, batch b, field f: DIR/d_b<b>_f<f>_ids.bin (int64 ids) and
// DIR/d_b<b>_f<f>_splits.bin (int64 row_splits, batch + 1 entries).
//
// Output, one machine-readable line per distribution:
//   HARNESS dist=uniform fields=26 batch=8192 dim=16 step_ms=... [key=value ...]
//
// Usage: bench_fields DIR [--warmup N] [--steps N] [--dists a,b] [--no-breakdown] [--parse-only]
//   --parse-only reads and checks the files and prints HARNESS_INPUT lines; it makes no CUDA call
//   (works on a machine without a GPU).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "addons/sparse_operation_kit/core/common.h"
#include "addons/sparse_operation_kit/core/cuda/gpu_api.h"
#include "harness/gpu/cuda_util.h"

using namespace sok;       // NOLINT
using namespace sok::gpu;  // NOLINT

namespace {

[[noreturn]] void die(const std::string& msg) {
  std::fprintf(stderr, "bench_fields: %s\n", msg.c_str());
  std::exit(4);
}

struct Header {
  int64_t fields = 0, batch = 0, dim = 0, vocab = 0, num_batches = 0, default_value_dim = 4096;
  std::string optimizer;
  float lr = 0.f, initial_accumulator = 0.1f, init_min = -0.05f, init_max = 0.05f;
  uint64_t seed = 0;
  std::vector<std::string> dists;
};

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, sep))
    if (!item.empty()) out.push_back(item);
  return out;
}

Header read_header(const std::string& dir) {
  const std::string path = dir + "/header.txt";
  FILE* f = std::fopen(path.c_str(), "r");
  if (!f) die("cannot open " + path);
  std::map<std::string, std::vector<std::string>> kv;
  char line[4096];
  while (std::fgets(line, sizeof(line), f)) {
    std::vector<std::string> w;
    std::stringstream ss(line);
    std::string tok;
    while (ss >> tok) w.push_back(tok);
    if (w.empty() || w[0][0] == '#') continue;
    kv[w[0]] = std::vector<std::string>(w.begin() + 1, w.end());
  }
  std::fclose(f);
  auto one = [&](const char* k) -> std::string {
    auto it = kv.find(k);
    if (it == kv.end() || it->second.size() != 1) die(path + ": missing or malformed '" + k + "'");
    return it->second[0];
  };
  if (one("format") != "sok_ids_v1") die(path + ": unknown format " + one("format"));
  Header h;
  h.fields = std::stoll(one("fields"));
  h.batch = std::stoll(one("batch"));
  h.dim = std::stoll(one("dim"));
  h.vocab = std::stoll(one("vocab"));
  h.num_batches = std::stoll(one("num_batches"));
  h.optimizer = one("optimizer");
  h.lr = std::stof(one("lr"));
  h.initial_accumulator = std::stof(one("initial_accumulator"));
  h.init_min = std::stof(one("init_min"));
  h.init_max = std::stof(one("init_max"));
  if (kv.count("default_value_dim")) h.default_value_dim = std::stoll(one("default_value_dim"));
  if (kv.count("seed")) h.seed = std::stoull(one("seed"));
  h.dists = kv["dists"];
  if (h.fields <= 0 || h.batch <= 0 || h.dim <= 0 || h.vocab <= 0 || h.num_batches <= 0 ||
      h.dists.empty())
    die(path + ": fields, batch, dim, vocab, num_batches must be positive and dists non-empty");
  if (h.optimizer != "adagrad")
    die(path + ": optimizer '" + h.optimizer + "' (only adagrad is timed here)");
  return h;
}

std::vector<int64_t> read_i64(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) die("cannot open " + path);
  std::fseek(f, 0, SEEK_END);
  const long bytes = std::ftell(f);
  std::fseek(f, 0, SEEK_SET);
  if (bytes < 0 || bytes % 8) die(path + ": size is not a multiple of 8 bytes");
  std::vector<int64_t> v(static_cast<size_t>(bytes / 8));
  if (!v.empty() && std::fread(v.data(), 8, v.size(), f) != v.size()) die("cannot read " + path);
  std::fclose(f);
  return v;
}

// ids[b][f], splits[b][f] of one distribution, checked.
struct HostIds {
  std::vector<std::vector<std::vector<int64_t>>> ids, splits;
  int64_t total_ids = 0;  // over all batches and fields
  int64_t max_n = 0;      // the most ids of one field in one batch
};

HostIds read_ids(const std::string& dir, const Header& h, const std::string& dist) {
  HostIds d;
  d.ids.resize(h.num_batches);
  d.splits.resize(h.num_batches);
  for (int64_t b = 0; b < h.num_batches; ++b) {
    for (int64_t f = 0; f < h.fields; ++f) {
      const std::string stem =
          dir + "/" + dist + "_b" + std::to_string(b) + "_f" + std::to_string(f);
      std::vector<int64_t> ids = read_i64(stem + "_ids.bin"), sp = read_i64(stem + "_splits.bin");
      if (static_cast<int64_t>(sp.size()) != h.batch + 1)
        die(stem + "_splits.bin: want batch + 1 entries");
      if (sp[0] != 0 || sp[h.batch] != static_cast<int64_t>(ids.size()))
        die(stem + ": row_splits do not span the ids");
      for (int64_t i = 0; i < h.batch; ++i)
        if (sp[i + 1] < sp[i]) die(stem + "_splits.bin: not ascending");
      for (int64_t x : ids)
        if (x < 0 || x >= h.vocab) die(stem + "_ids.bin: id outside [0, vocab)");
      d.total_ids += static_cast<int64_t>(ids.size());
      d.max_n = std::max<int64_t>(d.max_n, static_cast<int64_t>(ids.size()));
      d.ids[b].push_back(std::move(ids));
      d.splits[b].push_back(std::move(sp));
    }
  }
  return d;
}

cudaStream_t g_s;

__global__ void k_fill_random(float* p, size_t n, uint64_t seed) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    p[i] = static_cast<float>(static_cast<int64_t>(sok::mix64(seed ^ i) >> 40) - (1 << 23)) *
           (1.0f / (1 << 23)) * 1e-3f;
}

struct FieldBufs {
  DevBuf<int64_t> uniq, counts, num;
  DevBuf<int32_t> inverse;
  DevBuf<float> rows, grad, out;
};

void run_dist(const Header& h, const std::string& dist, const HostIds& hid, int warmup, int steps,
              bool breakdown) {
  const int64_t nb = h.num_batches, nf = h.fields, dim = h.dim, batch = h.batch;
  // Device copies of every batch (ids and row_splits per field).
  std::vector<std::vector<DevBuf<int64_t>>> ids(nb), splits(nb);
  std::vector<std::vector<int64_t>> n(nb, std::vector<int64_t>(nf));
  for (int64_t b = 0; b < nb; ++b)
    for (int64_t f = 0; f < nf; ++f) {
      ids[b].push_back(to_device(hid.ids[b][f]));
      splits[b].push_back(to_device(hid.splits[b][f]));
      n[b][f] = static_cast<int64_t>(hid.ids[b][f].size());
    }
  const int64_t cap = std::max<int64_t>(hid.max_n, 1);
  std::vector<FieldBufs> fb(nf);
  for (auto& x : fb) {
    x.uniq.resize(cap);
    x.counts.resize(cap);
    x.num.resize(1);
    x.inverse.resize(cap);
    x.rows.resize(cap * dim);
    x.grad.resize(cap * dim);
    x.out.resize(batch * dim);
  }
  DevBuf<float> gout(batch * dim);  // the fixed upstream gradient d(loss)/d(pooled), all fields
  k_fill_random<<<1024, 256, 0, g_s>>>(gout.get(), gout.size(), 11);
  CUDA_OK(cudaGetLastError());

  std::vector<std::unique_ptr<GpuEmbeddingTable<int64_t>>> tables(nf);
  for (int64_t f = 0; f < nf; ++f) {
    TableConfig cfg;
    cfg.name = "field_" + std::to_string(f);
    cfg.dim = dim;
    cfg.init.kind = InitKind::kUniform;
    cfg.init.a = h.init_min;
    cfg.init.b = h.init_max;
    cfg.init.seed = h.seed + static_cast<uint64_t>(f);
    cfg.init.default_value_dim = h.default_value_dim;
    SOK_OK(GpuEmbeddingTable<int64_t>::Create(cfg, GpuTableOptions(), &tables[f]));
  }
  OptimizerParams p;
  p.kind = OptimizerKind::kAdagrad;
  p.lr = h.lr;
  p.initial_accumulator = h.initial_accumulator;
  p.epsilon = 0.f;
  int64_t global_step = 0;

  // The phases of field f on batch b.
  auto dedup = [&](int64_t b, int64_t f) {
    SOK_OK(unique_keys<int64_t>(ids[b][f].get(), n[b][f], fb[f].uniq.get(), fb[f].inverse.get(),
                                fb[f].counts.get(), fb[f].num.get(), g_s));
  };
  auto lookup = [&](int64_t b, int64_t f) {
    SOK_OK(tables[f]->find_or_insert(fb[f].uniq.get(), n[b][f], fb[f].rows.get(),
                                     fb[f].counts.get(), g_s, fb[f].num.get()));
  };
  auto seg = [&](int64_t b, int64_t f) {
    Segments s;
    s.row_splits = splits[b][f].get();
    return s;
  };
  auto forward = [&](int64_t b, int64_t f) {
    SOK_OK(pooled_forward(fb[f].rows.get(), dim, n[b][f], fb[f].inverse.get(), seg(b, f), nullptr,
                          n[b][f], batch, Combiner::kSum, fb[f].out.get(), g_s));
  };
  auto backward = [&](int64_t b, int64_t f) {
    SOK_OK(pooled_backward(gout.get(), dim, fb[f].inverse.get(), seg(b, f), nullptr, n[b][f], batch,
                           Combiner::kSum, n[b][f], fb[f].num.get(), fb[f].grad.get(), g_s));
  };
  auto update = [&](int64_t b, int64_t f) {
    p.step = global_step;
    SOK_OK(tables[f]->apply_gradients(fb[f].uniq.get(), n[b][f], fb[f].grad.get(), p, global_step,
                                      g_s, true, fb[f].num.get()));
  };
  const std::vector<std::function<void(int64_t, int64_t)>> phases = {dedup, lookup, forward,
                                                                     backward, update};
  auto step = [&](int64_t k) {
    const int64_t b = k % nb;
    ++global_step;
    for (int64_t f = 0; f < nf; ++f)
      for (auto& ph : phases) ph(b, f);
  };

  cudaEvent_t e0, e1;
  CUDA_OK(cudaEventCreate(&e0));
  CUDA_OK(cudaEventCreate(&e1));
  auto elapsed = [&]() {
    CUDA_OK(cudaEventSynchronize(e1));
    float ms = 0;
    CUDA_OK(cudaEventElapsedTime(&ms, e0, e1));
    return static_cast<double>(ms);
  };
  int64_t k = 0;
  for (int i = 0; i < warmup; ++i) step(k++);
  CUDA_OK(cudaStreamSynchronize(g_s));
  std::vector<double> times;
  for (int i = 0; i < steps; ++i) {
    CUDA_OK(cudaEventRecord(e0, g_s));
    step(k++);
    CUDA_OK(cudaEventRecord(e1, g_s));
    times.push_back(elapsed());
  }
  const double step_ms = median(times);
  const double min_ms = *std::min_element(times.begin(), times.end());
  // Distinct ids of the last step and table sizes.
  int64_t uniq = 0, keys = 0;
  const int64_t last_b = (k - 1) % nb;
  for (int64_t f = 0; f < nf; ++f) {
    uniq += fb[f].num.download(1)[0];
    int64_t sz = 0;
    SOK_OK(tables[f]->size(&sz, g_s));
    keys += sz;
  }
  int64_t last_n = 0;
  for (int64_t f = 0; f < nf; ++f) last_n += n[last_b][f];

  // Each phase alone over all fields: the earlier phases of the same batch run untimed first.
  std::string parts;
  if (breakdown) {
    const char* names[] = {"dedup_ms", "find_or_insert_ms", "fwd_ms", "bwd_ms", "adagrad_ms"};
    const int reps = std::max(3, std::min(steps, 20));
    for (size_t ph = 0; ph < phases.size(); ++ph) {
      std::vector<double> t;
      for (int r = 0; r < reps; ++r) {
        const int64_t b = k++ % nb;
        ++global_step;
        for (int64_t f = 0; f < nf; ++f)
          for (size_t q = 0; q < ph; ++q) phases[q](b, f);
        CUDA_OK(cudaEventRecord(e0, g_s));
        for (int64_t f = 0; f < nf; ++f) phases[ph](b, f);
        CUDA_OK(cudaEventRecord(e1, g_s));
        t.push_back(elapsed());
      }
      char buf[64];
      std::snprintf(buf, sizeof(buf), " %s=%.4f", names[ph], median(t));
      parts += buf;
    }
  }
  CUDA_OK(cudaStreamSynchronize(g_s));
  CUDA_OK(cudaGetLastError());
  CUDA_OK(cudaEventDestroy(e0));
  CUDA_OK(cudaEventDestroy(e1));
  std::printf(
      "HARNESS dist=%s fields=%lld batch=%lld dim=%lld vocab=%lld step_ms=%.4f min_ms=%.4f "
      "warmup=%d steps=%d "
      "ids=%lld unique=%lld table_keys=%lld%s\n",
      dist.c_str(), (long long)nf, (long long)batch, (long long)dim, (long long)h.vocab, step_ms,
      min_ms, warmup, steps, (long long)last_n, (long long)uniq, (long long)keys, parts.c_str());
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || argv[1][0] == '-') {
    std::fprintf(
        stderr,
        "usage: %s DIR [--warmup N] [--steps N] [--dists a,b] [--no-breakdown] [--parse-only]\n"
        "  DIR: what `benchmarks/embedding/run.py --dump-ids DIR` wrote\n",
        argv[0]);
    return 1;
  }
  const std::string dir = argv[1];
  int warmup = 20, steps = 100;
  bool breakdown = true, parse_only = false;
  std::string dists_arg;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) die("missing value after " + a);
      return argv[++i];
    };
    if (a == "--warmup") warmup = std::stoi(next());
    else if (a == "--steps") steps = std::stoi(next());
    else if (a == "--dists") dists_arg = next();
    else if (a == "--no-breakdown") breakdown = false;
    else if (a == "--parse-only") parse_only = true;
    else die("unknown argument " + a);
  }
  if (steps < 1 || warmup < 0) die("--steps must be >= 1 and --warmup >= 0");
  const Header h = read_header(dir);
  const std::vector<std::string> dists = dists_arg.empty() ? h.dists : split(dists_arg, ',');
  if (!parse_only) {
    cudaDeviceProp prop;
    CUDA_OK(cudaGetDeviceProperties(&prop, 0));
    int drv = 0, rt = 0;
    CUDA_OK(cudaDriverGetVersion(&drv));
    CUDA_OK(cudaRuntimeGetVersion(&rt));
    std::string name = prop.name;
    std::replace(name.begin(), name.end(), ' ', '_');
    std::printf("HARNESS_DEVICE name=%s sms=%d mem_gb=%.1f driver=%d runtime=%d\n", name.c_str(),
                prop.multiProcessorCount, prop.totalGlobalMem / 1e9, drv, rt);
    CUDA_OK(cudaStreamCreateWithFlags(&g_s, cudaStreamNonBlocking));
  }
  for (const std::string& dist : dists) {
    const HostIds hid = read_ids(dir, h, dist);
    if (parse_only) {
      std::printf(
          "HARNESS_INPUT dist=%s fields=%lld batch=%lld dim=%lld vocab=%lld num_batches=%lld "
          "ids=%lld "
          "max_ids_per_field=%lld optimizer=%s lr=%g initial_accumulator=%g ok\n",
          dist.c_str(), (long long)h.fields, (long long)h.batch, (long long)h.dim,
          (long long)h.vocab, (long long)h.num_batches, (long long)hid.total_ids,
          (long long)hid.max_n, h.optimizer.c_str(), h.lr, h.initial_accumulator);
      continue;
    }
    run_dist(h, dist, hid, warmup, steps, breakdown);
  }
  return 0;
}
