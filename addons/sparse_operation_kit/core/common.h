// Small helpers shared by the CPU and CUDA halves of the core.
// Framework-free: no TensorFlow (or any other framework) header may be included below core/.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define SOK_HD __host__ __device__ __forceinline__
#else
#define SOK_HD inline
#endif

namespace sok {

// Owner of a key and its local row follow floor modulo, so negative keys are legal
// and land on the same rank on every layout (NVIDIA SOK's convention: key k -> rank k mod N).
template <typename K>
SOK_HD int64_t floor_mod(K key, int64_t n) {
  int64_t r = static_cast<int64_t>(key) % n;
  return r < 0 ? r + n : r;
}

template <typename K>
SOK_HD int64_t floor_div(K key, int64_t n) {
  int64_t k = static_cast<int64_t>(key);
  int64_t q = k / n;
  return (k % n != 0 && ((k < 0) != (n < 0))) ? q - 1 : q;
}

// splitmix64 finaliser: a cheap, well-mixed 64-bit hash (used for hash tables and the
// counter-based initialiser RNG alike).
SOK_HD uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

template <typename K>
SOK_HD uint64_t hash_key(K key) {
  return mix64(static_cast<uint64_t>(static_cast<int64_t>(key)));
}

}  // namespace sok
