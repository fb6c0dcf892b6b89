// RowIndex: a hash index from a key's 64-bit hash to its row, 8 bytes a slot, up to 4/5 full.
// It keeps no keys: a slot holds the row and a 24-bit tag (other bits of the hash than those
// choosing the bucket), and the caller compares the row's key on a tag match. A row is thus 8
// bytes / load (10 to 15 bytes) instead of a 16-byte key+row slot at most half full.
//
// Layout: buckets of 8 slots, one cache line each, filled in order; a key lives in its home
// bucket or, when that is full, in the next ones (linear probing over buckets). A bucket with
// an empty slot ends every search that reaches it. No deletions: the table rebuilds the index.
// The bucket count is any integer (the hash's high bits scale to it), so growth is by 3/2,
// not by doubling, which bounds the empty slots after growth.
//
// The slots live in a PageVector (mapped from the OS when large): growth frees the old slots
// before the new ones are filled, and they go back to the OS at once.
//
// Not thread-safe: readers may share it, a writer needs it alone (the table's shared_mutex).
#pragma once

#include <cstdint>

#include "addons/sparse_operation_kit/core/page_vector.h"

namespace sok {

class RowIndex {
 public:
  static constexpr int64_t kNone = -1;
  static constexpr int kSlotsPerBucket = 8;
  static constexpr int kTagBits = 24;
  static constexpr int64_t kMaxRows = (int64_t{1} << (64 - kTagBits)) - 1;

  // Empty, with room for min_rows rows.
  explicit RowIndex(int64_t min_rows = 0) { reset(min_rows); }

  // Empties it, with room for min_rows rows (at most 4/5 of the slots). The old slots are freed
  // first.
  void reset(int64_t min_rows);
  // How many rows it holds before it must grow.
  int64_t max_rows() const { return max_rows_; }
  int64_t num_slots() const { return buckets_.size() * kSlotsPerBucket; }

  // The first row whose tag matches the hash, or kNone, in which case no row has this hash. The
  // row's key is not compared: the caller confirms it (see find for the full search).
  int64_t candidate(uint64_t hash) const {
    const uint64_t tag = tag_of(hash);
    for (int64_t b = home(hash);; b = next(b)) {
      const uint64_t* s = buckets_[b].slots;
      for (int i = 0; i < kSlotsPerBucket; ++i) {
        if (s[i] == 0) return kNone;
        if ((s[i] >> kRowBits) == tag) return row_of(s[i]);
      }
    }
  }

  // The row with this hash for which is_row(row) holds, or kNone.
  template <typename IsRow>
  int64_t find(uint64_t hash, const IsRow& is_row) const {
    const uint64_t tag = tag_of(hash);
    for (int64_t b = home(hash);; b = next(b)) {
      const uint64_t* s = buckets_[b].slots;
      for (int i = 0; i < kSlotsPerBucket; ++i) {
        if (s[i] == 0) return kNone;
        if ((s[i] >> kRowBits) == tag && is_row(row_of(s[i]))) return row_of(s[i]);
      }
    }
  }

  // Adds row under hash; the caller made sure it is absent, that row < kMaxRows and that
  // there is room (it holds fewer than max_rows()).
  void insert(uint64_t hash, int64_t row);

  void prefetch(uint64_t hash) const {
#if defined(__GNUC__)
    __builtin_prefetch(&buckets_[home(hash)], 0, 3);
#endif
  }

 private:
  static constexpr int kRowBits = 64 - kTagBits;
  static constexpr uint64_t kRowMask = (uint64_t{1} << kRowBits) - 1;
  struct alignas(64) Bucket {
    uint64_t slots[kSlotsPerBucket];  // (tag << kRowBits) | (row + 1); 0: empty
  };

  static uint64_t tag_of(uint64_t hash) { return hash & ((uint64_t{1} << kTagBits) - 1); }
  static int64_t row_of(uint64_t slot) { return static_cast<int64_t>(slot & kRowMask) - 1; }
  // The hash's high bits scaled to [0, buckets) (Lemire's multiply-shift).
  int64_t home(uint64_t hash) const {
    return static_cast<int64_t>(
        (static_cast<unsigned __int128>(hash) * static_cast<uint64_t>(buckets_.size())) >> 64);
  }
  int64_t next(int64_t b) const { return b + 1 == buckets_.size() ? 0 : b + 1; }

  PageVector<Bucket> buckets_;
  int64_t max_rows_ = 0;
};

}  // namespace sok
