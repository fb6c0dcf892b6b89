// Times one large CPU Embedding Variable (core/embedding_table.h) on the framework-free core:
// inserting --keys random keys, then find, find_or_insert and Adagrad apply_gradients on random
// batches of present keys, and find on absent keys. Also prints the resident memory the table
// added per key beyond its values and slots (like memory.py, without TensorFlow).
//
//   (from the repository root; Bazel builds the core with -O3 -fno-math-errno too)
//   g++ -O3 -fno-math-errno -std=c++17 -I. -pthread -o /tmp/table_bench
//   benchmarks/embedding/table_bench.cc addons/sparse_operation_kit/core/*.cc /tmp/table_bench
//   [keys] [dim] [batch] [repeats]
//
// Prints ns per key, the best of the repeats (one thread, thread CPU time).
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "addons/sparse_operation_kit/core/embedding_table.h"

namespace {

double now_ns() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return t.tv_sec * 1e9 + t.tv_nsec;
}

int64_t rss_bytes() {
  std::ifstream f("/proc/self/status");
  for (std::string line; std::getline(f, line);) {
    if (line.rfind("VmRSS:", 0) == 0) return std::atoll(line.c_str() + 6) * 1024;
  }
  return 0;
}

uint64_t mix(uint64_t x) {  // splitmix64: distinct inputs give distinct keys
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// ns per key of fn(batch) over `batches`, the best of `repeats` passes.
double time_per_key(const std::vector<std::vector<int64_t>>& batches, int repeats,
                    const std::function<void(const std::vector<int64_t>&)>& fn) {
  double best = 1e30;
  for (int r = 0; r < repeats; ++r) {
    double t0 = now_ns(), keys = 0;
    for (const auto& b : batches) {
      fn(b);
      keys += b.size();
    }
    best = std::min(best, (now_ns() - t0) / keys);
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace sok;
  const int64_t n = argc > 1 ? std::atoll(argv[1]) : 4000000;
  const int64_t dim = argc > 2 ? std::atoll(argv[2]) : 16;
  const int64_t batch = argc > 3 ? std::atoll(argv[3]) : 65536;
  const int repeats = argc > 4 ? std::atoi(argv[4]) : 3;
  std::vector<int64_t> keys(n);
  for (int64_t i = 0; i < n; ++i) keys[i] = static_cast<int64_t>(mix(i));
  // Batches of distinct present keys in random order, and of absent keys.
  std::vector<int64_t> perm(keys);
  std::sort(perm.begin(), perm.end());
  const int64_t num_batches = std::max<int64_t>(1, std::min<int64_t>(16, n / batch));
  std::vector<std::vector<int64_t>> present(num_batches), absent(num_batches);
  for (int64_t b = 0; b < num_batches; ++b) {
    for (int64_t i = 0; i < batch && i < n; ++i) {
      present[b].push_back(perm[(b * batch + i) % n]);
      absent[b].push_back(static_cast<int64_t>(mix(n + b * batch + i)));
    }
  }
  std::vector<float> out(batch * dim), grads(batch * dim, 0.01f);
  TableConfig c;
  c.name = "bench";
  c.dim = dim;
  c.init.kind = InitKind::kUniform;
  c.init.a = -0.05f;
  c.init.b = 0.05f;
  OptimizerParams adagrad;
  adagrad.kind = OptimizerKind::kAdagrad;
  adagrad.lr = 0.05f;
  const int64_t rss0 = rss_bytes();
  EmbeddingTable<int64_t> t(c);
  t.apply_gradients(keys.data(), 1, grads.data(), adagrad, 0, serial_for, true);  // slots
  double t0 = now_ns();
  for (int64_t b = 0; b < n; b += batch) {
    t.find_or_insert(keys.data() + b, std::min(batch, n - b), out.data());
  }
  const double insert_ns = (now_ns() - t0) / n;
  for (int64_t b = 0; b < n; b += batch) {
    t.apply_gradients(keys.data() + b, std::min(batch, n - b), grads.data(), adagrad, 1, serial_for,
                      true);
  }
  const double overhead = static_cast<double>(rss_bytes() - rss0) / n - 2 * 4 * dim;
  const double find_ns = time_per_key(present, repeats, [&](const std::vector<int64_t>& b) {
    t.find(b.data(), b.size(), out.data());
  });
  const double foi_ns = time_per_key(present, repeats, [&](const std::vector<int64_t>& b) {
    t.find_or_insert(b.data(), b.size(), out.data());
  });
  const double apply_ns = time_per_key(present, repeats, [&](const std::vector<int64_t>& b) {
    t.apply_gradients(b.data(), b.size(), grads.data(), adagrad, 2, serial_for, true);
  });
  const double miss_ns = time_per_key(absent, repeats, [&](const std::vector<int64_t>& b) {
    t.find(b.data(), b.size(), out.data());
  });
  std::printf(
      "TABLE keys=%lld dim=%lld batch=%lld ns/key: insert %.1f find %.1f find_or_insert %.1f "
      "apply_adagrad %.1f find_absent %.1f | overhead %.1f B/key\n",
      static_cast<long long>(n), static_cast<long long>(dim), static_cast<long long>(batch),
      insert_ns, find_ns, foi_ns, apply_ns, miss_ns, overhead);
  return 0;
}
