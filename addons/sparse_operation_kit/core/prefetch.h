// Software prefetches for the CPU's batched loops that touch memory out of order (rows visited
// in row order write or read their per-key outputs and gradients in another order).
#pragma once

#include <cstdint>

namespace sok {

inline void prefetch_read(const void* p) {
#if defined(__GNUC__)
  __builtin_prefetch(p, 0, 3);
#endif
}

inline void prefetch_write(const void* p) {
#if defined(__GNUC__)
  __builtin_prefetch(p, 1, 3);
#endif
}

// The d floats at p, for a read or (kWrite) a write: their first and last cache lines.
template <bool kWrite>
inline void prefetch_floats(const float* p, int64_t d) {
  if (kWrite) {
    prefetch_write(p);
    prefetch_write(p + d - 1);
  } else {
    prefetch_read(p);
    prefetch_read(p + d - 1);
  }
}

}  // namespace sok
