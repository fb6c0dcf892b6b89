// Kernels of the collectives between GPUs (ops/collective_ops.cc) over core/cuda/collectives.h:
// the bootstrap runs on the CPU, the all-to-all and all-reduce on TensorFlow's GPU stream.
#include "addons/sparse_operation_kit/tf/kernels/device.h"

#if GOOGLE_CUDA
#include "addons/sparse_operation_kit/core/cuda/collectives.h"
#endif

namespace tensorflow {
namespace sok_kernels {

#if GOOGLE_CUDA
using sok::gpu::Communicator;

class NcclUniqueIdOp : public SokOpKernel<CpuDevice> {
 public:
  using SokOpKernel::SokOpKernel;

 protected:
  void ComputeOnDevice(OpKernelContext* ctx) override {
    std::string id;
    OP_REQUIRES_OK(ctx, ToTf(sok::gpu::nccl_unique_id(&id)));
    Tensor* out;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    out->scalar<tstring>()() = id;
  }
};

class NcclInitOp : public SokOpKernel<CpuDevice> {
 public:
  explicit NcclInitOp(OpKernelConstruction* ctx) : SokOpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("rank", &rank_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("world", &world_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("device", &device_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("timeout_seconds", &timeout_));
  }

 protected:
  void ComputeOnDevice(OpKernelContext* ctx) override {
    if (Communicator* c = Communicator::on_device(device_)) {
      OP_REQUIRES(ctx, c->rank() == rank_ && c->world() == world_,
                  errors::FailedPrecondition("this process already has an NCCL communicator on "
                                             "GPU ",
                                             device_, " as rank ", c->rank(), " of ", c->world(),
                                             ", not rank ", rank_, " of ", world_));
      return;
    }
    const std::string id(ctx->input(0).scalar<tstring>()());
    std::unique_ptr<Communicator> comm;
    OP_REQUIRES_OK(ctx, ToTf(Communicator::Create(id, rank_, world_, device_, timeout_, &comm)));
    OP_REQUIRES_OK(ctx, ToTf(Communicator::install(std::move(comm))));
  }

 private:
  int rank_, world_, device_;
  float timeout_;
};

// The communicator of the GPU the kernel runs on.
Status CommunicatorOf(OpKernelContext* ctx, Communicator** comm) {
  int device = -1;
  cudaError_t e = cudaStreamGetDevice(OnDevice<GpuDevice>::Stream(ctx), &device);
  if (e != cudaSuccess) return ToTf(sok::gpu::cuda_status(e, "cudaStreamGetDevice"));
  *comm = Communicator::on_device(device);
  if (*comm == nullptr) {
    return errors::FailedPrecondition(
        "no NCCL communicator on GPU ", device,
        " in this process: sok.init() makes one, under horovodrun with a GPU per rank, on the GPU "
        "tf.config shows the rank. A TF1 Session given its own ConfigProto ignores tf.config's "
        "visible devices: set its gpu_options.visible_device_list to the same GPU");
  }
  return OkStatus();
}

// Rows of `input` as `row_bytes`-byte rows (dim 0 counts rows).
size_t RowBytes(const Tensor& input) {
  TensorShape row_shape = input.shape();
  row_shape.RemoveDim(0);
  return row_shape.num_elements() * DataTypeSize(input.dtype());
}

Status AllocateRows(OpKernelContext* ctx, const Tensor& input, int64_t rows, Tensor** out) {
  TensorShape shape = input.shape();
  shape.set_dim(0, rows);
  return ctx->allocate_output(0, shape, out);
}

// The rows' half of both all-to-alls: the counts checked, the output (input 0's rows) allocated,
// send[p] rows sent to rank p and recv[p] received from it. `what` names the op's counts.
// tail_ok: the input may hold rows past the counts, which are not sent (a padded request).
Status SendRows(OpKernelContext* ctx, Communicator* comm, const int64_t* send, const int64_t* recv,
                const char* what, bool tail_ok, cudaStream_t stream) {
  const Tensor& input = ctx->input(0);
  int64_t sent = 0, received = 0;
  for (int p = 0; p < comm->world(); ++p) {
    if (send[p] < 0 || recv[p] < 0) {
      return errors::InvalidArgument(what, ": negative count for rank ", p);
    }
    sent += send[p];
    received += recv[p];
  }
  if (tail_ok ? sent > input.dim_size(0) : sent != input.dim_size(0)) {
    return errors::InvalidArgument(what, " sum to ", sent, " but the input has ", input.dim_size(0),
                                   " rows");
  }
  Tensor* output;
  TF_RETURN_IF_ERROR(AllocateRows(ctx, input, received, &output));
  return ToTf(comm->all_to_all(input.data(), send, output->data(), recv, RowBytes(input), stream));
}

class AllToAllOp : public SokOpKernel<GpuDevice> {
 public:
  explicit AllToAllOp(OpKernelConstruction* ctx) : SokOpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("row_columns", &row_columns_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("width_mismatch", &width_mismatch_));
  }

 protected:
  void ComputeOnDevice(OpKernelContext* ctx) override {
    const Tensor& input = ctx->input(0);
    const Tensor& send_counts = ctx->input(1);
    Communicator* comm;
    OP_REQUIRES_OK(ctx, CommunicatorOf(ctx, &comm));
    const int world = comm->world();
    OP_REQUIRES(ctx, input.dims() >= 1,
                errors::InvalidArgument("SokAllToAll: the input needs a dimension of rows"));
    OP_REQUIRES(
        ctx, send_counts.dims() >= 1 && send_counts.dims() <= 2 && send_counts.dim_size(0) == world,
        errors::InvalidArgument("SokAllToAll: send_counts must have a row per rank (", world,
                                "), got shape ", send_counts.shape().DebugString()));
    const int k = send_counts.dims() == 2 ? static_cast<int>(send_counts.dim_size(1)) : 1;
    const int row_columns = row_columns_ < 0 ? k : row_columns_;
    OP_REQUIRES(ctx, row_columns <= k,
                errors::InvalidArgument("SokAllToAll: row_columns ", row_columns, " of ", k));
    Tensor* outs[3];
    for (int i = 0; i < 3; ++i) {
      OP_REQUIRES_OK(ctx, ctx->allocate_output(i + 1, send_counts.shape(), &outs[i]));
    }
    Tensor host;
    AllocatorAttributes pinned;
    pinned.set_on_host(true);
    pinned.set_gpu_compatible(true);
    OP_REQUIRES_OK(ctx, ctx->allocate_temp(DT_INT64, TensorShape({2 * world * k}), &host, pinned));
    const cudaStream_t stream = OnDevice<GpuDevice>::Stream(ctx);
    auto hold = comm->lock();
    int64_t* counts = host.flat<int64_t>().data();
    OP_REQUIRES_OK(ctx, ExchangeCounts(comm, send_counts, outs[0], k, counts, stream));
    std::copy(counts, counts + world * k, outs[1]->flat<int64_t>().data());
    std::copy(counts + world * k, counts + 2 * world * k, outs[2]->flat<int64_t>().data());
    std::vector<int64_t> send_rows(world, 0), recv_rows(world, 0);
    for (int p = 0; p < world; ++p) {
      for (int c = 0; c < row_columns; ++c) {
        send_rows[p] += counts[p * k + c];
        recv_rows[p] += counts[(world + p) * k + c];
      }
    }
    OP_REQUIRES_OK(ctx, SendRows(ctx, comm, send_rows.data(), recv_rows.data(),
                                 "SokAllToAll: "
                                 "send_counts",
                                 /*tail_ok=*/true, stream));
  }

 private:
  // Every rank sends the same number of columns, or every rank fails alike (a rank that posted
  // a different width would leave NCCL's sends and receives unmatched).
  Status ExchangeCounts(Communicator* comm, const Tensor& send_counts, Tensor* recv_counts, int k,
                        int64_t* counts, cudaStream_t stream) {
    const int64_t* send = send_counts.flat<int64_t>().data();
    int64_t* recv = recv_counts->flat<int64_t>().data();
    if (send_counts.dims() == 1) return ToTf(comm->exchange_counts(send, recv, 1, counts, stream));
    const int world = comm->world();
    std::vector<int64_t> widths(world);
    TF_RETURN_IF_ERROR(
        ToTf(comm->exchange_count_matrix(send, recv, k, counts, widths.data(), stream)));
    if (std::all_of(widths.begin(), widths.end(), [k](int64_t w) { return w == k; })) {
      return OkStatus();
    }
    std::string per_rank;
    for (int p = 0; p < world; ++p) absl::StrAppend(&per_rank, p ? ", " : "", widths[p]);
    return errors::InvalidArgument(width_mismatch_, " Count columns per rank 0..", world - 1, ": [",
                                   per_rank, "]");
  }

  int row_columns_ = -1;
  std::string width_mismatch_;
};

class AllToAllSizedOp : public SokOpKernel<GpuDevice> {
 public:
  using SokOpKernel::SokOpKernel;

 protected:
  void ComputeOnDevice(OpKernelContext* ctx) override {
    const Tensor& input = ctx->input(0);
    const Tensor& send_rows = ctx->input(1);
    const Tensor& recv_rows = ctx->input(2);
    Communicator* comm;
    OP_REQUIRES_OK(ctx, CommunicatorOf(ctx, &comm));
    const int world = comm->world();
    OP_REQUIRES(ctx, input.dims() >= 1,
                errors::InvalidArgument("SokAllToAllSized: the input needs a dimension of rows"));
    OP_REQUIRES(ctx, send_rows.NumElements() == world && recv_rows.NumElements() == world,
                errors::InvalidArgument("SokAllToAllSized: send_rows and recv_rows need one "
                                        "count per rank (",
                                        world, ")"));
    auto hold = comm->lock();
    OP_REQUIRES_OK(ctx, SendRows(ctx, comm, send_rows.flat<int64_t>().data(),
                                 recv_rows.flat<int64_t>().data(), "SokAllToAllSized: send_rows",
                                 /*tail_ok=*/false, OnDevice<GpuDevice>::Stream(ctx)));
  }
};

template <typename T>
struct NcclTypeOf;
template <>
struct NcclTypeOf<Eigen::half> {
  static constexpr sok::gpu::NcclType value = sok::gpu::NcclType::kFloat16;
};
template <>
struct NcclTypeOf<float> {
  static constexpr sok::gpu::NcclType value = sok::gpu::NcclType::kFloat32;
};
template <>
struct NcclTypeOf<double> {
  static constexpr sok::gpu::NcclType value = sok::gpu::NcclType::kFloat64;
};
template <>
struct NcclTypeOf<int32> {
  static constexpr sok::gpu::NcclType value = sok::gpu::NcclType::kInt32;
};
template <>
struct NcclTypeOf<int64_t> {
  static constexpr sok::gpu::NcclType value = sok::gpu::NcclType::kInt64;
};

template <typename T>
class AllReduceOp : public SokOpKernel<GpuDevice> {
 public:
  explicit AllReduceOp(OpKernelConstruction* ctx) : SokOpKernel(ctx) {
    std::string reduction;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("reduction", &reduction));
    mean_ = reduction == "mean";
  }

 protected:
  void ComputeOnDevice(OpKernelContext* ctx) override {
    Communicator* comm;
    OP_REQUIRES_OK(ctx, CommunicatorOf(ctx, &comm));
    std::vector<Tensor*> outs(ctx->num_inputs());
    for (int i = 0; i < ctx->num_inputs(); ++i) {
      OP_REQUIRES_OK(ctx, ctx->allocate_output(i, ctx->input(i).shape(), &outs[i]));
    }
    const cudaStream_t stream = OnDevice<GpuDevice>::Stream(ctx);
    auto hold = comm->lock();
    OP_REQUIRES_OK(ctx, ToTf(comm->group_start()));
    sok::Status s;
    for (int i = 0; i < ctx->num_inputs() && s.ok(); ++i) {
      const Tensor& in = ctx->input(i);
      if (in.NumElements() == 0) continue;
      s = comm->all_reduce(in.data(), outs[i]->data(), in.NumElements(), NcclTypeOf<T>::value,
                           mean_, stream);
    }
    sok::Status end = comm->group_end();
    OP_REQUIRES_OK(ctx, ToTf(s.ok() ? end : s));
  }

 private:
  bool mean_ = true;
};

REGISTER_KERNEL_BUILDER(Name("SokNcclUniqueId").Device(DEVICE_CPU), NcclUniqueIdOp);
REGISTER_KERNEL_BUILDER(Name("SokNcclInit").Device(DEVICE_CPU), NcclInitOp);
REGISTER_KERNEL_BUILDER(Name("SokAllToAll")
                            .Device(DEVICE_GPU)
                            .HostMemory("send_counts_host")
                            .HostMemory("recv_counts_host"),
                        AllToAllOp);
REGISTER_KERNEL_BUILDER(
    Name("SokAllToAllSized").Device(DEVICE_GPU).HostMemory("send_rows").HostMemory("recv_rows"),
    AllToAllSizedOp);
#define SOK_REGISTER_ALL_REDUCE(T)                                                        \
  REGISTER_KERNEL_BUILDER(Name("SokAllReduce").Device(DEVICE_GPU).TypeConstraint<T>("T"), \
                          AllReduceOp<T>);
SOK_REGISTER_ALL_REDUCE(Eigen::half)
SOK_REGISTER_ALL_REDUCE(float)
SOK_REGISTER_ALL_REDUCE(double)
SOK_REGISTER_ALL_REDUCE(int32)
SOK_REGISTER_ALL_REDUCE(int64_t)
#undef SOK_REGISTER_ALL_REDUCE
#endif  // GOOGLE_CUDA

}  // namespace sok_kernels
}  // namespace tensorflow
