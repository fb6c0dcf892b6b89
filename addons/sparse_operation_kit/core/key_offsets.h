// KeyOffsets: the SSD tier's index, int64 key -> where its record lies in the file (offset,
// bytes). One flat array of 16-byte entries with linear probing and tombstones: a
// std::unordered_map cost a cache miss or two and an allocation per key, most of the time a
// tiered step spent in its index, and 40 to 80 bytes a key of DRAM.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace sok {

class KeyOffsets {
 public:
  // A record's location packed in 8 bytes: offset * 2^22 + bytes. 0 marks an empty slot (a
  // record has bytes >= 1), all ones an erased one (no record has that offset).
  static constexpr int kBytesBits = 22;
  static constexpr int64_t kMaxRecordBytes = (int64_t{1} << kBytesBits) - 1;    // 4 MiB - 1
  static constexpr int64_t kMaxOffset = (int64_t{1} << (64 - kBytesBits)) - 2;  // 4 TiB - 2

  // Whether a record of `bytes` at `offset` can be indexed (the store refuses one that cannot).
  static bool fits(int64_t offset, int64_t bytes) {
    return bytes >= 1 && bytes <= kMaxRecordBytes && offset >= 0 && offset <= kMaxOffset;
  }

  struct Entry {
    int64_t key = 0;
    uint64_t loc = kEmpty;
    int64_t offset() const { return static_cast<int64_t>(loc >> kBytesBits); }
    int64_t bytes() const { return static_cast<int64_t>(loc & kMaxRecordBytes); }
    bool live() const { return loc != kEmpty && loc != kErased; }
  };

  int64_t size() const { return live_; }
  // Bytes the index holds (its slots), for the memory figures.
  int64_t memory_bytes() const { return static_cast<int64_t>(slots_.capacity() * sizeof(Entry)); }

  const Entry* find(int64_t key) const {
    if (live_ == 0) return nullptr;
    for (std::size_t i = home(key);; i = next(i)) {
      const Entry& e = slots_[i];
      if (e.loc == kEmpty) return nullptr;
      if (e.key == key && e.live()) return &e;
    }
  }

  // Sets the key's location (fits(offset, bytes) must hold); returns the bytes of the one it
  // replaced (0: the key is new). One probe: a new key takes the first tombstone on its path, or
  // the empty slot that ends it.
  int64_t assign(int64_t key, int64_t offset, int64_t bytes) {
    if (4 * (used_ + 1) > 3 * static_cast<int64_t>(slots_.size())) rehash();
    const uint64_t loc =
        (static_cast<uint64_t>(offset) << kBytesBits) | static_cast<uint64_t>(bytes);
    Entry* tombstone = nullptr;
    for (std::size_t i = home(key);; i = next(i)) {
      Entry& e = slots_[i];
      if (e.key == key && e.live()) {
        const int64_t old = e.bytes();
        e.loc = loc;
        return old;
      }
      if (e.loc == kErased && tombstone == nullptr) tombstone = &e;
      if (e.loc == kEmpty) {
        Entry* at = tombstone != nullptr ? tombstone : &e;
        if (at == &e) ++used_;
        *at = Entry{key, loc};
        ++live_;
        return 0;
      }
    }
  }

  // Removes the key; returns the bytes of its location (0: it was absent).
  int64_t erase(int64_t key) {
    Entry* e = const_cast<Entry*>(find(key));
    if (e == nullptr) return 0;
    const int64_t old = e->bytes();
    e->loc = kErased;
    --live_;
    return old;
  }

  // f(entry) for every key.
  template <typename F>
  void for_each(const F& f) const {
    for (const Entry& e : slots_) {
      if (e.live()) f(e);
    }
  }

  void clear() { *this = KeyOffsets(); }
  void swap(KeyOffsets& other) {
    slots_.swap(other.slots_);
    std::swap(live_, other.live_);
    std::swap(used_, other.used_);
  }

 private:
  static constexpr uint64_t kEmpty = 0, kErased = ~uint64_t{0};

  // splitmix64's finalizer, then the high half of hash * slots: any number of slots, so the
  // index can grow by half instead of doubling.
  std::size_t home(int64_t key) const {
    uint64_t x = static_cast<uint64_t>(key) + 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    x ^= x >> 31;
    return static_cast<std::size_t>((static_cast<unsigned __int128>(x) * slots_.size()) >> 64);
  }
  std::size_t next(std::size_t i) const { return i + 1 == slots_.size() ? 0 : i + 1; }

  // Called when keys and tombstones would fill 3/4 of the slots (a probe for an absent key then
  // reads about 8 entries, 2 cache lines): half again the room when the keys alone fill over
  // half, else the same room without tombstones. As keys are added the keys fill 1/2 to 3/4 of
  // the slots: 16-byte entries, 21 to 32 bytes a key.
  void rehash() {
    std::size_t cap = slots_.empty() ? 64 : slots_.size();
    if (2 * (live_ + 1) > static_cast<int64_t>(cap)) cap += cap / 2;
    std::vector<Entry> old(cap);
    old.swap(slots_);
    live_ = used_ = 0;
    for (const Entry& e : old) {
      if (!e.live()) continue;
      std::size_t i = home(e.key);
      while (slots_[i].loc != kEmpty) i = next(i);
      slots_[i] = e;
      ++live_;
      ++used_;
    }
  }

  std::vector<Entry> slots_;
  int64_t live_ = 0;  // keys
  int64_t used_ = 0;  // keys and tombstones
};

}  // namespace sok
