// Internal: the GPU hash table's memory layout and its cooperative probing (device side).
//
// Layout: nb (power of two) buckets of 32 slots. Per slot: a digest byte (0 empty, 1 erased,
// 2 being written, 3..255 = 3 + (hash >> 56) % 253), {key, frequency} (16 bytes, so the frequency
// update hits the line the key compare just brought into L2), the version, and the row
// [value(dim) | slots(num_slots x dim)]: row s of `rows`, or, in a pooled table (a tiered
// table's tiers), row row_of[s] of a pool that holds only the rows the tier needs (the HBM
// tier's budget; the host tier's keys and a growth margin, in blocks), whatever the index's spare
// slots (a fresh slot takes a row from the free list, an erased one gives it back; a launch only
// takes or only gives, so a row given back is never reused while a tile of the same launch still
// reads it). A key lives in its home bucket (hash & (nb - 1)) or, when that was full at insertion,
// in one of the following buckets (linear probing over buckets); a bucket with an empty slot ends a
// search. Erased slots stay "erased" (never reused) until the next rehash, so concurrent inserts
// and erases cannot break a probe chain.
//
// Probing is cooperative: 8 threads per key, each loading one 4-byte word of the bucket's 32
// digests (one 32-byte sector per bucket), comparing 4 digests at once (__vcmpeq4), and only the
// candidate slots' keys are read. Inserting claims the FIRST empty slot of the first bucket with
// room by CAS on its digest word (empty -> being written), writes key, frequency, version and row,
// then publishes the digest (fence + atomic xor). A thread that sees a slot being written in the
// bucket it is inserting into waits for it (it may be its own key), so two inserts of one key, in
// one batch or on two streams, always meet on one slot.
#pragma once

#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "addons/sparse_operation_kit/core/common.h"
#include "addons/sparse_operation_kit/core/cuda/device_util.cuh"
#include "addons/sparse_operation_kit/core/cuda/runtime.h"
#include "addons/sparse_operation_kit/core/initializer.h"

namespace sok {
namespace gpu {
namespace detail {

namespace cg = cooperative_groups;

constexpr int kSlots = 32;  // slots per bucket
constexpr int kTile = 8;    // threads per key: one digest word (4 slots) each
constexpr uint32_t kErasedB = 1, kBusyB = 2;
constexpr uint32_t kBytes = 0x01010101u;

struct alignas(16) Meta {
  int64_t key;
  int64_t freq;
};

struct DevTable {
  uint32_t* digests = nullptr;  // nb * 8 words
  Meta* meta = nullptr;         // nb * 32
  int64_t* versions = nullptr;  // nb * 32
  float* rows = nullptr;        // nb * 32 * stride; pooled: pool rows * stride (below)
  // Pooled tables only (else null): each slot's pool row (nb * 32), after the pool's header.
  int32_t* row_of = nullptr;
  uint64_t mask = 0;  // nb - 1
  // 32 bits: a launch's parts hold two DevTables each (table_many.cuh).
  int32_t stride = 0;
  int32_t dim = 0;
};

// A pooled table's free list (a row number per pool row) is a device allocation of its own,
// even for rows in host memory, so its atomics stay on the GPU. The pool's rows are blocks:
// a growth adds one and copies nothing (pool rows [start[c], start[c + 1]) are block[c]'s).
// The header in the kPoolAlign bytes before row_of finds both: a rehash copies the header with
// the index, and a new pool (growth, relayout, import) rewrites it, so DevTable, in every
// launch's parameters, stays small.
constexpr int kMaxPoolBlocks = 60;  // growth by half: 1 row to kMaxPoolRows in 54 blocks
struct PoolHeader {
  unsigned long long count;  // free rows: list[0, count)
  int32_t* list;
  int64_t num_blocks;
  int64_t start[kMaxPoolBlocks];
  float* block[kMaxPoolBlocks];
};
constexpr int64_t kPoolAlign = 1024;
static_assert(sizeof(PoolHeader) <= kPoolAlign, "the pool header fits before row_of");
constexpr int64_t kMaxPoolRows = 2147483647;  // row numbers are int32
__host__ __device__ __forceinline__ PoolHeader* pool_header(const int32_t* row_of) {
  return reinterpret_cast<PoolHeader*>(reinterpret_cast<char*>(const_cast<int32_t*>(row_of)) -
                                       kPoolAlign);
}

// Pool row r of a pooled table (the last blocks, the largest, are searched first).
__device__ __forceinline__ float* pool_row(const DevTable& t, int64_t r) {
  const PoolHeader* h = pool_header(t.row_of);
  int64_t b = h->num_blocks - 1;
  while (r < h->start[b]) --b;
  return h->block[b] + (r - h->start[b]) * t.stride;
}

// A launch's fail flag: kFailFull, no free slot; kFailPoolEmpty, a pooled table had no free row.
constexpr int kFailFull = 1, kFailPoolEmpty = 2;

// The row of live slot s.
__device__ __forceinline__ float* row_at(const DevTable& t, int64_t s) {
  return t.row_of != nullptr ? pool_row(t, t.row_of[s]) : t.rows + s * t.stride;
}

struct RowInit {
  InitializerSpec init;
  int num_slots;
  float slot_init[2];
  int64_t filter_freq;
  float no_perm;
};

using Tile = cg::thread_block_tile<kTile>;

__device__ __forceinline__ uint32_t digest_of(uint64_t h) {
  return 3u + static_cast<uint32_t>((h >> 56) % 253u);
}

// Whether slot s holds a published key (digest 3..255: not empty, erased or being written).
__device__ __forceinline__ bool live_slot(const uint32_t* digests, int64_t s) {
  return ((digests[s >> 2] >> (8 * (s & 3))) & 0xffu) >= 3u;
}
// live_slot as a predicate over slot numbers (cub's selections).
struct IsLiveSlot {
  const uint32_t* digests;
  __device__ bool operator()(int64_t s) const { return live_slot(digests, s); }
};

// Element c >= dim of a row: its optimizer slot's initial value.
__device__ __forceinline__ float initial_slot_element(const RowInit& ri, int64_t c, int64_t dim) {
  return c < 2 * dim ? ri.slot_init[0] : ri.slot_init[1];  // no run-time index into kernel params
}

// Initial content of element c of a fresh row (value from initializer.h, slots their init).
__device__ __forceinline__ float fresh_element(const RowInit& ri, int64_t key, int64_t c,
                                               int64_t dim) {
  return c < dim ? initial_value(ri.init, key, c, dim) : initial_slot_element(ri, c, dim);
}

// Returns the slot of key or -1. kAcquire orders the caller's later reads of that slot after the
// writer's publication (needed when the slot may have been published during this kernel).
template <bool kAcquire>
__device__ int64_t probe_find(const Tile& tile, const DevTable& t, int64_t key, uint64_t h) {
  const uint32_t dw = digest_of(h) * kBytes;
  const int lane = tile.thread_rank();
  uint64_t b = h & t.mask;
  for (uint64_t step = 0; step <= t.mask; ++step) {
    const uint32_t* wp = t.digests + b * 8 + lane;
    const uint32_t w = kAcquire ? ld_acquire_u32(wp) : ld_relaxed_u32(wp);
    uint32_t m = __vcmpeq4(w, dw);
    int64_t found = -1;
    while (m != 0) {
      const int byte = (__ffs(m) - 1) >> 3;
      m &= ~(0xffu << (8 * byte));
      const int64_t s = static_cast<int64_t>(b) * kSlots + lane * 4 + byte;
      if (ld_relaxed_i64(&t.meta[s].key) == key) {
        found = s;
        break;
      }
    }
    const unsigned fb = tile.ballot(found >= 0);
    if (fb != 0) return tile.shfl(found, __ffs(fb) - 1);
    if (tile.any(__vcmpeq4(w, 0u) != 0)) return -1;
    b = (b + 1) & t.mask;
  }
  return -1;
}

struct Claim {
  int64_t slot;  // -1: table full
  bool fresh;    // claimed (caller writes the slot, then publish()) vs. found
};

__device__ inline Claim probe_insert(const Tile& tile, const DevTable& t, int64_t key, uint64_t h,
                                     int* fail) {
  const uint32_t dw = digest_of(h) * kBytes;
  const int lane = tile.thread_rank();
  uint64_t b = h & t.mask;
  uint64_t advanced = 0;
  while (true) {
    uint32_t* wp = t.digests + b * 8 + lane;
    const uint32_t w = ld_acquire_u32(wp);
    uint32_t m = __vcmpeq4(w, dw);
    int64_t found = -1;
    while (m != 0) {
      const int byte = (__ffs(m) - 1) >> 3;
      m &= ~(0xffu << (8 * byte));
      const int64_t s = static_cast<int64_t>(b) * kSlots + lane * 4 + byte;
      if (ld_relaxed_i64(&t.meta[s].key) == key) {
        found = s;
        break;
      }
    }
    const unsigned fb = tile.ballot(found >= 0);
    if (fb != 0) return Claim{tile.shfl(found, __ffs(fb) - 1), false};
    // A slot being written here may hold our key: wait until it is published.
    if (tile.any(__vcmpeq4(w, kBusyB * kBytes) != 0)) {
      __nanosleep(32);
      continue;
    }
    const uint32_t e = __vcmpeq4(w, 0u);
    const unsigned eb = tile.ballot(e != 0);
    if (eb == 0) {
      if (++advanced > t.mask) {
        if (lane == 0 && fail != nullptr) atomicOr(fail, kFailFull);
        return Claim{-1, false};
      }
      b = (b + 1) & t.mask;
      continue;
    }
    const int leader = __ffs(eb) - 1;
    int64_t claimed = -1;
    if (lane == leader) {
      const int byte = (__ffs(e) - 1) >> 3;
      const uint32_t nw = (w & ~(0xffu << (8 * byte))) | (kBusyB << (8 * byte));
      if (atomicCAS(wp, w, nw) == w) claimed = static_cast<int64_t>(b) * kSlots + lane * 4 + byte;
    }
    claimed = tile.shfl(claimed, leader);
    if (claimed >= 0) return Claim{claimed, true};
  }
}

// Tiered tables (GpuTieredTable): `first` is the other tier, probed before the table a kernel
// inserts into. A key it holds is served there in place (read, counted, updated); it never gets
// a new key, so a key repeated in one call still meets one slot (in the inserting table).
// first.digests == nullptr: no other tier.
struct FirstTier {
  DevTable t;
  int64_t* counts = nullptr;  // optional: [keys served by `first`, keys served by the table]
};

// The slot of `key`: in `first` if it holds the key (*in_first), else found or claimed in `t`.
__device__ inline Claim claim_in_tiers(const Tile& tile, const DevTable& first, const DevTable& t,
                                       int64_t key, uint64_t h, int* fail, bool* in_first) {
  *in_first = false;
  if (first.digests != nullptr) {
    const int64_t s = probe_find<false>(tile, first, key, h);
    if (s >= 0) {
      *in_first = true;
      return Claim{s, false};
    }
  }
  return probe_insert(tile, t, key, h, fail);
}

// Makes a claimed slot visible: everything the tile wrote becomes visible before the digest.
__device__ __forceinline__ void publish(const Tile& tile, const DevTable& t, int64_t slot,
                                        uint64_t h) {
  asm volatile("fence.acq_rel.gpu;" ::: "memory");  // release: this lane's writes before the digest
  tile.sync();
  if (tile.thread_rank() == 0) {
    const int byte = static_cast<int>(slot & 3);
    atomicXor(t.digests + (slot >> 2), (kBusyB ^ digest_of(h)) << (8 * byte));
  }
}

// The row of a slot this tile claimed: in a pooled table lane 0 takes one from the free list.
// With none left (the tier's budget logic keeps that from happening) the slot is given up,
// marked erased before it was ever published, *fail gets kFailPoolEmpty and the result is null.
__device__ inline float* fresh_row(const Tile& tile, const DevTable& t, int64_t slot, int* fail) {
  if (t.row_of == nullptr) return t.rows + slot * t.stride;
  int64_t r = -1;
  if (tile.thread_rank() == 0) {
    PoolHeader* pool = pool_header(t.row_of);
    unsigned long long* count = &pool->count;
    const int64_t i = static_cast<int64_t>(atomicAdd(count, ~0ull)) - 1;  // pop
    if (i >= 0) {
      r = pool->list[i];
      t.row_of[slot] = static_cast<int32_t>(r);
    } else {
      atomicAdd(count, 1ull);
      atomicXor(t.digests + (slot >> 2), (kBusyB ^ kErasedB) << (8 * static_cast<int>(slot & 3)));
      if (fail != nullptr) atomicOr(fail, kFailPoolEmpty);
    }
  }
  r = tile.shfl(r, 0);
  return r < 0 ? nullptr : pool_row(t, r);
}

// A pooled table's row of slot s, just erased by this thread, back to the free list.
__device__ __forceinline__ void give_row(const DevTable& t, int64_t s) {
  if (t.row_of == nullptr) return;
  PoolHeader* pool = pool_header(t.row_of);
  pool->list[atomicAdd(&pool->count, 1ull)] = t.row_of[s];
}

// Row -> output. Outputs are written evict-first (streaming), so they do not push the digests
// and keys out of L2; kStreamLoad reads the row evict-first too (read-only find).
template <bool V4, bool kStreamLoad = false>
__device__ __forceinline__ void copy_row(const Tile& tile, const float* src, float* dst,
                                         int64_t dim) {
  const int lane = tile.thread_rank();
  // Up to 4 loads per lane issued before any store (the compiler may not hoist a load above a
  // store that could alias it, which would serialise the round trips of a wide row).
  if (V4) {
    for (int64_t c0 = 4 * lane; c0 < dim; c0 += 16 * kTile) {
      float4 x[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const int64_t c = c0 + k * 4 * kTile;
        if (c < dim) {
          const float4* sp = reinterpret_cast<const float4*>(src + c);
          x[k] = kStreamLoad ? __ldcs(sp) : __ldcg(sp);
        }
      }
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const int64_t c = c0 + k * 4 * kTile;
        if (c < dim) __stcs(reinterpret_cast<float4*>(dst + c), x[k]);
      }
    }
  } else {
    for (int64_t c0 = lane; c0 < dim; c0 += 4 * kTile) {
      float x[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const int64_t c = c0 + k * kTile;
        if (c < dim) x[k] = kStreamLoad ? __ldcs(src + c) : __ldcg(src + c);
      }
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const int64_t c = c0 + k * kTile;
        if (c < dim) __stcs(dst + c, x[k]);
      }
    }
  }
}

template <bool V4>
__device__ __forceinline__ void fill_row(const Tile& tile, float v, float* dst, int64_t dim) {
  const int lane = tile.thread_rank();
  if (V4) {
    for (int64_t c = 4 * lane; c < dim; c += 4 * kTile)
      *reinterpret_cast<float4*>(dst + c) = make_float4(v, v, v, v);
  } else {
    for (int64_t c = lane; c < dim; c += kTile) dst[c] = v;
  }
}

__device__ __forceinline__ void add_count(int64_t* counter, int local) {
  const int total = __syncthreads_count(local);
  if (threadIdx.x == 0 && total != 0)
    atomicAdd(reinterpret_cast<unsigned long long*>(counter),
              static_cast<unsigned long long>(total));
}

// Adds the block's keys served by each tier to FirstTier::counts (block-uniform `counts`).
__device__ __forceinline__ void count_tiers(int64_t* counts, bool served, bool in_first) {
  if (counts == nullptr) return;
  add_count(counts, served && in_first);
  add_count(counts + 1, served && !in_first);
}

inline int64_t next_pow2(int64_t x) {
  int64_t c = 1;
  while (c < x) c <<= 1;
  return c;
}

// Slots needed so that `keys` stays within the load factor.
inline int64_t capacity_for(int64_t keys, double max_load) {
  const int64_t need =
      static_cast<int64_t>(std::ceil(static_cast<double>(std::max<int64_t>(keys, 1)) / max_load));
  return kSlots * next_pow2(ceil_div(need, kSlots));
}

}  // namespace detail
}  // namespace gpu
}  // namespace sok
