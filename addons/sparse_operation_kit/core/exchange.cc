#include "addons/sparse_operation_kit/core/exchange.h"

#include <algorithm>
#include <cstring>
#include <string>

namespace sok {
namespace exchange {

Status BlockLayout::Of(const int64_t* counts, int stride, int world,
                       const std::vector<int64_t>& dims, BlockLayout* out) {
  const int n = static_cast<int>(dims.size());
  out->world = world;
  out->n = n;
  out->flat_elem.assign(static_cast<size_t>(world) * n, 0);
  out->table_row.assign(static_cast<size_t>(world) * n, 0);
  out->table_rows.assign(n, 0);
  int64_t elem = 0, rows = 0;
  for (int q = 0; q < world; ++q) {
    for (int t = 0; t < n; ++t) {
      const int64_t c = counts[static_cast<int64_t>(q) * stride + t];
      if (c < 0) {
        return Status::Invalid("exchange: negative count " + std::to_string(c) + " for rank " +
                               std::to_string(q) + ", table " + std::to_string(t));
      }
      out->flat_elem[q * n + t] = elem;
      out->table_row[q * n + t] = out->table_rows[t];
      out->table_rows[t] += c;
      elem += c * dims[t];
      rows += c;
    }
  }
  out->flat_elems = elem;
  out->rows = rows;
  return Status::OK();
}

void plan(const std::vector<TableSpec>& tables, int world, const int64_t* const* keys,
          const int64_t* const* counts, const int64_t* sizes, int64_t signature, int64_t* request,
          int64_t* matrix, int64_t* row_at) {
  const int n = static_cast<int>(tables.size());
  std::vector<int64_t> per_block(static_cast<size_t>(world) * n, 0);
  int64_t bad = 0;
  for (int t = 0; t < n; ++t) {
    for (int64_t i = 0; i < sizes[t]; ++i) {
      const int64_t k = keys[t][i];
      ++per_block[owner_of(k, tables[t].target, world) * n + t];
      if (bad_key(k, tables[t].rows)) bad = std::max<int64_t>(bad, t + 1);
    }
  }
  // Block starts in keys (the request) and in floats (the rows that come back).
  std::vector<int64_t> next_key(per_block.size()), next_elem(per_block.size());
  int64_t key_at = 0, elem_at = 0;
  for (size_t b = 0; b < per_block.size(); ++b) {
    next_key[b] = key_at;
    next_elem[b] = elem_at;
    key_at += per_block[b];
    elem_at += per_block[b] * tables[b % n].dim;
  }
  int64_t i_all = 0;
  for (int t = 0; t < n; ++t) {
    for (int64_t i = 0; i < sizes[t]; ++i, ++i_all) {
      const int64_t k = keys[t][i];
      const int64_t b = owner_of(k, tables[t].target, world) * n + t;
      const int64_t j = next_key[b]++;
      request[2 * j] = k;
      request[2 * j + 1] = counts[t] ? counts[t][i] : 1;
      row_at[i_all] = next_elem[b];
      next_elem[b] += tables[t].dim;
    }
  }
  for (int q = 0; q < world; ++q) {
    int64_t* row = matrix + static_cast<int64_t>(q) * (n + 2);
    std::copy(per_block.begin() + q * n, per_block.begin() + (q + 1) * n, row);
    row[n] = signature;
    row[n + 1] = bad;
  }
}

void split_received(const std::vector<TableSpec>& tables, int world, const BlockLayout& layout,
                    const int64_t* received, int64_t* const* keys, int64_t* const* counts) {
  const int n = layout.n;
  int64_t j = 0;
  for (int q = 0; q < world; ++q) {
    for (int t = 0; t < n; ++t) {
      const int64_t rows =
          (q + 1 < world ? layout.table_row[(q + 1) * n + t] : layout.table_rows[t]) -
          layout.table_row[q * n + t];
      for (int64_t r = 0; r < rows; ++r, ++j) {
        const int64_t at = layout.table_row[q * n + t] + r;
        keys[t][at] = local_key(received[2 * j], tables[t].target, tables[t].rows, world);
        counts[t][at] = received[2 * j + 1];
      }
    }
  }
}

namespace {

// Copies every block between the flat buffer and the tables' tensors.
template <bool kToBlocks>
void move_blocks(const BlockLayout& l, const std::vector<int64_t>& dims, float* flat,
                 float* const* rows) {
  for (int q = 0; q < l.world; ++q) {
    for (int t = 0; t < l.n; ++t) {
      const int64_t b = q * l.n + t;
      const int64_t end = q + 1 < l.world ? l.table_row[b + l.n] : l.table_rows[t];
      const int64_t elems = (end - l.table_row[b]) * dims[t];
      float* a = flat + l.flat_elem[b];
      float* r = rows[t] + l.table_row[b] * dims[t];
      if (elems == 0) continue;
      if (kToBlocks) {
        std::memcpy(a, r, sizeof(float) * elems);
      } else {
        std::memcpy(r, a, sizeof(float) * elems);
      }
    }
  }
}

}  // namespace

void rows_to_blocks(const BlockLayout& layout, const std::vector<int64_t>& dims,
                    const float* const* rows, float* flat) {
  move_blocks<true>(layout, dims, flat, const_cast<float* const*>(rows));
}

void rows_from_blocks(const BlockLayout& layout, const std::vector<int64_t>& dims,
                      const float* flat, float* const* rows) {
  move_blocks<false>(layout, dims, const_cast<float*>(flat), rows);
}

void gather_rows(const std::vector<int64_t>& dims, const int64_t* sizes, const int64_t* row_at,
                 const float* returned, float* const* out) {
  int64_t i_all = 0;
  for (size_t t = 0; t < dims.size(); ++t) {
    for (int64_t i = 0; i < sizes[t]; ++i, ++i_all) {
      std::memcpy(out[t] + i * dims[t], returned + row_at[i_all], sizeof(float) * dims[t]);
    }
  }
}

void scatter_rows(const std::vector<int64_t>& dims, const int64_t* sizes, const int64_t* row_at,
                  const float* const* d_out, float* d_returned) {
  int64_t i_all = 0;
  for (size_t t = 0; t < dims.size(); ++t) {
    for (int64_t i = 0; i < sizes[t]; ++i, ++i_all) {
      std::memcpy(d_returned + row_at[i_all], d_out[t] + i * dims[t], sizeof(float) * dims[t]);
    }
  }
}

}  // namespace exchange
}  // namespace sok
