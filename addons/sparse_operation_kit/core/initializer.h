// Deterministic initial values: value(seed, key, column) with no state, so a row's first value
// does not depend on batch order, thread count, device or world size. The same function runs
// in the CPU table and in the CUDA kernels.
//
// DeepRec's InitializerOption(initializer, default_value_dim) semantics: key k starts from row
// floor_mod(k, default_value_dim) of a [default_value_dim, dim] default-value matrix. Here that
// matrix is never stored for the built-in distributions: its entries are computed on the fly.
// default_value_dim == 0 means "one independent row per key" (NVIDIA SOK's DynamicVariable).
// kind == kMatrix takes an explicit matrix (any other TensorFlow initializer, evaluated once).
#pragma once

#include <cmath>
#include <cstdint>
#include <string>

#include "addons/sparse_operation_kit/core/common.h"

namespace sok {

enum class InitKind : int32_t {
  kConstant = 0,         // a
  kUniform = 1,          // U[a, b)
  kNormal = 2,           // N(mean=a, stddev=b)
  kTruncatedNormal = 3,  // N(a, b) redrawn outside 2 stddev (TensorFlow's definition)
  kMatrix = 4,           // rows of `matrix` ([default_value_dim, dim], row-major)
};

// The kinds by name, in enum order: the ops' "init_kind" attribute spells them so, and
// sparse_operation_kit/runtime/schema.py lists the same names
// (tests/python/runtime/test_schema.py checks both).
inline constexpr const char* kInitKindNames[] = {"constant", "uniform", "normal",
                                                 "truncated_normal", "matrix"};
inline constexpr int kNumInitKinds =
    static_cast<int>(sizeof(kInitKindNames) / sizeof(kInitKindNames[0]));

static_assert(kNumInitKinds == static_cast<int>(InitKind::kMatrix) + 1, "one name per InitKind");

inline bool parse_init_kind(const std::string& name, InitKind* out) {
  for (int k = 0; k < kNumInitKinds; ++k) {
    if (name == kInitKindNames[k]) {
      *out = static_cast<InitKind>(k);
      return true;
    }
  }
  return false;
}

struct InitializerSpec {
  InitKind kind = InitKind::kConstant;
  float a = 0.f;
  float b = 0.f;
  uint64_t seed = 0;
  int64_t default_value_dim = 0;  // 0: every key its own row
  const float* matrix = nullptr;  // kMatrix only; device pointer on the GPU
};

// Uniform float in [0, 1) from 24 random bits of a counter hash.
SOK_HD float uniform01(uint64_t seed, uint64_t row, uint64_t col, uint64_t draw) {
  uint64_t h = mix64(seed ^ mix64(row ^ mix64(col * 0x100000001B3ull + draw)));
  return static_cast<float>(h >> 40) * (1.0f / 16777216.0f);
}

SOK_HD float standard_normal(uint64_t seed, uint64_t row, uint64_t col, uint64_t draw) {
  // Box-Muller on two independent counter draws; u1 in (0, 1] so log() is finite.
  float u1 = 1.0f - uniform01(seed, row, col, 2 * draw);
  float u2 = uniform01(seed, row, col, 2 * draw + 1);
  return sqrtf(-2.0f * logf(u1)) * cosf(6.28318530717958647692f * u2);
}

// Which row of the default-value matrix a key starts from.
template <typename K>
SOK_HD uint64_t init_row(const InitializerSpec& s, K key) {
  if (s.default_value_dim > 0) return static_cast<uint64_t>(floor_mod(key, s.default_value_dim));
  return static_cast<uint64_t>(static_cast<int64_t>(key));
}

template <typename K>
SOK_HD float initial_value(const InitializerSpec& s, K key, int64_t col, int64_t dim) {
  const uint64_t row = init_row(s, key);
  switch (s.kind) {
    case InitKind::kConstant: return s.a;
    case InitKind::kUniform:
      return s.a + (s.b - s.a) * uniform01(s.seed, row, static_cast<uint64_t>(col), 0);
    case InitKind::kNormal:
      return s.a + s.b * standard_normal(s.seed, row, static_cast<uint64_t>(col), 0);
    case InitKind::kTruncatedNormal: {
      float z = 0.f;
      for (uint64_t draw = 0; draw < 64; ++draw) {
        z = standard_normal(s.seed, row, static_cast<uint64_t>(col), draw);
        if (z > -2.f && z < 2.f) break;
      }
      if (!(z > -2.f && z < 2.f)) z = 0.f;  // 64 misses in a row: p ~ 1e-82
      return s.a + s.b * z;
    }
    case InitKind::kMatrix:
      return s.matrix[row * static_cast<uint64_t>(dim) + static_cast<uint64_t>(col)];
  }
  return 0.f;
}

template <typename K>
SOK_HD void initialize_row(const InitializerSpec& s, K key, float* out, int64_t dim) {
  for (int64_t c = 0; c < dim; ++c) out[c] = initial_value(s, key, c, dim);
}

}  // namespace sok
