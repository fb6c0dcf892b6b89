// KeyOffsets: the SSD tier's index, int64 key -> where its record lies in the file (offset,
// bytes). One flat array with linear probing and tombstones: a std::unordered_map cost a cache
// miss or two and an allocation per key, most of the time a tiered step spent in its index.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace sok {

class KeyOffsets {
 public:
  struct Entry {
    int64_t key = 0;
    int64_t offset = 0;
    int64_t bytes = 0;  // > 0: a record; kEmpty or kErased: no key here
  };

  int64_t size() const { return live_; }

  const Entry* find(int64_t key) const {
    if (live_ == 0) return nullptr;
    for (uint64_t i = home(key);; i = (i + 1) & mask_) {
      const Entry& e = slots_[i];
      if (e.bytes == kEmpty) return nullptr;
      if (e.bytes > 0 && e.key == key) return &e;
    }
  }

  // Sets the key's location; returns the bytes of the one it replaced (0: the key is new). One
  // probe: a new key takes the first tombstone on its path, or the empty slot that ends it.
  int64_t assign(int64_t key, int64_t offset, int64_t bytes) {
    if (8 * (used_ + 1) > 5 * static_cast<int64_t>(slots_.size())) rehash();
    Entry* tombstone = nullptr;
    for (uint64_t i = home(key);; i = (i + 1) & mask_) {
      Entry& e = slots_[i];
      if (e.bytes > 0 && e.key == key) {
        const int64_t old = e.bytes;
        e.offset = offset;
        e.bytes = bytes;
        return old;
      }
      if (e.bytes == kErased && tombstone == nullptr) tombstone = &e;
      if (e.bytes == kEmpty) {
        Entry* at = tombstone != nullptr ? tombstone : &e;
        if (at == &e) ++used_;
        *at = Entry{key, offset, bytes};
        ++live_;
        return 0;
      }
    }
  }

  // Removes the key; returns the bytes of its location (0: it was absent).
  int64_t erase(int64_t key) {
    Entry* e = const_cast<Entry*>(find(key));
    if (e == nullptr) return 0;
    const int64_t old = e->bytes;
    e->bytes = kErased;
    --live_;
    return old;
  }

  // f(entry) for every key.
  template <typename F>
  void for_each(const F& f) const {
    for (const Entry& e : slots_) {
      if (e.bytes > 0) f(e);
    }
  }

  void clear() { *this = KeyOffsets(); }
  void swap(KeyOffsets& other) {
    slots_.swap(other.slots_);
    std::swap(mask_, other.mask_);
    std::swap(live_, other.live_);
    std::swap(used_, other.used_);
  }

 private:
  static constexpr int64_t kEmpty = 0, kErased = -1;

  uint64_t home(int64_t key) const {
    uint64_t x = static_cast<uint64_t>(key) + 0x9E3779B97F4A7C15ull;  // splitmix64's finalizer
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return (x ^ (x >> 31)) & mask_;
  }

  // Called when keys and tombstones fill 5/8 of the slots (a probe for an absent key then
  // reads about 4 entries): twice the room when the keys alone fill over 5/16, else the same
  // room without tombstones. 24-byte entries, 1.6 to 3.2 slots a key as keys are added: 38 to
  // 77 bytes a key, about what std::unordered_map's nodes and buckets took.
  void rehash() {
    std::size_t cap = slots_.empty() ? 64 : slots_.size();
    if (16 * (live_ + 1) > 5 * static_cast<int64_t>(cap)) cap *= 2;
    std::vector<Entry> old(cap);
    old.swap(slots_);
    mask_ = cap - 1;
    live_ = used_ = 0;
    for (const Entry& e : old) {
      if (e.bytes <= 0) continue;
      uint64_t i = home(e.key);
      while (slots_[i].bytes != kEmpty) i = (i + 1) & mask_;
      slots_[i] = e;
      ++live_;
      ++used_;
    }
  }

  std::vector<Entry> slots_;
  uint64_t mask_ = 0;
  int64_t live_ = 0;  // keys
  int64_t used_ = 0;  // keys and tombstones
};

}  // namespace sok
