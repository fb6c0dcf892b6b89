// The index work of the exchange between ranks (framework-free), CPU half; core/cuda/exchange.h
// is the GPU half with the same semantics. One lookup of n tables makes one exchange:
//
//   requester  plan: its distinct keys sorted into blocks (owner q, table t), q-major, each block
//              in input order; a [world, n + 2] matrix of keys per block plus [signature, bad];
//              row_at: where each key's row will start in the rows that come back.
//   owner      owner_keys: the received [key, count] blocks (requester q, table t) as each
//              table's distinct keys (counts summed) and where their rows go back;
//              rows_to_blocks: each table's distinct rows to every asking requester's place in
//              the flat blocks (q, t), q-major.
//   requester  gather_rows: each key's row out of the returned flat rows (row_at);
//   backward   scatter_rows and rows_from_blocks, the inverses.
//
// The owner rule (which rank holds a key) lives here for the exchange; the Python package's
// tables.owner, used for dumps, must agree (tests/python/parallel/test_exchange_ops.py checks it).
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

// The header's bad flag of a call of n tables (the highest reason wins): 0 none; t + 1: an id of
// static table t outside its rows; bad_positions_flag(n, t): table t's ids outside their dense
// shape (its padded dedup's valid[t] < 0: the plan requests none of its keys).
SOK_HD int64_t bad_positions_flag(int64_t n, int64_t t) { return n + 1 + t; }

// Where the blocks (rank q, table t) of a rank-major flat buffer lie, from counts[q * stride + t]
// rows per block, and where each block starts within its table's tensor.
struct BlockLayout {
  int world = 1, n = 0;
  std::vector<int64_t> flat_row;    // [world * n]: first row of block (q, t) in the flat buffer
  std::vector<int64_t> flat_elem;   // [world * n]: its first element (rows of dims[t] elements)
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
// valid (may be null: all): table t's keys are its first valid[t] entries, the rest padding (a
// dedup that did not wait for its counts): padding is not requested, its row_at is -1 and the
// request's tail past the matrix's counts holds zeros. valid[t] < 0: the ids' positions were bad
// (nothing of t is requested; the bad flag says so).
void plan(const std::vector<TableSpec>& tables, int world, const int64_t* const* keys,
          const int64_t* const* counts, const int64_t* sizes, const int64_t* valid,
          int64_t signature, int64_t* request, int64_t* matrix, int64_t* row_at);

// After the sizes' exchange, on the host: received [world, n + 2], row q what rank q sent here
// (its counts for this rank, then [signature, bad]). Every rank sees every rank's header, so a
// mismatch fails on all of them at once instead of hanging the next exchange.
struct HeaderCheck {
  bool same_tables = true;       // every rank sent `signature`
  bool ids_valid = true;         // no rank flagged a static id outside its table
  int bad_positions_rank = -1;   // the first rank whose ids lay outside their dense shape
  int bad_positions_table = -1;  // which table's
};
HeaderCheck check_headers(const int64_t* received, int world, int n, int64_t signature);

// out[q] = sum over tables t of counts[q, t] * dims[t] (counts [world, n + 2]): the floats of the
// row blocks to or from rank q.
void floats_per_rank(const int64_t* counts, int world, const std::vector<int64_t>& dims,
                     int64_t* out);

// The owner's side. Its distinct keys of each table (local keys: a static shard's rows), in order
// of first appearance among the received rows (requesters in rank order), each key's counts summed
// over the requesters, and where each one's rows lie in the flat rank-major rows (`layout`, with
// the tables' dims): row_pos[(d_t + u) * world + q] = the first element of requester q's copy of
// distinct key u of table t (d_t: the distinct keys of the tables before t), -1 where q did not
// ask for it. A requester sends each key once, so a key has at most `world` copies.
// padded: each table's outputs hold as many entries as it received (layout.table_rows[t], known
// on the host before the dedup, so the owner needs no wait to size them): its distinct[t] keys,
// then copies of its first key with count 0 whose rows go nowhere (row_pos -1). The copies of a
// key the tables already hold keep any update of the padded keys equal (a zero gradient summed
// into a row that has one); an update given distinct[t] skips them.
struct OwnerKeys {
  std::vector<std::vector<int64_t>> keys, counts;
  std::vector<int64_t> row_pos;
  std::vector<int64_t> distinct;  // [n]
};
void owner_keys(const std::vector<TableSpec>& tables, const BlockLayout& layout,
                const int64_t* received, bool padded, OwnerKeys* out);

// rows[t] ([distinct[t], dims[t]]) copied to every requester's place in the flat rows; and the
// gradient's way back: each distinct row's copies summed in rank order (deterministic).
void rows_to_blocks(const std::vector<int64_t>& dims, const int64_t* distinct, int world,
                    const int64_t* row_pos, const float* const* rows, float* flat);
void rows_from_blocks(const std::vector<int64_t>& dims, const int64_t* distinct, int world,
                      const int64_t* row_pos, const float* flat, float* const* rows);

// The requester's rows: out[t][i] = returned[row_at[start_t + i] ...] (dims[t] floats), and the
// gradient's inverse (row_at is a permutation of the returned rows: every element is written).
// Padding (row_at -1) reads zeros and writes nothing.
void gather_rows(const std::vector<int64_t>& dims, const int64_t* sizes, const int64_t* row_at,
                 const float* returned, float* const* out);
void scatter_rows(const std::vector<int64_t>& dims, const int64_t* sizes, const int64_t* row_at,
                  const float* const* d_out, float* d_returned);

}  // namespace exchange
}  // namespace sok
