// NarrowColumn<N>: a column of int64 values (one a row) kept as N (4 bytes instead of 8) while
// every value fits in N, and widened to int64 for good the first time one does not. Lossless:
// no value is ever clipped. The table keeps its frequencies and versions (global steps) in it,
// which stay far below 2^31 in practice. Its values live in a PageVector (page_vector.h).
//
// Not thread-safe beyond this: under a shared lock, readers, set() of distinct rows (when the
// value fits, see can_hold) and try_add() may run together; growth and widening need the column
// alone (the table's exclusive lock).
#pragma once

#include <cstdint>
#include <limits>
#include <vector>

#include "addons/sparse_operation_kit/core/page_vector.h"

namespace sok {

template <typename N>
class NarrowColumn {
 public:
  int64_t size() const { return wide_ ? wide_values_.size() : narrow_values_.size(); }
  bool wide() const { return wide_; }
  static bool fits(int64_t v) {
    return v >= std::numeric_limits<N>::min() && v <= std::numeric_limits<N>::max();
  }
  // Whether set(row, v) may store v without widening.
  bool can_hold(int64_t v) const { return wide_ || fits(v); }

  int64_t get(int64_t row) const {
    return wide_ ? __atomic_load_n(&wide_values_[row], __ATOMIC_RELAXED)
                 : static_cast<int64_t>(__atomic_load_n(&narrow_values_[row], __ATOMIC_RELAXED));
  }
  void prefetch(int64_t row) const {
#if defined(__GNUC__)
    if (wide_) {
      __builtin_prefetch(&wide_values_[row], 1, 3);
    } else {
      __builtin_prefetch(&narrow_values_[row], 1, 3);
    }
#endif
  }
  // The caller made sure can_hold(v).
  void set(int64_t row, int64_t v) {
    if (wide_) {
      wide_values_[row] = v;
    } else {
      narrow_values_[row] = static_cast<N>(v);
    }
  }

  // Atomically adds c to the row, unless the sum would not fit the narrow column: then it
  // changes nothing and returns false (the caller adds it with add() under its exclusive lock).
  bool try_add(int64_t row, int64_t c) {
    if (wide_) {
      __atomic_fetch_add(&wide_values_[row], c, __ATOMIC_RELAXED);
      return true;
    }
    N* p = &narrow_values_[row];
    N old = __atomic_load_n(p, __ATOMIC_RELAXED);
    int64_t sum;
    do {
      if (__builtin_add_overflow(static_cast<int64_t>(old), c, &sum) || !fits(sum)) return false;
    } while (!__atomic_compare_exchange_n(p, &old, static_cast<N>(sum), true, __ATOMIC_RELAXED,
                                          __ATOMIC_RELAXED));
    return true;
  }
  // Adds c (wrapping like int64 arithmetic), widening first if the sum does not fit.
  void add(int64_t row, int64_t c) {
    const int64_t sum = static_cast<int64_t>(static_cast<uint64_t>(get(row)) + c);
    if (!can_hold(sum)) widen();
    set(row, sum);
  }

  void push_back(int64_t v) {
    if (!can_hold(v)) widen();
    if (wide_) {
      wide_values_.push_back(v);
    } else {
      narrow_values_.push_back(static_cast<N>(v));
    }
  }
  // Frees the capacity beyond size().
  void shrink_to_fit() {
    narrow_values_.shrink_to_fit();
    wide_values_.shrink_to_fit();
  }
  void resize(int64_t n) {
    if (wide_) {
      wide_values_.resize(n);
    } else {
      narrow_values_.resize(n);
    }
  }
  // Replaces the content with values[0, n) (narrow again when every value fits).
  void assign(const int64_t* values, int64_t n) {
    wide_ = false;
    narrow_values_.release();
    wide_values_.release();
    for (int64_t i = 0; i < n; ++i) wide_ = wide_ || !fits(values[i]);
    if (wide_) {
      wide_values_.assign(values, values + n);
    } else {
      narrow_values_.assign(values, values + n);
    }
  }
  void assign(const std::vector<int64_t>& values) {
    assign(values.data(), static_cast<int64_t>(values.size()));
  }
  std::vector<int64_t> to_vector() const {
    if (wide_) return wide_values_.to_vector();
    return std::vector<int64_t>(narrow_values_.begin(), narrow_values_.end());
  }
  void widen() {
    if (wide_) return;
    wide_values_.assign(narrow_values_.begin(), narrow_values_.end());
    narrow_values_.release();
    wide_ = true;
  }

 private:
  bool wide_ = false;
  PageVector<N> narrow_values_;
  PageVector<int64_t> wide_values_;
};

}  // namespace sok
