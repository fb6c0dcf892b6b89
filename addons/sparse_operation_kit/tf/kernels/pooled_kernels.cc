// The pooled combine (tf/ops/lookup_ops.cc: SokPooledCombine, its gradient, and the Flat pair
// that reads the exchange's returned rows in place), forward and backward, written once for the
// CPU and the GPU. The kernels validate and allocate; PoolOn<Device> only calls the core
// (core/lookup.h on the CPU, core/cuda/gpu_api.h on the GPU). Ids of table i belong to sample
// segment_ids_i[j] and read row inverse_i[j].
#include <algorithm>
#include <limits>
#include <string>
#include <vector>

#include "addons/sparse_operation_kit/core/exchange.h"
#include "addons/sparse_operation_kit/core/lookup.h"
#include "addons/sparse_operation_kit/tf/kernels/device.h"
#include "addons/sparse_operation_kit/tf/kernels/embedding_variable_resource.h"
#include "addons/sparse_operation_kit/tf/kernels/flat_rows.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/util/determinism.h"

#if GOOGLE_CUDA
#include "addons/sparse_operation_kit/core/cuda/exchange.h"
#endif

namespace tensorflow {
namespace sok_kernels {
namespace {

// One table's pooled combine (forward) or its gradient (backward).
struct PooledArgs {
  const std::string* name;
  const float* src;  // forward: rows [num_rows, dim]; backward: grads [batch, dim]
  int64_t dim, num_rows, batch, n;
  const int32_t* inverse;
  const int64_t* segment_ids;  // null: a dense table (or no ids), see IdsPerSample
  int32_t segment_stride;      // 1, or r for SparseTensor indices [n, r] (column 0: the sample)
  const int32_t* order;        // null: none given; else the ids in sample order (SokUniqueKeys)
  const float* weights;        // null: all 1
  sok::Combiner combiner;
  float* out;  // forward: [batch, dim]; backward: [num_rows, dim]
  // null: rows (forward src, backward out) are [num_rows, dim]; else where each row starts in
  // them, -1: none (the exchange's flat rows, read in place: see SokPooledCombineFlat).
  const int64_t* row_at = nullptr;
  bool row_at_x4 = false;  // every row_at entry a multiple of 4
};

// A table without segment ids holds the same number of ids in every sample (checked by the op).
int64_t IdsPerSample(const PooledArgs& a) { return a.batch > 0 ? a.n / a.batch : 0; }

// The segment ids of a table on the host (read with a.segment_stride), materialized (i / k, stride
// 1) when it has none.
const int64_t* SegmentIds(const PooledArgs& a, std::vector<int64_t>* storage) {
  if (a.segment_ids != nullptr || a.n == 0) return a.segment_ids;
  storage->resize(a.n);
  const int64_t k = IdsPerSample(a);
  for (int64_t i = 0; i < a.n; ++i) (*storage)[i] = i / k;
  return storage->data();
}

template <typename Device>
struct PoolOn;

template <>
struct PoolOn<CpuDevice> {
  // The segment ids and inverse entries of table a in range, unless `checked` (lookup_sparse:
  // SokUniqueKeys checked the segments and made the inverse): no second pass over every id (a
  // pass each way costs as much as a light table's pooling).
  static Status CheckIndices(const PooledArgs& a, const int64_t* seg, bool checked) {
    if (checked) return OkStatus();
    return ToTf(sok::check_lookup_indices(*a.name, a.inverse, seg, a.n, a.num_rows, a.batch,
                                          a.segment_stride));
  }

  // The CPU core handles unsorted segment ids itself: the orders are not needed.
  static Status Forward(OpKernelContext* ctx, const std::vector<PooledArgs>& tables, bool checked) {
    return EachTable(ctx, tables, checked,
                     [](const PooledArgs& a, const int64_t* seg, const sok::ExecContext& exec) {
                       sok::pooled_forward(a.src, a.dim, a.inverse, seg, a.weights, a.n, a.batch,
                                           a.combiner, a.out, exec.parallel_for, a.segment_stride);
                     });
  }

  // Bad indices are reported (as in the forward) instead of written out of bounds.
  static Status Backward(OpKernelContext* ctx, const std::vector<PooledArgs>& tables,
                         bool checked) {
    return EachTable(ctx, tables, checked,
                     [](const PooledArgs& a, const int64_t* seg, const sok::ExecContext& exec) {
                       sok::pooled_backward(a.src, a.dim, a.inverse, seg, a.weights, a.n, a.batch,
                                            a.combiner, a.num_rows, a.out, exec.parallel_for,
                                            a.segment_stride);
                     });
  }

  // run(table, its segment ids, exec) for each table on the worker pool, once its indices
  // passed CheckIndices; the first failing table's error.
  template <typename Run>
  static Status EachTable(OpKernelContext* ctx, const std::vector<PooledArgs>& tables, bool checked,
                          Run run) {
    std::vector<Status> status(tables.size());
    OnDevice<CpuDevice>::ForEachTable(ctx, tables.size(), [&](int i, const sok::ExecContext& exec) {
      const PooledArgs& a = tables[i];
      std::vector<int64_t> dense;
      const int64_t* seg = SegmentIds(a, &dense);
      status[i] = CheckIndices(a, seg, checked);
      if (status[i].ok()) run(a, seg, exec);
    });
    for (const Status& s : status) TF_RETURN_IF_ERROR(s);
    return OkStatus();
  }

  // Whether the pooled kernels read (write) rows in place through row_at: never on the CPU.
  static bool ReadsFlatInPlace(bool, bool) { return false; }

  // The flat rows per table and back (core/exchange.h); and zeroing a float buffer.
  static Status GatherFlat(OpKernelContext*, const std::vector<int64_t>& dims, const int64_t* sizes,
                           const int64_t* row_at, const float* flat,
                           const std::vector<float*>& rows) {
    sok::exchange::gather_rows(dims, sizes, row_at, flat, rows.data());
    return OkStatus();
  }
  static Status ScatterFlat(OpKernelContext*, const std::vector<int64_t>& dims,
                            const int64_t* sizes, const int64_t* row_at,
                            const std::vector<const float*>& rows, float* flat) {
    sok::exchange::scatter_rows(dims, sizes, row_at, rows.data(), flat);
    return OkStatus();
  }
  static Status Zero(OpKernelContext*, float* p, int64_t n) {
    std::fill(p, p + n, 0.f);
    return OkStatus();
  }

  // Every row_at entry (host memory here) -1 or a row that lies within the flat rows.
  static Status CheckFlatRows(const std::vector<std::string>& names,
                              const std::vector<int64_t>& dims, const int64_t* sizes,
                              const int64_t* row_at, int64_t floats) {
    int64_t k = 0;
    for (size_t t = 0; t < dims.size(); ++t) {
      for (int64_t r = 0; r < sizes[t]; ++r, ++k) {
        const int64_t at = row_at[k];
        if (at < -1 || (at >= 0 && at + dims[t] > floats)) {
          return errors::InvalidArgument("pooled lookup: table '", names[t], "': row ", r,
                                         " at float ", at, " outside the ", floats,
                                         " returned floats");
        }
      }
    }
    return OkStatus();
  }
};

#if GOOGLE_CUDA
template <>
struct PoolOn<GpuDevice> {
  // checked (segment ids known in range, each table's sample order given): every table in one
  // launch (after one finding the samples' starts), nothing read back. Otherwise the dense
  // tables (in range by construction) still take that path; the others' bad sample indices or
  // rows are skipped on the device and reported after every table's work is enqueued (one
  // synchronisation), naming the table.
  static Status Forward(OpKernelContext* ctx, const std::vector<PooledArgs>& tables, bool checked) {
    const cudaStream_t stream = OnDevice<GpuDevice>::Stream(ctx);
    TfDeviceAllocator alloc(ctx->get_allocator(AllocatorAttributes()));
    std::vector<PooledArgs> fused, rest;
    Split(tables, checked, &fused, &rest);
    if (!fused.empty()) {
      const std::vector<sok::gpu::PooledTable> multi = MultiTables(fused);
      TF_RETURN_IF_ERROR(
          ToTf(sok::gpu::pooled_forward_multi(multi.data(), multi.size(), stream, &alloc)));
    }
    if (rest.empty()) return OkStatus();
    std::vector<Tensor> columns;
    TF_RETURN_IF_ERROR(ContiguousSegments(ctx, &rest, &columns));
    const int n = rest.size();
    Tensor err_t;
    sok::gpu::GpuLookupError* d_err;
    TF_RETURN_IF_ERROR(DeviceScratch(ctx, n, &err_t, &d_err));
    TF_RETURN_IF_ERROR(ToTf(sok::gpu::reset_lookup_error(d_err, stream, n)));
    std::vector<std::string> what(n);
    for (int i = 0; i < n; ++i) {
      const PooledArgs& a = rest[i];
      sok::gpu::Segments seg;
      seg.segment_ids = a.segment_ids;
      TF_RETURN_IF_ERROR(
          ToTf(sok::gpu::pooled_forward(a.src, a.dim, a.num_rows, a.inverse, seg, a.weights, a.n,
                                        a.batch, a.combiner, a.out, stream, d_err + i, &alloc)));
      what[i] = "lookup of table '" + *a.name + "'";
    }
    return ToTf(sok::gpu::check_lookup_errors(d_err, what, stream));
  }

  // Bad indices are skipped by the core (never read or written out of bounds); the forward of
  // the same ids reports them. Sums with atomics unless op determinism is required
  // (tf.config.experimental.enable_op_determinism), as TF's own ops do: for checked segments and
  // dense tables (see Forward) a few launches for all of them, else a few launches per table.
  static Status Backward(OpKernelContext* ctx, const std::vector<PooledArgs>& tables,
                         bool checked) {
    const cudaStream_t stream = OnDevice<GpuDevice>::Stream(ctx);
    TfDeviceAllocator alloc(ctx->get_allocator(AllocatorAttributes()));
    if (!OpDeterminismRequired()) {
      std::vector<PooledArgs> fused, rest;
      Split(tables, checked, &fused, &rest);
      if (!fused.empty()) {
        const std::vector<sok::gpu::PooledTable> multi = MultiTables(fused);
        TF_RETURN_IF_ERROR(ToTf(
            sok::gpu::pooled_backward_multi_unordered(multi.data(), multi.size(), stream, &alloc)));
      }
      std::vector<Tensor> columns;
      TF_RETURN_IF_ERROR(ContiguousSegments(ctx, &rest, &columns));
      for (const PooledArgs& a : rest) {
        TF_RETURN_IF_ERROR(ToTf(sok::gpu::pooled_backward_unordered(
            a.src, a.dim, a.inverse, a.segment_ids, a.weights, a.n, a.batch, a.combiner, a.num_rows,
            a.out, stream, &alloc)));
      }
      return OkStatus();
    }
    std::vector<PooledArgs> ordered = tables;
    std::vector<Tensor> columns;
    TF_RETURN_IF_ERROR(ContiguousSegments(ctx, &ordered, &columns));
    for (const PooledArgs& a : ordered) {
      sok::gpu::Segments seg;
      seg.segment_ids = a.segment_ids;
      Tensor splits_t;
      if (a.segment_ids == nullptr) {  // dense: its samples as row splits
        int64_t* splits;
        TF_RETURN_IF_ERROR(DeviceScratch(ctx, a.batch + 1, &splits_t, &splits));
        TF_RETURN_IF_ERROR(
            ToTf(sok::gpu::dense_row_splits(a.batch, IdsPerSample(a), splits, stream)));
        seg.row_splits = splits;
      }
      TF_RETURN_IF_ERROR(
          ToTf(sok::gpu::pooled_backward(a.src, a.dim, a.inverse, seg, a.weights, a.n, a.batch,
                                         a.combiner, a.num_rows, nullptr, a.out, stream, &alloc)));
    }
    return OkStatus();
  }

 private:
  // The per-table core calls read segment ids [n]: column 0 of indices [n, r] is copied out
  // (one strided copy per table) into `columns`, which must outlive the calls.
  static Status ContiguousSegments(OpKernelContext* ctx, std::vector<PooledArgs>* tables,
                                   std::vector<Tensor>* columns) {
    columns->reserve(tables->size());
    for (PooledArgs& a : *tables) {
      if (a.segment_ids == nullptr || a.segment_stride == 1 || a.n == 0) continue;
      columns->emplace_back();
      int64_t* column;
      TF_RETURN_IF_ERROR(DeviceScratch(ctx, a.n, &columns->back(), &column));
      TF_RETURN_IF_ERROR(
          CudaCall(cudaMemcpy2DAsync(column, sizeof(int64_t), a.segment_ids,
                                     a.segment_stride * sizeof(int64_t), sizeof(int64_t), a.n,
                                     cudaMemcpyDeviceToDevice, OnDevice<GpuDevice>::Stream(ctx)),
                   "copying sample indices"));
      a.segment_ids = column;
      a.segment_stride = 1;
    }
    return OkStatus();
  }

  // The tables of the fused path (every table when checked, else those without segment ids)
  // and the rest.
  static void Split(const std::vector<PooledArgs>& tables, bool checked,
                    std::vector<PooledArgs>* fused, std::vector<PooledArgs>* rest) {
    for (const PooledArgs& a : tables) {
      (checked || a.segment_ids == nullptr ? fused : rest)->push_back(a);
    }
  }

  // The core's descriptor of each table (forward: src = rows; backward: src = grads).
  static std::vector<sok::gpu::PooledTable> MultiTables(const std::vector<PooledArgs>& tables) {
    std::vector<sok::gpu::PooledTable> out(tables.size());
    for (size_t i = 0; i < tables.size(); ++i) {
      const PooledArgs& a = tables[i];
      sok::gpu::PooledTable& t = out[i];
      t.src = a.src;
      t.out = a.out;
      t.inverse = a.inverse;
      t.segment_ids = a.segment_ids;
      t.segment_stride = a.segment_stride;
      t.order = a.order;
      t.weights = a.weights;
      t.n = a.n;
      t.batch = a.batch;
      t.num_rows = a.num_rows;
      t.dim = a.dim;
      t.combiner = a.combiner;
      t.row_at = a.row_at;
      t.row_at_x4 = a.row_at_x4;
    }
    return out;
  }

 public:
  // Checked segments take every table down the fused launches, which read (and the atomic
  // backward writes) rows in place through row_at.
  static bool ReadsFlatInPlace(bool checked, bool forward) {
    return checked && (forward || !OpDeterminismRequired());
  }

  static Status GatherFlat(OpKernelContext* ctx, const std::vector<int64_t>& dims,
                           const int64_t* sizes, const int64_t* row_at, const float* flat,
                           const std::vector<float*>& rows) {
    return ToTf(sok::gpu::exchange::gather_rows(dims, sizes, row_at, flat, rows,
                                                OnDevice<GpuDevice>::Stream(ctx)));
  }
  static Status ScatterFlat(OpKernelContext* ctx, const std::vector<int64_t>& dims,
                            const int64_t* sizes, const int64_t* row_at,
                            const std::vector<const float*>& rows, float* flat) {
    return ToTf(sok::gpu::exchange::scatter_rows(dims, sizes, row_at, rows, flat,
                                                 OnDevice<GpuDevice>::Stream(ctx)));
  }
  // row_at lies in device memory, made by the exchange's plan on the device: not read back.
  static Status CheckFlatRows(const std::vector<std::string>&, const std::vector<int64_t>&,
                              const int64_t*, const int64_t*, int64_t) {
    return OkStatus();
  }

  static Status Zero(OpKernelContext* ctx, float* p, int64_t n) {
    if (n == 0) return OkStatus();
    return CudaCall(cudaMemsetAsync(p, 0, n * sizeof(float), OnDevice<GpuDevice>::Stream(ctx)),
                    "zeroing the flat rows' gradient");
  }
};
#endif  // GOOGLE_CUDA

template <typename Device>
class PooledCombineOp : public SokOpKernel<Device> {
 public:
  explicit PooledCombineOp(OpKernelConstruction* c) : SokOpKernel<Device>(c) {
    int n;
    OP_REQUIRES_OK(c, c->GetAttr("N", &n));
    OP_REQUIRES_OK(c, ParseCombiners(c, n, &combiners_));
    OP_REQUIRES_OK(c, TableNames(c, n, &names_));
    int m;
    OP_REQUIRES_OK(c, c->GetAttr("M", &m));
    OP_REQUIRES(
        c, m == 0 || m == n,
        errors::InvalidArgument(m, " segment orders for ", n, " tables (give 0 or ", n, ")"));
    has_orders_ = m == n;
    bool segments_checked;
    OP_REQUIRES_OK(c, c->GetAttr("segments_checked", &segments_checked));
    checked_ = has_orders_ && segments_checked;
  }

 protected:
  void ComputeOnDevice(OpKernelContext* ctx) override {
    PooledInputs in;
    OP_REQUIRES_OK(ctx, ParseInputs(ctx, /*forward=*/true, &in));
    const int n = in.src.size();
    Tensor* num_rows;  // HostMemory
    OP_REQUIRES_OK(ctx, ctx->allocate_output(n, TensorShape({n}), &num_rows));
    for (int i = 0; i < n; ++i) num_rows->flat<int64_t>()(i) = in.src[i].dim_size(0);
    OP_REQUIRES_OK(ctx, PoolOn<Device>::Forward(ctx, in.tables, checked_));
  }

  // The inputs of the forward and of the gradient, checked, with their outputs allocated.
  struct PooledInputs {
    OpInputList src;                 // the forward's rows or the gradient's grads
    std::vector<PooledArgs> tables;  // one per table
  };

  // The forward pools table i's rows [num_rows, dim] into batch_sizes[i] samples; the gradient
  // scatters its grads [batch, dim] into num_rows[i] rows. Both take inverse, segment_ids,
  // weights and segment_order alike, and one host-memory count per table.
  Status ParseInputs(OpKernelContext* ctx, bool forward, PooledInputs* in) const {
    OpInputList inverse, segments, weights, orders;
    TF_RETURN_IF_ERROR(ctx->input_list(forward ? "rows" : "grads", &in->src));
    TF_RETURN_IF_ERROR(ctx->input_list("inverse", &inverse));
    TF_RETURN_IF_ERROR(ctx->input_list("segment_ids", &segments));
    TF_RETURN_IF_ERROR(ctx->input_list("weights", &weights));
    TF_RETURN_IF_ERROR(ctx->input_list("segment_order", &orders));
    const int n = in->src.size();
    const Tensor* counts_t;
    TF_RETURN_IF_ERROR(ctx->input(forward ? "batch_sizes" : "num_rows", &counts_t));  // HostMemory
    const Tensor& counts = *counts_t;
    if (counts.NumElements() != n) {
      return errors::InvalidArgument(
          counts.NumElements(), forward ? " batch sizes for " : " row counts for ", n, " tables");
    }
    std::vector<TensorShape> shapes;
    for (int i = 0; i < n; ++i) {
      const std::string& name = names_[i];
      const Tensor& src = in->src[i];
      if (src.dims() != 2) {
        return errors::InvalidArgument(forward ? "rows" : "gradient", " of table '", name,
                                       "' must be a matrix");
      }
      const int64_t count = counts.flat<int64_t>()(i);
      const Status count_ok =
          count >= 0 ? OkStatus()
                     : errors::InvalidArgument("table '", name, "': negative ",
                                               forward ? "batch size " : "row count ", count);
      // The forward's batch size bounds its ids: checked first. The gradient's row count after.
      if (forward) TF_RETURN_IF_ERROR(count_ok);
      const int64_t m = inverse[i].NumElements();
      const int64_t batch = forward ? count : src.dim_size(0);
      TF_RETURN_IF_ERROR(CheckIdArrays(name, m, batch, segments[i], weights[i]));
      TF_RETURN_IF_ERROR(CheckOrder(name, m, segments[i], orders, i));
      TF_RETURN_IF_ERROR(count_ok);
      shapes.push_back(TensorShape({count, src.dim_size(1)}));
    }
    std::vector<Tensor*> outs;
    TF_RETURN_IF_ERROR(AllocateTableOutputs<Device>(ctx, 0, DT_FLOAT, shapes, &outs));
    in->tables.resize(n);
    for (int i = 0; i < n; ++i) {
      const Tensor& src = in->src[i];
      const int64_t count = shapes[i].dim_size(0);
      in->tables[i] = Args(i, src.flat<float>().data(), src.dim_size(1),
                           forward ? src.dim_size(0) : count, forward ? count : src.dim_size(0),
                           inverse[i], segments[i], weights[i], orders, outs[i]);
    }
    return OkStatus();
  }

 public:
  // Sample indices and weights must match the ids one to one. No sample indices for m > 0 ids:
  // a dense table, m / batch ids per sample (id j belongs to sample j / (m / batch)).
  static Status CheckIdArrays(const std::string& name, int64_t m, int64_t batch,
                              const Tensor& segments, const Tensor& weights) {
    if (segments.NumElements() == 0 && m > 0 && (batch == 0 || m % batch != 0)) {
      return errors::InvalidArgument("lookup_sparse: table '", name, "': ", m,
                                     " ids without segment ids must be k ids per sample of batch ",
                                     batch);
    }
    if (segments.dims() == 2 && segments.dim_size(0) == m && segments.dim_size(1) >= 1) {
      // SparseTensor indices [m, r]: column 0 holds the samples.
    } else if (segments.dims() > 1 ||
               (segments.NumElements() != m && segments.NumElements() != 0)) {
      return errors::InvalidArgument("table '", name, "': sample indices of shape ",
                                     segments.shape().DebugString(), " for ", m, " ids (want [", m,
                                     "] or indices [", m, ", rank])");
    }
    if (weights.NumElements() != 0 && weights.NumElements() != m) {
      return errors::InvalidArgument("table '", name, "': ", weights.NumElements(), " weights for ",
                                     m, " ids");
    }
    return OkStatus();
  }

  // A table's sample order is empty (its segment ids are sorted, or it has none) or a
  // permutation of its m ids.
  Status CheckOrder(const std::string& name, int64_t m, const Tensor& segments,
                    const OpInputList& orders, int i) const {
    if (!has_orders_) return OkStatus();
    const int64_t k = orders[i].NumElements();
    if (k != 0 && segments.NumElements() == 0) {
      return errors::InvalidArgument("table '", name, "': a segment order of ", k,
                                     " entries for a table without segment ids");
    }
    if (k != 0 && k != m) {
      return errors::InvalidArgument("table '", name, "': a segment order of ", k, " entries for ",
                                     m, " ids");
    }
    return OkStatus();
  }

 protected:
  // src: the forward's rows or the gradient's grads, `dim` floats a row.
  PooledArgs Args(int i, const float* src, int64_t dim, int64_t num_rows, int64_t batch,
                  const Tensor& inverse, const Tensor& segments, const Tensor& weights,
                  const OpInputList& orders, Tensor* out) const {
    PooledArgs a;
    a.name = &names_[i];
    a.src = src;
    a.dim = dim;
    a.num_rows = num_rows;
    a.batch = batch;
    a.n = inverse.NumElements();
    a.inverse = inverse.flat<int32_t>().data();
    a.segment_ids = segments.NumElements() ? segments.flat<int64_t>().data() : nullptr;
    a.segment_stride = segments.dims() == 2 ? static_cast<int32_t>(segments.dim_size(1)) : 1;
    a.order = has_orders_ && orders[i].NumElements() ? orders[i].flat<int32_t>().data() : nullptr;
    a.weights = weights.NumElements() ? weights.flat<float>().data() : nullptr;
    a.combiner = combiners_[i];
    a.out = out->flat<float>().data();
    return a;
  }

  std::vector<sok::Combiner> combiners_;
  std::vector<std::string> names_;
  bool has_orders_ = false;  // M == N
  bool checked_ = false;     // M == N and segments_checked: the GPU skips the checks
};

// The gradient has the forward's attributes; only its inputs and outputs differ.
template <typename Device>
class PooledCombineGradOp : public PooledCombineOp<Device> {
 public:
  using PooledCombineOp<Device>::PooledCombineOp;

 protected:
  void ComputeOnDevice(OpKernelContext* ctx) override {
    typename PooledCombineOp<Device>::PooledInputs in;
    OP_REQUIRES_OK(ctx, this->ParseInputs(ctx, /*forward=*/false, &in));
    OP_REQUIRES_OK(ctx, PoolOn<Device>::Backward(ctx, in.tables, this->checked_));
  }
};

// SokPooledCombineFlat (kForward) and its gradient: the pooled combine of rows read in place from
// the exchange's flat rows (row_at), or its gradient written in place into d_returned. Where the
// fused GPU launches do not run (the CPU, unchecked segments, a deterministic backward), the
// rows are first gathered into one tensor per table (the gradient: scattered back after): the
// same results, one copy more.
template <typename Device, bool kForward>
class PooledCombineFlatOp : public PooledCombineOp<Device> {
 public:
  explicit PooledCombineFlatOp(OpKernelConstruction* c) : PooledCombineOp<Device>(c) {
    OP_REQUIRES_OK(c, c->GetAttr("dims", &dims_));
    OP_REQUIRES(
        c, dims_.size() == this->names_.size(),
        errors::InvalidArgument(dims_.size(), " dims for ", this->names_.size(), " tables"));
    for (int64_t d : dims_) {
      OP_REQUIRES(c, d >= 0, errors::InvalidArgument("negative dim ", d));
      x4_ = x4_ && d % 4 == 0;
    }
  }

 protected:
  void ComputeOnDevice(OpKernelContext* ctx) override {
    const int n = dims_.size();
    OpInputList src, inverse, segments, weights, orders;
    OP_REQUIRES_OK(ctx, ctx->input_list(kForward ? "returned" : "grads", &src));
    OP_REQUIRES_OK(ctx, ctx->input_list("inverse", &inverse));
    OP_REQUIRES_OK(ctx, ctx->input_list("segment_ids", &segments));
    OP_REQUIRES_OK(ctx, ctx->input_list("weights", &weights));
    OP_REQUIRES_OK(ctx, ctx->input_list("segment_order", &orders));
    const Tensor *row_at_t, *sizes_t, *count_t;
    OP_REQUIRES_OK(ctx, ctx->input("row_at", &row_at_t));
    OP_REQUIRES_OK(ctx, ctx->input("sizes", &sizes_t));  // HostMemory
    OP_REQUIRES_OK(ctx, ctx->input(kForward ? "batch_sizes" : "returned_floats", &count_t));
    const Tensor &row_at = *row_at_t, &sizes = *sizes_t, &count = *count_t;  // count: HostMemory
    std::vector<int64_t> starts;
    OP_REQUIRES_OK(ctx, CheckFlatSizes("pooled lookup", sizes, row_at, this->names_,
                                       static_cast<int>(dims_.size()), &starts));
    OP_REQUIRES(ctx, count.NumElements() == (kForward ? n : 1),
                errors::InvalidArgument(count.NumElements(),
                                        kForward ? " batch sizes for " : " float counts for ", n,
                                        " tables"));
    const int64_t floats = kForward ? src[0].NumElements() : count.flat<int64_t>()(0);
    OP_REQUIRES(ctx, floats >= 0 && floats <= FlatFloats(sizes, dims_),
                errors::InvalidArgument("pooled lookup: ", floats, " returned floats for ",
                                        FlatFloats(sizes, dims_), " in the tables' rows"));
    OP_REQUIRES_OK(ctx,
                   PoolOn<Device>::CheckFlatRows(this->names_, dims_, sizes.flat<int64_t>().data(),
                                                 row_at.flat<int64_t>().data(), floats));
    std::vector<TensorShape> shapes;
    for (int i = 0; i < n; ++i) {
      const int64_t batch = kForward ? count.flat<int64_t>()(i) : src[i].dim_size(0);
      OP_REQUIRES(ctx, batch >= 0,
                  errors::InvalidArgument("table '", this->names_[i], "': negative batch size"));
      if (!kForward) {
        OP_REQUIRES(
            ctx, src[i].dims() == 2 && src[i].dim_size(1) == dims_[i],
            errors::InvalidArgument("gradient of table '", this->names_[i], "' must be [batch, ",
                                    dims_[i], "], got ", src[i].shape().DebugString()));
      }
      const int64_t m = inverse[i].NumElements();
      OP_REQUIRES_OK(ctx, PooledCombineOp<Device>::CheckIdArrays(this->names_[i], m, batch,
                                                                 segments[i], weights[i]));
      OP_REQUIRES_OK(ctx, this->CheckOrder(this->names_[i], m, segments[i], orders, i));
      shapes.push_back(TensorShape({batch, dims_[i]}));
    }
    std::vector<Tensor*> outs;
    Tensor* flat_out = nullptr;
    if (kForward) {
      OP_REQUIRES_OK(ctx, AllocateTableOutputs<Device>(ctx, 0, DT_FLOAT, shapes, &outs));
      Tensor* floats_t;
      OP_REQUIRES_OK(ctx, ctx->allocate_output(n, TensorShape({1}), &floats_t));
      floats_t->flat<int64_t>()(0) = floats;
    } else {
      OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({floats}), &flat_out));
      OP_REQUIRES_OK(ctx, PoolOn<Device>::Zero(ctx, flat_out->flat<float>().data(), floats));
    }
    const float* flat = kForward ? src[0].flat<float>().data() : nullptr;
    std::vector<PooledArgs> tables(n);
    for (int i = 0; i < n; ++i) {
      const int64_t rows = sizes.flat<int64_t>()(i);
      PooledArgs& a = tables[i];
      a = this->Args(i, kForward ? flat : src[i].flat<float>().data(), dims_[i], rows,
                     shapes[i].dim_size(0), inverse[i], segments[i], weights[i], orders,
                     kForward ? outs[i] : flat_out);
      a.row_at = row_at.flat<int64_t>().data() + starts[i];
      a.row_at_x4 = x4_;
    }
    const int64_t* row_at_p = row_at.flat<int64_t>().data();
    const int64_t* sizes_p = sizes.flat<int64_t>().data();
    if (PoolOn<Device>::ReadsFlatInPlace(this->checked_, kForward)) {
      OP_REQUIRES_OK(ctx, Run(ctx, tables));
      return;
    }
    // One tensor per table's rows (forward: gathered; backward: scattered after).
    std::vector<Tensor> per_table(n);
    std::vector<float*> ptrs(n);
    for (int i = 0; i < n; ++i) {
      OP_REQUIRES_OK(
          ctx, ctx->allocate_temp(DT_FLOAT, TensorShape({sizes_p[i], dims_[i]}), &per_table[i]));
      ptrs[i] = per_table[i].flat<float>().data();
      if (kForward) tables[i].src = ptrs[i];
      else tables[i].out = ptrs[i];
      tables[i].row_at = nullptr;
    }
    if (kForward) {
      OP_REQUIRES_OK(ctx, PoolOn<Device>::GatherFlat(ctx, dims_, sizes_p, row_at_p, flat, ptrs));
      OP_REQUIRES_OK(ctx, Run(ctx, tables));
      return;
    }
    OP_REQUIRES_OK(ctx, Run(ctx, tables));
    OP_REQUIRES_OK(ctx,
                   PoolOn<Device>::ScatterFlat(ctx, dims_, sizes_p, row_at_p,
                                               std::vector<const float*>(ptrs.begin(), ptrs.end()),
                                               flat_out->flat<float>().data()));
  }

 private:
  Status Run(OpKernelContext* ctx, const std::vector<PooledArgs>& tables) const {
    return kForward ? PoolOn<Device>::Forward(ctx, tables, this->checked_)
                    : PoolOn<Device>::Backward(ctx, tables, this->checked_);
  }

  std::vector<int64_t> dims_;
  bool x4_ = true;
};

REGISTER_KERNEL_BUILDER(Name("SokPooledCombine").Device(DEVICE_CPU), PooledCombineOp<CpuDevice>);
REGISTER_KERNEL_BUILDER(Name("SokPooledCombineGrad").Device(DEVICE_CPU),
                        PooledCombineGradOp<CpuDevice>);
REGISTER_KERNEL_BUILDER(Name("SokPooledCombineFlat").Device(DEVICE_CPU),
                        PooledCombineFlatOp<CpuDevice, true>);
REGISTER_KERNEL_BUILDER(Name("SokPooledCombineFlatGrad").Device(DEVICE_CPU),
                        PooledCombineFlatOp<CpuDevice, false>);
#if GOOGLE_CUDA
REGISTER_KERNEL_BUILDER(
    Name("SokPooledCombine").Device(DEVICE_GPU).HostMemory("batch_sizes").HostMemory("num_rows"),
    PooledCombineOp<GpuDevice>);
REGISTER_KERNEL_BUILDER(Name("SokPooledCombineGrad").Device(DEVICE_GPU).HostMemory("num_rows"),
                        PooledCombineGradOp<GpuDevice>);
REGISTER_KERNEL_BUILDER(Name("SokPooledCombineFlat")
                            .Device(DEVICE_GPU)
                            .HostMemory("sizes")
                            .HostMemory("batch_sizes")
                            .HostMemory("returned_floats"),
                        PooledCombineFlatOp<GpuDevice, true>);
REGISTER_KERNEL_BUILDER(Name("SokPooledCombineFlatGrad")
                            .Device(DEVICE_GPU)
                            .HostMemory("sizes")
                            .HostMemory("returned_floats"),
                        PooledCombineFlatOp<GpuDevice, false>);
#endif

}  // namespace
}  // namespace sok_kernels
}  // namespace tensorflow
