// Op registrations of the exchange's index work (core/exchange.h): what a rank does before and
// after each all-to-all of lookup_sparse, every table of a call in one op. Pure functions of their
// inputs; sizes in host memory (`*_counts`, `sizes`) are what the all-to-alls already copied there.
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tensorflow {
namespace sok_ops {

using shape_inference::DimensionHandle;
using shape_inference::InferenceContext;
using shape_inference::ShapeHandle;

// The requester's keys grouped for their owners: `request` [total, 2] ([key, count] rows in blocks
// (owner, table), owner-major, each block in input order); `matrix` [world, N + 2]: keys per
// (owner, table), then [signature, the 1-based table of a static id outside [0, rows) or 0];
// `row_at` [total]: where each key's row starts in the rows that come back (floats); `sizes`
// [N] (host): keys per table. targets / rows / dims per table: target_gpu, a static table's rows
// over all ranks (-1: an Embedding Variable), floats per row. valid: [N] or [0] (every key):
// table t's keys are its first valid[t] (a padded dedup's, SokUniqueKeys' `valid`); the
// padding is not requested, its row_at is -1, and the request's rows past the matrix's counts
// are zeros.
REGISTER_OP("SokExchangePlan")
    .Input("keys: N * int64")
    .Input("counts: N * int64")
    .Input("valid: int64")
    .Output("request: int64")
    .Output("matrix: int64")
    .Output("row_at: int64")
    .Output("sizes: int64")
    .Attr("N: int >= 1")
    .Attr("world: int >= 1")
    .Attr("targets: list(int)")
    .Attr("rows: list(int)")
    .Attr("dims: list(int)")
    .Attr("signature: int")
    .SetShapeFn([](InferenceContext* c) {
      int n, world;
      TF_RETURN_IF_ERROR(c->GetAttr("N", &n));
      TF_RETURN_IF_ERROR(c->GetAttr("world", &world));
      c->set_output(0, c->Matrix(InferenceContext::kUnknownDim, 2));
      c->set_output(1, c->Matrix(world, n + 2));
      c->set_output(2, c->Vector(InferenceContext::kUnknownDim));
      c->set_output(3, c->Vector(n));
      return OkStatus();
    });

// The owner's received [key, count] rows (blocks (requester, table), requester-major, as
// recv_counts [world, >= N] says) as each table's distinct keys (static tables: rows of this
// rank's shard; order of first appearance) with their counts summed; row_pos [sum(distinct),
// world]: where requester q's copy of each distinct key's row goes in the flat rows (floats; -1:
// q did not ask); distinct [N] (host): each table's entries; valid [N] (on the op's device): its
// distinct keys. Exact: entries = distinct keys, one wait on the host for their counts. padded:
// entries = received keys, no wait (core/exchange.h says what the padding holds).
REGISTER_OP("SokExchangeOwnerKeys")
    .Input("received: int64")
    .Input("recv_counts: int64")
    .Output("keys: N * int64")
    .Output("counts: N * int64")
    .Output("row_pos: int64")
    .Output("distinct: int64")
    .Output("valid: int64")
    .Attr("N: int >= 1")
    .Attr("targets: list(int)")
    .Attr("rows: list(int)")
    .Attr("dims: list(int)")
    .Attr("padded: bool = false")
    .SetShapeFn([](InferenceContext* c) {
      int n;
      TF_RETURN_IF_ERROR(c->GetAttr("N", &n));
      for (int i = 0; i < 2 * n; ++i) c->set_output(i, c->Vector(InferenceContext::kUnknownDim));
      c->set_output(2 * n, c->Matrix(InferenceContext::kUnknownDim, InferenceContext::kUnknownDim));
      c->set_output(2 * n + 1, c->Vector(n));
      c->set_output(2 * n + 2, c->Vector(n));
      return OkStatus();
    });

// On the host, after the sizes' all-to-all: received / sent [world, N + 2] (what each rank sent
// here / what this rank sent each rank). Fails with `mismatch` (and every rank's signature)
// unless every rank passed the tables of `signature`, and with `bad_ids` (and every rank's flag)
// if any rank passed a static id outside its table, naming table_names[t] if a rank's ids of
// table t lay outside their dense shape; else owed_to[q] / due_from[q]: the floats of the rows
// this rank sends rank q / receives from rank q. One op for what every rank checks alike.
REGISTER_OP("SokExchangeSizes")
    .Input("received: int64")
    .Input("sent: int64")
    .Output("owed_to: int64")
    .Output("due_from: int64")
    .Attr("dims: list(int)")
    .Attr("signature: int")
    .Attr("mismatch: string")
    .Attr("bad_ids: string")
    .Attr("table_names: list(string) = []")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle m;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &m));
      c->set_output(0, c->Vector(c->Dim(m, 0)));
      c->set_output(1, c->Vector(c->Dim(m, 0)));
      return OkStatus();
    });

Status SetTableRowsShapes(InferenceContext* c, int first_output) {
  std::vector<int> dims;
  TF_RETURN_IF_ERROR(c->GetAttr("dims", &dims));
  for (size_t i = 0; i < dims.size(); ++i) {
    c->set_output(first_output + static_cast<int>(i),
                  c->Matrix(InferenceContext::kUnknownDim, dims[i]));
  }
  return OkStatus();
}

// Each table's distinct rows ([distinct[t], dims[t]]) copied to every asking requester's place
// in one flat buffer of blocks (requester, table), requester-major (row_pos; `counts` [world,
// >= N] sizes it); and the gradient's way back, each row's copies summed in rank order.
REGISTER_OP("SokExchangeRowsToBlocks")
    .Input("rows: N * float")
    .Input("row_pos: int64")
    .Input("counts: int64")
    .Output("flat: float")
    .Attr("N: int >= 1")
    .Attr("dims: list(int)")
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->Vector(InferenceContext::kUnknownDim));
      return OkStatus();
    });

REGISTER_OP("SokExchangeRowsFromBlocks")
    .Input("flat: float")
    .Input("row_pos: int64")
    .Input("distinct: int64")
    .Output("rows: N * float")
    .Attr("N: int >= 1")
    .Attr("dims: list(int)")
    .SetShapeFn([](InferenceContext* c) { return SetTableRowsShapes(c, 0); });

// The requester's rows of its keys out of the returned flat rows (row_at from SokExchangePlan,
// sizes its keys per table; padding, row_at -1, reads zeros); and the gradient's way back, into
// as many floats as returned_floats [world] (host: the floats from each owner) add up to.
REGISTER_OP("SokExchangeGatherRows")
    .Input("returned: float")
    .Input("row_at: int64")
    .Input("sizes: int64")
    .Output("rows: N * float")
    .Attr("N: int >= 1")
    .Attr("dims: list(int)")
    .SetShapeFn([](InferenceContext* c) { return SetTableRowsShapes(c, 0); });

REGISTER_OP("SokExchangeScatterRows")
    .Input("rows: N * float")
    .Input("row_at: int64")
    .Input("sizes: int64")
    .Input("returned_floats: int64")
    .Output("returned: float")
    .Attr("N: int >= 1")
    .Attr("dims: list(int)")
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->Vector(InferenceContext::kUnknownDim));
      return OkStatus();
    });

}  // namespace sok_ops
}  // namespace tensorflow
