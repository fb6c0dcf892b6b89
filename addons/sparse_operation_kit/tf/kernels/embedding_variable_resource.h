// The Embedding Variable as a TensorFlow resource: a thin owner of a core table.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "addons/sparse_operation_kit/core/embedding_table.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/platform/threadpool.h"

namespace tensorflow {
namespace sok_kernels {

template <typename K>
class EmbeddingVariableResource : public ResourceBase {
 public:
  explicit EmbeddingVariableResource(sok::TableConfig config)
      : table_(std::make_unique<sok::EmbeddingTable<K>>(std::move(config))) {}
  std::string DebugString() const override {
    return "EmbeddingVariable '" + table_->config().name + "'";
  }
  sok::EmbeddingTable<K>* table() { return table_.get(); }

 private:
  std::unique_ptr<sok::EmbeddingTable<K>> table_;
};

inline Status ToTf(const sok::Status& s) {
  return s.ok() ? OkStatus() : errors::InvalidArgument(s.message());
}

// TensorFlow's CPU worker pool, handed to the core as its ParallelFor.
inline sok::ParallelFor CpuParallelFor(OpKernelContext* ctx) {
  thread::ThreadPool* pool = ctx->device()->tensorflow_cpu_worker_threads()->workers;
  return [pool](int64_t total, int64_t cost, const sok::RangeFn& fn) {
    pool->ParallelFor(total, cost, [&fn](int64_t b, int64_t e) { fn(b, e); });
  };
}

// Runs fn(i) for every table i on TensorFlow's CPU worker pool, one table per task (the calling
// thread takes tasks too): a slow or preempted worker then holds up at most one table.
inline void ParallelForTables(OpKernelContext* ctx, int n, const std::function<void(int)>& fn) {
  thread::ThreadPool* pool = ctx->device()->tensorflow_cpu_worker_threads()->workers;
  pool->ParallelFor(n, thread::ThreadPool::SchedulingParams::Fixed(1), [&fn](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) fn(static_cast<int>(i));
  });
}

// Looks up the table behind input `index` (or list element); a missing one or one of another
// key dtype gets an error naming the variable.
template <typename K>
Status LookupTable(OpKernelContext* ctx, const ResourceHandle& handle,
                   core::RefCountPtr<EmbeddingVariableResource<K>>* out) {
  Status s = LookupResource(ctx, handle, out);
  if (!s.ok()) {
    return errors::FailedPrecondition("Embedding Variable '", handle.name(),
                                      "' is not initialized, or its key dtype is not ",
                                      DataTypeString(DataTypeToEnum<K>::v()),
                                      " (run its initializer first): ", s.message());
  }
  return OkStatus();
}

}  // namespace sok_kernels
}  // namespace tensorflow
