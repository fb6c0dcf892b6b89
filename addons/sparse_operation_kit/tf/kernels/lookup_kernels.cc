// Kernels of the lookup steps (tf/ops/lookup_ops.cc): dedup and pooled combine, forward and
// backward, written once for the CPU and the GPU. The kernels validate and allocate; the
// per-device launchers (LookupSteps<Device>) only call the core (core/lookup.h on the CPU,
// core/cuda/gpu_api.h on the GPU). Ids of table i belong to sample segment_ids_i[j] and read row
// inverse_i[j].
#include <algorithm>
#include <limits>
#include <string>
#include <vector>

#include "addons/sparse_operation_kit/core/exchange.h"
#include "addons/sparse_operation_kit/core/lookup.h"
#include "addons/sparse_operation_kit/tf/kernels/device.h"
#include "addons/sparse_operation_kit/tf/kernels/embedding_variable_resource.h"
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
struct LookupSteps;

template <>
struct LookupSteps<CpuDevice> {
  struct State {};  // what a kernel keeps between calls: nothing on the CPU

  // Each table's dedup and position checks; valid[i] = table i's distinct keys, -1 for bad
  // positions. padded: the outputs keep every entry, the tails past the distinct keys zeros
  // (the CPU never waits; the padded outputs only keep its results equal to the GPU's).
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
    std::vector<Status> status(tables.size());
    OnDevice<CpuDevice>::ForEachTable(ctx, tables.size(), [&](int i, const sok::ExecContext& exec) {
      const PooledArgs& a = tables[i];
      std::vector<int64_t> dense;
      const int64_t* seg = SegmentIds(a, &dense);
      status[i] = CheckIndices(a, seg, checked);
      if (!status[i].ok()) return;
      sok::pooled_forward(a.src, a.dim, a.inverse, seg, a.weights, a.n, a.batch, a.combiner, a.out,
                          exec.parallel_for, a.segment_stride);
    });
    for (const Status& s : status) TF_RETURN_IF_ERROR(s);
    return OkStatus();
  }

  // Bad indices are reported (as in the forward) instead of written out of bounds.
  static Status Backward(OpKernelContext* ctx, const std::vector<PooledArgs>& tables,
                         bool checked) {
    std::vector<Status> status(tables.size());
    OnDevice<CpuDevice>::ForEachTable(ctx, tables.size(), [&](int i, const sok::ExecContext& exec) {
      const PooledArgs& a = tables[i];
      std::vector<int64_t> dense;
      const int64_t* seg = SegmentIds(a, &dense);
      status[i] = CheckIndices(a, seg, checked);
      if (!status[i].ok()) return;
      sok::pooled_backward(a.src, a.dim, a.inverse, seg, a.weights, a.n, a.batch, a.combiner,
                           a.num_rows, a.out, exec.parallel_for, a.segment_stride);
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
// Device scratch for `count` objects of T (int64 words, so 8-byte aligned).
template <typename T>
Status DeviceScratch(OpKernelContext* ctx, int64_t count, Tensor* t, T** out) {
  const int64_t words = (count * static_cast<int64_t>(sizeof(T)) + 7) / 8;
  TF_RETURN_IF_ERROR(ctx->allocate_temp(DT_INT64, TensorShape({words > 0 ? words : 1}), t));
  *out = reinterpret_cast<T*>(t->flat<int64_t>().data());
  return OkStatus();
}

template <>
struct LookupSteps<GpuDevice> {
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

// Table names of the ops' error messages; "#i" when the graph gives none.
Status TableNames(OpKernelConstruction* c, int n, std::vector<std::string>* names) {
  TF_RETURN_IF_ERROR(c->GetAttr("table_names", names));
  if (names->empty()) {  // a graph that gives no names: tables by position
    for (int i = 0; i < n; ++i) names->push_back("#" + std::to_string(i));
  }
  if (static_cast<int>(names->size()) != n) {
    return errors::InvalidArgument(names->size(), " table names for ", n, " tables");
  }
  return OkStatus();
}

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
    OP_REQUIRES_OK(ctx, LookupSteps<Device>::Unique(ctx, &tables, valid, padded_, &state_));
    for (int i = 0; !defer_ && i < m; ++i) {  // the first bad table (deferred: the exchange's)
      if (tables[i].check.first_outside < 0) continue;
      std::vector<int64_t> index;
      OP_REQUIRES_OK(ctx, LookupSteps<Device>::ReadIndex(ctx, positions[i],
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
    if (!unordered.empty()) OP_REQUIRES_OK(ctx, LookupSteps<Device>::Order(ctx, unordered));
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
  typename LookupSteps<Device>::State state_;
};

template <typename Device>
class PooledCombineOp : public SokOpKernel<Device> {
 public:
  explicit PooledCombineOp(OpKernelConstruction* c) : SokOpKernel<Device>(c) {
    int n;
    OP_REQUIRES_OK(c, c->GetAttr("N", &n));
    OP_REQUIRES_OK(c, ParseCombiners(c, n, &combiners_));
    OP_REQUIRES_OK(c, c->GetAttr("table_names", &names_));
    if (names_.empty()) {  // a graph that gives no names: tables by position
      for (int i = 0; i < n; ++i) names_.push_back("#" + std::to_string(i));
    }
    OP_REQUIRES(c, static_cast<int>(names_.size()) == n,
                errors::InvalidArgument(names_.size(), " table names for ", n, " tables"));
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
    OP_REQUIRES_OK(ctx, LookupSteps<Device>::Forward(ctx, in.tables, checked_));
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
    OP_REQUIRES_OK(ctx, LookupSteps<Device>::Backward(ctx, in.tables, this->checked_));
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
    OP_REQUIRES_OK(ctx, CheckRowAt(row_at, sizes, &starts));
    OP_REQUIRES(ctx, count.NumElements() == (kForward ? n : 1),
                errors::InvalidArgument(count.NumElements(),
                                        kForward ? " batch sizes for " : " float counts for ", n,
                                        " tables"));
    const int64_t floats = kForward ? src[0].NumElements() : count.flat<int64_t>()(0);
    OP_REQUIRES(ctx, floats >= 0 && floats <= FlatFloats(sizes),
                errors::InvalidArgument("pooled lookup: ", floats, " returned floats for ",
                                        FlatFloats(sizes), " in the tables' rows"));
    OP_REQUIRES_OK(
        ctx, LookupSteps<Device>::CheckFlatRows(this->names_, dims_, sizes.flat<int64_t>().data(),
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
      OP_REQUIRES_OK(ctx, LookupSteps<Device>::Zero(ctx, flat_out->flat<float>().data(), floats));
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
    if (LookupSteps<Device>::ReadsFlatInPlace(this->checked_, kForward)) {
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
      OP_REQUIRES_OK(ctx,
                     LookupSteps<Device>::GatherFlat(ctx, dims_, sizes_p, row_at_p, flat, ptrs));
      OP_REQUIRES_OK(ctx, Run(ctx, tables));
      return;
    }
    OP_REQUIRES_OK(ctx, Run(ctx, tables));
    OP_REQUIRES_OK(
        ctx, LookupSteps<Device>::ScatterFlat(ctx, dims_, sizes_p, row_at_p,
                                              std::vector<const float*>(ptrs.begin(), ptrs.end()),
                                              flat_out->flat<float>().data()));
  }

 private:
  Status Run(OpKernelContext* ctx, const std::vector<PooledArgs>& tables) const {
    return kForward ? LookupSteps<Device>::Forward(ctx, tables, this->checked_)
                    : LookupSteps<Device>::Backward(ctx, tables, this->checked_);
  }

  // sizes [N] (host) add up to row_at's entries; starts[i]: table i's first.
  Status CheckRowAt(const Tensor& row_at, const Tensor& sizes, std::vector<int64_t>* starts) const {
    const int n = dims_.size();
    if (row_at.dims() != 1 || sizes.NumElements() != n) {
      return errors::InvalidArgument("pooled lookup: row_at must be a vector and sizes hold ", n,
                                     " entries, got ", row_at.shape().DebugString(), " and ",
                                     sizes.shape().DebugString());
    }
    int64_t total = 0;
    for (int i = 0; i < n; ++i) {
      const int64_t k = sizes.flat<int64_t>()(i);
      if (k < 0) {
        return errors::InvalidArgument("table '", this->names_[i], "': negative row count ", k);
      }
      starts->push_back(total);
      total += k;
    }
    if (total != row_at.NumElements()) {
      return errors::InvalidArgument("pooled lookup: sizes add up to ", total,
                                     " rows but row_at has ", row_at.NumElements(), " entries");
    }
    return OkStatus();
  }

  int64_t FlatFloats(const Tensor& sizes) const {
    int64_t total = 0;
    for (size_t i = 0; i < dims_.size(); ++i) total += sizes.flat<int64_t>()(i) * dims_[i];
    return total;
  }

  std::vector<int64_t> dims_;
  bool x4_ = true;
};

REGISTER_KERNEL_BUILDER(Name("SokUniqueKeys").Device(DEVICE_CPU), UniqueKeysOp<CpuDevice>);
REGISTER_KERNEL_BUILDER(Name("SokPooledCombine").Device(DEVICE_CPU), PooledCombineOp<CpuDevice>);
REGISTER_KERNEL_BUILDER(Name("SokPooledCombineGrad").Device(DEVICE_CPU),
                        PooledCombineGradOp<CpuDevice>);
REGISTER_KERNEL_BUILDER(Name("SokPooledCombineFlat").Device(DEVICE_CPU),
                        PooledCombineFlatOp<CpuDevice, true>);
REGISTER_KERNEL_BUILDER(Name("SokPooledCombineFlatGrad").Device(DEVICE_CPU),
                        PooledCombineFlatOp<CpuDevice, false>);
#if GOOGLE_CUDA
REGISTER_KERNEL_BUILDER(
    Name("SokUniqueKeys").Device(DEVICE_GPU).HostMemory("dense_shapes").HostMemory("batch_sizes"),
    UniqueKeysOp<GpuDevice>);
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
