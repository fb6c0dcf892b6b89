// SokUniqueKeys (tf/ops/lookup_ops.cc), the lookup's dedup, written once for the CPU and the
// GPU: each table's distinct keys, inverse and counts, and the checks of its ids' positions. The
// kernel validates and allocates; DedupOn<Device> only calls the core (core/lookup.h on the
// CPU, core/cuda/gpu_api.h on the GPU).
#include <algorithm>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "addons/sparse_operation_kit/core/lookup.h"
#include "addons/sparse_operation_kit/tf/kernels/device.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"

namespace tensorflow {
namespace sok_kernels {
namespace {

// One table of SokUniqueKeys: its inputs, outputs and what the dedup found.
struct UniqueArgs {
  const Tensor* keys;
  Tensor* inverse;      // output [n]
  Tensor uniq, counts;  // scratch [n]: the outputs are their leading num_unique entries
  const Tensor* positions = nullptr;    // [n, r] (M == N), else null: no checks
  const Tensor* dense_shape = nullptr;  // [r], host memory
  int64_t num_unique = 0;
  sok::PositionsCheck check;
};

// One table whose ids must be listed in sample order (its samples decrease somewhere).
struct OrderArgs {
  const Tensor* positions;
  int64_t num_samples;
  Tensor* order;  // output [n]
};

template <typename Device>
struct DedupOn;

template <>
struct DedupOn<CpuDevice> {
  struct State {};  // what a kernel keeps between calls: nothing on the CPU

  // Each table's dedup and position checks; valid[i] = table i's distinct keys, -1 for bad
  // positions. padded: the outputs keep every entry (the GPU's shape: it does not wait for the
  // counts), the tails past the distinct keys zeros here. Every consumer reads only the first
  // valid[i] entries: on the GPU the counts' tails are zeros too, the keys' tails unwritten.
  static Status Unique(OpKernelContext* ctx, std::vector<UniqueArgs>* tables, Tensor* valid,
                       bool padded, State*) {
    OnDevice<CpuDevice>::ForEachTable(ctx, tables->size(), [&](int i, const sok::ExecContext&) {
      UniqueArgs& a = (*tables)[i];
      auto run = [&](auto tag) {
        using K = decltype(tag);
        a.num_unique = sok::unique_keys(a.keys->flat<K>().data(), a.keys->NumElements(),
                                        a.uniq.flat<K>().data(), a.inverse->flat<int32_t>().data(),
                                        a.counts.flat<int64_t>().data());
      };
      if (a.keys->dtype() == DT_INT64) run(int64_t());
      else run(int32_t());
      if (a.positions != nullptr) {
        a.check =
            sok::check_positions(a.positions->flat<int64_t>().data(), a.keys->NumElements(),
                                 a.positions->dim_size(1), a.dense_shape->flat<int64_t>().data());
      }
    });
    for (size_t i = 0; i < tables->size(); ++i) {
      const UniqueArgs& a = (*tables)[i];
      valid->flat<int64_t>()(i) = a.check.first_outside >= 0 ? -1 : a.num_unique;
    }
    if (!padded) return OkStatus();
    for (UniqueArgs& a : *tables) {
      const int64_t u = a.num_unique, n = a.keys->NumElements();
      auto bytes = a.uniq.tensor_data();
      const size_t width = DataTypeSize(a.uniq.dtype());
      std::memset(const_cast<char*>(bytes.data()) + u * width, 0, (n - u) * width);
      std::fill(a.counts.flat<int64_t>().data() + u, a.counts.flat<int64_t>().data() + n, 0);
      a.num_unique = n;
    }
    return OkStatus();
  }

  static Status Order(OpKernelContext* ctx, const std::vector<OrderArgs>& tables) {
    OnDevice<CpuDevice>::ForEachTable(ctx, tables.size(), [&](int i, const sok::ExecContext&) {
      const OrderArgs& a = tables[i];
      sok::stable_sample_order(a.positions->flat<int64_t>().data(), a.positions->dim_size(0),
                               a.positions->dim_size(1), a.order->flat<int32_t>().data());
    });
    return OkStatus();
  }

  // Row `id` of positions [n, r].
  static Status ReadIndex(OpKernelContext*, const Tensor& positions, int64_t id,
                          std::vector<int64_t>* index) {
    const int64_t r = positions.dim_size(1);
    const int64_t* row = positions.flat<int64_t>().data() + id * r;
    index->assign(row, row + r);
    return OkStatus();
  }
};

#if GOOGLE_CUDA
template <>
struct DedupOn<GpuDevice> {
  using State = UploadStaging;

  // The distinct counts (and the checks) are only known on the device: every table is
  // deduplicated and checked by one set of launches per key dtype, the distinct counts copied to
  // valid (device), then, unless padded, the per-table reports come back with ONE copy and ONE
  // synchronisation.
  static Status Unique(OpKernelContext* ctx, std::vector<UniqueArgs>* tables, Tensor* valid,
                       bool padded, State* state) {
    const int n = tables->size();
    const cudaStream_t stream = OnDevice<GpuDevice>::Stream(ctx);
    TfDeviceAllocator alloc(ctx->get_allocator(AllocatorAttributes()));
    std::vector<sok::gpu::UniqueTable> spans(n);
    for (int i = 0; i < n; ++i) {
      UniqueArgs& a = (*tables)[i];
      sok::gpu::UniqueTable& t = spans[i];
      t.keys_int64 = a.keys->dtype() == DT_INT64;
      t.keys = a.keys->tensor_data().data();
      t.n = a.keys->NumElements();
      t.unique = const_cast<char*>(a.uniq.tensor_data().data());
      t.inverse = a.inverse->flat<int32_t>().data();
      t.counts = a.counts.flat<int64_t>().data();
      if (a.positions != nullptr) {
        t.positions = a.positions->flat<int64_t>().data();
        t.rank = static_cast<int>(a.positions->dim_size(1));
        t.dense_shape = a.dense_shape->flat<int64_t>().data();
      }
    }
    Tensor reports_t;
    sok::gpu::UniqueTableReport* d_reports;
    TF_RETURN_IF_ERROR(DeviceScratch(ctx, n, &reports_t, &d_reports));
    const int64_t staging = std::max<int64_t>(sok::gpu::unique_keys_multi_staging_bytes(spans), 1);
    void* upload;
    UploadBuffer buffer;  // exact: alive until the sync below
    TF_RETURN_IF_ERROR(buffer.Get(ctx, state, padded, staging, &upload));
    TF_RETURN_IF_ERROR(buffer.Done(
        ToTf(sok::gpu::unique_keys_multi(spans, d_reports, stream, &alloc, upload)), stream));
    TF_RETURN_IF_ERROR(
        ToTf(sok::gpu::unique_valid_counts(d_reports, n, valid->flat<int64_t>().data(), stream)));
    if (padded) {
      for (UniqueArgs& a : *tables) a.num_unique = a.keys->NumElements();
      return OkStatus();
    }
    std::vector<sok::gpu::UniqueTableReport> reports(n);
    tsl::profiler::TraceMe wait("SokUniqueKeys waits for the distinct counts");
    TF_RETURN_IF_ERROR(
        CudaCall(cudaMemcpyAsync(reports.data(), d_reports, n * sizeof(sok::gpu::UniqueTableReport),
                                 cudaMemcpyDeviceToHost, stream),
                 "reading the number of distinct keys"));
    TF_RETURN_IF_ERROR(
        CudaCall(cudaStreamSynchronize(stream), "reading the number of distinct keys"));
    for (int i = 0; i < n; ++i) {
      UniqueArgs& a = (*tables)[i];
      a.num_unique = reports[i].num_unique;
      a.check.first_outside = reports[i].first_outside;
      a.check.first_unordered = reports[i].first_unordered;
    }
    return OkStatus();
  }

  static Status Order(OpKernelContext* ctx, const std::vector<OrderArgs>& tables) {
    TfDeviceAllocator alloc(ctx->get_allocator(AllocatorAttributes()));
    std::vector<sok::gpu::SampleOrderTable> spans(tables.size());
    for (size_t i = 0; i < tables.size(); ++i) {
      spans[i].positions = tables[i].positions->flat<int64_t>().data();
      spans[i].n = tables[i].positions->dim_size(0);
      spans[i].rank = static_cast<int>(tables[i].positions->dim_size(1));
      spans[i].num_samples = tables[i].num_samples;
      spans[i].order = tables[i].order->flat<int32_t>().data();
    }
    return ToTf(
        sok::gpu::stable_sample_order_multi(spans, OnDevice<GpuDevice>::Stream(ctx), &alloc));
  }

  // Row `id` of positions [n, r] (error path only: a second copy and sync).
  static Status ReadIndex(OpKernelContext* ctx, const Tensor& positions, int64_t id,
                          std::vector<int64_t>* index) {
    const int64_t r = positions.dim_size(1);
    index->resize(r);
    const cudaStream_t stream = OnDevice<GpuDevice>::Stream(ctx);
    TF_RETURN_IF_ERROR(
        CudaCall(cudaMemcpyAsync(index->data(), positions.flat<int64_t>().data() + id * r,
                                 r * sizeof(int64_t), cudaMemcpyDeviceToHost, stream),
                 "reading a bad index"));
    return CudaCall(cudaStreamSynchronize(stream), "reading a bad index");
  }
};
#endif  // GOOGLE_CUDA

std::string JoinIndex(const int64_t* v, int64_t r) {
  std::string s = "[";
  for (int64_t d = 0; d < r; ++d) s += (d ? ", " : "") + std::to_string(v[d]);
  return s + "]";
}

template <typename Device>
class UniqueKeysOp : public SokOpKernel<Device> {
 public:
  explicit UniqueKeysOp(OpKernelConstruction* c) : SokOpKernel<Device>(c) {
    int n;
    OP_REQUIRES_OK(c, c->GetAttr("N", &n));
    OP_REQUIRES_OK(c, TableNames(c, n, &names_));
    OP_REQUIRES_OK(c, c->GetAttr("padded", &padded_));
    OP_REQUIRES_OK(c, c->GetAttr("defer_position_errors", &defer_));
  }

 protected:
  void ComputeOnDevice(OpKernelContext* ctx) override {
    OpInputList keys, positions, dense_shapes;
    OP_REQUIRES_OK(ctx, ctx->input_list("keys", &keys));
    OP_REQUIRES_OK(ctx, ctx->input_list("positions", &positions));
    OP_REQUIRES_OK(ctx, ctx->input_list("dense_shapes", &dense_shapes));
    const int n = keys.size(), m = positions.size();
    OP_REQUIRES(ctx, m == 0 || m == n,
                errors::InvalidArgument("SokUniqueKeys: ", m, " position tensors for ", n,
                                        " tables (0 or one per table)"));
    std::vector<UniqueArgs> tables(n);
    std::vector<TensorShape> inverse_shapes;
    for (int i = 0; i < n; ++i) {
      const int64_t k = keys[i].NumElements();
      OP_REQUIRES(ctx, k <= std::numeric_limits<int32_t>::max(),
                  errors::InvalidArgument("SokUniqueKeys: table '", names_[i], "' has ", k,
                                          " ids, more than 2^31 - 1"));
      UniqueArgs& a = tables[i];
      a.keys = &keys[i];
      if (m && !DenseIds(positions[i])) {
        OP_REQUIRES(ctx, !padded_,
                    errors::InvalidArgument("SokUniqueKeys: padded needs dense ids, table '",
                                            names_[i], "' has positions to check"));
        OP_REQUIRES_OK(ctx, CheckPositions(names_[i], k, positions[i], dense_shapes[i]));
        a.positions = &positions[i];
        a.dense_shape = &dense_shapes[i];
      }
      inverse_shapes.push_back(TensorShape({k}));
    }
    std::vector<Tensor*> inverse;
    OP_REQUIRES_OK(ctx, AllocateTableOutputs<Device>(ctx, n, DT_INT32, inverse_shapes, &inverse));
    for (int i = 0; i < n; ++i) tables[i].inverse = inverse[i];
    OP_REQUIRES_OK(ctx, AllocateScratch(ctx, keys, &tables));
    Tensor* valid;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(3 * n + m + 1, TensorShape({n}), &valid));
    OP_REQUIRES_OK(ctx, DedupOn<Device>::Unique(ctx, &tables, valid, padded_, &state_));
    for (int i = 0; !defer_ && i < m; ++i) {  // the first bad table (deferred: the exchange's)
      if (tables[i].check.first_outside < 0) continue;
      std::vector<int64_t> index;
      OP_REQUIRES_OK(ctx, DedupOn<Device>::ReadIndex(ctx, positions[i],
                                                     tables[i].check.first_outside, &index));
      const int64_t r = dense_shapes[i].NumElements();
      ctx->CtxFailure(errors::InvalidArgument(
          "lookup_sparse: ids of table '", names_[i],
          "': an index is negative or beyond dense_shape: index ", JoinIndex(index.data(), r),
          " for dense_shape ", JoinIndex(dense_shapes[i].flat<int64_t>().data(), r)));
      return;
    }
    // The outputs are the leading num_unique entries of the scratch (padded: all): views.
    for (int i = 0; i < n; ++i) {
      ctx->set_output(i, tables[i].uniq.Slice(0, tables[i].num_unique));
      ctx->set_output(2 * n + i, tables[i].counts.Slice(0, tables[i].num_unique));
    }
    std::vector<OrderArgs> unordered;
    for (int i = 0; i < m; ++i) {
      const bool ordered = tables[i].positions == nullptr || tables[i].check.first_unordered < 0 ||
                           tables[i].check.first_outside >= 0;  // deferred error: no order
      Tensor* order;
      OP_REQUIRES_OK(
          ctx, ctx->allocate_output(3 * n + i, TensorShape({ordered ? 0 : keys[i].NumElements()}),
                                    &order));
      if (!ordered) {
        unordered.push_back(OrderArgs{&positions[i], dense_shapes[i].flat<int64_t>()(0), order});
      }
    }
    if (!unordered.empty()) OP_REQUIRES_OK(ctx, DedupOn<Device>::Order(ctx, unordered));
    Tensor* batch_sizes;  // HostMemory
    OP_REQUIRES_OK(ctx, ctx->allocate_output(3 * n + m, TensorShape({m}), &batch_sizes));
    for (int i = 0; i < m; ++i) {
      batch_sizes->flat<int64_t>()(i) =
          dense_shapes[i].NumElements() > 0 ? dense_shapes[i].flat<int64_t>()(0) : -1;
    }
  }

 private:
  // positions [0, 0]: the table's ids are a dense [batch, k] tensor (lookup_sparse of dense
  // ids), in sample order and within their shape by construction: nothing to check or order.
  static bool DenseIds(const Tensor& positions) {
    return positions.dims() == 2 && positions.dim_size(0) == 0 && positions.dim_size(1) == 0;
  }

  // Every table's distinct keys and counts (AllocateTableTensors: on the GPU one buffer for the
  // int32 keys, one for the int64 keys and one for the counts); the outputs are views of their
  // leading entries.
  static Status AllocateScratch(OpKernelContext* ctx, const OpInputList& keys,
                                std::vector<UniqueArgs>* tables) {
    std::vector<int> of_dtype[2];  // the tables of int32 and of int64 keys
    std::vector<TensorShape> shapes[2], all;
    for (int i = 0; i < keys.size(); ++i) {
      const bool k64 = keys[i].dtype() == DT_INT64;
      of_dtype[k64].push_back(i);
      shapes[k64].push_back(TensorShape({keys[i].NumElements()}));
      all.push_back(shapes[k64].back());
    }
    for (int k64 = 0; k64 < 2; ++k64) {
      if (of_dtype[k64].empty()) continue;
      std::vector<Tensor> uniq;
      TF_RETURN_IF_ERROR(
          AllocateTableTensors<Device>(ctx, k64 ? DT_INT64 : DT_INT32, shapes[k64], &uniq));
      for (size_t j = 0; j < uniq.size(); ++j) (*tables)[of_dtype[k64][j]].uniq = uniq[j];
    }
    std::vector<Tensor> counts;
    TF_RETURN_IF_ERROR(AllocateTableTensors<Device>(ctx, DT_INT64, all, &counts));
    for (int i = 0; i < keys.size(); ++i) (*tables)[i].counts = counts[i];
    return OkStatus();
  }

  // positions [k, r] with r >= 1, dense_shape [r].
  static Status CheckPositions(const std::string& name, int64_t k, const Tensor& positions,
                               const Tensor& dense_shape) {
    if (positions.dims() != 2 || positions.dim_size(0) != k || positions.dim_size(1) < 1) {
      return errors::InvalidArgument("lookup_sparse: ids of table '", name,
                                     "': positions of shape ", positions.shape().DebugString(),
                                     " for ", k, " ids (want [", k, ", rank])");
    }
    if (dense_shape.dims() != 1 || dense_shape.NumElements() != positions.dim_size(1)) {
      return errors::InvalidArgument("lookup_sparse: ids of table '", name, "': dense_shape of ",
                                     "shape ", dense_shape.shape().DebugString(),
                                     " for indices of ", "rank ", positions.dim_size(1));
    }
    return OkStatus();
  }

  std::vector<std::string> names_;
  bool padded_ = false;
  bool defer_ = false;  // bad positions go to valid (-1), not to an error here
  typename DedupOn<Device>::State state_;
};

REGISTER_KERNEL_BUILDER(Name("SokUniqueKeys").Device(DEVICE_CPU), UniqueKeysOp<CpuDevice>);
#if GOOGLE_CUDA
REGISTER_KERNEL_BUILDER(
    Name("SokUniqueKeys").Device(DEVICE_GPU).HostMemory("dense_shapes").HostMemory("batch_sizes"),
    UniqueKeysOp<GpuDevice>);
#endif

}  // namespace
}  // namespace sok_kernels
}  // namespace tensorflow
