// CPU kernels of the lookup steps: dedup and pooled combine (forward and backward).
#include <vector>

#include "addons/sparse_operation_kit/core/lookup.h"
#include "addons/sparse_operation_kit/tf/kernels/embedding_variable_resource.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"

namespace tensorflow {
namespace sok_kernels {
namespace {

// Runs fn(i, inner) for every table: tables in parallel when there are several,
// otherwise the single table gets the whole pool.
template <typename Fn>
void ForEachTable(OpKernelContext* ctx, int n, const Fn& fn) {
  const sok::ParallelFor pf = CpuParallelFor(ctx);
  if (n == 1) {
    fn(0, pf);
    return;
  }
  const sok::ParallelFor serial(sok::serial_for);
  ParallelForTables(ctx, n, [&](int i) { fn(i, serial); });
}


}  // namespace

class UniqueKeysOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    OpInputList keys;
    OP_REQUIRES_OK(ctx, ctx->input_list("keys", &keys));
    const int n = keys.size();
    std::vector<Status> status(n);
    // Outputs are allocated inside the per-table work, so only after each table's size is known;
    // allocate_output is thread-safe for distinct indices.
    ForEachTable(ctx, n, [&](int i, const sok::ParallelFor&) {
      const Tensor& k = keys[i];
      const int64_t m = k.NumElements();
      Tensor* inverse = nullptr;
      status[i] = ctx->allocate_output(n + i, TensorShape({m}), &inverse);
      if (!status[i].ok()) return;
      auto run = [&](auto tag) {
        using K = decltype(tag);
        std::vector<K> uniq;
        std::vector<int64_t> counts;
        sok::unique_keys(k.flat<K>().data(), m, &uniq, inverse->flat<int32_t>().data(), &counts);
        const int64_t u = static_cast<int64_t>(uniq.size());
        Tensor *uo = nullptr, *co = nullptr;
        status[i] = ctx->allocate_output(i, TensorShape({u}), &uo);
        if (status[i].ok()) status[i] = ctx->allocate_output(2 * n + i, TensorShape({u}), &co);
        if (!status[i].ok()) return;
        std::copy(uniq.begin(), uniq.end(), uo->flat<K>().data());
        std::copy(counts.begin(), counts.end(), co->flat<int64_t>().data());
      };
      if (k.dtype() == DT_INT64) run(int64_t()); else run(int32_t());
    });
    for (const Status& s : status) OP_REQUIRES_OK(ctx, s);
  }
};

class PooledCombineOp : public OpKernel {
 public:
  explicit PooledCombineOp(OpKernelConstruction* c) : OpKernel(c) {
    int n;
    OP_REQUIRES_OK(c, c->GetAttr("N", &n));
    OP_REQUIRES_OK(c, ParseCombiners(c, n, &combiners_));
    OP_REQUIRES_OK(c, c->GetAttr("table_names", &names_));
    OP_REQUIRES(c, static_cast<int>(names_.size()) == n,
                errors::InvalidArgument(names_.size(), " table names for ", n, " tables"));
  }

  void Compute(OpKernelContext* ctx) override {
    OpInputList rows, inverse, segments, weights;
    OP_REQUIRES_OK(ctx, ctx->input_list("rows", &rows));
    OP_REQUIRES_OK(ctx, ctx->input_list("inverse", &inverse));
    OP_REQUIRES_OK(ctx, ctx->input_list("segment_ids", &segments));
    OP_REQUIRES_OK(ctx, ctx->input_list("weights", &weights));
    const Tensor& batch_sizes = ctx->input(4 * rows.size());
    const int n = rows.size();
    OP_REQUIRES(ctx, batch_sizes.NumElements() == n,
                errors::InvalidArgument(batch_sizes.NumElements(), " batch sizes for ", n, " tables"));
    std::vector<Tensor*> outs(n);
    for (int i = 0; i < n; ++i) {
      const int64_t m = inverse[i].NumElements();
      OP_REQUIRES(ctx, rows[i].dims() == 2,
                  errors::InvalidArgument("rows of table '", names_[i], "' must be a matrix"));
      OP_REQUIRES(ctx, segments[i].NumElements() == m,
                  errors::InvalidArgument("table '", names_[i], "': ", segments[i].NumElements(),
                                          " sample indices for ", m, " ids"));
      OP_REQUIRES(ctx, weights[i].NumElements() == 0 || weights[i].NumElements() == m,
                  errors::InvalidArgument("table '", names_[i], "': ", weights[i].NumElements(),
                                          " weights for ", m, " ids"));
      const int64_t b = batch_sizes.flat<int64_t>()(i);
      OP_REQUIRES(ctx, b >= 0,
                  errors::InvalidArgument("table '", names_[i], "': negative batch size ", b));
      OP_REQUIRES_OK(ctx, ctx->allocate_output(i, TensorShape({b, rows[i].dim_size(1)}), &outs[i]));
    }
    // The index check runs with each table's combine, tables in parallel.
    std::vector<Status> status(n);
    ForEachTable(ctx, n, [&](int i, const sok::ParallelFor& pf) {
      status[i] = ToTf(sok::check_lookup_indices(names_[i], inverse[i].flat<int32_t>().data(),
                                                 segments[i].flat<int64_t>().data(),
                                                 inverse[i].NumElements(), rows[i].dim_size(0),
                                                 outs[i]->dim_size(0)));
      if (!status[i].ok()) return;
      sok::pooled_forward(rows[i].flat<float>().data(), rows[i].dim_size(1),
                          inverse[i].flat<int32_t>().data(), segments[i].flat<int64_t>().data(),
                          weights[i].NumElements() ? weights[i].flat<float>().data() : nullptr,
                          inverse[i].NumElements(), outs[i]->dim_size(0), combiners_[i],
                          outs[i]->flat<float>().data(), pf);
    });
    for (const Status& st : status) OP_REQUIRES_OK(ctx, st);
  }

 private:
  std::vector<sok::Combiner> combiners_;
  std::vector<std::string> names_;
};

class PooledCombineGradOp : public OpKernel {
 public:
  explicit PooledCombineGradOp(OpKernelConstruction* c) : OpKernel(c) {
    int n;
    OP_REQUIRES_OK(c, c->GetAttr("N", &n));
    OP_REQUIRES_OK(c, ParseCombiners(c, n, &combiners_));
  }

  void Compute(OpKernelContext* ctx) override {
    OpInputList grads, inverse, segments, weights;
    OP_REQUIRES_OK(ctx, ctx->input_list("grads", &grads));
    OP_REQUIRES_OK(ctx, ctx->input_list("inverse", &inverse));
    OP_REQUIRES_OK(ctx, ctx->input_list("segment_ids", &segments));
    OP_REQUIRES_OK(ctx, ctx->input_list("weights", &weights));
    const Tensor& num_rows = ctx->input(4 * grads.size());
    const int n = grads.size();
    std::vector<Tensor*> outs(n);
    for (int i = 0; i < n; ++i) {
      OP_REQUIRES_OK(ctx, ctx->allocate_output(
                              i, TensorShape({num_rows.flat<int64_t>()(i), grads[i].dim_size(1)}), &outs[i]));
    }
    ForEachTable(ctx, n, [&](int i, const sok::ParallelFor& pf) {
      sok::pooled_backward(grads[i].flat<float>().data(), grads[i].dim_size(1),
                           inverse[i].flat<int32_t>().data(), segments[i].flat<int64_t>().data(),
                           weights[i].NumElements() ? weights[i].flat<float>().data() : nullptr,
                           inverse[i].NumElements(), grads[i].dim_size(0), combiners_[i],
                           outs[i]->dim_size(0), outs[i]->flat<float>().data(), pf);
    });
  }

 private:
  std::vector<sok::Combiner> combiners_;
};

REGISTER_KERNEL_BUILDER(Name("SokUniqueKeys").Device(DEVICE_CPU), UniqueKeysOp);
REGISTER_KERNEL_BUILDER(Name("SokPooledCombine").Device(DEVICE_CPU), PooledCombineOp);
REGISTER_KERNEL_BUILDER(Name("SokPooledCombineGrad").Device(DEVICE_CPU), PooledCombineGradOp);

}  // namespace sok_kernels
}  // namespace tensorflow
