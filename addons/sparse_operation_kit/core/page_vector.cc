#include "addons/sparse_operation_kit/core/page_vector.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdlib>
#include <new>

namespace sok {
namespace {

constexpr size_t kAlign = 64;

size_t page_bytes() {
  static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return page;
}

size_t round_up(size_t bytes, size_t unit) { return (bytes + unit - 1) / unit * unit; }

}  // namespace

void* buffer_alloc(size_t bytes, bool zero) {
  if (bytes == 0) return nullptr;
  if (buffer_is_mapped(bytes)) {
    // Anonymous pages read as zero: no need to write them.
    void* p = mmap(nullptr, round_up(bytes, page_bytes()), PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    return p;
  }
  void* p = std::aligned_alloc(kAlign, round_up(bytes, kAlign));
  if (p == nullptr) throw std::bad_alloc();
  if (zero) std::memset(p, 0, bytes);
  return p;
}

void buffer_free(void* p, size_t bytes) {
  if (p == nullptr) return;
  if (buffer_is_mapped(bytes)) {
    munmap(p, round_up(bytes, page_bytes()));
  } else {
    std::free(p);
  }
}

void* buffer_resize(void* p, size_t old_bytes, size_t keep_bytes, size_t new_bytes) {
  if (p == nullptr) return buffer_alloc(new_bytes, false);
  if (new_bytes == 0) {
    buffer_free(p, old_bytes);
    return nullptr;
  }
#if defined(__linux__)
  if (buffer_is_mapped(old_bytes) && buffer_is_mapped(new_bytes)) {
    // Moves the pages (or extends the mapping in place): nothing is copied.
    const size_t old_mapped = round_up(old_bytes, page_bytes());
    const size_t new_mapped = round_up(new_bytes, page_bytes());
    if (old_mapped == new_mapped) return p;
    void* q = mremap(p, old_mapped, new_mapped, MREMAP_MAYMOVE);
    if (q == MAP_FAILED) throw std::bad_alloc();
    return q;
  }
#endif
  void* q = buffer_alloc(new_bytes, false);
  std::memcpy(q, p, keep_bytes);
  buffer_free(p, old_bytes);
  return q;
}

}  // namespace sok
