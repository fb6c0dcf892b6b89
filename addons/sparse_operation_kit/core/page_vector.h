// PageVector<T>: a growable array of trivially copyable T for the table's large buffers (its
// index, key column, counter columns and row blocks). A buffer of kMapBytes or more is mapped
// from the OS directly (mmap) instead of taken from malloc, so that:
//  - freeing it returns its memory to the OS at once. glibc's malloc keeps freed heap memory
//    resident, and after freeing an mmapped chunk it raises its mmap threshold to that chunk's
//    size (up to 32 MiB), so the old copies of a growing column would stay resident;
//  - growing it moves its pages (mremap) instead of copying them: never two copies at once;
//  - capacity not written yet costs address space, not memory (its pages are never touched),
//    so growth slack is not resident.
// Smaller buffers come from malloc (a page or more each would waste memory on small tables).
//
// Not thread-safe, like std::vector: readers may share it, a writer needs it alone.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

namespace sok {

// Buffers of at least this many bytes are mapped from the OS.
constexpr size_t kMapBytes = size_t{64} << 10;

// A buffer of `bytes` (null for 0), aligned to 64 bytes, its content zero if `zero`.
void* buffer_alloc(size_t bytes, bool zero);
// Frees a buffer from buffer_alloc/buffer_resize; `bytes` as it was allocated.
void buffer_free(void* p, size_t bytes);
// The buffer of old_bytes resized to new_bytes; its first keep_bytes (<= both) are kept, the
// rest is unspecified. May move it.
void* buffer_resize(void* p, size_t old_bytes, size_t keep_bytes, size_t new_bytes);
// Whether a buffer of `bytes` is mapped from the OS (not malloc).
inline bool buffer_is_mapped(size_t bytes) { return bytes >= kMapBytes; }

template <typename T>
class PageVector {
  static_assert(std::is_trivially_copyable<T>::value, "PageVector holds trivially copyable T");

 public:
  PageVector() = default;
  PageVector(const PageVector&) = delete;
  PageVector& operator=(const PageVector&) = delete;
  PageVector(PageVector&& o) noexcept { swap(o); }
  PageVector& operator=(PageVector&& o) noexcept {
    if (this != &o) {
      release();
      swap(o);
    }
    return *this;
  }
  ~PageVector() { release(); }

  int64_t size() const { return size_; }
  int64_t capacity() const { return capacity_; }
  bool empty() const { return size_ == 0; }
  T* data() { return data_; }
  const T* data() const { return data_; }
  T* begin() { return data_; }
  T* end() { return data_ + size_; }
  const T* begin() const { return data_; }
  const T* end() const { return data_ + size_; }
  T& operator[](int64_t i) { return data_[i]; }
  const T& operator[](int64_t i) const { return data_[i]; }

  void reserve(int64_t n) {
    if (n > capacity_) reallocate(n);
  }
  void push_back(const T& v) {
    if (size_ == capacity_) reallocate(grown(size_ + 1));
    data_[size_++] = v;
  }
  // New elements are copies of v; shrinking keeps the capacity (see shrink_to_fit).
  void resize(int64_t n, const T& v = T()) {
    if (n > capacity_) reallocate(grown(n));
    for (int64_t i = size_; i < n; ++i) data_[i] = v;
    size_ = n;
  }
  void clear() { size_ = 0; }
  template <typename It>
  void assign(It first, It last) {
    clear();
    reserve(static_cast<int64_t>(last - first));
    for (; first != last; ++first) data_[size_++] = static_cast<T>(*first);
  }
  // n elements whose bytes are all zero, in a fresh buffer (the old one is freed first: pages
  // mapped from the OS are zero without being written).
  void assign_zeroed(int64_t n) {
    release();
    data_ = static_cast<T*>(buffer_alloc(bytes(n), true));
    size_ = capacity_ = n;
  }
  // Frees the capacity beyond size().
  void shrink_to_fit() {
    if (capacity_ > size_) reallocate(size_);
  }
  // Empties it and frees its buffer.
  void release() {
    buffer_free(data_, bytes(capacity_));
    data_ = nullptr;
    size_ = capacity_ = 0;
  }
  std::vector<T> to_vector() const { return std::vector<T>(begin(), end()); }
  void swap(PageVector& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(size_, o.size_);
    std::swap(capacity_, o.capacity_);
  }

 private:
  static size_t bytes(int64_t n) { return static_cast<size_t>(n) * sizeof(T); }
  // Doubling: unused capacity of a mapped buffer is not resident, and mremap copies nothing.
  int64_t grown(int64_t n) const { return n > 2 * capacity_ ? n : 2 * capacity_ + 8; }
  void reallocate(int64_t n) {
    if (n == 0) {
      release();
      return;
    }
    data_ = static_cast<T*>(
        buffer_resize(data_, bytes(capacity_), bytes(size_ < n ? size_ : n), bytes(n)));
    capacity_ = n;
    if (size_ > n) size_ = n;
  }

  T* data_ = nullptr;
  int64_t size_ = 0;
  int64_t capacity_ = 0;
};

}  // namespace sok
