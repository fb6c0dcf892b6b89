// SokCheckRowIds (tf/ops/lookup_ops.cc): a static table's ids against its rows, on the device
// that holds them (core/lookup.h's first_id_outside; on the GPU core/cuda/row_ids.h).
#include <string>

#include "absl/strings/str_cat.h"
#include "addons/sparse_operation_kit/core/lookup.h"
#include "addons/sparse_operation_kit/tf/kernels/device.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"

#if GOOGLE_CUDA
#include "addons/sparse_operation_kit/core/cuda/row_ids.h"
#endif

namespace tensorflow {
namespace sok_kernels {
namespace {

template <typename Device>
struct RowIdsOn;

template <>
struct RowIdsOn<CpuDevice> {
  template <typename K>
  static Status FirstOutside(OpKernelContext*, const K* ids, int64_t n, int64_t rows,
                             int64_t* position, K* id) {
    *position = sok::first_id_outside(ids, n, rows);
    if (*position >= 0) *id = ids[*position];
    return OkStatus();
  }
};

#if GOOGLE_CUDA
template <>
struct RowIdsOn<GpuDevice> {
  template <typename K>
  static Status FirstOutside(OpKernelContext* ctx, const K* ids, int64_t n, int64_t rows,
                             int64_t* position, K* id) {
    Tensor scratch;
    TF_RETURN_IF_ERROR(ctx->allocate_temp(DT_INT64, TensorShape({1}), &scratch));
    return ToTf(sok::gpu::first_id_outside(ids, n, rows, scratch.flat<int64_t>().data(),
                                           OnDevice<GpuDevice>::Stream(ctx), position, id));
  }
};
#endif

template <typename Device, typename K>
class CheckRowIdsOp : public SokOpKernel<Device> {
 public:
  explicit CheckRowIdsOp(OpKernelConstruction* c) : SokOpKernel<Device>(c) {
    OP_REQUIRES_OK(c, c->GetAttr("table_name", &table_));
    OP_REQUIRES_OK(c, c->GetAttr("what", &what_));
  }

 protected:
  void ComputeOnDevice(OpKernelContext* ctx) override {
    const Tensor& ids = ctx->input(0);
    const Tensor& num_rows = ctx->input(1);
    OP_REQUIRES(ctx, TensorShapeUtils::IsScalar(num_rows.shape()),
                errors::InvalidArgument("SokCheckRowIds: num_rows must be a scalar"));
    const int64_t rows = num_rows.scalar<int64_t>()();
    int64_t position = -1;
    K id = 0;
    OP_REQUIRES_OK(ctx, RowIdsOn<Device>::FirstOutside(ctx, ids.flat<K>().data(), ids.NumElements(),
                                                       rows, &position, &id));
    if (position >= 0) {
      const std::string at = absl::StrCat(what_, " of static table ", table_, ": ");
      // position: in the ids flattened (row-major), whatever their shape.
      if (id < 0) {
        ctx->CtxFailure(errors::InvalidArgument(at, "negative id ", id, " at position ", position,
                                                " (the table has ", rows, " rows)"));
      } else {
        ctx->CtxFailure(errors::InvalidArgument(at, "id out of range [0, ", rows, "): ", id,
                                                " at position ", position));
      }
      return;
    }
    ctx->set_output(0, ids);
  }

 private:
  std::string table_, what_;
};

REGISTER_KERNEL_BUILDER(Name("SokCheckRowIds").Device(DEVICE_CPU).TypeConstraint<int32>("Tids"),
                        CheckRowIdsOp<CpuDevice, int32>);
REGISTER_KERNEL_BUILDER(Name("SokCheckRowIds").Device(DEVICE_CPU).TypeConstraint<int64_t>("Tids"),
                        CheckRowIdsOp<CpuDevice, int64_t>);
#if GOOGLE_CUDA
REGISTER_KERNEL_BUILDER(
    Name("SokCheckRowIds").Device(DEVICE_GPU).TypeConstraint<int32>("Tids").HostMemory("num_rows"),
    CheckRowIdsOp<GpuDevice, int32>);
REGISTER_KERNEL_BUILDER(Name("SokCheckRowIds")
                            .Device(DEVICE_GPU)
                            .TypeConstraint<int64_t>("Tids")
                            .HostMemory("num_rows"),
                        CheckRowIdsOp<GpuDevice, int64_t>);
#endif  // GOOGLE_CUDA

}  // namespace
}  // namespace sok_kernels
}  // namespace tensorflow
