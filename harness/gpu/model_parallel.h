// Model-parallel embedding lookup over several GPUs driven by one process (one NCCL communicator
// per GPU, ncclCommInitAll), built from the core's GPU entry points and key_routing.h. Checked by
// tests/gpu/test_multi_gpu.cu, timed by benchmarks/gpu/bench_multi_gpu.cu:
//   forward:  unique_keys -> bucketize_by_owner (owner = floor_mod(key, world)) -> all-to-all of
//             keys and counts -> owner find_or_insert -> all-to-all of rows back -> scatter to
//             unique order -> pooled_forward
//   backward: pooled_backward (per unique key) -> gather into owner order -> all-to-all of the
//             gradients -> owner apply_gradients (sums the ranks' gradients of one key first)
// The one-GPU reference runs the same steps on the concatenated batch without communication.
// Each GPU is driven by its own persistent host thread (as one process per GPU would), so the
// host work of one rank (launches, the wait for the all-to-all sizes) does not delay the others.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "addons/sparse_operation_kit/core/cuda/gpu_api.h"
#include "harness/gpu/cuda_util.h"
#include "harness/gpu/key_routing.h"

#define NCCL_OK(expr)                                                                              \
  do {                                                                                             \
    ncclResult_t r_ = (expr);                                                                      \
    if (r_ != ncclSuccess) {                                                                       \
      std::fprintf(stderr, "FATAL NCCL error %s at %s:%d: %s\n", ncclGetErrorString(r_), __FILE__, \
                   __LINE__, #expr);                                                               \
      std::exit(4);                                                                                \
    }                                                                                              \
  } while (0)

namespace mp {

using sok::Combiner;
using sok::OptimizerParams;
using sok::TableConfig;
using sok::gpu::GpuEmbeddingTable;

struct Rank {
  int dev = 0;
  cudaStream_t s = nullptr;
  ncclComm_t comm = nullptr;
  std::unique_ptr<GpuEmbeddingTable<int64_t>> table;
  int64_t n = 0, batch = 0, dim = 0;
  DevBuf<int64_t> ids, splits;
  DevBuf<int64_t> uniq, counts, num, order, owner_counts, all_counts;
  DevBuf<int32_t> inverse;
  DevBuf<int64_t> send_keys, send_cnts, recv_keys, recv_cnts;
  DevBuf<float> send_rows, recv_rows, rows_u, out, grad_out, grad_u, grad_send, grad_recv;
  int64_t* h_all = nullptr;  // pinned [world * world]
  std::vector<size_t> soff, scnt, roff, rcnt;
  int64_t recv_total = 0;
};

// Persistent worker threads, one per rank: run(f) calls f(r) on thread r and waits for all.
class RankPool {
 public:
  explicit RankPool(int n) : n_(n) {
    for (int r = 0; r < n; ++r) threads_.emplace_back([this, r] { loop(r); });
  }
  ~RankPool() {
    {
      std::lock_guard<std::mutex> l(mu_);
      stop_ = true;
      ++gen_;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }
  void run(const std::function<void(int)>& f) {
    std::unique_lock<std::mutex> l(mu_);
    task_ = &f;
    pending_ = n_;
    ++gen_;
    cv_.notify_all();
    done_cv_.wait(l, [this] { return pending_ == 0; });
    task_ = nullptr;
  }

 private:
  void loop(int r) {
    uint64_t seen = 0;
    while (true) {
      const std::function<void(int)>* f;
      {
        std::unique_lock<std::mutex> l(mu_);
        cv_.wait(l, [&] { return gen_ != seen; });
        seen = gen_;
        if (stop_) return;
        f = task_;
      }
      (*f)(r);
      {
        std::lock_guard<std::mutex> l(mu_);
        if (--pending_ == 0) done_cv_.notify_all();
      }
    }
  }
  int n_;
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  const std::function<void(int)>* task_ = nullptr;
  int pending_ = 0;
  uint64_t gen_ = 0;
  bool stop_ = false;
};

class ModelParallel {
 public:
  // n_max: most ids one rank gets per step; batch: samples per rank.
  ModelParallel(int world, int64_t n_max, int64_t batch, const TableConfig& cfg,
                int64_t reserve_keys, bool no_comm_single = false)
      : world_(world), dim_(cfg.dim), no_comm_(no_comm_single && world == 1) {
    ranks_.resize(world);
    std::vector<int> devs(world);
    for (int r = 0; r < world; ++r) devs[r] = r;
    std::vector<ncclComm_t> comms(world);
    if (!no_comm_) NCCL_OK(ncclCommInitAll(comms.data(), world, devs.data()));
    for (int r = 0; r < world; ++r) {
      Rank& k = ranks_[r];
      k.dev = r;
      CUDA_OK(cudaSetDevice(r));
      CUDA_OK(cudaStreamCreateWithFlags(&k.s, cudaStreamNonBlocking));
      k.comm = comms[r];
      sok::gpu::GpuTableOptions o;
      SOK_OK(GpuEmbeddingTable<int64_t>::Create(cfg, o, &k.table));
      if (reserve_keys > 0) SOK_OK(k.table->reserve(reserve_keys, k.s));
      k.batch = batch;
      k.dim = dim_;
      const size_t nm = n_max, rm = n_max * static_cast<size_t>(world);
      k.ids.resize(nm);
      k.splits.resize(batch + 1);
      k.uniq.resize(nm);
      k.counts.resize(nm);
      k.num.resize(1);
      k.order.resize(nm);
      k.owner_counts.resize(world);
      k.all_counts.resize(world * world);
      k.inverse.resize(nm);
      k.send_keys.resize(nm);
      k.send_cnts.resize(nm);
      k.recv_keys.resize(rm);
      k.recv_cnts.resize(rm);
      k.send_rows.resize(nm * dim_);
      k.recv_rows.resize(rm * dim_);
      k.rows_u.resize(nm * dim_);
      k.out.resize(batch * dim_);
      k.grad_out.resize(batch * dim_);
      k.grad_u.resize(nm * dim_);
      k.grad_send.resize(nm * dim_);
      k.grad_recv.resize(rm * dim_);
      CUDA_OK(cudaMallocHost(&k.h_all, sizeof(int64_t) * world * world));
      k.soff.assign(world, 0);
      k.scnt.assign(world, 0);
      k.roff.assign(world, 0);
      k.rcnt.assign(world, 0);
    }
    CUDA_OK(cudaSetDevice(0));
  }
  ~ModelParallel() {
    for (Rank& k : ranks_) {
      cudaSetDevice(k.dev);
      cudaStreamSynchronize(k.s);
      if (k.comm) ncclCommDestroy(k.comm);
      k.table.reset();
      cudaFreeHost(k.h_all);
      cudaStreamDestroy(k.s);
    }
    cudaSetDevice(0);
  }

  Rank& rank(int r) { return ranks_[r]; }
  int world() const { return world_; }

  // ids/splits/grad_out of rank r are set by the caller (n_r ids).
  void set_batch(int r, int64_t n) { ranks_[r].n = n; }

  void forward() {
    each([this](int r) { forward_rank(r); });
  }
  void backward(const OptimizerParams& p, int64_t step) {
    each([this, &p, step](int r) { backward_rank(r, p, step); });
  }

  void sync() {
    for (Rank& k : ranks_) {
      CUDA_OK(cudaSetDevice(k.dev));
      CUDA_OK(cudaStreamSynchronize(k.s));
    }
    CUDA_OK(cudaSetDevice(0));
  }

 private:
  void each(const std::function<void(int)>& f) {
    if (world_ == 1) {
      f(0);
      CUDA_OK(cudaSetDevice(0));
      return;
    }
    if (!pool_) pool_.reset(new RankPool(world_));
    pool_->run(f);
  }

  void forward_rank(int r) {
    Rank& k = ranks_[r];
    CUDA_OK(cudaSetDevice(k.dev));
    SOK_OK(sok::gpu::unique_keys<int64_t>(k.ids.get(), k.n, k.uniq.get(), k.inverse.get(),
                                          k.counts.get(), k.num.get(), k.s));
    if (no_comm_) {
      SOK_OK(k.table->find_or_insert(k.uniq.get(), k.n, k.rows_u.get(), k.counts.get(), k.s,
                                     k.num.get()));
      pool(k);
      return;
    }
    SOK_OK(sok::harness::bucketize_by_owner<int64_t>(k.uniq.get(), k.n, k.num.get(), world_,
                                                     k.order.get(), k.owner_counts.get(), k.s));
    SOK_OK(sok::harness::gather<int64_t>(k.uniq.get(), k.order.get(), k.n, k.num.get(),
                                         k.send_keys.get(), k.s));
    SOK_OK(sok::harness::gather<int64_t>(k.counts.get(), k.order.get(), k.n, k.num.get(),
                                         k.send_cnts.get(), k.s));
    // Every rank learns every rank's per-owner counts: the sizes of the ragged all-to-alls.
    NCCL_OK(
        ncclAllGather(k.owner_counts.get(), k.all_counts.get(), world_, ncclInt64, k.comm, k.s));
    CUDA_OK(cudaMemcpyAsync(k.h_all, k.all_counts.get(), sizeof(int64_t) * world_ * world_,
                            cudaMemcpyDeviceToHost, k.s));
    CUDA_OK(cudaStreamSynchronize(k.s));
    size_t so = 0, ro = 0;
    for (int p = 0; p < world_; ++p) {
      k.scnt[p] = static_cast<size_t>(k.h_all[r * world_ + p]);  // my keys owned by p
      k.rcnt[p] = static_cast<size_t>(k.h_all[p * world_ + r]);  // p's keys owned by me
      k.soff[p] = so;
      k.roff[p] = ro;
      so += k.scnt[p];
      ro += k.rcnt[p];
    }
    k.recv_total = static_cast<int64_t>(ro);
    exchange(k, k.send_keys.get(), k.recv_keys.get(), 1, ncclInt64, false);
    exchange(k, k.send_cnts.get(), k.recv_cnts.get(), 1, ncclInt64, false);
    SOK_OK(k.table->find_or_insert(k.recv_keys.get(), k.recv_total, k.recv_rows.get(),
                                   k.recv_cnts.get(), k.s));
    // Rows go back the opposite way.
    exchange(k, k.recv_rows.get(), k.send_rows.get(), dim_, ncclFloat32, true);
    SOK_OK(sok::harness::scatter_rows(k.send_rows.get(), dim_, k.order.get(), k.n, k.num.get(),
                                      k.rows_u.get(), k.s));
    pool(k);
  }

  void backward_rank(int r, const OptimizerParams& p, int64_t step) {
    Rank& k = ranks_[r];
    CUDA_OK(cudaSetDevice(k.dev));
    sok::gpu::Segments sg;
    sg.row_splits = k.splits.get();
    SOK_OK(sok::gpu::pooled_backward(k.grad_out.get(), dim_, k.inverse.get(), sg, nullptr, k.n,
                                     k.batch, Combiner::kSum, k.n, k.num.get(), k.grad_u.get(),
                                     k.s));
    if (no_comm_) {
      SOK_OK(k.table->apply_gradients(k.uniq.get(), k.n, k.grad_u.get(), p, step, k.s, true,
                                      k.num.get()));
      return;
    }
    SOK_OK(sok::harness::gather_rows(k.grad_u.get(), dim_, k.order.get(), k.n, k.num.get(),
                                     k.grad_send.get(), k.s));
    exchange(k, k.grad_send.get(), k.grad_recv.get(), dim_, ncclFloat32, false);
    // The owner sums the ranks' gradients of one key (apply_gradients dedups), then updates.
    SOK_OK(
        k.table->apply_gradients(k.recv_keys.get(), k.recv_total, k.grad_recv.get(), p, step, k.s));
  }

  void pool(Rank& k) {
    sok::gpu::Segments sg;
    sg.row_splits = k.splits.get();
    SOK_OK(sok::gpu::pooled_forward(k.rows_u.get(), dim_, k.n, k.inverse.get(), sg, nullptr, k.n,
                                    k.batch, Combiner::kSum, k.out.get(), k.s));
  }

  // Ragged all-to-all of rank k. Forward direction (reverse = false): k sends its [soff, scnt)
  // segment to each p and receives p's into [roff, rcnt). Reverse: the owner side sends back.
  void exchange(Rank& k, void* send, void* recv, int64_t width, ncclDataType_t type, bool reverse) {
    const size_t esz = type == ncclFloat32 ? 4 : 8;
    char* sb = static_cast<char*>(send);
    char* rb = static_cast<char*>(recv);
    NCCL_OK(ncclGroupStart());
    for (int p = 0; p < world_; ++p) {
      const size_t so = reverse ? k.roff[p] : k.soff[p], sc = reverse ? k.rcnt[p] : k.scnt[p];
      const size_t ro = reverse ? k.soff[p] : k.roff[p], rc = reverse ? k.scnt[p] : k.rcnt[p];
      if (sc) NCCL_OK(ncclSend(sb + so * width * esz, sc * width, type, p, k.comm, k.s));
      if (rc) NCCL_OK(ncclRecv(rb + ro * width * esz, rc * width, type, p, k.comm, k.s));
    }
    NCCL_OK(ncclGroupEnd());
  }

  std::unique_ptr<RankPool> pool_;
  int world_;
  int64_t dim_;
  bool no_comm_;
  std::vector<Rank> ranks_;
};

}  // namespace mp
