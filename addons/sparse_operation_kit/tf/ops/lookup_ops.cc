// Op registrations of the sparse lookup steps (see core/lookup.h): dedup and pooled combine, and
// the id check of static tables.
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tensorflow {
namespace sok_ops {

using shape_inference::InferenceContext;
using shape_inference::ShapeHandle;

// Distinct keys of each table in order of first appearance, the inverse map and the counts.
// With M == N, also checks every table's id positions (SparseTensor indices [n_i, r], or a
// RaggedTensor's row ids as [n_i, 1]) lie within dense_shapes_i, naming the first bad table, and
// gives segment_order_i: [0] when the samples (column 0) do not decrease, else the stable
// permutation that lists the ids in sample order. M == 0 (no positions given): no checks.
// Positions of shape [0, 0] mark a table of dense ids ([batch] or [batch, k]): no check, order [0].
// batch_sizes [M] (host memory): dim 0 of each dense shape (-1 for an empty one), the batch sizes
// SokPooledCombine takes, so that no op on the CPU computes them in a GPU step.
// valid [N] (the op's device): each table's number of distinct keys. defer_position_errors (the
// exchange's plan takes valid): bad positions raise nothing here but set valid_i to -1 (the
// exchange then fails on every rank, core/exchange.h; that table's segment_order_i is [0]).
// padded (dense ids only: their order needs no check): unique_i and counts_i hold n_i entries,
// the distinct ones first; the op then needs no wait for the distinct counts (the exchange's
// plan takes valid instead).
REGISTER_OP("SokUniqueKeys")
    .Input("keys: Tkeys")
    .Input("positions: M * int64")
    .Input("dense_shapes: M * int64")
    .Output("unique: Tkeys")
    .Output("inverse: N * int32")
    .Output("counts: N * int64")
    .Output("segment_order: M * int32")
    .Output("batch_sizes: int64")
    .Output("valid: int64")
    .Attr("N: int >= 1")
    .Attr("M: int >= 0 = 0")
    .Attr("Tkeys: list({int32, int64})")
    .Attr("table_names: list(string) = []")  // for error messages; empty: tables by position
    .Attr("padded: bool = false")
    .Attr("defer_position_errors: bool = false")
    .SetShapeFn([](InferenceContext* c) {
      int n, m;
      TF_RETURN_IF_ERROR(c->GetAttr("N", &n));
      TF_RETURN_IF_ERROR(c->GetAttr("M", &m));
      if (m != 0 && m != n) {
        return errors::InvalidArgument("SokUniqueKeys: M must be 0 or N (", n, "), got ", m);
      }
      for (int i = 0; i < n; ++i) {
        ShapeHandle keys;
        TF_RETURN_IF_ERROR(c->WithRank(c->input(i), 1, &keys));
        c->set_output(i, c->Vector(InferenceContext::kUnknownDim));
        c->set_output(n + i, keys);
        c->set_output(2 * n + i, c->Vector(InferenceContext::kUnknownDim));
      }
      for (int i = 0; i < m; ++i) {
        ShapeHandle unused;
        TF_RETURN_IF_ERROR(c->WithRank(c->input(n + i), 2, &unused));
        TF_RETURN_IF_ERROR(c->WithRank(c->input(n + m + i), 1, &unused));
        c->set_output(3 * n + i, c->Vector(InferenceContext::kUnknownDim));
      }
      c->set_output(3 * n + m, c->Vector(m));
      c->set_output(3 * n + m + 1, c->Vector(n));
      return OkStatus();
    });

// out_i[batch_i, dim_i] = combine_i over ids j of weights_i[j] * rows_i[inverse_i[j]], by sample
// segment_ids_i[j]. An empty weights_i means all weights are 1. An empty segment_ids_i for
// n_i > 0 ids is a dense table (a [batch, k] id tensor): k = n_i / batch_i ids per sample, id j
// in sample j / k (n_i must be a multiple of batch_i; its segment_order, if any, empty); the GPU
// kernel takes such tables down the one-launch path whatever segments_checked says.
// segment_order (M = 0, or M = N: SokUniqueKeys' output): per table, shape [0] when its segment
// ids are non-decreasing, else the stable permutation listing the ids in sample order. With
// M = N and segments_checked (every segment id known in [0, batch_i)) the GPU kernel runs every
// table in one launch with no error read-back (no host sync); otherwise it checks the ids.
// num_rows [N] (host memory): dim 0 of each rows_i, the gradient's num_rows (read on the host
// here, it needs no shape ops on the CPU in a GPU step).
REGISTER_OP("SokPooledCombine")
    .Input("rows: N * float")
    .Input("inverse: N * int32")
    .Input("segment_ids: N * int64")
    .Input("weights: N * float")
    .Input("segment_order: M * int32")
    .Input("batch_sizes: int64")  // [N]
    .Output("embeddings: N * float")
    .Output("num_rows: int64")
    .Attr("N: int >= 1")
    .Attr("M: int >= 0 = 0")
    .Attr("segments_checked: bool = false")
    .Attr("combiners: list(string)")
    .Attr("table_names: list(string)")
    .SetShapeFn([](InferenceContext* c) {
      int n;
      TF_RETURN_IF_ERROR(c->GetAttr("N", &n));
      for (int i = 0; i < n; ++i) {
        ShapeHandle rows;
        TF_RETURN_IF_ERROR(c->WithRank(c->input(i), 2, &rows));
        c->set_output(i, c->Matrix(InferenceContext::kUnknownDim, c->Dim(rows, 1)));
      }
      c->set_output(n, c->Vector(n));
      return OkStatus();
    });

// The gradient; segment_order, M and segments_checked as in the forward.
REGISTER_OP("SokPooledCombineGrad")
    .Input("grads: N * float")
    .Input("inverse: N * int32")
    .Input("segment_ids: N * int64")
    .Input("weights: N * float")
    .Input("segment_order: M * int32")
    .Input("num_rows: int64")  // [N]
    .Output("row_grads: N * float")
    .Attr("N: int >= 1")
    .Attr("M: int >= 0 = 0")
    .Attr("segments_checked: bool = false")
    .Attr("combiners: list(string)")
    .Attr("table_names: list(string) = []")  // for error messages; empty: tables by position
    .SetShapeFn([](InferenceContext* c) {
      int n;
      TF_RETURN_IF_ERROR(c->GetAttr("N", &n));
      for (int i = 0; i < n; ++i) {
        ShapeHandle g;
        TF_RETURN_IF_ERROR(c->WithRank(c->input(i), 2, &g));
        c->set_output(i, c->Matrix(InferenceContext::kUnknownDim, c->Dim(g, 1)));
      }
      return OkStatus();
    });

// SokPooledCombine of rows read in place from the flat rows the exchange returned (every table
// in one buffer): row r of table i starts at float row_at[s_i + r] of `returned` (s_i: sizes
// summed over the tables before i; -1: no row, it reads zeros and takes no gradient), sizes[i]
// rows per table (host memory), dims[i] floats each. The other inputs and attributes are
// SokPooledCombine's. returned_floats [1] (host memory): the gradient's size.
REGISTER_OP("SokPooledCombineFlat")
    .Input("returned: float")
    .Input("row_at: int64")
    .Input("sizes: int64")  // [N]
    .Input("inverse: N * int32")
    .Input("segment_ids: N * int64")
    .Input("weights: N * float")
    .Input("segment_order: M * int32")
    .Input("batch_sizes: int64")  // [N]
    .Output("embeddings: N * float")
    .Output("returned_floats: int64")
    .Attr("N: int >= 1")
    .Attr("M: int >= 0 = 0")
    .Attr("dims: list(int)")
    .Attr("segments_checked: bool = false")
    .Attr("combiners: list(string)")
    .Attr("table_names: list(string)")
    .SetShapeFn([](InferenceContext* c) {
      int n;
      TF_RETURN_IF_ERROR(c->GetAttr("N", &n));
      std::vector<int64_t> dims;
      TF_RETURN_IF_ERROR(c->GetAttr("dims", &dims));
      if (static_cast<int>(dims.size()) != n) {
        return errors::InvalidArgument("SokPooledCombineFlat: ", dims.size(), " dims for ", n,
                                       " tables");
      }
      ShapeHandle unused;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &unused));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &unused));
      for (int i = 0; i < n; ++i) {
        c->set_output(i, c->Matrix(InferenceContext::kUnknownDim, dims[i]));
      }
      c->set_output(n, c->Vector(1));
      return OkStatus();
    });

// The gradient: d(returned) [returned_floats], every float written (those of no row zeros).
REGISTER_OP("SokPooledCombineFlatGrad")
    .Input("grads: N * float")
    .Input("row_at: int64")
    .Input("sizes: int64")  // [N]
    .Input("inverse: N * int32")
    .Input("segment_ids: N * int64")
    .Input("weights: N * float")
    .Input("segment_order: M * int32")
    .Input("returned_floats: int64")  // [1]
    .Output("d_returned: float")
    .Attr("N: int >= 1")
    .Attr("M: int >= 0 = 0")
    .Attr("dims: list(int)")
    .Attr("segments_checked: bool = false")
    .Attr("combiners: list(string)")
    .Attr("table_names: list(string) = []")
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->Vector(InferenceContext::kUnknownDim));
      return OkStatus();
    });

// ids, unchanged, once each is a row of a static table of num_rows rows (a scalar in host
// memory): else InvalidArgument naming the table and the first id outside [0, num_rows), with
// `what` (the call, e.g. "sparse_read") in front. TensorFlow's GPU gather reads zeros for such an
// id and its GPU scatter skips it without a word.
REGISTER_OP("SokCheckRowIds")
    .Input("ids: Tids")
    .Input("num_rows: int64")
    .Output("checked: Tids")
    .Attr("Tids: {int32, int64}")
    .Attr("table_name: string")
    .Attr("what: string")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle unused;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 0, &unused));
      c->set_output(0, c->input(0));
      return OkStatus();
    });

}  // namespace sok_ops
}  // namespace tensorflow
