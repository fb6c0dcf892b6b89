// RowArena: rows of `stride` floats in fixed-size blocks (about 4 MiB each). Growing adds a
// block: rows never move and no copy is made, and the unused room is at most one block (a
// doubling vector copies everything and may leave a whole table's worth unused). Blocks are
// mapped from the OS (buffer_alloc in page_vector.h): a block's pages not written yet are not
// resident, and no allocator header spills a block onto one more page.
//
// Not thread-safe: readers may share it, a writer needs it alone (the table's shared_mutex);
// rows may be written concurrently as long as each by one thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace sok {

class RowArena {
 public:
  explicit RowArena(int64_t stride = 0);
  RowArena(const RowArena&) = delete;
  RowArena& operator=(const RowArena&) = delete;
  ~RowArena();

  int64_t stride() const { return stride_; }
  int64_t size() const { return size_; }
  int64_t rows_per_block() const { return mask_ + 1; }

  float* row(int64_t r) { return blocks_[r >> shift_] + (r & mask_) * stride_; }
  const float* row(int64_t r) const { return blocks_[r >> shift_] + (r & mask_) * stride_; }

  // A new last row, not initialised.
  float* append();
  // Keeps the first `rows` rows, freeing the blocks past them.
  void truncate(int64_t rows);
  void swap(RowArena& other);

 private:
  int64_t stride_ = 0;
  int64_t size_ = 0;
  int shift_ = 0;               // log2(rows per block)
  int64_t mask_ = 0;            // rows per block - 1
  std::vector<float*> blocks_;  // of block_bytes() each, from buffer_alloc

  size_t block_bytes() const { return sizeof(float) * rows_per_block() * stride_; }
};

}  // namespace sok
