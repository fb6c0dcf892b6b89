#include "addons/sparse_operation_kit/core/row_arena.h"

#include <utility>

#include "addons/sparse_operation_kit/core/page_vector.h"

namespace sok {
namespace {

// 4 MiB: a block's untouched pages cost address space only, and a table of 128 GB of rows stays
// at 32K mappings, half the kernel's default vm.max_map_count even if none of them merge.
constexpr int64_t kBlockBytes = int64_t{4} << 20;

}  // namespace

RowArena::RowArena(int64_t stride) : stride_(stride) {
  // The most rows (a power of two, so a row's block is a shift) that fit in kBlockBytes.
  const int64_t row_bytes = sizeof(float) * (stride > 0 ? stride : 1);
  while ((int64_t{2} << shift_) * row_bytes <= kBlockBytes) ++shift_;
  mask_ = (int64_t{1} << shift_) - 1;
}

RowArena::~RowArena() {
  for (float* b : blocks_) buffer_free(b, block_bytes());
}

float* RowArena::append() {
  if ((size_ >> shift_) == static_cast<int64_t>(blocks_.size())) {
    // Not written: the block's pages stay unused until rows are written there.
    blocks_.push_back(static_cast<float*>(buffer_alloc(block_bytes(), false)));
  }
  return row(size_++);
}

void RowArena::truncate(int64_t rows) {
  if (rows >= size_) return;
  size_ = rows;
  const size_t keep = static_cast<size_t>((size_ + mask_) >> shift_);
  for (size_t b = keep; b < blocks_.size(); ++b) buffer_free(blocks_[b], block_bytes());
  blocks_.resize(keep);
}

void RowArena::swap(RowArena& other) {
  std::swap(stride_, other.stride_);
  std::swap(size_, other.size_);
  std::swap(shift_, other.shift_);
  std::swap(mask_, other.mask_);
  blocks_.swap(other.blocks_);
}

}  // namespace sok
