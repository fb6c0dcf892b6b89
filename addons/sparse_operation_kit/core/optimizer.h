// Sparse optimizer update rules, written once as per-row functions that the CPU loop and the
// CUDA kernel both call. A row is [value(dim) | slot 0 (dim) | slot 1 (dim) ...]; `grad` is the
// already-aggregated gradient of that key (duplicates summed first, as TensorFlow's optimizers do).
#pragma once

#include <cmath>
#include <cstdint>
#include <string>

#include "addons/sparse_operation_kit/core/common.h"

namespace sok {

enum class OptimizerKind : int32_t { kSGD = 0, kAdagrad = 1, kAdam = 2, kFtrl = 3 };

struct OptimizerParams {
  OptimizerKind kind = OptimizerKind::kSGD;
  float lr = 0.01f;
  float beta1 = 0.9f;    // Adam
  float beta2 = 0.999f;  // Adam
  float epsilon = 0.f;   // Adagrad (Keras: 1e-7, inside the sqrt; tf.compat.v1: 0), Adam
  float initial_accumulator = 0.1f;  // Adagrad, FTRL
  float l1 = 0.f;                    // FTRL
  float l2 = 0.f;                    // FTRL
  float lr_power = -0.5f;            // FTRL
  int64_t step = 1;                  // Adam: 1-based step count t used for bias correction
};

SOK_HD int num_slots(OptimizerKind k) {
  switch (k) {
    case OptimizerKind::kSGD: return 0;
    case OptimizerKind::kAdagrad: return 1;  // accumulator
    case OptimizerKind::kAdam: return 2;     // m, v
    case OptimizerKind::kFtrl: return 2;     // accumulator, linear
  }
  return 0;
}

SOK_HD float slot_initial_value(const OptimizerParams& p, int slot) {
  switch (p.kind) {
    case OptimizerKind::kAdagrad: return p.initial_accumulator;
    case OptimizerKind::kFtrl: return slot == 0 ? p.initial_accumulator : 0.f;
    default: return 0.f;
  }
}

// Host-only helpers (names, the slot rule).
// The optimizers by name, in enum order: the ops' "optimizer" attribute spells them so, and
// sparse_operation_kit/runtime/schema.py lists the same names
// (tests/python/runtime/test_schema.py checks both).
inline constexpr const char* kOptimizerNames[] = {"sgd", "adagrad", "adam", "ftrl"};
inline constexpr int kNumOptimizers =
    static_cast<int>(sizeof(kOptimizerNames) / sizeof(kOptimizerNames[0]));
static_assert(kNumOptimizers == static_cast<int>(OptimizerKind::kFtrl) + 1,
              "one name per OptimizerKind");

inline const char* optimizer_name(int kind) {
  return kind >= 0 && kind < kNumOptimizers ? kOptimizerNames[kind] : "unknown";
}

inline bool parse_optimizer(const std::string& name, OptimizerKind* out) {
  for (int k = 0; k < kNumOptimizers; ++k) {
    if (name == kOptimizerNames[k]) {
      *out = static_cast<OptimizerKind>(k);
      return true;
    }
  }
  return false;
}

// What a table whose rows carry `num_slots` slots owned by optimizer `slot_kind` (-1: unknown,
// e.g. restored from a checkpoint) does before optimizer `kind` first updates it. One rule for
// the CPU and the GPU table.
enum class SlotPlan { kKeep, kAdopt, kRelayout };
inline bool plan_slots(const std::string& table, int slot_kind, int num_slots, OptimizerKind kind,
                       SlotPlan* plan, std::string* error) {
  const int want = sok::num_slots(kind);
  const int k = static_cast<int>(kind);
  if (slot_kind == k && num_slots == want) {
    *plan = SlotPlan::kKeep;
  } else if (slot_kind == -1 && num_slots == want && want > 0) {
    *plan = SlotPlan::kAdopt;  // restored rows whose slots this optimizer now owns
  } else if (num_slots != 0 && slot_kind != -1) {
    *error = "table '" + table + "' already carries the slots of optimizer " +
             optimizer_name(slot_kind) + "; it cannot also be trained by optimizer " +
             optimizer_name(k);
    return false;
  } else if (num_slots != 0 && num_slots != want) {
    *error = "table '" + table + "' was restored with " + std::to_string(num_slots) +
             " optimizer slots but its optimizer needs " + std::to_string(want);
    return false;
  } else {
    *plan = SlotPlan::kRelayout;  // [value] -> [value | slots at their initial value]
  }
  return true;
}

// Adam's step size with bias correction, computed once per call rather than per element.
SOK_HD float adam_step_size(const OptimizerParams& p) {
  const double t = static_cast<double>(p.step);
  return static_cast<float>(p.lr * sqrt(1.0 - pow(static_cast<double>(p.beta2), t)) /
                            (1.0 - pow(static_cast<double>(p.beta1), t)));
}

// Updates element c of one row. `alpha` is adam_step_size(p) (unused by the others).
SOK_HD void apply_element(const OptimizerParams& p, float alpha, float* value, float* slots,
                          int64_t dim, int64_t c, float g) {
  switch (p.kind) {
    case OptimizerKind::kSGD: value[c] -= p.lr * g; break;
    case OptimizerKind::kAdagrad: {
      float acc = slots[c] + g * g;
      slots[c] = acc;
      value[c] -= p.lr * g / sqrtf(acc + p.epsilon);  // Keras's form (TF1's epsilon is 0)
      break;
    }
    case OptimizerKind::kAdam: {
      float m = p.beta1 * slots[c] + (1.f - p.beta1) * g;
      float v = p.beta2 * slots[dim + c] + (1.f - p.beta2) * g * g;
      slots[c] = m;
      slots[dim + c] = v;
      value[c] -= alpha * m / (sqrtf(v) + p.epsilon);
      break;
    }
    case OptimizerKind::kFtrl: {
      // TensorFlow's ApplyFtrl (l2_shrinkage = 0).
      float acc = slots[c];
      float acc_new = acc + g * g;
      float sigma = (powf(acc_new, -p.lr_power) - powf(acc, -p.lr_power)) / p.lr;
      float linear = slots[dim + c] + g - sigma * value[c];
      float quadratic = powf(acc_new, -p.lr_power) / p.lr + 2.f * p.l2;
      float l1_clipped = linear > p.l1 ? p.l1 : (linear < -p.l1 ? -p.l1 : linear);
      value[c] = (fabsf(linear) > p.l1) ? (l1_clipped - linear) / quadratic : 0.f;
      slots[c] = acc_new;
      slots[dim + c] = linear;
      break;
    }
  }
}

// The same arithmetic as apply_element, with the kind switch hoisted out of the column loop so
// the CPU compiler vectorises the loops (bit-identical results: same operations, same order).
SOK_HD void apply_row(const OptimizerParams& p, float alpha, float* row, int64_t dim,
                      const float* grad) {
  float* __restrict__ value = row;
  float* __restrict__ s0 = row + dim;
  const float* __restrict__ g = grad;
  switch (p.kind) {
    case OptimizerKind::kSGD:
      for (int64_t c = 0; c < dim; ++c) value[c] -= p.lr * g[c];
      return;
    case OptimizerKind::kAdagrad:
      for (int64_t c = 0; c < dim; ++c) {
        const float acc = s0[c] + g[c] * g[c];
        s0[c] = acc;
        value[c] -= p.lr * g[c] / sqrtf(acc + p.epsilon);
      }
      return;
    case OptimizerKind::kAdam: {
      float* __restrict__ s1 = row + 2 * dim;
      for (int64_t c = 0; c < dim; ++c) {
        const float m = p.beta1 * s0[c] + (1.f - p.beta1) * g[c];
        const float v = p.beta2 * s1[c] + (1.f - p.beta2) * g[c] * g[c];
        s0[c] = m;
        s1[c] = v;
        value[c] -= alpha * m / (sqrtf(v) + p.epsilon);
      }
      return;
    }
    default:
      for (int64_t c = 0; c < dim; ++c) apply_element(p, alpha, row, row + dim, dim, c, grad[c]);
  }
}

}  // namespace sok
