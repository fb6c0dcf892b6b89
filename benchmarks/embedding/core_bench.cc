// Times each CPU step of the SOK pipeline on the framework-free core, without TensorFlow:
// unique_keys, find_or_insert (the Embedding Variable gather), check_lookup_indices,
// pooled_forward, pooled_backward, apply_gradients (Adagrad). Every step runs over all tables
// before the next one, as the fused TensorFlow ops do, so rows are as cold as in training, and
// the batches cycle so keys do not come in the order their rows were inserted.
//
//   (from the repository root; Bazel builds the core with -O3 -fno-math-errno too)
//   g++ -O3 -fno-math-errno -std=c++17 -I. -pthread -o /tmp/core_bench
//   benchmarks/embedding/core_bench.cc addons/sparse_operation_kit/core/*.cc /tmp/core_bench
//   [uniform|powerlaw] [steps] [threads]
//
// Prints the smallest time per step of each phase (1 thread: thread CPU time; more: wall time).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "addons/sparse_operation_kit/core/embedding_table.h"
#include "addons/sparse_operation_kit/core/lookup.h"

namespace {

constexpr int kFields = 100, kIdsPerSample = 10, kVocab = 8192, kDim = 16, kBatch = 4096;
constexpr int kBatches = 4;

double now_ms(bool thread_cpu) {
  timespec t;
  clock_gettime(thread_cpu ? CLOCK_THREAD_CPUTIME_ID : CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

// Persistent workers (like TensorFlow's pool): run(fn) calls fn(f) for every table f.
class Pool {
 public:
  explicit Pool(int threads) {
    for (int t = 1; t < threads; ++t) workers_.emplace_back([this] { loop(); });
  }
  ~Pool() {
    {
      std::lock_guard<std::mutex> l(mu_);
      quit_ = true;
    }
    cv_.notify_all();
    for (auto& w : workers_) w.join();
  }
  void run(const std::function<void(int)>& fn) {
    {
      std::lock_guard<std::mutex> l(mu_);
      job_ = fn;
      next_ = 0;
      done_ = 0;
      ++generation_;
    }
    cv_.notify_all();
    work();
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait(l, [&] { return done_ == static_cast<int>(workers_.size()); });
  }

 private:
  void work() {
    for (int f; (f = next_++) < kFields;) job_(f);
  }
  void loop() {
    for (int seen = 0;;) {
      {
        std::unique_lock<std::mutex> l(mu_);
        cv_.wait(l, [&] { return generation_ != seen || quit_; });
        if (quit_) return;
        seen = generation_;
      }
      work();
      {
        std::lock_guard<std::mutex> l(mu_);
        ++done_;
      }
      cv_.notify_all();
    }
  }
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::function<void(int)> job_;
  std::atomic<int> next_{0};
  int generation_ = 0, done_ = 0;
  bool quit_ = false;
};

}  // namespace

int main(int argc, char** argv) {
  using namespace sok;
  const bool powerlaw = argc > 1 && std::string(argv[1]) == "powerlaw";
  const int steps = argc > 2 ? std::atoi(argv[2]) : 8;
  const int threads = argc > 3 ? std::atoi(argv[3]) : 1;
  const int64_t n = int64_t{kBatch} * kIdsPerSample;

  // ids[f][b]: batch b of field f; power-law ids rank a random permutation per field.
  std::mt19937_64 rng(1);
  std::vector<double> cdf(kVocab);
  double total = 0;
  for (int i = 0; i < kVocab; ++i) cdf[i] = total += 1.0 / std::pow(i + 1, 1.1);
  std::vector<std::vector<std::vector<int64_t>>> ids(kFields);
  for (auto& field : ids) {
    std::vector<int64_t> perm(kVocab);
    for (int i = 0; i < kVocab; ++i) perm[i] = i;
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int b = 0; b < kBatches; ++b) {
      std::vector<int64_t> k(n);
      for (auto& x : k) {
        if (!powerlaw) {
          x = static_cast<int64_t>(rng() % kVocab);
        } else {
          const double u = std::uniform_real_distribution<double>(0, total)(rng);
          x = perm[std::min<int64_t>(kVocab - 1,
                                     std::lower_bound(cdf.begin(), cdf.end(), u) - cdf.begin())];
        }
      }
      field.push_back(std::move(k));
    }
  }
  std::vector<int64_t> segments(n);
  for (int64_t i = 0; i < n; ++i) segments[i] = i / kIdsPerSample;

  std::vector<std::unique_ptr<EmbeddingTable<int64_t>>> tables;
  for (int f = 0; f < kFields; ++f) {
    TableConfig c;
    c.name = "field_" + std::to_string(f);
    c.dim = kDim;
    c.init.kind = InitKind::kUniform;
    c.init.a = -0.05f;
    c.init.b = 0.05f;
    tables.emplace_back(new EmbeddingTable<int64_t>(c));
  }
  OptimizerParams adagrad;
  adagrad.kind = OptimizerKind::kAdagrad;
  adagrad.lr = 0.05f;

  std::vector<std::vector<int64_t>> uniq(kFields), counts(kFields);
  std::vector<std::vector<int32_t>> inverse(kFields, std::vector<int32_t>(n));
  std::vector<std::vector<float>> rows(kFields), out(kFields, std::vector<float>(kBatch * kDim));
  std::vector<std::vector<float>> row_grads(kFields);
  const std::vector<float> out_grad(kBatch * kDim, 0.01f);

  const char* names[] = {"unique", "gather", "check", "forward", "backward", "apply"};
  double best[6];
  std::fill(best, best + 6, 1e30);
  Pool pool(threads);
  const bool cpu = threads == 1;
  for (int step = 0; step <= steps; ++step) {
    const int batch = step % kBatches;
    double t[6], t0 = now_ms(cpu), t1;
    auto lap = [&](int phase) {
      t1 = now_ms(cpu);
      t[phase] = t1 - t0;
      t0 = t1;
    };
    pool.run([&](int f) {
      unique_keys(ids[f][batch].data(), n, &uniq[f], inverse[f].data(), &counts[f]);
    });
    lap(0);
    pool.run([&](int f) {
      rows[f].resize(uniq[f].size() * kDim);
      tables[f]->find_or_insert(uniq[f].data(), uniq[f].size(), rows[f].data(), counts[f].data());
    });
    lap(1);
    pool.run([&](int f) {
      check_lookup_indices("t", inverse[f].data(), segments.data(), n, uniq[f].size(), kBatch);
    });
    lap(2);
    pool.run([&](int f) {
      pooled_forward(rows[f].data(), kDim, inverse[f].data(), segments.data(), nullptr, n, kBatch,
                     Combiner::kSum, out[f].data());
    });
    lap(3);
    pool.run([&](int f) {
      row_grads[f].resize(uniq[f].size() * kDim);
      pooled_backward(out_grad.data(), kDim, inverse[f].data(), segments.data(), nullptr, n, kBatch,
                      Combiner::kSum, uniq[f].size(), row_grads[f].data());
    });
    lap(4);
    pool.run([&](int f) {
      tables[f]->apply_gradients(uniq[f].data(), uniq[f].size(), row_grads[f].data(), adagrad, step,
                                 serial_for, /*keys_unique=*/true);
    });
    lap(5);
    // Step 0 inserts the rows; the batch that inserted them reads them in insertion order.
    if (step > 0 && batch != 0) {
      for (int i = 0; i < 6; ++i) best[i] = std::min(best[i], t[i]);
    }
  }
  double sum = 0;
  std::printf("%s, %d tables, %d thread(s), ms per step (%s):", powerlaw ? "powerlaw" : "uniform",
              kFields, threads, cpu ? "CPU" : "wall");
  for (int i = 0; i < 6; ++i) {
    std::printf(" %s %.1f", names[i], best[i]);
    sum += best[i];
  }
  std::printf(" | total %.1f\n", sum);
  return 0;
}
