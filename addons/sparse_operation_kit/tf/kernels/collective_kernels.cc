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
        " in this process: sok.init() makes one when the job runs under horovodrun with GPUs");
  }
  return OkStatus();
}

class AllToAllOp : public SokOpKernel<GpuDevice> {
 public:
  using SokOpKernel::SokOpKernel;

 protected:
  void ComputeOnDevice(OpKernelContext* ctx) override {
    const Tensor& input = ctx->input(0);
    const Tensor& send_counts = ctx->input(1);
    Communicator* comm;
    OP_REQUIRES_OK(ctx, CommunicatorOf(ctx, &comm));
    const int world = comm->world();
    OP_REQUIRES(ctx, input.dims() >= 1,
                errors::InvalidArgument("SokAllToAll: the input needs a dimension of rows"));
    OP_REQUIRES(ctx, send_counts.dims() == 1 && send_counts.NumElements() == world,
                errors::InvalidArgument("SokAllToAll: send_counts must have one count per rank (",
                                        world, "), got shape ", send_counts.shape().DebugString()));
    TensorShape row_shape = input.shape();
    row_shape.RemoveDim(0);
    const size_t row_bytes = row_shape.num_elements() * DataTypeSize(input.dtype());
    Tensor* recv_counts;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({world}), &recv_counts));
    Tensor host;
    AllocatorAttributes pinned;
    pinned.set_on_host(true);
    pinned.set_gpu_compatible(true);
    OP_REQUIRES_OK(ctx, ctx->allocate_temp(DT_INT64, TensorShape({2 * world}), &host, pinned));
    const cudaStream_t stream = OnDevice<GpuDevice>::Stream(ctx);
    auto hold = comm->lock();
    const int64_t* counts = host.flat<int64_t>().data();
    OP_REQUIRES_OK(ctx, ToTf(comm->exchange_counts(send_counts.flat<int64_t>().data(),
                                                   recv_counts->flat<int64_t>().data(),
                                                   host.flat<int64_t>().data(), stream)));
    int64_t sent = 0, received = 0;
    for (int p = 0; p < world; ++p) {
      OP_REQUIRES(ctx, counts[p] >= 0 && counts[world + p] >= 0,
                  errors::InvalidArgument("SokAllToAll: negative count for rank ", p));
      sent += counts[p];
      received += counts[world + p];
    }
    OP_REQUIRES(ctx, sent == input.dim_size(0),
                errors::InvalidArgument("SokAllToAll: send_counts sum to ", sent,
                                        " but the input "
                                        "has ",
                                        input.dim_size(0), " rows"));
    TensorShape out_shape = row_shape;
    out_shape.InsertDim(0, received);
    Tensor* output;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, out_shape, &output));
    OP_REQUIRES_OK(ctx, ToTf(comm->all_to_all(input.data(), counts, output->data(), counts + world,
                                              row_bytes, stream)));
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
REGISTER_KERNEL_BUILDER(Name("SokAllToAll").Device(DEVICE_GPU), AllToAllOp);
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
