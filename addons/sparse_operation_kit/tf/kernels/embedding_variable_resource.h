// The Embedding Variable as a TensorFlow resource: a thin owner of a core table on either device,
// and the attribute parsing every kernel shares.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_join.h"
#include "addons/sparse_operation_kit/core/lookup.h"
#include "addons/sparse_operation_kit/core/table.h"
#include "addons/sparse_operation_kit/tf/kernels/device.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"

namespace tensorflow {
namespace sok_kernels {

template <typename K>
class EmbeddingVariableResource : public ResourceBase {
 public:
  EmbeddingVariableResource(std::unique_ptr<sok::Table<K>> table, std::shared_ptr<void> keep_alive)
      : keep_alive_(std::move(keep_alive)), table_(std::move(table)) {}
  std::string DebugString() const override { return "EmbeddingVariable '" + table_->name() + "'"; }
  sok::Table<K>* table() { return table_.get(); }

 private:
  std::shared_ptr<void> keep_alive_;  // declared first: outlives the table (e.g. its allocator)
  std::unique_ptr<sok::Table<K>> table_;
};

// The table behind a handle; a missing one or one of another key dtype gets an error naming the
// variable.
template <typename K>
Status LookupTable(OpKernelContext* ctx, const ResourceHandle& handle,
                   core::RefCountPtr<EmbeddingVariableResource<K>>* out) {
  Status s = LookupResource(ctx, handle, out);
  if (!s.ok()) {
    return errors::FailedPrecondition(
        "Embedding Variable '", handle.name(), "' is not initialized on ", ctx->device()->name(),
        ", or its key dtype is not ", DataTypeString(DataTypeToEnum<K>::v()),
        " (run its initializer first): ", s.message());
  }
  return OkStatus();
}

// The storage attributes of SokEmbeddingVariableInitialize (the Python StorageOption checked
// them already; graphs made elsewhere get the same refusals here).
inline Status ParseStorage(OpKernelConstruction* c, sok::TableConfig* config) {
  std::string type, strategy;
  std::vector<int64_t> sizes;
  TF_RETURN_IF_ERROR(c->GetAttr("storage_type", &type));
  TF_RETURN_IF_ERROR(c->GetAttr("storage_path", &config->storage_path));
  TF_RETURN_IF_ERROR(c->GetAttr("storage_size", &sizes));
  TF_RETURN_IF_ERROR(c->GetAttr("cache_strategy", &strategy));
  const std::string where = "Embedding Variable '" + config->name + "': ";
  if (!sok::parse_storage_kind(type, &config->storage)) {
    return errors::InvalidArgument(
        where, "storage_type '", type,
        "' is not supported (supported: DRAM, DRAM_SSDHASH on the CPU, DRAM, HBM, HBM_DRAM, "
        "HBM_DRAM_SSDHASH on the GPU)");
  }
  if (!sok::parse_cache_strategy(strategy, &config->cache_strategy)) {
    return errors::InvalidArgument(where, "unknown cache_strategy '", strategy, "'");
  }
  const size_t cached = sok::cached_tiers(config->storage);
  if (sizes.size() != cached) {
    return errors::InvalidArgument(where, "storage_size has ", sizes.size(), " entries, but ", type,
                                   " has ", cached, " cached tier(s)");
  }
  // Top tier first: HBM_DRAM* start with the GPU tier's budget, then the host tier's.
  const bool hbm = config->storage == sok::StorageKind::kHbmDram ||
                   config->storage == sok::StorageKind::kHbmDramSsdHash;
  if (cached > 0) (hbm ? config->hbm_bytes : config->dram_bytes) = sizes[0];
  if (cached > 1) config->dram_bytes = sizes[1];
  if (!sok::has_ssd_tier(config->storage) && !config->storage_path.empty()) {
    return errors::InvalidArgument(where, "storage_path is given but ", type, " has no SSD tier");
  }
  return OkStatus();
}

// The attributes of SokEmbeddingVariableInitialize as a TableConfig.
inline Status ParseTableConfig(OpKernelConstruction* c, sok::TableConfig* config) {
  std::string kind;
  int64_t seed;
  TF_RETURN_IF_ERROR(c->GetAttr("table_name", &config->name));
  TF_RETURN_IF_ERROR(c->GetAttr("dim", &config->dim));
  TF_RETURN_IF_ERROR(c->GetAttr("init_kind", &kind));
  if (!sok::parse_init_kind(kind, &config->init.kind)) {
    return errors::InvalidArgument("unknown initializer kind '", kind, "' for '", config->name,
                                   "' (expected ", absl::StrJoin(sok::kInitKindNames, ", "), ")");
  }
  TF_RETURN_IF_ERROR(c->GetAttr("init_a", &config->init.a));
  TF_RETURN_IF_ERROR(c->GetAttr("init_b", &config->init.b));
  TF_RETURN_IF_ERROR(c->GetAttr("seed", &seed));
  config->init.seed = static_cast<uint64_t>(seed);
  TF_RETURN_IF_ERROR(c->GetAttr("default_value_dim", &config->init.default_value_dim));
  TF_RETURN_IF_ERROR(c->GetAttr("filter_freq", &config->filter_freq));
  TF_RETURN_IF_ERROR(
      c->GetAttr("default_value_no_permission", &config->default_value_no_permission));
  TF_RETURN_IF_ERROR(c->GetAttr("steps_to_live", &config->steps_to_live));
  TF_RETURN_IF_ERROR(c->GetAttr("l2_weight_threshold", &config->l2_weight_threshold));
  return ParseStorage(c, config);
}

// The "combiners" attribute.
inline Status ParseCombiners(OpKernelConstruction* c, int n, std::vector<sok::Combiner>* out) {
  std::vector<std::string> names;
  TF_RETURN_IF_ERROR(c->GetAttr("combiners", &names));
  if (static_cast<int>(names.size()) != n) {
    return errors::InvalidArgument(names.size(), " combiners for ", n, " tables");
  }
  for (const std::string& name : names) {
    sok::Combiner comb;
    if (!sok::parse_combiner(name, &comb)) {
      return errors::InvalidArgument("unknown combiner '", name,
                                     "': expected 'sum', 'mean' or 'sqrtn'");
    }
    out->push_back(comb);
  }
  return OkStatus();
}

// The hyperparameter attributes of SokEmbeddingVariableSparseApply.
inline Status ParseOptimizerParams(OpKernelConstruction* c, sok::OptimizerParams* p,
                                   bool* keys_unique) {
  std::string opt;
  TF_RETURN_IF_ERROR(c->GetAttr("optimizer", &opt));
  if (!sok::parse_optimizer(opt, &p->kind)) {
    return errors::InvalidArgument("unknown optimizer '", opt, "' (expected ",
                                   absl::StrJoin(sok::kOptimizerNames, ", "), ")");
  }
  TF_RETURN_IF_ERROR(c->GetAttr("beta1", &p->beta1));
  TF_RETURN_IF_ERROR(c->GetAttr("beta2", &p->beta2));
  TF_RETURN_IF_ERROR(c->GetAttr("epsilon", &p->epsilon));
  TF_RETURN_IF_ERROR(c->GetAttr("initial_accumulator", &p->initial_accumulator));
  TF_RETURN_IF_ERROR(c->GetAttr("l1", &p->l1));
  TF_RETURN_IF_ERROR(c->GetAttr("l2", &p->l2));
  TF_RETURN_IF_ERROR(c->GetAttr("lr_power", &p->lr_power));
  TF_RETURN_IF_ERROR(c->GetAttr("keys_unique", keys_unique));
  return OkStatus();
}

}  // namespace sok_kernels
}  // namespace tensorflow
