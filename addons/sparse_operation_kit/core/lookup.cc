#include "addons/sparse_operation_kit/core/lookup.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "addons/sparse_operation_kit/core/prefetch.h"

namespace sok {

bool parse_combiner(const std::string& name, Combiner* out) {
  if (name == "sum") *out = Combiner::kSum;
  else if (name == "mean") *out = Combiner::kMean;
  else if (name == "sqrtn") *out = Combiner::kSqrtn;
  else return false;
  return true;
}

template <typename K>
int64_t unique_keys(const K* keys, int64_t n, K* unique, int32_t* inverse, int64_t* counts) {
  // Open addressing over positions into `unique`; -1 is empty, so every key value is legal.
  // The set is sized by the distinct keys seen so far (it doubles at half load), not by n: with
  // repeated ids it stays a few times smaller and cache-resident. Slots come from a
  // multiplicative (Fibonacci) hash: its top bits, after folding the key's high half into the
  // low half, are well spread at the cost of one multiply (the set lives for one call, so it
  // needs no hash shared with the tables).
  constexpr int64_t kKeptSlots = int64_t{1} << 22;  // kept per thread between calls: <= 16 MiB
  thread_local std::vector<int32_t> kept;
  std::vector<int32_t> local;
  int bits = 0;
  int64_t cap = 0;
  int32_t* slots = nullptr;
  int32_t num_unique = 0;
  auto slot_of = [&bits](K key) {
    const uint64_t x = static_cast<uint64_t>(static_cast<int64_t>(key));
    return ((x ^ (x >> 32)) * 0x9E3779B97F4A7C15ull) >> (64 - bits);
  };
  auto resize = [&](int new_bits) {
    bits = new_bits;
    cap = int64_t{1} << bits;
    std::vector<int32_t>& storage = cap <= kKeptSlots ? kept : local;
    if (static_cast<int64_t>(storage.size()) < cap) storage.resize(cap);
    slots = storage.data();
    std::fill(slots, slots + cap, -1);
    const uint64_t mask = static_cast<uint64_t>(cap - 1);
    for (int32_t u = 0; u < num_unique; ++u) {
      uint64_t pos = slot_of(unique[u]);
      while (slots[pos] >= 0) pos = (pos + 1) & mask;
      slots[pos] = u;
    }
  };
  int initial_bits = 4;
  while ((int64_t{1} << initial_bits) < 2 * std::min<int64_t>(n, 2048)) ++initial_bits;
  resize(initial_bits);
  uint64_t mask = static_cast<uint64_t>(cap - 1);
  for (int64_t i = 0; i < n; ++i) {
    const K key = keys[i];
    uint64_t pos = slot_of(key);
    while (true) {
      const int32_t u = slots[pos];
      if (u < 0) {
        const int32_t nu = num_unique++;
        slots[pos] = nu;
        inverse[i] = nu;
        unique[nu] = key;
        if (counts) counts[nu] = 1;
        if (2 * (static_cast<int64_t>(nu) + 1) > cap) {  // keep the load at most 1/2
          resize(bits + 1);
          mask = static_cast<uint64_t>(cap - 1);
        }
        break;
      }
      if (unique[u] == key) {
        inverse[i] = u;
        if (counts) ++counts[u];
        break;
      }
      pos = (pos + 1) & mask;
    }
  }
  return num_unique;
}

template <typename K>
void bucketize_by_owner(const K* keys, int64_t n, int world_size, int64_t* order, int64_t* counts) {
  std::vector<int64_t> offset(world_size + 1, 0);
  for (int r = 0; r < world_size; ++r) counts[r] = 0;
  for (int64_t i = 0; i < n; ++i) ++counts[floor_mod(keys[i], world_size)];
  for (int r = 0; r < world_size; ++r) offset[r + 1] = offset[r] + counts[r];
  for (int64_t i = 0; i < n; ++i) order[offset[floor_mod(keys[i], world_size)]++] = i;
}

namespace {

// Whether any index lies outside [0, dense_shape) or any sample is below its predecessor's: one
// branch-free pass (unsigned compares catch negative indices). It runs on every id of every
// lookup: ~1 ns an id (memory-bound) where the exact search below takes ~3.4.
template <int R>
bool any_bad_position(const int64_t* positions, int64_t n, int rank, const int64_t* dense_shape) {
  const int r = R > 0 ? R : rank;
  uint64_t bad = 0;
  int64_t prev = n > 0 ? positions[0] : 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t* index = positions + i * r;
    for (int d = 0; d < r; ++d)
      bad |= static_cast<uint64_t>(index[d]) >= static_cast<uint64_t>(dense_shape[d]);
    bad |= static_cast<uint64_t>(index[0] < prev);
    prev = index[0];
  }
  return bad != 0;
}

}  // namespace

PositionsCheck check_positions(const int64_t* positions, int64_t n, int rank,
                               const int64_t* dense_shape) {
  PositionsCheck c;
  bool shape_ok = true;  // a negative dimension makes every index bad (the exact pass says so)
  for (int d = 0; d < rank; ++d) shape_ok = shape_ok && dense_shape[d] >= 0;
  if (shape_ok) {
    const bool any = rank == 2   ? any_bad_position<2>(positions, n, rank, dense_shape)
                     : rank == 1 ? any_bad_position<1>(positions, n, rank, dense_shape)
                                 : any_bad_position<0>(positions, n, rank, dense_shape);
    if (!any) return c;
  }
  for (int64_t i = 0; i < n; ++i) {
    const int64_t* index = positions + i * rank;
    for (int d = 0; d < rank && c.first_outside < 0; ++d) {
      if (index[d] < 0 || index[d] >= dense_shape[d]) {
        c.first_outside = i;
        break;
      }
    }
    if (c.first_unordered < 0 && i > 0 && index[0] < index[-rank]) c.first_unordered = i;
  }
  return c;
}

void stable_sample_order(const int64_t* positions, int64_t n, int rank, int32_t* order) {
  for (int64_t i = 0; i < n; ++i) order[i] = static_cast<int32_t>(i);
  std::stable_sort(order, order + n, [positions, rank](int32_t a, int32_t b) {
    return positions[static_cast<int64_t>(a) * rank] < positions[static_cast<int64_t>(b) * rank];
  });
}

Status check_lookup_indices(const std::string& table, const int32_t* inverse,
                            const int64_t* segment_ids, int64_t n, int64_t num_rows, int64_t batch,
                            int64_t segment_stride) {
  for (int64_t i = 0; i < n; ++i) {
    const int64_t s = segment_ids[i * segment_stride];
    if (s < 0 || s >= batch) {
      return Status::Invalid("lookup of table '" + table + "': id " + std::to_string(i) +
                             " belongs to sample " + std::to_string(s) + ", outside a batch of " +
                             std::to_string(batch));
    }
    if (inverse[i] < 0 || inverse[i] >= num_rows) {
      return Status::Invalid("lookup of table '" + table + "': id " + std::to_string(i) +
                             " reads row " + std::to_string(inverse[i]) + " of " +
                             std::to_string(num_rows) + " fetched rows");
    }
  }
  return Status::OK();
}

namespace {

// Per-sample factor that turns the weighted sum into the requested combiner.
std::vector<float> segment_scales(const int64_t* segment_ids, int64_t stride, const float* weights,
                                  int64_t n, int64_t batch, Combiner combiner) {
  std::vector<float> scale(batch, 1.f);
  if (combiner == Combiner::kSum) return scale;
  std::vector<double> acc(batch, 0.0);
  for (int64_t i = 0; i < n; ++i) {
    const double w = weights ? weights[i] : 1.0;
    acc[segment_ids[i * stride]] += combiner == Combiner::kMean ? w : w * w;
  }
  for (int64_t b = 0; b < batch; ++b) {
    const double denom = combiner == Combiner::kMean ? acc[b] : std::sqrt(acc[b]);
    scale[b] = denom == 0.0 ? 0.f : static_cast<float>(1.0 / denom);
  }
  return scale;
}

// Calls fn(std::integral_constant<int64_t, D>) with D = dim for the common embedding sizes (the
// column loops then unroll into a few vector instructions) and D = 0 (runtime dim) otherwise.
template <typename Fn>
void dispatch_dim(int64_t dim, const Fn& fn) {
  switch (dim) {
    case 4: return fn(std::integral_constant<int64_t, 4>());
    case 8: return fn(std::integral_constant<int64_t, 8>());
    case 16: return fn(std::integral_constant<int64_t, 16>());
    case 32: return fn(std::integral_constant<int64_t, 32>());
    case 64: return fn(std::integral_constant<int64_t, 64>());
    default: return fn(std::integral_constant<int64_t, 0>());
  }
}

// dst[0, d) += src[0, d) (w == nullptr) or += *w * src; D > 0: d == D at compile time.
template <int64_t D>
inline void add_row(float* __restrict__ dst, const float* __restrict__ src, int64_t d,
                    const float* w) {
  if (D) d = D;
  if (w == nullptr) {
    for (int64_t c = 0; c < d; ++c) dst[c] += src[c];
  } else {
    const float wv = *w;
    for (int64_t c = 0; c < d; ++c) dst[c] += wv * src[c];
  }
}

// dst[0, d) = 0 + src (w == nullptr) or 0 + *w * src: what add_row gives on a zeroed row,
// bit for bit (0 + -0 is +0).
template <int64_t D>
inline void set_row(float* __restrict__ dst, const float* __restrict__ src, int64_t d,
                    const float* w) {
  if (D) d = D;
  if (w == nullptr) {
    for (int64_t c = 0; c < d; ++c) dst[c] = 0.f + src[c];
  } else {
    const float wv = *w;
    for (int64_t c = 0; c < d; ++c) dst[c] = 0.f + wv * src[c];
  }
}

bool is_sorted(const int64_t* segment_ids, int64_t stride, int64_t n) {
  for (int64_t i = 1; i < n; ++i)
    if (segment_ids[i * stride] < segment_ids[(i - 1) * stride]) return false;
  return true;
}

// The first i in [lo, hi) whose sample is >= s (samples sorted), else hi.
int64_t first_sample_at_least(const int64_t* segment_ids, int64_t stride, int64_t lo, int64_t hi,
                              int64_t s) {
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (segment_ids[mid * stride] < s) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

}  // namespace

void pooled_forward(const float* rows, int64_t dim, const int32_t* inverse,
                    const int64_t* segment_ids, const float* weights, int64_t n, int64_t batch,
                    Combiner combiner, float* out, const ParallelFor& pf, int64_t stride) {
  const std::vector<float> scale = segment_scales(segment_ids, stride, weights, n, batch, combiner);
  // Unweighted sums skip the multiply by w == 1 (bit-identical: 1 * x == x).
  const bool unit = weights == nullptr && combiner == Combiner::kSum;
  if (!is_sorted(segment_ids, stride, n)) {
    std::memset(out, 0, sizeof(float) * batch * dim);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t s = segment_ids[i * stride];
      const float w = (weights ? weights[i] : 1.f) * scale[s];
      const float* src = rows + static_cast<int64_t>(inverse[i]) * dim;
      float* dst = out + s * dim;
      for (int64_t c = 0; c < dim; ++c) dst[c] += w * src[c];
    }
    return;
  }
  // Sorted samples: split the ids on sample boundaries so no two workers share an output row;
  // each sample sums its ids in registers (same order as above) and is written once.
  dispatch_dim(dim, [&](auto dim_tag) {
    constexpr int64_t D = decltype(dim_tag)::value;
    const int64_t d = D ? D : dim;
    pf(batch, 8 * d * std::max<int64_t>(1, n / std::max<int64_t>(1, batch)),
       [&](int64_t sb, int64_t se) {
         int64_t i = first_sample_at_least(segment_ids, stride, 0, n, sb);
         const int64_t e = first_sample_at_least(segment_ids, stride, i, n, se);
         constexpr int64_t kAhead = 8;
         for (int64_t j = i; j < std::min(e, i + kAhead); ++j) prefetch_read(rows + inverse[j] * d);
         for (int64_t s = sb; s < se; ++s) {
           float* dst = out + s * d;
           std::fill(dst, dst + d, 0.f);
           for (; i < e && segment_ids[i * stride] == s; ++i) {
             if (i + kAhead < e)
               prefetch_read(rows + static_cast<int64_t>(inverse[i + kAhead]) * d);
             const float* src = rows + static_cast<int64_t>(inverse[i]) * d;
             float w = 1.f;
             if (!unit) w = (weights ? weights[i] : 1.f) * scale[s];
             add_row<D>(dst, src, d, unit ? nullptr : &w);
           }
         }
       });
  });
}

void pooled_backward(const float* grad_out, int64_t dim, const int32_t* inverse,
                     const int64_t* segment_ids, const float* weights, int64_t n, int64_t batch,
                     Combiner combiner, int64_t num_rows, float* grad_rows, const ParallelFor& pf,
                     int64_t stride) {
  const std::vector<float> scale = segment_scales(segment_ids, stride, weights, n, batch, combiner);
  const bool unit = weights == nullptr && combiner == Combiner::kSum;  // w == 1: skip the multiply
  // Each worker owns a range of output rows and scans every id: no two write the same row.
  dispatch_dim(dim, [&](auto dim_tag) {
    constexpr int64_t D = decltype(dim_tag)::value;
    const int64_t d = D ? D : dim;
    pf(num_rows, 8 * d * std::max<int64_t>(1, n / std::max<int64_t>(1, num_rows)),
       [&](int64_t rb, int64_t re) {
         // Rows [rb, ready) hold their sum so far, rows from `ready` on are untouched: no zero
         // fill up front. unique_keys numbers rows by first appearance, so a row's first id
         // normally comes exactly at `ready` and is stored; rows skipped over are zeroed then.
         int64_t ready = rb;
         constexpr int64_t kAhead = 8;
         for (int64_t i = 0; i < n; ++i) {
           if (i + kAhead < n)
             prefetch_write(grad_rows + static_cast<int64_t>(inverse[i + kAhead]) * d);
           const int64_t r = inverse[i];
           if (r < rb || r >= re) continue;
           const int64_t s = segment_ids[i * stride];
           float w = 1.f;
           if (!unit) w = (weights ? weights[i] : 1.f) * scale[s];
           float* dst = grad_rows + r * d;
           if (r < ready) {
             add_row<D>(dst, grad_out + s * d, d, unit ? nullptr : &w);
           } else {
             std::fill(grad_rows + ready * d, dst, 0.f);
             set_row<D>(dst, grad_out + s * d, d, unit ? nullptr : &w);
             ready = r + 1;
           }
         }
         std::fill(grad_rows + ready * d, grad_rows + re * d, 0.f);
       });
  });
}

template int64_t unique_keys<int32_t>(const int32_t*, int64_t, int32_t*, int32_t*, int64_t*);
template int64_t unique_keys<int64_t>(const int64_t*, int64_t, int64_t*, int32_t*, int64_t*);
template void bucketize_by_owner<int32_t>(const int32_t*, int64_t, int, int64_t*, int64_t*);
template void bucketize_by_owner<int64_t>(const int64_t*, int64_t, int, int64_t*, int64_t*);

}  // namespace sok
