// The exchange's flat rows (core/exchange.h) as the kernels that read them see them: table t's
// returned rows are the sizes[t] entries of row_at after those of the tables before it, each
// row_at entry where a row of dims[t] floats starts. The exchange's gather and scatter and the
// pooled ops that read the rows in place check their inputs with these.
#pragma once

#include <string>
#include <vector>

#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/platform/errors.h"

namespace tensorflow {
namespace sok_kernels {

// `sizes` holds one row count >= 0 per table (names[t] names table t; empty: by number) and
// they add up to row_at's entries; starts (optional) gets each table's first entry. `what`
// starts the messages.
inline Status CheckFlatSizes(const char* what, const Tensor& sizes, const Tensor& row_at,
                             const std::vector<std::string>& names, int n,
                             std::vector<int64_t>* starts = nullptr) {
  if (row_at.dims() != 1 || sizes.NumElements() != n) {
    return errors::InvalidArgument(what, ": row_at must be a vector and sizes hold ", n,
                                   " entries, got ", row_at.shape().DebugString(), " and ",
                                   sizes.shape().DebugString());
  }
  int64_t total = 0;
  for (int t = 0; t < n; ++t) {
    const int64_t k = sizes.flat<int64_t>()(t);
    if (k < 0) {
      const std::string table =
          t < static_cast<int>(names.size()) ? "'" + names[t] + "'" : std::to_string(t);
      return errors::InvalidArgument(what, ": table ", table, " has a negative row count ", k);
    }
    if (starts != nullptr) starts->push_back(total);
    total += k;
  }
  if (total != row_at.NumElements()) {
    return errors::InvalidArgument(what, ": sizes add up to ", total, " rows but row_at has ",
                                   row_at.NumElements(), " entries");
  }
  return OkStatus();
}

// Floats in the tables' returned rows: sizes[t] rows of dims[t] floats each.
inline int64_t FlatFloats(const Tensor& sizes, const std::vector<int64_t>& dims) {
  int64_t total = 0;
  for (size_t t = 0; t < dims.size(); ++t) total += sizes.flat<int64_t>()(t) * dims[t];
  return total;
}

}  // namespace sok_kernels
}  // namespace tensorflow
