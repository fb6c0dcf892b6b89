// Host-side helpers of the programs that drive the CUDA core (tests/gpu, benchmarks/gpu): fatal
// checks of CUDA calls and Statuses, device buffers, and the median of timings.
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
