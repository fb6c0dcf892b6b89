#include "addons/sparse_operation_kit/core/row_index.h"

#include <algorithm>

namespace sok {

void RowIndex::reset(int64_t min_rows) {
  // At most 4/5 full: a search then reads about one bucket when the key is present and under
  // three when it is absent.
  const int64_t slots = std::max<int64_t>(min_rows, 1) * 5 / 4 + 1;
  const int64_t buckets = (slots + kSlotsPerBucket - 1) / kSlotsPerBucket;
  buckets_.assign_zeroed(buckets);  // an all-zero slot is empty
  max_rows_ = buckets * kSlotsPerBucket * 4 / 5;
}

void RowIndex::insert(uint64_t hash, int64_t row) {
  const uint64_t slot = (tag_of(hash) << kRowBits) | static_cast<uint64_t>(row + 1);
  for (int64_t b = home(hash);; b = next(b)) {
    uint64_t* s = buckets_[b].slots;
    for (int i = 0; i < kSlotsPerBucket; ++i) {
      if (s[i] == 0) {
        s[i] = slot;
        return;
      }
    }
  }
}

}  // namespace sok
