// Host-side helpers of the programs that drive the CUDA core (tests/gpu, benchmarks/gpu): fatal
// checks of CUDA calls and Statuses, device buffers, the median of timings and the copy
// bandwidth.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <string>
#include <vector>

#include "addons/sparse_operation_kit/core/status.h"

#define CUDA_OK(expr)                                                                       \
  do {                                                                                      \
    cudaError_t e_ = (expr);                                                                \
    if (e_ != cudaSuccess) {                                                                \
      std::fprintf(stderr, "FATAL CUDA error %s (%s) at %s:%d: %s\n", cudaGetErrorName(e_), \
                   cudaGetErrorString(e_), __FILE__, __LINE__, #expr);                      \
      std::exit(2);                                                                         \
    }                                                                                       \
  } while (0)

#define SOK_OK(expr)                                                                       \
  do {                                                                                     \
    ::sok::Status s_ = (expr);                                                             \
    if (!s_.ok()) {                                                                        \
      std::fprintf(stderr, "FATAL status at %s:%d: %s -> %s\n", __FILE__, __LINE__, #expr, \
                   s_.message().c_str());                                                  \
      std::exit(3);                                                                        \
    }                                                                                      \
  } while (0)

template <typename T>
class DevBuf {
 public:
  DevBuf() = default;
  explicit DevBuf(size_t n) { resize(n); }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  DevBuf(DevBuf&& o) noexcept : p_(o.p_), n_(o.n_) {
    o.p_ = nullptr;
    o.n_ = 0;
  }
  ~DevBuf() {
    if (p_) cudaFree(p_);
  }
  void resize(size_t n) {
    if (p_) CUDA_OK(cudaFree(p_));
    p_ = nullptr;
    n_ = n;
    CUDA_OK(cudaMalloc(&p_, std::max<size_t>(n, 1) * sizeof(T)));
  }
  void upload(const std::vector<T>& v) {
    if (v.size() > n_) resize(v.size());
    if (!v.empty()) CUDA_OK(cudaMemcpy(p_, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  }
  std::vector<T> download(size_t n) const {
    std::vector<T> v(n);
    if (n) CUDA_OK(cudaMemcpy(v.data(), p_, n * sizeof(T), cudaMemcpyDeviceToHost));
    return v;
  }
  std::vector<T> download() const { return download(n_); }
  void poison() {
    CUDA_OK(cudaMemset(p_, 0xff, std::max<size_t>(n_, 1) * sizeof(T)));
  }  // NaN for float
  T* get() const { return p_; }
  size_t size() const { return n_; }

 private:
  T* p_ = nullptr;
  size_t n_ = 0;
};

template <typename T>
DevBuf<T> to_device(const std::vector<T>& v) {
  DevBuf<T> b(v.size());
  b.upload(v);
  return b;
}

inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

// GB/s of one copy of `bytes` between pinned `host` and `dev` (to_device: host to device), the
// best of five: the copy engine's bandwidth, the bound of rows that cross PCIe.
inline double pinned_copy_gbs(bool to_device, void* host, void* dev, size_t bytes) {
  cudaEvent_t a, b;
  CUDA_OK(cudaEventCreate(&a));
  CUDA_OK(cudaEventCreate(&b));
  float best = 1e30f;
  for (int i = 0; i < 5; ++i) {
    CUDA_OK(cudaEventRecord(a));
    CUDA_OK(cudaMemcpyAsync(to_device ? dev : host, to_device ? host : dev, bytes,
                            to_device ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost));
    CUDA_OK(cudaEventRecord(b));
    CUDA_OK(cudaEventSynchronize(b));
    float ms = 0;
    CUDA_OK(cudaEventElapsedTime(&ms, a, b));
    best = std::min(best, ms);
  }
  CUDA_OK(cudaEventDestroy(a));
  CUDA_OK(cudaEventDestroy(b));
  return static_cast<double>(bytes) / (best * 1e6);
}
