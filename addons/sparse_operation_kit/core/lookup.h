// The steps of a sparse lookup around the tables, CPU versions:
//   unique_keys        -> one row fetch per distinct key (inverse maps ids back)
//   bucketize_by_owner -> which rank owns each distinct key (model parallelism)
//   pooled_forward     -> per-sample sum / mean / sqrtn of the fetched rows, optional weights
//   pooled_backward    -> per-distinct-key gradient from the per-sample gradient
// An id i belongs to sample segment_ids[i] (0 <= segment_ids[i] < batch) and reads row inverse[i].
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "addons/sparse_operation_kit/core/common.h"
#include "addons/sparse_operation_kit/core/parallel.h"
#include "addons/sparse_operation_kit/core/status.h"

namespace sok {

enum class Combiner : int32_t { kSum = 0, kMean = 1, kSqrtn = 2 };

// "sum" | "mean" | "sqrtn"; false for anything else.
bool parse_combiner(const std::string& name, Combiner* out);

// Distinct keys in order of first appearance, inverse[i] = position of keys[i] among them,
// and (if counts is not null) how often each distinct key appeared. unique and counts have room
// for n entries (the GPU's unique_keys takes the same buffers); returns the number of distinct
// keys, the leading entries written.
template <typename K>
int64_t unique_keys(const K* keys, int64_t n, K* unique, int32_t* inverse, int64_t* counts);

// The same into vectors (sized to the distinct keys).
template <typename K>
void unique_keys(const K* keys, int64_t n, std::vector<K>* unique, int32_t* inverse,
                 std::vector<int64_t>* counts) {
  unique->resize(n);
  if (counts) counts->resize(n);
  const int64_t u =
      unique_keys(keys, n, unique->data(), inverse, counts ? counts->data() : nullptr);
  unique->resize(u);
  if (counts) counts->resize(u);
}

// Where each id of a table sits in its SparseTensor: positions[n, rank] (row-major; column 0 is
// the sample), to lie within dense_shape[rank]. A RaggedTensor's ids are rank 1: their row ids
// within [nrows].
struct PositionsCheck {
  int64_t first_outside = -1;    // first id with an index < 0 or >= dense_shape; -1: none
  int64_t first_unordered = -1;  // first id whose sample is below the previous id's; -1: none
};
PositionsCheck check_positions(const int64_t* positions, int64_t n, int rank,
                               const int64_t* dense_shape);

// order[j] = the id that comes j-th in sample order (column 0 of positions), ties in id order:
// the stable permutation that visits an unordered SparseTensor's ids sample by sample.
void stable_sample_order(const int64_t* positions, int64_t n, int rank, int32_t* order);

// The position of the first id outside a static table's rows [0, rows), or -1. A static table
// is a dense array: an id outside it would read or write memory that is no row (the GPU's:
// core/cuda/row_ids.h).
template <typename K>
int64_t first_id_outside(const K* ids, int64_t n, int64_t rows) {
  for (int64_t i = 0; i < n; ++i) {
    if (ids[i] < 0 || static_cast<int64_t>(ids[i]) >= rows) return i;
  }
  return -1;
}

// Stable order of the keys grouped by owner rank (owner = floor_mod(key, world_size)):
// order[j] is the position of the j-th key once grouped; counts[r] how many rank r owns.
template <typename K>
void bucketize_by_owner(const K* keys, int64_t n, int world_size, int64_t* order, int64_t* counts);

// Sample ids: the sample of id i is segment_ids[i * segment_stride] (stride 1: [n]; stride r:
// column 0 of SparseTensor indices [n, r], read in place).

// Checks segment_ids and inverse are in range; names `table` in the message.
Status check_lookup_indices(const std::string& table, const int32_t* inverse,
                            const int64_t* segment_ids, int64_t n, int64_t num_rows, int64_t batch,
                            int64_t segment_stride = 1);

// out[batch, dim] = combine over ids of weights[i] * rows[inverse[i]]; weights may be null (1).
// Samples without ids read zeros; a zero weight sum gives zeros (TensorFlow's div_no_nan).
void pooled_forward(const float* rows, int64_t dim, const int32_t* inverse,
                    const int64_t* segment_ids, const float* weights, int64_t n, int64_t batch,
                    Combiner combiner, float* out, const ParallelFor& pf = serial_for,
                    int64_t segment_stride = 1);

// grad_rows[num_rows, dim] = d(loss)/d(rows) given grad_out[batch, dim] = d(loss)/d(out).
void pooled_backward(const float* grad_out, int64_t dim, const int32_t* inverse,
                     const int64_t* segment_ids, const float* weights, int64_t n, int64_t batch,
                     Combiner combiner, int64_t num_rows, float* grad_rows,
                     const ParallelFor& pf = serial_for, int64_t segment_stride = 1);

}  // namespace sok
