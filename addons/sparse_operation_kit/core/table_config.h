// What a table is, independent of where it lives (CPU memory or GPU memory).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "addons/sparse_operation_kit/core/initializer.h"
#include "addons/sparse_operation_kit/core/optimizer.h"

namespace sok {

struct TableConfig {
  std::string name;              // for error messages
  int64_t dim = 0;
  InitializerSpec init;          // initial value of a newly inserted key
  std::vector<float> init_matrix;  // owns InitKind::kMatrix data ([default_value_dim, dim])
  // Counter filter (DeepRec CounterFilter): a key is admitted once it was looked up in training
  // `filter_freq` times; until then lookups read `default_value_no_permission` and updates skip it.
  int64_t filter_freq = 0;
  float default_value_no_permission = 0.f;
  // Eviction (DeepRec GlobalStepEvict / L2WeightEvict), applied by shrink().
  int64_t steps_to_live = 0;     // 0: never evict by age
  float l2_weight_threshold = -1.f;  // < 0: never evict by norm
  int64_t initial_capacity = 1024;
};

// Everything a table holds, in insertion order: what export produces and import consumes.
template <typename K>
struct TableSnapshot {
  int64_t dim = 0;
  int num_slots = 0;
  int slot_kind = -1;            // OptimizerKind that owns the slots; -1 none
  std::vector<float> slot_init;  // initial value of each slot for keys inserted later
  std::vector<K> keys;
  std::vector<float> values;  // [n, dim]
  std::vector<float> slots;   // [n, num_slots, dim]
  std::vector<int64_t> freqs;
  std::vector<int64_t> versions;
};

}  // namespace sok
