#include "addons/sparse_operation_kit/core/exchange.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <string>
#include <unordered_map>
#include <utility>

namespace sok {
namespace exchange {

Status BlockLayout::Of(const int64_t* counts, int stride, int world,
                       const std::vector<int64_t>& dims, BlockLayout* out) {
  const int n = static_cast<int>(dims.size());
  out->world = world;
  out->n = n;
  out->flat_row.assign(static_cast<size_t>(world) * n, 0);
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
      out->flat_row[q * n + t] = rows;
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
          const int64_t* const* counts, const int64_t* sizes, const int64_t* valid,
          int64_t signature, int64_t* request, int64_t* matrix, int64_t* row_at) {
  const int n = static_cast<int>(tables.size());
  std::vector<int64_t> per_block(static_cast<size_t>(world) * n, 0);
  auto used = [&](int t) { return valid ? std::min(valid[t], sizes[t]) : sizes[t]; };
  int64_t bad = 0;
  for (int t = 0; t < n; ++t) {
    if (valid && valid[t] < 0) bad = std::max(bad, bad_positions_flag(n, t));
    for (int64_t i = 0; i < used(t); ++i) {
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
  std::fill(request + 2 * key_at, request + 2 * std::accumulate(sizes, sizes + n, int64_t{0}), 0);
  int64_t i_all = 0;
  for (int t = 0; t < n; ++t) {
    for (int64_t i = 0; i < sizes[t]; ++i, ++i_all) {
      if (i >= used(t)) {
        row_at[i_all] = -1;
        continue;
      }
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

HeaderCheck check_headers(const int64_t* received, int world, int n, int64_t signature) {
  HeaderCheck out;
  for (int q = 0; q < world; ++q) {
    const int64_t* row = received + static_cast<int64_t>(q) * (n + 2);
    out.same_tables = out.same_tables && row[n] == signature;
    const int64_t bad = row[n + 1];
    if (bad >= bad_positions_flag(n, 0) && out.bad_positions_rank < 0) {
      out.bad_positions_rank = q;
      out.bad_positions_table = static_cast<int>(bad - bad_positions_flag(n, 0));
    } else if (bad != 0) {
      out.ids_valid = false;
    }
  }
  return out;
}

void floats_per_rank(const int64_t* counts, int world, const std::vector<int64_t>& dims,
                     int64_t* out) {
  const int n = static_cast<int>(dims.size());
  for (int q = 0; q < world; ++q) {
    const int64_t* row = counts + static_cast<int64_t>(q) * (n + 2);
    out[q] = 0;
    for (int t = 0; t < n; ++t) out[q] += row[t] * dims[t];
  }
}

void owner_keys(const std::vector<TableSpec>& tables, const BlockLayout& l, const int64_t* received,
                bool padded, OwnerKeys* out) {
  const int n = l.n, world = l.world;
  out->keys.assign(n, {});
  out->counts.assign(n, {});
  std::vector<std::unordered_map<int64_t, int64_t>> index(n);
  // Pass 1: the distinct keys in order of first appearance (requesters in rank order).
  std::vector<std::vector<std::pair<int64_t, int64_t>>> at(n);  // (distinct index, element)
  int64_t j = 0;
  for (int q = 0; q < world; ++q) {
    for (int t = 0; t < n; ++t) {
      const int64_t b = q * n + t;
      const int64_t rows = (q + 1 < world ? l.table_row[b + n] : l.table_rows[t]) - l.table_row[b];
      const int64_t dim = tables[t].dim;
      for (int64_t r = 0; r < rows; ++r, ++j) {
        const int64_t k = local_key(received[2 * j], tables[t].target, tables[t].rows, world);
        auto it = index[t].emplace(k, static_cast<int64_t>(out->keys[t].size())).first;
        if (it->second == static_cast<int64_t>(out->keys[t].size())) {
          out->keys[t].push_back(k);
          out->counts[t].push_back(0);
        }
        out->counts[t][it->second] += received[2 * j + 1];
        at[t].emplace_back(it->second * world + q, l.flat_elem[b] + r * dim);
      }
    }
  }
  int64_t total = 0;
  std::vector<int64_t> first(n);
  out->distinct.assign(n, 0);
  for (int t = 0; t < n; ++t) {
    out->distinct[t] = static_cast<int64_t>(out->keys[t].size());
    if (padded && out->distinct[t] > 0) {
      out->keys[t].resize(l.table_rows[t], out->keys[t][0]);
      out->counts[t].resize(l.table_rows[t], 0);
    }
    first[t] = total;
    total += static_cast<int64_t>(out->keys[t].size());
  }
  out->row_pos.assign(total * world, -1);
  for (int t = 0; t < n; ++t) {
    for (const auto& [slot, elem] : at[t]) out->row_pos[first[t] * world + slot] = elem;
  }
}

namespace {

// Each distinct row to its copies (kToBlocks), or its copies summed in rank order into it.
template <bool kToBlocks>
void move_rows(const std::vector<int64_t>& dims, const int64_t* distinct, int world,
               const int64_t* row_pos, float* flat, float* const* rows) {
  int64_t d = 0;
  for (size_t t = 0; t < dims.size(); ++t) {
    for (int64_t u = 0; u < distinct[t]; ++u, ++d) {
      float* r = rows[t] + u * dims[t];
      if (!kToBlocks) std::fill(r, r + dims[t], 0.f);
      for (int q = 0; q < world; ++q) {
        const int64_t p = row_pos[d * world + q];
        if (p < 0) continue;
        for (int64_t c = 0; c < dims[t]; ++c) {
          if (kToBlocks) {
            flat[p + c] = r[c];
          } else {
            r[c] += flat[p + c];
          }
        }
      }
    }
  }
}

}  // namespace

void rows_to_blocks(const std::vector<int64_t>& dims, const int64_t* distinct, int world,
                    const int64_t* row_pos, const float* const* rows, float* flat) {
  move_rows<true>(dims, distinct, world, row_pos, flat, const_cast<float* const*>(rows));
}

void rows_from_blocks(const std::vector<int64_t>& dims, const int64_t* distinct, int world,
                      const int64_t* row_pos, const float* flat, float* const* rows) {
  move_rows<false>(dims, distinct, world, row_pos, const_cast<float*>(flat), rows);
}

void gather_rows(const std::vector<int64_t>& dims, const int64_t* sizes, const int64_t* row_at,
                 const float* returned, float* const* out) {
  int64_t i_all = 0;
  for (size_t t = 0; t < dims.size(); ++t) {
    for (int64_t i = 0; i < sizes[t]; ++i, ++i_all) {
      float* row = out[t] + i * dims[t];
      if (row_at[i_all] < 0) {
        std::fill(row, row + dims[t], 0.f);
      } else {
        std::memcpy(row, returned + row_at[i_all], sizeof(float) * dims[t]);
      }
    }
  }
}

void scatter_rows(const std::vector<int64_t>& dims, const int64_t* sizes, const int64_t* row_at,
                  const float* const* d_out, float* d_returned) {
  int64_t i_all = 0;
  for (size_t t = 0; t < dims.size(); ++t) {
    for (int64_t i = 0; i < sizes[t]; ++i, ++i_all) {
      if (row_at[i_all] < 0) continue;
      std::memcpy(d_returned + row_at[i_all], d_out[t] + i * dims[t], sizeof(float) * dims[t]);
    }
  }
}

}  // namespace exchange
}  // namespace sok
