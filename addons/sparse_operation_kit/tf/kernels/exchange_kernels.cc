// Kernels of the exchange's index ops (ops/exchange_ops.cc) over core/exchange.h (CPU) and
// core/cuda/exchange.h (GPU): each written once over the device, the device's half in ExchangeOn.
#include <algorithm>

#include "addons/sparse_operation_kit/core/exchange.h"
#include "addons/sparse_operation_kit/tf/kernels/device.h"
#include "addons/sparse_operation_kit/tf/kernels/flat_rows.h"

#if GOOGLE_CUDA
#include "addons/sparse_operation_kit/core/cuda/exchange.h"
#endif

namespace tensorflow {
namespace sok_kernels {

namespace ex = sok::exchange;

// Where the owner's outputs go, once their sizes are known (exact: the distinct counts).
struct OwnerKeysOut {
  std::vector<int64_t*> keys, counts;
  int64_t* row_pos = nullptr;
  int64_t* valid = nullptr;  // the distinct counts, on the op's device
};
using AllocateOwnerKeys =
    std::function<Status(const std::vector<int64_t>& sizes, OwnerKeysOut* out)>;

template <typename Device>
struct ExchangeOn;

template <>
struct ExchangeOn<CpuDevice> {
  struct State {};  // what the owner's keys kernel keeps between calls: nothing on the CPU
  static Status Plan(OpKernelContext*, const std::vector<ex::TableSpec>& tables, int world,
                     const std::vector<const int64_t*>& keys,
                     const std::vector<const int64_t*>& counts, const int64_t* sizes,
                     const int64_t* valid, int64_t signature, int64_t* request, int64_t* matrix,
                     int64_t* row_at) {
    ex::plan(tables, world, keys.data(), counts.data(), sizes, valid, signature, request, matrix,
             row_at);
    return OkStatus();
  }
  static Status OwnerKeys(OpKernelContext* ctx, const std::vector<ex::TableSpec>& tables,
                          const ex::BlockLayout& l, const int64_t* received, bool padded,
                          const AllocateOwnerKeys& allocate, State*) {
    ex::OwnerKeys keys;
    ex::owner_keys(tables, l, received, padded, &keys);
    std::vector<int64_t> sizes(l.n);
    for (int t = 0; t < l.n; ++t) sizes[t] = static_cast<int64_t>(keys.keys[t].size());
    OwnerKeysOut out;
    TF_RETURN_IF_ERROR(allocate(sizes, &out));
    for (int t = 0; t < l.n; ++t) {
      std::copy(keys.keys[t].begin(), keys.keys[t].end(), out.keys[t]);
      std::copy(keys.counts[t].begin(), keys.counts[t].end(), out.counts[t]);
    }
    std::copy(keys.row_pos.begin(), keys.row_pos.end(), out.row_pos);
    std::copy(keys.distinct.begin(), keys.distinct.end(), out.valid);
    return OkStatus();
  }
  static Status ToBlocks(OpKernelContext*, const std::vector<int64_t>& dims,
                         const int64_t* distinct, int world, const int64_t* row_pos,
                         const std::vector<const float*>& rows, float* flat) {
    ex::rows_to_blocks(dims, distinct, world, row_pos, rows.data(), flat);
    return OkStatus();
  }
  static Status FromBlocks(OpKernelContext*, const std::vector<int64_t>& dims,
                           const int64_t* distinct, int world, const int64_t* row_pos,
                           const float* flat, const std::vector<float*>& rows) {
    ex::rows_from_blocks(dims, distinct, world, row_pos, flat, rows.data());
    return OkStatus();
  }
  static Status Gather(OpKernelContext*, const std::vector<int64_t>& dims, const int64_t* sizes,
                       const int64_t* row_at, const float* returned,
                       const std::vector<float*>& out) {
    ex::gather_rows(dims, sizes, row_at, returned, out.data());
    return OkStatus();
  }
  static Status Scatter(OpKernelContext*, const std::vector<int64_t>& dims, const int64_t* sizes,
                        const int64_t* row_at, const std::vector<const float*>& rows,
                        float* returned) {
    ex::scatter_rows(dims, sizes, row_at, rows.data(), returned);
    return OkStatus();
  }
};

#if GOOGLE_CUDA
namespace gex = sok::gpu::exchange;

template <>
struct ExchangeOn<GpuDevice> {
  using State = UploadStaging;
  static cudaStream_t S(OpKernelContext* ctx) { return OnDevice<GpuDevice>::Stream(ctx); }
  static Status Plan(OpKernelContext* ctx, const std::vector<ex::TableSpec>& tables, int world,
                     const std::vector<const int64_t*>& keys,
                     const std::vector<const int64_t*>& counts, const int64_t* sizes,
                     const int64_t* valid, int64_t signature, int64_t* request, int64_t* matrix,
                     int64_t* row_at) {
    TfDeviceAllocator alloc(ctx->device()->GetAllocator(AllocatorAttributes()));
    return ToTf(gex::plan(tables, world, keys, counts, sizes, valid, signature, request, matrix,
                          row_at, S(ctx), &alloc));
  }
  // The dedup's arguments go up from pinned memory: a pageable upload may wait for the stream.
  // Padded (nothing waits): the kernel's staging, reused once its last upload passed; exact: a
  // pinned temporary, alive until the op's own wait for the distinct counts.
  static Status OwnerKeys(OpKernelContext* ctx, const std::vector<ex::TableSpec>& tables,
                          const ex::BlockLayout& l, const int64_t* received, bool padded,
                          const AllocateOwnerKeys& allocate, State* state) {
    TfDeviceAllocator alloc(ctx->device()->GetAllocator(AllocatorAttributes()));
    const int64_t bytes = std::max<int64_t>(gex::owner_keys_staging_bytes(l.n), 1);
    void* upload;
    UploadBuffer buffer;
    TF_RETURN_IF_ERROR(buffer.Get(ctx, state, padded, bytes, &upload));
    tsl::profiler::TraceMe wait(padded ? "SokExchangeOwnerKeys (padded: no wait)"
                                       : "SokExchangeOwnerKeys waits for the distinct counts");
    Status done = ToTf(gex::owner_keys(
        tables, l, received, padded,
        [&](const std::vector<int64_t>& sizes, gex::OwnerKeysOut* out) {
          OwnerKeysOut o;
          Status s = allocate(sizes, &o);
          if (!s.ok()) return sok::Status::Invalid(std::string(s.message()));
          out->keys = o.keys;
          out->counts = o.counts;
          out->row_pos = o.row_pos;
          out->valid = o.valid;
          return sok::Status::OK();
        },
        S(ctx), &alloc, upload));
    return buffer.Done(done, S(ctx));
  }
  static Status ToBlocks(OpKernelContext* ctx, const std::vector<int64_t>& dims,
                         const int64_t* distinct, int world, const int64_t* row_pos,
                         const std::vector<const float*>& rows, float* flat) {
    return ToTf(gex::rows_to_blocks(dims, distinct, world, row_pos, rows, flat, S(ctx)));
  }
  static Status FromBlocks(OpKernelContext* ctx, const std::vector<int64_t>& dims,
                           const int64_t* distinct, int world, const int64_t* row_pos,
                           const float* flat, const std::vector<float*>& rows) {
    return ToTf(gex::rows_from_blocks(dims, distinct, world, row_pos, flat, rows, S(ctx)));
  }
  static Status Gather(OpKernelContext* ctx, const std::vector<int64_t>& dims, const int64_t* sizes,
                       const int64_t* row_at, const float* returned,
                       const std::vector<float*>& out) {
    return ToTf(gex::gather_rows(dims, sizes, row_at, returned, out, S(ctx)));
  }
  static Status Scatter(OpKernelContext* ctx, const std::vector<int64_t>& dims,
                        const int64_t* sizes, const int64_t* row_at,
                        const std::vector<const float*>& rows, float* returned) {
    return ToTf(gex::scatter_rows(dims, sizes, row_at, rows, returned, S(ctx)));
  }
};
#endif  // GOOGLE_CUDA

namespace {

Status ReadSpecs(OpKernelConstruction* ctx, int n, std::vector<ex::TableSpec>* out) {
  std::vector<int64_t> targets, rows, dims;
  TF_RETURN_IF_ERROR(ctx->GetAttr("targets", &targets));
  TF_RETURN_IF_ERROR(ctx->GetAttr("rows", &rows));
  if (ctx->HasAttr("dims")) TF_RETURN_IF_ERROR(ctx->GetAttr("dims", &dims));
  if (dims.empty()) dims.assign(n, 1);
  if (static_cast<int>(targets.size()) != n || static_cast<int>(rows.size()) != n ||
      static_cast<int>(dims.size()) != n) {
    return errors::InvalidArgument("exchange: targets, rows and dims need one entry per table (", n,
                                   ")");
  }
  out->resize(n);
  for (int t = 0; t < n; ++t) (*out)[t] = ex::TableSpec{targets[t], rows[t], dims[t]};
  return OkStatus();
}

Status ReadDims(OpKernelConstruction* ctx, int n, std::vector<int64_t>* dims) {
  TF_RETURN_IF_ERROR(ctx->GetAttr("dims", dims));
  if (static_cast<int>(dims->size()) != n) {
    return errors::InvalidArgument("exchange: dims needs one entry per table (", n, ")");
  }
  for (int64_t x : *dims) {
    if (x < 1) return errors::InvalidArgument("exchange: dims must be positive, got ", x);
  }
  return OkStatus();
}

// The block layout of a host [world, >= n] count matrix.
Status LayoutOf(const Tensor& counts, const std::vector<int64_t>& dims, ex::BlockLayout* l) {
  const int n = static_cast<int>(dims.size());
  if (counts.dims() != 2 || counts.dim_size(1) < n || counts.dim_size(0) < 1) {
    return errors::InvalidArgument("exchange: counts must be [world, >= ", n, "], got ",
                                   counts.shape().DebugString());
  }
  return ToTf(ex::BlockLayout::Of(counts.flat<int64_t>().data(),
                                  static_cast<int>(counts.dim_size(1)),
                                  static_cast<int>(counts.dim_size(0)), dims, l));
}

// Host sizes [n] of a gather / scatter, checked against row_at.
// Table t's rows input (a list of N float tensors) as [rows, dims[t]], checked.
Status RowsInput(OpKernelContext* ctx, const std::vector<int64_t>& dims,
                 std::vector<const float*>* ptrs, std::vector<int64_t>* rows) {
  OpInputList list;
  TF_RETURN_IF_ERROR(ctx->input_list("rows", &list));
  ptrs->resize(list.size());
  rows->resize(list.size());
  for (int t = 0; t < list.size(); ++t) {
    const Tensor& r = list[t];
    if (r.dims() != 2 || r.dim_size(1) != dims[t]) {
      return errors::InvalidArgument("exchange: rows of table ", t, " must be [n, ", dims[t],
                                     "], got ", r.shape().DebugString());
    }
    (*ptrs)[t] = r.flat<float>().data();
    (*rows)[t] = r.dim_size(0);
  }
  return OkStatus();
}

}  // namespace

// Host arithmetic on both devices: its inputs are sizes the all-to-all left in host memory, and
// its outputs size the rows' all-to-alls. On the GPU every tensor stays in host memory, so the
// op runs in the exchange's own device partition (no cross-device sends between the keys' and
// the rows' all-to-alls).
template <typename Device>
class ExchangeSizesOp : public SokOpKernel<Device> {
 public:
  explicit ExchangeSizesOp(OpKernelConstruction* ctx) : SokOpKernel<Device>(ctx) {
    std::vector<int64_t> dims;  // ReadDims checks them; GetAttr appends to a list
    OP_REQUIRES_OK(ctx, ctx->GetAttr("dims", &dims));
    OP_REQUIRES_OK(ctx, ReadDims(ctx, static_cast<int>(dims.size()), &dims_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("signature", &signature_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("mismatch", &mismatch_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("bad_ids", &bad_ids_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("table_names", &names_));
  }

 protected:
  void ComputeOnDevice(OpKernelContext* ctx) override {
    const Tensor& received = ctx->input(0);
    const Tensor& sent = ctx->input(1);
    const int n = static_cast<int>(dims_.size());
    for (const Tensor* m : {&received, &sent}) {
      OP_REQUIRES(ctx,
                  m->dims() == 2 && m->dim_size(1) == n + 2 && m->dim_size(0) >= 1 &&
                      m->shape() == received.shape(),
                  errors::InvalidArgument("exchange: size matrices must be [world, ", n + 2,
                                          "], got ", received.shape().DebugString(), " and ",
                                          sent.shape().DebugString()));
    }
    const int world = static_cast<int>(received.dim_size(0));
    const int64_t* recv = received.flat<int64_t>().data();
    const ex::HeaderCheck check = ex::check_headers(recv, world, n, signature_);
    OP_REQUIRES(ctx, check.same_tables,
                errors::InvalidArgument(mismatch_, " Table-list signatures of ranks 0..", world - 1,
                                        ": ", Column(recv, world, n, n)));
    OP_REQUIRES(ctx, check.ids_valid,
                errors::InvalidArgument(bad_ids_, " ", Column(recv, world, n, n + 1)));
    if (check.bad_positions_rank >= 0) {
      const int t = check.bad_positions_table;
      ctx->CtxFailure(errors::InvalidArgument(
          "lookup_sparse: ids of table '",
          t < static_cast<int>(names_.size()) ? names_[t] : std::to_string(t), "' on rank ",
          check.bad_positions_rank,
          ": an index is negative or beyond dense_shape (every rank stops at this lookup)"));
      return;
    }
    Tensor *owed_to, *due_from;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({world}), &owed_to));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({world}), &due_from));
    ex::floats_per_rank(recv, world, dims_, owed_to->flat<int64_t>().data());
    ex::floats_per_rank(sent.flat<int64_t>().data(), world, dims_,
                        due_from->flat<int64_t>().data());
  }

 private:
  // Every rank's header column c, as "[a b ...]".
  static std::string Column(const int64_t* m, int world, int n, int c) {
    std::string out = "[";
    for (int q = 0; q < world; ++q) {
      absl::StrAppend(&out, q ? " " : "", m[static_cast<int64_t>(q) * (n + 2) + c]);
    }
    return out + "]";
  }

  std::vector<int64_t> dims_;
  int64_t signature_ = 0;
  std::string mismatch_, bad_ids_;
  std::vector<std::string> names_;
};

template <typename Device>
class ExchangePlanOp : public SokOpKernel<Device> {
 public:
  explicit ExchangePlanOp(OpKernelConstruction* ctx) : SokOpKernel<Device>(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("N", &n_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("world", &world_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("signature", &signature_));
    OP_REQUIRES_OK(ctx, ReadSpecs(ctx, n_, &tables_));
  }

 protected:
  void ComputeOnDevice(OpKernelContext* ctx) override {
    OpInputList keys, counts;
    OP_REQUIRES_OK(ctx, ctx->input_list("keys", &keys));
    OP_REQUIRES_OK(ctx, ctx->input_list("counts", &counts));
    const Tensor& valid = ctx->input(2 * n_);
    OP_REQUIRES(ctx, valid.NumElements() == 0 || valid.NumElements() == n_,
                errors::InvalidArgument("exchange: valid holds ", valid.NumElements(),
                                        " counts for ", n_, " tables"));
    Tensor* sizes;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(3, TensorShape({n_}), &sizes));
    std::vector<const int64_t*> key_ptrs(n_), count_ptrs(n_);
    int64_t total = 0;
    for (int t = 0; t < n_; ++t) {
      const int64_t k = keys[t].NumElements();
      OP_REQUIRES(ctx, counts[t].NumElements() == k || counts[t].NumElements() == 0,
                  errors::InvalidArgument("exchange: table ", t, " has ", k, " keys but ",
                                          counts[t].NumElements(), " counts"));
      key_ptrs[t] = keys[t].flat<int64_t>().data();
      count_ptrs[t] = counts[t].NumElements() ? counts[t].flat<int64_t>().data() : nullptr;
      sizes->flat<int64_t>()(t) = k;
      total += k;
    }
    Tensor *request, *matrix, *row_at;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({total, 2}), &request));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({world_, n_ + 2}), &matrix));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, TensorShape({total}), &row_at));
    OP_REQUIRES_OK(ctx,
                   ExchangeOn<Device>::Plan(
                       ctx, tables_, world_, key_ptrs, count_ptrs, sizes->flat<int64_t>().data(),
                       valid.NumElements() ? valid.flat<int64_t>().data() : nullptr, signature_,
                       request->flat<int64_t>().data(), matrix->flat<int64_t>().data(),
                       row_at->flat<int64_t>().data()));
  }

 private:
  int n_ = 0, world_ = 1;
  int64_t signature_ = 0;
  std::vector<ex::TableSpec> tables_;
};

template <typename Device>
class ExchangeOwnerKeysOp : public SokOpKernel<Device> {
 public:
  explicit ExchangeOwnerKeysOp(OpKernelConstruction* ctx) : SokOpKernel<Device>(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("N", &n_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("padded", &padded_));
    OP_REQUIRES_OK(ctx, ReadSpecs(ctx, n_, &tables_));
    for (const ex::TableSpec& t : tables_) dims_.push_back(t.dim);
  }

 protected:
  void ComputeOnDevice(OpKernelContext* ctx) override {
    const Tensor& received = ctx->input(0);
    ex::BlockLayout l;
    OP_REQUIRES_OK(ctx, LayoutOf(ctx->input(1), dims_, &l));
    OP_REQUIRES(
        ctx, received.dims() == 2 && received.dim_size(1) == 2 && received.dim_size(0) == l.rows,
        errors::InvalidArgument("exchange: received must be [", l.rows,
                                ", 2] as the counts say, got ", received.shape().DebugString()));
    const int n = n_;
    const int64_t world = l.world;
    auto allocate = [ctx, n, world](const std::vector<int64_t>& sizes, OwnerKeysOut* out) {
      std::vector<TensorShape> shapes;
      int64_t total = 0;
      for (int t = 0; t < n; ++t) {
        shapes.push_back(TensorShape({sizes[t]}));
        total += sizes[t];
      }
      std::vector<Tensor*> keys, counts;
      TF_RETURN_IF_ERROR(AllocateTableOutputs<Device>(ctx, 0, DT_INT64, shapes, &keys));
      TF_RETURN_IF_ERROR(AllocateTableOutputs<Device>(ctx, n, DT_INT64, shapes, &counts));
      Tensor *row_pos, *sizes_out, *valid;
      TF_RETURN_IF_ERROR(ctx->allocate_output(2 * n, TensorShape({total, world}), &row_pos));
      TF_RETURN_IF_ERROR(ctx->allocate_output(2 * n + 1, TensorShape({n}), &sizes_out));
      TF_RETURN_IF_ERROR(ctx->allocate_output(2 * n + 2, TensorShape({n}), &valid));
      for (int t = 0; t < n; ++t) {
        out->keys.push_back(keys[t]->flat<int64_t>().data());
        out->counts.push_back(counts[t]->flat<int64_t>().data());
        sizes_out->flat<int64_t>()(t) = sizes[t];
      }
      out->row_pos = row_pos->flat<int64_t>().data();
      out->valid = valid->flat<int64_t>().data();
      return OkStatus();
    };
    OP_REQUIRES_OK(ctx,
                   ExchangeOn<Device>::OwnerKeys(ctx, tables_, l, received.flat<int64_t>().data(),
                                                 padded_, allocate, &state_));
  }

 private:
  typename ExchangeOn<Device>::State state_;
  int n_ = 0;
  bool padded_ = false;
  std::vector<ex::TableSpec> tables_;
  std::vector<int64_t> dims_;
};

// row_pos [sum(distinct), world] against `distinct` [n] (host).
Status CheckRowPos(const Tensor& row_pos, const int64_t* distinct, int n, int64_t* world) {
  int64_t total = 0;
  for (int t = 0; t < n; ++t) {
    if (distinct[t] < 0) return errors::InvalidArgument("exchange: negative distinct count");
    total += distinct[t];
  }
  if (row_pos.dims() != 2 || row_pos.dim_size(0) != total) {
    return errors::InvalidArgument("exchange: row_pos must be [", total, ", world], got ",
                                   row_pos.shape().DebugString());
  }
  *world = row_pos.dim_size(1);
  return OkStatus();
}

template <typename Device>
class ExchangeRowsToBlocksOp : public SokOpKernel<Device> {
 public:
  explicit ExchangeRowsToBlocksOp(OpKernelConstruction* ctx) : SokOpKernel<Device>(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("N", &n_));
    OP_REQUIRES_OK(ctx, ReadDims(ctx, n_, &dims_));
  }

 protected:
  void ComputeOnDevice(OpKernelContext* ctx) override {
    ex::BlockLayout l;
    OP_REQUIRES_OK(ctx, LayoutOf(ctx->input(n_ + 1), dims_, &l));
    std::vector<const float*> rows;
    std::vector<int64_t> distinct;
    OP_REQUIRES_OK(ctx, RowsInput(ctx, dims_, &rows, &distinct));
    int64_t world;
    OP_REQUIRES_OK(ctx, CheckRowPos(ctx->input(n_), distinct.data(), n_, &world));
    OP_REQUIRES(
        ctx, world == l.world,
        errors::InvalidArgument("exchange: row_pos has ", world, " ranks, counts ", l.world));
    Tensor* flat;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({l.flat_elems}), &flat));
    OP_REQUIRES_OK(
        ctx, ExchangeOn<Device>::ToBlocks(ctx, dims_, distinct.data(), static_cast<int>(world),
                                          ctx->input(n_).flat<int64_t>().data(), rows,
                                          flat->flat<float>().data()));
  }

 private:
  int n_ = 0;
  std::vector<int64_t> dims_;
};

template <typename Device>
class ExchangeRowsFromBlocksOp : public SokOpKernel<Device> {
 public:
  explicit ExchangeRowsFromBlocksOp(OpKernelConstruction* ctx) : SokOpKernel<Device>(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("N", &n_));
    OP_REQUIRES_OK(ctx, ReadDims(ctx, n_, &dims_));
  }

 protected:
  void ComputeOnDevice(OpKernelContext* ctx) override {
    const Tensor &flat = ctx->input(0), &row_pos = ctx->input(1), &distinct_t = ctx->input(2);
    OP_REQUIRES(ctx, distinct_t.NumElements() == n_,
                errors::InvalidArgument("exchange: distinct needs one entry per table (", n_, ")"));
    const int64_t* distinct = distinct_t.flat<int64_t>().data();
    int64_t world;
    OP_REQUIRES_OK(ctx, CheckRowPos(row_pos, distinct, n_, &world));
    std::vector<TensorShape> shapes;
    for (int t = 0; t < n_; ++t) shapes.push_back(TensorShape({distinct[t], dims_[t]}));
    std::vector<Tensor*> rows;
    OP_REQUIRES_OK(ctx, AllocateTableOutputs<Device>(ctx, 0, DT_FLOAT, shapes, &rows));
    std::vector<float*> ptrs(n_);
    for (int t = 0; t < n_; ++t) ptrs[t] = rows[t]->flat<float>().data();
    OP_REQUIRES_OK(ctx, ExchangeOn<Device>::FromBlocks(
                            ctx, dims_, distinct, static_cast<int>(world),
                            row_pos.flat<int64_t>().data(), flat.flat<float>().data(), ptrs));
  }

 private:
  int n_ = 0;
  std::vector<int64_t> dims_;
};

template <typename Device>
class ExchangeGatherRowsOp : public SokOpKernel<Device> {
 public:
  explicit ExchangeGatherRowsOp(OpKernelConstruction* ctx) : SokOpKernel<Device>(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("N", &n_));
    OP_REQUIRES_OK(ctx, ReadDims(ctx, n_, &dims_));
  }

 protected:
  void ComputeOnDevice(OpKernelContext* ctx) override {
    const Tensor &returned = ctx->input(0), &row_at = ctx->input(1), &sizes = ctx->input(2);
    OP_REQUIRES_OK(ctx, CheckFlatSizes("exchange", sizes, row_at, {}, n_));
    // Padded keys (row_at -1) have no row among the returned ones.
    OP_REQUIRES(ctx, returned.NumElements() <= FlatFloats(sizes, dims_),
                errors::InvalidArgument("exchange: ", returned.NumElements(),
                                        " returned floats for at most ", FlatFloats(sizes, dims_)));
    std::vector<TensorShape> shapes;
    for (int t = 0; t < n_; ++t) {
      shapes.push_back(TensorShape({sizes.flat<int64_t>()(t), dims_[t]}));
    }
    std::vector<Tensor*> rows;
    OP_REQUIRES_OK(ctx, AllocateTableOutputs<Device>(ctx, 0, DT_FLOAT, shapes, &rows));
    std::vector<float*> ptrs(n_);
    for (int t = 0; t < n_; ++t) ptrs[t] = rows[t]->flat<float>().data();
    OP_REQUIRES_OK(ctx, ExchangeOn<Device>::Gather(ctx, dims_, sizes.flat<int64_t>().data(),
                                                   row_at.flat<int64_t>().data(),
                                                   returned.flat<float>().data(), ptrs));
  }

 private:
  int n_ = 0;
  std::vector<int64_t> dims_;
};

template <typename Device>
class ExchangeScatterRowsOp : public SokOpKernel<Device> {
 public:
  explicit ExchangeScatterRowsOp(OpKernelConstruction* ctx) : SokOpKernel<Device>(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("N", &n_));
    OP_REQUIRES_OK(ctx, ReadDims(ctx, n_, &dims_));
  }

 protected:
  void ComputeOnDevice(OpKernelContext* ctx) override {
    const Tensor &row_at = ctx->input(n_), &sizes = ctx->input(n_ + 1);
    OP_REQUIRES_OK(ctx, CheckFlatSizes("exchange", sizes, row_at, {}, n_));
    const Tensor& per_owner = ctx->input(n_ + 2);
    int64_t floats = 0;
    for (int64_t q = 0; q < per_owner.NumElements(); ++q) floats += per_owner.flat<int64_t>()(q);
    OP_REQUIRES(ctx, floats <= FlatFloats(sizes, dims_),
                errors::InvalidArgument("exchange: ", floats, " returned floats for at most ",
                                        FlatFloats(sizes, dims_)));
    std::vector<const float*> rows;
    std::vector<int64_t> num_rows;
    OP_REQUIRES_OK(ctx, RowsInput(ctx, dims_, &rows, &num_rows));
    for (int t = 0; t < n_; ++t) {
      OP_REQUIRES(ctx, num_rows[t] == sizes.flat<int64_t>()(t),
                  errors::InvalidArgument("exchange: table ", t, " has ", num_rows[t], " rows for ",
                                          sizes.flat<int64_t>()(t), " keys"));
    }
    Tensor* returned;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({floats}), &returned));
    OP_REQUIRES_OK(ctx, ExchangeOn<Device>::Scatter(ctx, dims_, sizes.flat<int64_t>().data(),
                                                    row_at.flat<int64_t>().data(), rows,
                                                    returned->flat<float>().data()));
  }

 private:
  int n_ = 0;
  std::vector<int64_t> dims_;
};

REGISTER_KERNEL_BUILDER(Name("SokExchangeSizes").Device(DEVICE_CPU), ExchangeSizesOp<CpuDevice>);
REGISTER_KERNEL_BUILDER(Name("SokExchangePlan").Device(DEVICE_CPU), ExchangePlanOp<CpuDevice>);
REGISTER_KERNEL_BUILDER(Name("SokExchangeOwnerKeys").Device(DEVICE_CPU),
                        ExchangeOwnerKeysOp<CpuDevice>);
REGISTER_KERNEL_BUILDER(Name("SokExchangeRowsToBlocks").Device(DEVICE_CPU),
                        ExchangeRowsToBlocksOp<CpuDevice>);
REGISTER_KERNEL_BUILDER(Name("SokExchangeRowsFromBlocks").Device(DEVICE_CPU),
                        ExchangeRowsFromBlocksOp<CpuDevice>);
REGISTER_KERNEL_BUILDER(Name("SokExchangeGatherRows").Device(DEVICE_CPU),
                        ExchangeGatherRowsOp<CpuDevice>);
REGISTER_KERNEL_BUILDER(Name("SokExchangeScatterRows").Device(DEVICE_CPU),
                        ExchangeScatterRowsOp<CpuDevice>);
#if GOOGLE_CUDA
REGISTER_KERNEL_BUILDER(Name("SokExchangeSizes")
                            .Device(DEVICE_GPU)
                            .HostMemory("received")
                            .HostMemory("sent")
                            .HostMemory("owed_to")
                            .HostMemory("due_from"),
                        ExchangeSizesOp<GpuDevice>);
REGISTER_KERNEL_BUILDER(Name("SokExchangePlan").Device(DEVICE_GPU).HostMemory("sizes"),
                        ExchangePlanOp<GpuDevice>);
REGISTER_KERNEL_BUILDER(Name("SokExchangeOwnerKeys")
                            .Device(DEVICE_GPU)
                            .HostMemory("recv_counts")
                            .HostMemory("distinct"),
                        ExchangeOwnerKeysOp<GpuDevice>);
REGISTER_KERNEL_BUILDER(Name("SokExchangeRowsToBlocks").Device(DEVICE_GPU).HostMemory("counts"),
                        ExchangeRowsToBlocksOp<GpuDevice>);
REGISTER_KERNEL_BUILDER(Name("SokExchangeRowsFromBlocks").Device(DEVICE_GPU).HostMemory("distinct"),
                        ExchangeRowsFromBlocksOp<GpuDevice>);
REGISTER_KERNEL_BUILDER(Name("SokExchangeGatherRows").Device(DEVICE_GPU).HostMemory("sizes"),
                        ExchangeGatherRowsOp<GpuDevice>);
REGISTER_KERNEL_BUILDER(Name("SokExchangeScatterRows")
                            .Device(DEVICE_GPU)
                            .HostMemory("sizes")
                            .HostMemory("returned_floats"),
                        ExchangeScatterRowsOp<GpuDevice>);
#endif

}  // namespace sok_kernels
}  // namespace tensorflow
