// Op registrations of the collectives between GPUs (see core/cuda/collectives.h): the NCCL
// communicator's bootstrap and the exchange's all-to-all and the data-parallel all-reduce. All are
// stateful: TensorFlow must neither fold, dedupe nor reorder them (every rank runs the same
// collectives in the same order).
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tensorflow {
namespace sok_ops {

using shape_inference::InferenceContext;
using shape_inference::ShapeHandle;

// A fresh NCCL unique id (128 bytes) for a new communicator: rank 0's goes to every rank.
REGISTER_OP("SokNcclUniqueId")
    .Output("id: string")
    .SetIsStateful()
    .SetShapeFn(shape_inference::ScalarShape);

// Joins the process's communicator on CUDA device `device` (blocks until every rank joined);
// nothing if this process already has one there for the same rank and world.
REGISTER_OP("SokNcclInit")
    .Input("id: string")
    .Attr("rank: int >= 0")
    .Attr("world: int >= 1")
    .Attr("device: int >= 0")
    .Attr("timeout_seconds: float")
    .SetIsStateful()
    .SetShapeFn(shape_inference::NoOutputs);

// Variable all-to-all over NCCL: rows of `input` (grouped by destination rank) go
// send_counts[p] to rank p; `output` holds the rows from every rank in rank order, recv_counts[p]
// from rank p. Both counts are int64 [world] in device memory; the one wait on the host is for the
// sizes, bounded by the communicator's timeout.
REGISTER_OP("SokAllToAll")
    .Input("input: T")
    .Input("send_counts: int64")
    .Output("output: T")
    .Output("recv_counts: int64")
    .Attr("T: type")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle in, rows, out;
      TF_RETURN_IF_ERROR(c->WithRankAtLeast(c->input(0), 1, &in));
      TF_RETURN_IF_ERROR(c->Subshape(in, 1, &rows));
      TF_RETURN_IF_ERROR(c->Concatenate(c->Vector(InferenceContext::kUnknownDim), rows, &out));
      c->set_output(0, out);
      ShapeHandle counts;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &counts));
      c->set_output(1, counts);
      return OkStatus();
    });

// outputs[i] = sum (or mean) over ranks of inputs[i]: one NCCL launch for all of them.
REGISTER_OP("SokAllReduce")
    .Input("inputs: N * T")
    .Output("outputs: N * T")
    .Attr("N: int >= 1")
    .Attr("T: {half, float, double, int32, int64}")
    .Attr("reduction: {'sum', 'mean'} = 'mean'")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      for (int i = 0; i < c->num_inputs(); ++i) c->set_output(i, c->input(i));
      return OkStatus();
    });

}  // namespace sok_ops
}  // namespace tensorflow
