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

// Output 0 of an all-to-all: input 0's rows, as many as arrive.
Status SetReceivedRowsShape(InferenceContext* c) {
  ShapeHandle in, rows, out;
  TF_RETURN_IF_ERROR(c->WithRankAtLeast(c->input(0), 1, &in));
  TF_RETURN_IF_ERROR(c->Subshape(in, 1, &rows));
  TF_RETURN_IF_ERROR(c->Concatenate(c->Vector(InferenceContext::kUnknownDim), rows, &out));
  c->set_output(0, out);
  return OkStatus();
}

// Variable all-to-all over NCCL: rows of `input` (grouped by destination rank) go to rank p,
// as many as the first `row_columns` values of send_counts[p] add up to (-1: all of them; a 1-D
// send_counts is one column); the other columns travel along (e.g. checks every rank must see).
// `output` holds the rows from every rank in rank order; recv_counts[p] is what rank p sent here.
// Rows of `input` past the counts are not sent (a padded request's tail). The counts are exchanged
// first and copied to the host (the one wait on the host, bounded by the
// communicator's timeout); *_host are those copies, in host memory. With a 2-D send_counts the
// ranks first check that they all send as many columns: if not, every rank fails with
// `width_mismatch` and the columns each rank sends.
REGISTER_OP("SokAllToAll")
    .Input("input: T")
    .Input("send_counts: int64")
    .Output("output: T")
    .Output("recv_counts: int64")
    .Output("send_counts_host: int64")
    .Output("recv_counts_host: int64")
    .Attr("T: type")
    .Attr("row_columns: int = -1")
    .Attr("width_mismatch: string = 'the ranks sent count matrices of different widths'")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(SetReceivedRowsShape(c));
      ShapeHandle counts;
      TF_RETURN_IF_ERROR(c->WithRankAtLeast(c->input(1), 1, &counts));
      TF_RETURN_IF_ERROR(c->WithRankAtMost(counts, 2, &counts));
      for (int i = 1; i < 4; ++i) c->set_output(i, counts);
      return OkStatus();
    });

// The all-to-all when both sides already know the sizes (rows of dim 0): send_rows[p] rows to
// rank p, recv_rows[p] from rank p (host memory, e.g. SokAllToAll's host counts). No exchange of
// sizes and no wait on the host.
REGISTER_OP("SokAllToAllSized")
    .Input("input: T")
    .Input("send_rows: int64")
    .Input("recv_rows: int64")
    .Output("output: T")
    .Attr("T: type")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(SetReceivedRowsShape(c));
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
