// The index work of the exchange between ranks (framework-free), CPU half; core/cuda/exchange.h
// is the GPU half with the same semantics. One lookup of n tables makes one exchange:
//
//   requester  plan: its distinct keys sorted into blocks (owner q, table t), q-major, each block
//              in input order; a [world, n + 2] matrix of keys per block plus [signature, bad];
//              row_at: where each key's row will start in the rows that come back.
//   owner      split_received: the received [key, count] blocks (requester q, table t) into one
//              key and one count tensor per table (blocks of requesters in rank order);
//              rows_to_blocks: each table's rows back into blocks (q, t), q-major, flat.
//   requester  gather_rows: each key's row out of the returned flat rows (row_at);
//   backward   scatter_rows and rows_from_blocks, the inverses.
//
// The owner rule (which rank holds a key) lives here for the exchange; the Python package's
// tables.owner, used for dumps, must agree (tests/tf/test_exchange_ops.py checks it).
#pragma once

#include <cstdint>
#include <vector>

#include "addons/sparse_operation_kit/core/common.h"
#include "addons/sparse_operation_kit/core/status.h"

namespace sok {
namespace exchange {

// One table of an exchange, the same on every rank.
struct TableSpec {
  int64_t target = -1;  // target_gpu: -1 spreads keys over the ranks (key mod world)
  int64_t rows = -1;    // a static table's rows over all ranks; -1: an Embedding Variable
  int64_t dim = 1;      // floats per row
};

SOK_HD int64_t owner_of(int64_t key, int64_t target, int64_t world) {
  return target >= 0 ? target : floor_mod(key, world);
}

// The key an owner looks up: an Embedding Variable's key, or a static shard's local row.
SOK_HD int64_t local_key(int64_t key, int64_t target, int64_t rows, int64_t world) {
  return (rows < 0 || target >= 0) ? key : floor_div(key, world);
}

// A static table's id outside [0, rows).
SOK_HD bool bad_key(int64_t key, int64_t rows) { return rows >= 0 && (key < 0 || key >= rows); }

// Where the blocks (rank q, table t) of a rank-major flat buffer lie, from counts[q * stride + t]
// rows per block, and where each block starts within its table's tensor.
struct BlockLayout {
  int world = 1, n = 0;
  std::vector<int64_t> flat_elem;   // [world * n]: first element of block (q, t) in the flat buffer
  std::vector<int64_t> table_row;   // [world * n]: first row of block (q, t) in table t's tensor
  std::vector<int64_t> table_rows;  // [n]
  int64_t flat_elems = 0;
  int64_t rows = 0;

  // dims[t] elements per row; counts must be >= 0 (checked).
  static Status Of(const int64_t* counts, int stride, int world, const std::vector<int64_t>& dims,
                   BlockLayout* out);
};

// The requester's plan (see above). keys[t], counts[t]: sizes[t] entries of table t (counts may
// be null: 1 each). request: [total, 2]; matrix: [world, n + 2]; row_at: [total] (in elements of
// the returned flat rows; key i of table t is entry sum(sizes[:t]) + i).
void plan(const std::vector<TableSpec>& tables, int world, const int64_t* const* keys,
          const int64_t* const* counts, const int64_t* sizes, int64_t signature, int64_t* request,
          int64_t* matrix, int64_t* row_at);

// The owner's split of `received` ([rows, 2], laid out as `layout` with dims 1) into keys[t] and
// counts[t] (layout.table_rows[t] each); static tables' keys become local rows.
void split_received(const std::vector<TableSpec>& tables, int world, const BlockLayout& layout,
                    const int64_t* received, int64_t* const* keys, int64_t* const* counts);

// rows[t] ([table_rows[t], dims[t]]) <-> the flat rank-major buffer (layout.flat_elems floats).
void rows_to_blocks(const BlockLayout& layout, const std::vector<int64_t>& dims,
                    const float* const* rows, float* flat);
void rows_from_blocks(const BlockLayout& layout, const std::vector<int64_t>& dims,
                      const float* flat, float* const* rows);

// The requester's rows: out[t][i] = returned[row_at[start_t + i] ...] (dims[t] floats), and the
// gradient's inverse (row_at is a permutation of the returned rows: every element is written).
void gather_rows(const std::vector<int64_t>& dims, const int64_t* sizes, const int64_t* row_at,
                 const float* returned, float* const* out);
void scatter_rows(const std::vector<int64_t>& dims, const int64_t* sizes, const int64_t* row_at,
                  const float* const* d_out, float* d_returned);

}  // namespace exchange
}  // namespace sok
