// GpuEmbeddingTable<K>: the CPU EmbeddingTable's semantics in device memory.
//
// Layout: nb (power of two) buckets of 32 slots. Per slot: a digest byte (0 empty, 1 erased,
// 2 being written, 3..255 = 3 + (hash >> 56) % 253), {key, frequency} (16 bytes, so the frequency
// update hits the line the key compare just brought into L2), the version, and the row
// [value(dim) | slots(num_slots x dim)]. A key lives in its home bucket (hash & (nb - 1)) or, when
// that was full at insertion, in one of the following buckets (linear probing over buckets); a
// bucket with an empty slot ends a search. Erased slots stay "erased" (never reused) until the
// next rehash, so concurrent inserts and erases cannot break a probe chain.
//
// Probing is cooperative: 8 threads per key, each loading one 4-byte word of the bucket's 32
// digests (one 32-byte sector per bucket), comparing 4 digests at once (__vcmpeq4), and only the
// candidate slots' keys are read. Inserting claims the FIRST empty slot of the first bucket with
// room by CAS on its digest word (empty -> being written), writes key, frequency, version and row,
// then publishes the digest (fence + atomic xor). A thread that sees a slot being written in the
// bucket it is inserting into waits for it (it may be its own key), so two inserts of one key, in
// one batch or on two streams, always meet on one slot.
#include <cooperative_groups.h>
#include <cuda_runtime.h>
#include <thrust/iterator/counting_iterator.h>

#include <cub/device/device_select.cuh>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "addons/sparse_operation_kit/core/common.h"
#include "addons/sparse_operation_kit/core/cuda/gpu_api.h"
#include "addons/sparse_operation_kit/core/cuda/gpu_common.cuh"
#include "addons/sparse_operation_kit/core/cuda/gpu_internal.h"
#include "addons/sparse_operation_kit/core/initializer.h"
#include "addons/sparse_operation_kit/core/optimizer.h"

namespace sok {
namespace gpu {

using namespace detail;  // NOLINT
namespace cg = cooperative_groups;

namespace {

constexpr int kSlots = 32;  // slots per bucket
constexpr int kTile = 8;    // threads per key: one digest word (4 slots) each
constexpr int kBlock = 256;
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
  float* rows = nullptr;        // nb * 32 * stride
  uint64_t mask = 0;            // nb - 1
  int64_t stride = 0;
  int64_t dim = 0;
};

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

// Initial content of element c of a fresh row (value from initializer.h, slots their init).
__device__ __forceinline__ float fresh_element(const RowInit& ri, int64_t key, int64_t c, int64_t dim) {
  if (c < dim) return initial_value(ri.init, key, c, dim);
  return c < 2 * dim ? ri.slot_init[0] : ri.slot_init[1];  // no run-time index into kernel params
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

__device__ Claim probe_insert(const Tile& tile, const DevTable& t, int64_t key, uint64_t h, int* fail) {
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
        if (lane == 0 && fail != nullptr) atomicOr(fail, 1);
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

// Makes a claimed slot visible: everything the tile wrote becomes visible before the digest.
__device__ __forceinline__ void publish(const Tile& tile, const DevTable& t, int64_t slot, uint64_t h) {
  asm volatile("fence.acq_rel.gpu;" ::: "memory");  // release: this lane's writes before the digest
  tile.sync();
  if (tile.thread_rank() == 0) {
    const int byte = static_cast<int>(slot & 3);
    atomicXor(t.digests + (slot >> 2), (kBusyB ^ digest_of(h)) << (8 * byte));
  }
}

// Row -> output. Outputs are written evict-first (streaming), so they do not push the digests
// and keys out of L2; kStreamLoad reads the row evict-first too (read-only find).
template <bool V4, bool kStreamLoad = false>
__device__ __forceinline__ void copy_row(const Tile& tile, const float* src, float* dst, int64_t dim) {
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
    atomicAdd(reinterpret_cast<unsigned long long*>(counter), static_cast<unsigned long long>(total));
}

// ------------------------------------------------------------------------------------------------

// MINB 8 caps the registers at 32 for 64 resident warps per SM (more lookups in flight).
template <typename K, bool V4, int MINB>
__global__ void __launch_bounds__(kBlock, MINB) k_find(DevTable t, RowInit ri, const K* keys, int64_t n,
                                                 const int64_t* d_n, float* out) {
  const Tile tile = cg::tiled_partition<kTile>(cg::this_thread_block());
  const int64_t i = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / kTile;
  if (i >= effective_n(n, d_n)) return;
  const int64_t key = static_cast<int64_t>(keys[i]);
  const uint64_t h = hash_key(key);
  const int64_t s = probe_find<false>(tile, t, key, h);
  float* o = out + i * t.dim;
  if (s >= 0 && (ri.filter_freq <= 0 || ld_relaxed_i64(&t.meta[s].freq) >= ri.filter_freq)) {
    copy_row<V4, true>(tile, t.rows + s * t.stride, o, t.dim);
  } else if (ri.filter_freq > 0) {
    fill_row<V4>(tile, ri.no_perm, o, t.dim);
  } else {
    for (int64_t c = tile.thread_rank(); c < t.dim; c += kTile) o[c] = initial_value(ri.init, key, c, t.dim);
  }
}

template <typename K, bool V4>
__global__ void __launch_bounds__(kBlock) k_find_or_insert(DevTable t, RowInit ri, const K* keys,
                                                           int64_t n, const int64_t* d_n, float* out,
                                                           const int64_t* counts, int64_t* counters,
                                                           int* fail) {
  const Tile tile = cg::tiled_partition<kTile>(cg::this_thread_block());
  const int64_t i = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / kTile;
  const int lane = tile.thread_rank();
  int inserted = 0;
  if (i < effective_n(n, d_n)) {
    const int64_t key = static_cast<int64_t>(keys[i]);
    const uint64_t h = hash_key(key);
    const int64_t cnt = counts ? counts[i] : 1;
    const Claim r = probe_insert(tile, t, key, h, fail);
    float* o = out ? out + i * t.dim : nullptr;
    if (r.slot < 0) {
      if (o) fill_row<V4>(tile, 0.f, o, t.dim);
    } else if (r.fresh) {
      if (lane == 0) {
        t.meta[r.slot].key = key;
        t.meta[r.slot].freq = cnt;
      }
      const bool admitted = ri.filter_freq <= 0 || cnt >= ri.filter_freq;
      float* row = t.rows + r.slot * t.stride;
      for (int64_t c = lane; c < t.stride; c += kTile) {
        const float v = fresh_element(ri, key, c, t.dim);
        row[c] = v;
        if (o && c < t.dim) o[c] = admitted ? v : ri.no_perm;
      }
      publish(tile, t, r.slot, h);
      inserted = lane == 0;
    } else {
      unsigned long long* fp = reinterpret_cast<unsigned long long*>(&t.meta[r.slot].freq);
      bool admitted = true;
      if (ri.filter_freq > 0) {  // the new frequency decides what is read
        int64_t f = 0;
        if (lane == 0) f = static_cast<int64_t>(atomicAdd(fp, static_cast<unsigned long long>(cnt))) + cnt;
        admitted = tile.shfl(f, 0) >= ri.filter_freq;
      } else if (lane == 0) {
        atomicAdd(fp, static_cast<unsigned long long>(cnt));  // result unused: no round trip
      }
      if (o) {
        if (!admitted) fill_row<V4>(tile, ri.no_perm, o, t.dim);
        else copy_row<V4>(tile, t.rows + r.slot * t.stride, o, t.dim);
      }
    }
  }
  add_count(counters, inserted);
}

template <typename K>
__global__ void __launch_bounds__(kBlock) k_insert_or_assign(DevTable t, RowInit ri, const K* keys,
                                                             int64_t n, const float* values,
                                                             int64_t* counters, int* fail) {
  const Tile tile = cg::tiled_partition<kTile>(cg::this_thread_block());
  const int64_t i = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / kTile;
  const int lane = tile.thread_rank();
  int inserted = 0;
  if (i < n) {
    const int64_t key = static_cast<int64_t>(keys[i]);
    const uint64_t h = hash_key(key);
    const Claim r = probe_insert(tile, t, key, h, fail);
    const float* v = values + i * t.dim;
    if (r.slot >= 0) {
      float* row = t.rows + r.slot * t.stride;
      if (r.fresh) {
        if (lane == 0) {
          t.meta[r.slot].key = key;
          t.meta[r.slot].freq = 0;
        }
        for (int64_t c = lane; c < t.stride; c += kTile)
          row[c] = c < t.dim ? v[c] : (c < 2 * t.dim ? ri.slot_init[0] : ri.slot_init[1]);
        publish(tile, t, r.slot, h);
        inserted = lane == 0;
      } else {
        for (int64_t c = lane; c < t.dim; c += kTile) __stcg(row + c, v[c]);
      }
    }
  }
  add_count(counters, inserted);
}

// One optimizer step per (unique) key; apply_element from optimizer.h on a one-element view
// of the row (dim 1, column 0), so the math is the CPU's, element by element.
// NC > 0: float4 columns, NC chunks of 32 columns loaded before the math (more bytes in flight,
// more registers); NC == 0: scalar columns (dim % 4 != 0).
template <typename K, int NC>
__global__ void __launch_bounds__(kBlock) k_apply(DevTable t, RowInit ri, const K* keys, int64_t n,
                                                  const int64_t* d_n, const float* grads,
                                                  OptimizerParams p, float alpha, int64_t step,
                                                  int64_t* counters, int* fail) {
  const Tile tile = cg::tiled_partition<kTile>(cg::this_thread_block());
  const int64_t i = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / kTile;
  const int lane = tile.thread_rank();
  int inserted = 0;
  if (i < effective_n(n, d_n)) {
    const int64_t key = static_cast<int64_t>(keys[i]);
    const uint64_t h = hash_key(key);
    const Claim r = probe_insert(tile, t, key, h, fail);
    if (r.slot >= 0) {
      float* row = t.rows + r.slot * t.stride;
      int64_t freq = 0;
      if (r.fresh) {
        if (lane == 0) {
          t.meta[r.slot].key = key;
          t.meta[r.slot].freq = 0;
        }
        for (int64_t c = lane; c < t.stride; c += kTile) row[c] = fresh_element(ri, key, c, t.dim);
        publish(tile, t, r.slot, h);
        inserted = lane == 0;
      } else {
        freq = ld_relaxed_i64(&t.meta[r.slot].freq);
      }
      if (ri.filter_freq <= 0 || freq >= ri.filter_freq) {
        const int64_t dim = t.dim;
        const float* g = grads + i * dim;
        const int ns = ri.num_slots;
        if (NC > 0) {
          constexpr int C = NC > 0 ? NC : 1;
          // Loads of C column chunks first, then the math (optimizer.h), then the stores.
          for (int64_t c0 = 4 * lane; c0 < dim; c0 += 4 * kTile * C) {
            float4 v[C], s0[C], s1[C], gg[C];
#pragma unroll
            for (int k = 0; k < C; ++k) {
              const int64_t c = c0 + k * 4 * kTile;
              s0[k] = s1[k] = make_float4(0.f, 0.f, 0.f, 0.f);
              if (c < dim) {
                v[k] = __ldcg(reinterpret_cast<const float4*>(row + c));
                if (ns > 0) s0[k] = __ldcg(reinterpret_cast<const float4*>(row + dim + c));
                if (ns > 1) s1[k] = __ldcg(reinterpret_cast<const float4*>(row + 2 * dim + c));
                gg[k] = __ldg(reinterpret_cast<const float4*>(g + c));
              }
            }
#pragma unroll
            for (int k = 0; k < C; ++k) {
              const int64_t c = c0 + k * 4 * kTile;
              if (c >= dim) continue;
              float* vp = &v[k].x;
              float* s0p = &s0[k].x;
              float* s1p = &s1[k].x;
              const float* gp = &gg[k].x;
#pragma unroll
              for (int q = 0; q < 4; ++q) {
                float sl[2] = {s0p[q], s1p[q]};
                apply_element(p, alpha, vp + q, sl, 1, 0, gp[q]);
                s0p[q] = sl[0];
                s1p[q] = sl[1];
              }
            }
#pragma unroll
            for (int k = 0; k < C; ++k) {
              const int64_t c = c0 + k * 4 * kTile;
              if (c >= dim) continue;
              *reinterpret_cast<float4*>(row + c) = v[k];
              if (ns > 0) *reinterpret_cast<float4*>(row + dim + c) = s0[k];
              if (ns > 1) *reinterpret_cast<float4*>(row + 2 * dim + c) = s1[k];
            }
          }
        } else {
          for (int64_t c = lane; c < dim; c += kTile) {
            float v = __ldcg(row + c);
            float sl[2] = {ns > 0 ? __ldcg(row + dim + c) : 0.f, ns > 1 ? __ldcg(row + 2 * dim + c) : 0.f};
            apply_element(p, alpha, &v, sl, 1, 0, g[c]);
            row[c] = v;
            if (ns > 0) row[dim + c] = sl[0];
            if (ns > 1) row[2 * dim + c] = sl[1];
          }
        }
        if (lane == 0) t.versions[r.slot] = step;
      }
    }
  }
  add_count(counters, inserted);
}

template <typename K>
__global__ void __launch_bounds__(kBlock) k_erase(DevTable t, const K* keys, int64_t n,
                                                  int64_t* counters, int64_t* erased_out) {
  const Tile tile = cg::tiled_partition<kTile>(cg::this_thread_block());
  const int64_t i = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / kTile;
  int erased = 0;
  if (i < n) {
    const int64_t key = static_cast<int64_t>(keys[i]);
    const uint64_t h = hash_key(key);
    const int64_t s = probe_find<true>(tile, t, key, h);
    if (s >= 0 && tile.thread_rank() == 0) {
      uint32_t* wp = t.digests + (s >> 2);
      const int sh = 8 * static_cast<int>(s & 3);
      const uint32_t d = digest_of(h);
      uint32_t w = ld_relaxed_u32(wp);
      while (((w >> sh) & 0xffu) == d) {
        const uint32_t nw = (w & ~(0xffu << sh)) | (kErasedB << sh);
        const uint32_t old = atomicCAS(wp, w, nw);
        if (old == w) {
          erased = 1;
          break;
        }
        w = old;
      }
    }
  }
  const int total = __syncthreads_count(erased);
  if (threadIdx.x == 0 && total != 0) {
    atomicAdd(reinterpret_cast<unsigned long long*>(&counters[0]), static_cast<unsigned long long>(-total));
    atomicAdd(reinterpret_cast<unsigned long long*>(&counters[1]), static_cast<unsigned long long>(total));
    atomicAdd(reinterpret_cast<unsigned long long*>(erased_out), static_cast<unsigned long long>(total));
  }
}

// Moves every live slot of `o` into `t` (same stride).
__global__ void __launch_bounds__(kBlock) k_rehash(DevTable o, DevTable t, int64_t old_slots, int* fail) {
  const Tile tile = cg::tiled_partition<kTile>(cg::this_thread_block());
  const int64_t s = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / kTile;
  if (s >= old_slots) return;
  const uint32_t w = o.digests[s >> 2];
  if (((w >> (8 * (s & 3))) & 0xffu) < 3u) return;
  const int64_t key = o.meta[s].key;
  const uint64_t h = hash_key(key);
  const Claim r = probe_insert(tile, t, key, h, fail);
  if (r.slot < 0) return;
  const int lane = tile.thread_rank();
  if (lane == 0) {
    t.meta[r.slot] = o.meta[s];
    t.versions[r.slot] = o.versions[s];
  }
  const float* src = o.rows + s * o.stride;
  float* dst = t.rows + r.slot * t.stride;
  for (int64_t c = lane; c < t.stride; c += kTile) dst[c] = src[c];
  if (r.fresh) publish(tile, t, r.slot, h);
}

// [value | old slots] -> [value | new slots at their initial value], every slot position.
__global__ void k_relayout(const float* old_rows, int64_t old_stride, float* rows, int64_t stride,
                           int64_t dim, RowInit ri, int64_t slots) {
  const int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t s = t / kTile;
  const int l = static_cast<int>(t % kTile);
  if (s >= slots) return;
  for (int64_t c = l; c < stride; c += kTile)
    rows[s * stride + c] = c < dim ? old_rows[s * old_stride + c] : (c < 2 * dim ? ri.slot_init[0] : ri.slot_init[1]);
}

struct IsLive {
  const uint32_t* digests;
  __device__ bool operator()(int64_t s) const { return ((digests[s >> 2] >> (8 * (s & 3))) & 0xffu) >= 3u; }
};

template <typename K>
__global__ void k_export(DevTable t, const int64_t* slots, const int64_t* d_n, int ns, K* keys,
                         float* values, float* slot_vals, int64_t* freqs, int64_t* versions) {
  const int64_t x = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t j = x / kTile;
  const int l = static_cast<int>(x % kTile);
  if (j >= *d_n) return;
  const int64_t s = slots[j];
  if (l == 0) {
    keys[j] = static_cast<K>(t.meta[s].key);
    freqs[j] = t.meta[s].freq;
    versions[j] = t.versions[s];
  }
  const float* row = t.rows + s * t.stride;
  for (int64_t c = l; c < t.dim; c += kTile) values[j * t.dim + c] = row[c];
  for (int64_t c = l; c < ns * t.dim; c += kTile) slot_vals[j * ns * t.dim + c] = row[t.dim + c];
}

template <typename K>
__global__ void __launch_bounds__(kBlock) k_import(DevTable t, const K* keys, const float* values,
                                                   const float* slot_vals, const int64_t* freqs,
                                                   const int64_t* versions, int ns, int64_t n,
                                                   int64_t* counters, int* dup, int* fail) {
  const Tile tile = cg::tiled_partition<kTile>(cg::this_thread_block());
  const int64_t i = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / kTile;
  const int lane = tile.thread_rank();
  int inserted = 0;
  if (i < n) {
    const int64_t key = static_cast<int64_t>(keys[i]);
    const uint64_t h = hash_key(key);
    const Claim r = probe_insert(tile, t, key, h, fail);
    if (r.slot >= 0 && !r.fresh) {
      if (lane == 0) atomicOr(dup, 1);
    } else if (r.slot >= 0) {
      if (lane == 0) {
        t.meta[r.slot].key = key;
        t.meta[r.slot].freq = freqs[i];
        t.versions[r.slot] = versions[i];
      }
      float* row = t.rows + r.slot * t.stride;
      for (int64_t c = lane; c < t.dim; c += kTile) row[c] = values[i * t.dim + c];
      for (int64_t c = lane; c < ns * t.dim; c += kTile) row[t.dim + c] = slot_vals[i * ns * t.dim + c];
      publish(tile, t, r.slot, h);
      inserted = lane == 0;
    }
  }
  add_count(counters, inserted);
}

int64_t next_pow2(int64_t x) {
  int64_t c = 1;
  while (c < x) c <<= 1;
  return c;
}

// Slots needed so that `keys` stays within the load factor.
int64_t capacity_for(int64_t keys, double max_load) {
  const int64_t need = static_cast<int64_t>(std::ceil(static_cast<double>(std::max<int64_t>(keys, 1)) / max_load));
  return kSlots * next_pow2(ceil_div(need, kSlots));
}

// Sets the current device for a scope, restoring the previous one.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    cudaGetDevice(&prev_);
    if (prev_ != device) cudaSetDevice(device);
    restore_ = prev_ != device;
  }
  ~DeviceGuard() {
    if (restore_) cudaSetDevice(prev_);
  }

 private:
  int prev_ = 0;
  bool restore_ = false;
};

}  // namespace

// ------------------------------------------------------------------------------------------------

template <typename K>
struct GpuEmbeddingTable<K>::Impl {
  TableConfig cfg;
  GpuTableOptions opt;
  DeviceAllocator* alloc = nullptr;    // temporaries
  DeviceAllocator* storage = nullptr;  // the arrays below
  int device = 0;
  DevTable t;
  int64_t capacity = 0;
  float* d_matrix = nullptr;
  int64_t* d_counters = nullptr;  // [0] live keys, [1] erased slots
  int* d_fail = nullptr;
  int64_t* h_counters = nullptr;  // pinned
  int num_slots = 0;
  int slot_kind = -1;
  std::vector<float> slot_init;
  int64_t upper = 0;  // upper bound of live + erased
  cudaStream_t last_stream = nullptr;
  bool used = false, mixed = false;
  std::mutex mu;

  ~Impl() {
    if (storage == nullptr) return;
    cudaDeviceSynchronize();  // no kernel still reads the arrays given back
    free_arrays(&t);
    release(d_matrix);
    release(d_counters);
    release(d_fail);
    if (h_counters) cudaFreeHost(h_counters);
    cudaGetLastError();
  }

  // Storage of `bytes` from the storage allocator; an error names the table, the size asked and
  // the memory free.
  template <typename T>
  Status acquire(T** p, size_t bytes, const char* what) {
    *p = static_cast<T*>(storage->allocate(bytes < 16 ? 16 : bytes, nullptr));
    if (*p != nullptr) return Status::OK();
    cudaGetLastError();
    return Status::Invalid("table '" + cfg.name + "': cannot allocate " + std::to_string(bytes) + " bytes for " +
                           what + " on GPU " + std::to_string(device) + " (" + storage->describe_free_memory() + ")");
  }
  template <typename T>
  void release(T*& p) {
    if (p != nullptr) storage->deallocate(p, 0, nullptr);
    p = nullptr;
  }

  RowInit row_init() const {
    RowInit ri;
    ri.init = cfg.init;
    ri.init.matrix = d_matrix;
    ri.num_slots = num_slots;
    ri.slot_init[0] = num_slots > 0 ? slot_init[0] : 0.f;
    ri.slot_init[1] = num_slots > 1 ? slot_init[1] : 0.f;
    ri.filter_freq = cfg.filter_freq;
    ri.no_perm = cfg.default_value_no_permission;
    return ri;
  }

  void free_arrays(DevTable* a) {
    release(a->digests);
    release(a->meta);
    release(a->versions);
    release(a->rows);
    *a = DevTable();
  }

  Status alloc_arrays(int64_t cap, int64_t stride, DevTable* a, cudaStream_t s) {
    *a = DevTable();
    const int64_t nb = cap / kSlots;
    a->mask = static_cast<uint64_t>(nb - 1);
    a->stride = stride;
    a->dim = cfg.dim;
    const std::string what = std::to_string(cap) + " slots of " + std::to_string(stride) + " floats";
    Status st = acquire(&a->digests, nb * 8 * sizeof(uint32_t), what.c_str());
    if (st.ok()) st = acquire(&a->meta, cap * sizeof(Meta), what.c_str());
    if (st.ok()) st = acquire(&a->versions, cap * sizeof(int64_t), what.c_str());
    if (st.ok()) st = acquire(&a->rows, static_cast<size_t>(cap) * stride * sizeof(float), what.c_str());
    if (!st.ok()) {
      free_arrays(a);
      return st;
    }
    SOK_CUDA_RETURN(cudaMemsetAsync(a->digests, 0, nb * 8 * sizeof(uint32_t), s));
    // Versions start at 0 for every slot (slots are never reused before a rehash), so inserting
    // a key needs no extra random write for it.
    SOK_CUDA_RETURN(cudaMemsetAsync(a->versions, 0, cap * sizeof(int64_t), s));
    return Status::OK();
  }

  void note_stream(cudaStream_t s) {
    if (used && s != last_stream) mixed = true;
    used = true;
    last_stream = s;
  }

  // Waits for every launch that may touch the counters, then reads them.
  Status sync_counts(cudaStream_t s, int64_t* live, int64_t* erased) {
    if (mixed) {
      SOK_CUDA_RETURN(cudaDeviceSynchronize());
      mixed = false;
    }
    SOK_CUDA_RETURN(cudaMemcpyAsync(h_counters, d_counters, 2 * sizeof(int64_t), cudaMemcpyDeviceToHost, s));
    int h_fail = 0;
    SOK_CUDA_RETURN(cudaMemcpyAsync(&h_counters[2], d_fail, sizeof(int), cudaMemcpyDeviceToHost, s));
    SOK_CUDA_RETURN(cudaStreamSynchronize(s));
    std::memcpy(&h_fail, &h_counters[2], sizeof(int));
    if (h_fail != 0) return Status::Invalid("table '" + cfg.name + "': GPU hash table overflowed");
    *live = h_counters[0];
    *erased = h_counters[1];
    return Status::OK();
  }

  Status rehash(int64_t new_cap, cudaStream_t s) {
    SOK_CUDA_RETURN(cudaDeviceSynchronize());
    mixed = false;
    DevTable nt;
    SOK_RETURN_IF_ERROR(alloc_arrays(new_cap, t.stride, &nt, s));
    if (capacity > 0) {
      k_rehash<<<grid_for(capacity * kTile, kBlock), kBlock, 0, s>>>(t, nt, capacity, d_fail);
      SOK_LAUNCH_CHECK();
    }
    SOK_CUDA_RETURN(cudaMemsetAsync(d_counters + 1, 0, sizeof(int64_t), s));
    SOK_CUDA_RETURN(cudaStreamSynchronize(s));
    free_arrays(&t);
    t = nt;
    capacity = new_cap;
    return Status::OK();
  }

  // Makes sure n more keys fit under the load factor, growing if needed.
  Status prepare_insert(int64_t n, cudaStream_t s) {
    note_stream(s);
    const int64_t limit = static_cast<int64_t>(opt.max_load_factor * static_cast<double>(capacity));
    if (upper + n <= limit) {
      upper += n;
      return Status::OK();
    }
    int64_t live = 0, erased = 0;
    SOK_RETURN_IF_ERROR(sync_counts(s, &live, &erased));
    upper = live + erased;
    if (upper + n > limit) {
      int64_t cap = capacity;
      while (static_cast<double>(live + n) > opt.max_load_factor * static_cast<double>(cap)) cap *= 2;
      SOK_RETURN_IF_ERROR(rehash(cap, s));
      upper = live;
    }
    upper += n;
    return Status::OK();
  }

  Status ensure_slots(const OptimizerParams& p, cudaStream_t s) {
    SlotPlan plan;
    std::string error;
    if (!plan_slots(cfg.name, slot_kind, num_slots, p.kind, &plan, &error)) return Status::Invalid(error);
    const int want = sok::num_slots(p.kind);
    const int kind = static_cast<int>(p.kind);
    if (plan != SlotPlan::kRelayout) {
      slot_kind = kind;
      return Status::OK();
    }
    std::vector<float> init(want);
    for (int i = 0; i < want; ++i) init[i] = slot_initial_value(p, i);
    if (want > 0) {
      SOK_CUDA_RETURN(cudaDeviceSynchronize());
      mixed = false;
      const int64_t stride = cfg.dim * (1 + want);
      float* rows = nullptr;
      SOK_RETURN_IF_ERROR(acquire(&rows, static_cast<size_t>(capacity) * stride * sizeof(float), "optimizer slots"));
      num_slots = want;
      slot_init = init;
      k_relayout<<<grid_for(capacity * kTile, kBlock), kBlock, 0, s>>>(t.rows, t.stride, rows, stride,
                                                                       cfg.dim, row_init(), capacity);
      SOK_LAUNCH_CHECK();
      SOK_CUDA_RETURN(cudaStreamSynchronize(s));
      release(t.rows);
      t.rows = rows;
      t.stride = stride;
    }
    num_slots = want;
    slot_kind = kind;
    slot_init = init;
    return Status::OK();
  }
};

template <typename K>
GpuEmbeddingTable<K>::GpuEmbeddingTable() : impl_(new Impl) {}

template <typename K>
GpuEmbeddingTable<K>::~GpuEmbeddingTable() {
  if (impl_) {
    DeviceGuard g(impl_->device);
    impl_.reset();
  }
}

template <typename K>
Status GpuEmbeddingTable<K>::Create(const TableConfig& config, const GpuTableOptions& options,
                                    std::unique_ptr<GpuEmbeddingTable>* out) {
  if (config.dim <= 0) return Status::Invalid("table '" + config.name + "': dim must be positive");
  if (!(options.max_load_factor > 0.0 && options.max_load_factor <= 0.98))
    return Status::Invalid("table '" + config.name + "': max_load_factor must be in (0, 0.98]");
  std::unique_ptr<GpuEmbeddingTable> tab(new GpuEmbeddingTable());
  Impl& m = *tab->impl_;
  m.cfg = config;
  m.opt = options;
  m.alloc = options.allocator ? options.allocator : default_allocator();
  m.storage = options.storage ? options.storage : default_storage_allocator();
  SOK_CUDA_RETURN(cudaGetDevice(&m.device));
  if (config.init.kind == InitKind::kMatrix) {
    const size_t count = static_cast<size_t>(config.init.default_value_dim) * config.dim;
    if (config.init.default_value_dim <= 0 || config.init_matrix.size() != count)
      return Status::Invalid("table '" + config.name + "': the initializer matrix must hold default_value_dim x dim values");
    SOK_RETURN_IF_ERROR(m.acquire(&m.d_matrix, count * sizeof(float), "the initializer matrix"));
    SOK_CUDA_RETURN(cudaMemcpy(m.d_matrix, config.init_matrix.data(), count * sizeof(float), cudaMemcpyHostToDevice));
  }
  SOK_RETURN_IF_ERROR(m.acquire(&m.d_counters, 2 * sizeof(int64_t), "counters"));
  SOK_RETURN_IF_ERROR(m.acquire(&m.d_fail, sizeof(int), "counters"));
  SOK_CUDA_RETURN(cudaMallocHost(&m.h_counters, 4 * sizeof(int64_t)));
  SOK_CUDA_RETURN(cudaMemset(m.d_counters, 0, 2 * sizeof(int64_t)));
  SOK_CUDA_RETURN(cudaMemset(m.d_fail, 0, sizeof(int)));
  const int64_t cap = capacity_for(std::max<int64_t>(config.initial_capacity, 1), options.max_load_factor);
  SOK_RETURN_IF_ERROR(m.alloc_arrays(cap, config.dim, &m.t, nullptr));
  m.capacity = cap;
  SOK_CUDA_RETURN(cudaDeviceSynchronize());
  *out = std::move(tab);
  return Status::OK();
}

template <typename K>
const TableConfig& GpuEmbeddingTable<K>::config() const { return impl_->cfg; }
template <typename K>
int64_t GpuEmbeddingTable<K>::dim() const { return impl_->cfg.dim; }
template <typename K>
int GpuEmbeddingTable<K>::num_slots() const { return impl_->num_slots; }
template <typename K>
int64_t GpuEmbeddingTable<K>::capacity() const { return impl_->capacity; }

template <typename K>
Status GpuEmbeddingTable<K>::size(int64_t* out, cudaStream_t stream) {
  Impl& m = *impl_;
  DeviceGuard g(m.device);
  std::lock_guard<std::mutex> l(m.mu);
  m.note_stream(stream);
  int64_t live = 0, erased = 0;
  SOK_RETURN_IF_ERROR(m.sync_counts(stream, &live, &erased));
  m.upper = live + erased;
  *out = live;
  return Status::OK();
}

template <typename K>
Status GpuEmbeddingTable<K>::find(const K* keys, int64_t n, float* out, cudaStream_t stream,
                                  const int64_t* d_n) {
  if (n <= 0) return Status::OK();
  Impl& m = *impl_;
  DeviceGuard g(m.device);
  std::lock_guard<std::mutex> l(m.mu);
  m.note_stream(stream);
  const bool v4 = m.cfg.dim % 4 == 0 && reinterpret_cast<uintptr_t>(out) % 16 == 0;
  const int grid = grid_for(n * kTile, kBlock);
  const bool many = tuning().find_min_blocks != 1;  // default: 64 warps per SM (measured faster)
  if (v4 && many) k_find<K, true, 8><<<grid, kBlock, 0, stream>>>(m.t, m.row_init(), keys, n, d_n, out);
  else if (v4) k_find<K, true, 1><<<grid, kBlock, 0, stream>>>(m.t, m.row_init(), keys, n, d_n, out);
  else k_find<K, false, 1><<<grid, kBlock, 0, stream>>>(m.t, m.row_init(), keys, n, d_n, out);
  SOK_LAUNCH_CHECK();
  return Status::OK();
}

template <typename K>
Status GpuEmbeddingTable<K>::find_or_insert(const K* keys, int64_t n, float* out, const int64_t* counts,
                                            cudaStream_t stream, const int64_t* d_n) {
  if (n <= 0) return Status::OK();
  Impl& m = *impl_;
  DeviceGuard g(m.device);
  std::lock_guard<std::mutex> l(m.mu);
  SOK_RETURN_IF_ERROR(m.prepare_insert(n, stream));
  const bool v4 = m.cfg.dim % 4 == 0 && reinterpret_cast<uintptr_t>(out) % 16 == 0;
  const int grid = grid_for(n * kTile, kBlock);
  if (v4)
    k_find_or_insert<K, true><<<grid, kBlock, 0, stream>>>(m.t, m.row_init(), keys, n, d_n, out, counts,
                                                           m.d_counters, m.d_fail);
  else
    k_find_or_insert<K, false><<<grid, kBlock, 0, stream>>>(m.t, m.row_init(), keys, n, d_n, out, counts,
                                                            m.d_counters, m.d_fail);
  SOK_LAUNCH_CHECK();
  return Status::OK();
}

template <typename K>
Status GpuEmbeddingTable<K>::insert_or_assign(const K* keys, int64_t n, const float* values,
                                              cudaStream_t stream) {
  if (n <= 0) return Status::OK();
  Impl& m = *impl_;
  DeviceGuard g(m.device);
  std::lock_guard<std::mutex> l(m.mu);
  SOK_RETURN_IF_ERROR(m.prepare_insert(n, stream));
  k_insert_or_assign<K><<<grid_for(n * kTile, kBlock), kBlock, 0, stream>>>(m.t, m.row_init(), keys, n,
                                                                           values, m.d_counters, m.d_fail);
  SOK_LAUNCH_CHECK();
  return Status::OK();
}

template <typename K>
Status GpuEmbeddingTable<K>::erase(const K* keys, int64_t n, cudaStream_t stream, int64_t* num_erased) {
  if (num_erased) *num_erased = 0;
  if (n <= 0) return Status::OK();
  Impl& m = *impl_;
  DeviceGuard g(m.device);
  std::lock_guard<std::mutex> l(m.mu);
  m.note_stream(stream);
  Temp cnt;
  SOK_RETURN_IF_ERROR(cnt.alloc(m.alloc, sizeof(int64_t), stream));
  SOK_CUDA_RETURN(cudaMemsetAsync(cnt.as<int64_t>(), 0, sizeof(int64_t), stream));
  k_erase<K><<<grid_for(n * kTile, kBlock), kBlock, 0, stream>>>(m.t, keys, n, m.d_counters, cnt.as<int64_t>());
  SOK_LAUNCH_CHECK();
  if (num_erased) {
    SOK_CUDA_RETURN(cudaMemcpyAsync(num_erased, cnt.as<int64_t>(), sizeof(int64_t), cudaMemcpyDeviceToHost, stream));
    SOK_CUDA_RETURN(cudaStreamSynchronize(stream));
  }
  return Status::OK();
}

// Victims are chosen on the host from an export (shrinking is rare: checkpoint time) by the one
// eviction rule, then erased on the device.
template <typename K>
Status GpuEmbeddingTable<K>::shrink(int64_t global_step, cudaStream_t stream, int64_t* removed) {
  *removed = 0;
  if (!evicts_anything(impl_->cfg)) return Status::OK();
  TableSnapshot<K> s;
  SOK_RETURN_IF_ERROR(export_rows(&s, stream));
  std::vector<K> victims;
  for (size_t row = 0; row < s.keys.size(); ++row) {
    if (should_evict(impl_->cfg, global_step, s.versions[row], s.values.data() + row * s.dim)) {
      victims.push_back(s.keys[row]);
    }
  }
  if (victims.empty()) return Status::OK();
  DeviceGuard g(impl_->device);
  Temp d_victims;
  const size_t bytes = victims.size() * sizeof(K);
  SOK_RETURN_IF_ERROR(d_victims.alloc(impl_->alloc, bytes, stream));
  SOK_CUDA_RETURN(cudaMemcpyAsync(d_victims.as<K>(), victims.data(), bytes, cudaMemcpyHostToDevice, stream));
  // erase() with a count synchronises the stream, so `victims` outlives the copy.
  return erase(d_victims.as<K>(), static_cast<int64_t>(victims.size()), stream, removed);
}

template <typename K>
Status GpuEmbeddingTable<K>::apply_gradients(const K* keys, int64_t n, const float* grads,
                                             const OptimizerParams& p, int64_t global_step,
                                             cudaStream_t stream, bool keys_unique, const int64_t* d_n) {
  Impl& m = *impl_;
  DeviceGuard g(m.device);
  std::lock_guard<std::mutex> l(m.mu);
  m.note_stream(stream);
  SOK_RETURN_IF_ERROR(m.ensure_slots(p, stream));
  if (n <= 0) return Status::OK();
  const int64_t dim = m.cfg.dim;
  const K* ukeys = keys;
  const float* ugrads = grads;
  const int64_t* un = d_n;
  Temp tmp;
  if (!keys_unique) {
    auto al = [](size_t b) { return (b + 255) & ~size_t(255); };
    const size_t kb = n * sizeof(K), ib = n * sizeof(int32_t), gb = static_cast<size_t>(n) * dim * sizeof(float);
    SOK_RETURN_IF_ERROR(tmp.alloc(m.alloc, al(kb) + al(ib) + al(gb) + al(sizeof(int64_t)), stream));
    char* base = tmp.as<char>();
    K* uniq = reinterpret_cast<K*>(base);
    int32_t* inverse = reinterpret_cast<int32_t*>(base + al(kb));
    float* summed = reinterpret_cast<float*>(base + al(kb) + al(ib));
    int64_t* num = reinterpret_cast<int64_t*>(base + al(kb) + al(ib) + al(gb));
    if (d_n != nullptr)
      return Status::Invalid("apply_gradients: a device count needs keys_unique (run unique_keys first)");
    SOK_RETURN_IF_ERROR(unique_keys<K>(keys, n, uniq, inverse, nullptr, num, stream, m.alloc));
    SOK_RETURN_IF_ERROR(sum_rows_by_group(grads, dim, inverse, nullptr, 0, nullptr, nullptr, n, n, num,
                                          summed, stream, m.alloc));
    ukeys = uniq;
    ugrads = summed;
    un = num;
  }
  SOK_RETURN_IF_ERROR(m.prepare_insert(n, stream));
  const float alpha = p.kind == OptimizerKind::kAdam ? adam_step_size(p) : 0.f;
  const bool v4 = dim % 4 == 0 && reinterpret_cast<uintptr_t>(ugrads) % 16 == 0;
  const int grid = grid_for(n * kTile, kBlock);
  int nc = 0;
  if (v4) {
    nc = tuning().apply_chunks;
    if (nc != 1 && nc != 2 && nc != 4) nc = dim <= 32 ? 1 : 2;  // measured best on H200
  }
#define SOK_APPLY(NC)                                                                                \
  k_apply<K, NC><<<grid, kBlock, 0, stream>>>(m.t, m.row_init(), ukeys, n, un, ugrads, p, alpha, \
                                              global_step, m.d_counters, m.d_fail)
  if (nc == 1) SOK_APPLY(1);
  else if (nc == 2) SOK_APPLY(2);
  else if (nc == 4) SOK_APPLY(4);
  else SOK_APPLY(0);
#undef SOK_APPLY
  SOK_LAUNCH_CHECK();
  return Status::OK();
}

template <typename K>
Status GpuEmbeddingTable<K>::export_rows(TableSnapshot<K>* out, cudaStream_t stream) {
  Impl& m = *impl_;
  DeviceGuard g(m.device);
  std::lock_guard<std::mutex> l(m.mu);
  m.note_stream(stream);
  int64_t live = 0, erased = 0;
  SOK_RETURN_IF_ERROR(m.sync_counts(stream, &live, &erased));
  m.upper = live + erased;
  const int64_t d = m.cfg.dim;
  const int ns = m.num_slots;
  auto al = [](size_t b) { return (b + 255) & ~size_t(255); };
  size_t sel_bytes = 0;
  thrust::counting_iterator<int64_t> it(0);
  IsLive pred{m.t.digests};
  SOK_CUDA_RETURN(cub::DeviceSelect::If(nullptr, sel_bytes, it, static_cast<int64_t*>(nullptr),
                                        static_cast<int64_t*>(nullptr), m.capacity, pred, stream));
  const int64_t nl = std::max<int64_t>(live, 1);
  const size_t slot_b = m.capacity * sizeof(int64_t);
  const size_t kb = nl * sizeof(K), vb = nl * d * sizeof(float), sb = nl * ns * d * sizeof(float) + 4,
               fb = nl * sizeof(int64_t);
  Temp tmp;
  SOK_RETURN_IF_ERROR(tmp.alloc(m.alloc, al(slot_b) + al(sizeof(int64_t)) + al(sel_bytes) + al(kb) + al(vb) +
                                             al(sb) + 2 * al(fb), stream));
  char* base = tmp.as<char>();
  int64_t* slots = reinterpret_cast<int64_t*>(base);
  base += al(slot_b);
  int64_t* num = reinterpret_cast<int64_t*>(base);
  base += al(sizeof(int64_t));
  void* sel_tmp = base;
  base += al(sel_bytes);
  K* keys = reinterpret_cast<K*>(base);
  base += al(kb);
  float* values = reinterpret_cast<float*>(base);
  base += al(vb);
  float* slot_vals = reinterpret_cast<float*>(base);
  base += al(sb);
  int64_t* freqs = reinterpret_cast<int64_t*>(base);
  base += al(fb);
  int64_t* versions = reinterpret_cast<int64_t*>(base);
  SOK_CUDA_RETURN(cub::DeviceSelect::If(sel_tmp, sel_bytes, it, slots, num, m.capacity, pred, stream));
  int64_t h_num = 0;
  SOK_CUDA_RETURN(cudaMemcpyAsync(&h_num, num, sizeof(int64_t), cudaMemcpyDeviceToHost, stream));
  SOK_CUDA_RETURN(cudaStreamSynchronize(stream));
  if (h_num != live)
    return Status::Invalid("table '" + m.cfg.name + "': export found " + std::to_string(h_num) +
                           " live slots but the counter says " + std::to_string(live));
  out->dim = d;
  out->num_slots = ns;
  out->slot_kind = m.slot_kind;
  out->slot_init = m.slot_init;
  out->keys.resize(h_num);
  out->values.resize(h_num * d);
  out->slots.resize(h_num * ns * d);
  out->freqs.resize(h_num);
  out->versions.resize(h_num);
  if (h_num == 0) return Status::OK();
  k_export<K><<<grid_for(h_num * kTile, kBlock), kBlock, 0, stream>>>(m.t, slots, num, ns, keys, values,
                                                                     slot_vals, freqs, versions);
  SOK_LAUNCH_CHECK();
  SOK_CUDA_RETURN(cudaMemcpyAsync(out->keys.data(), keys, h_num * sizeof(K), cudaMemcpyDeviceToHost, stream));
  SOK_CUDA_RETURN(cudaMemcpyAsync(out->values.data(), values, h_num * d * sizeof(float), cudaMemcpyDeviceToHost, stream));
  if (ns > 0)
    SOK_CUDA_RETURN(cudaMemcpyAsync(out->slots.data(), slot_vals, h_num * ns * d * sizeof(float),
                                    cudaMemcpyDeviceToHost, stream));
  SOK_CUDA_RETURN(cudaMemcpyAsync(out->freqs.data(), freqs, h_num * sizeof(int64_t), cudaMemcpyDeviceToHost, stream));
  SOK_CUDA_RETURN(cudaMemcpyAsync(out->versions.data(), versions, h_num * sizeof(int64_t), cudaMemcpyDeviceToHost, stream));
  SOK_CUDA_RETURN(cudaStreamSynchronize(stream));
  return Status::OK();
}

template <typename K>
Status GpuEmbeddingTable<K>::import_rows(const TableSnapshot<K>& s, cudaStream_t stream) {
  Impl& m = *impl_;
  const int64_t n = static_cast<int64_t>(s.keys.size()), d = m.cfg.dim;
  if (s.dim != d) {
    return Status::Invalid("cannot restore table '" + m.cfg.name + "': the checkpoint has dimension " +
                           std::to_string(s.dim) + ", the table " + std::to_string(d));
  }
  if (static_cast<int64_t>(s.values.size()) != n * d ||
      static_cast<int64_t>(s.slots.size()) != n * s.num_slots * d ||
      static_cast<int64_t>(s.freqs.size()) != n || static_cast<int64_t>(s.versions.size()) != n ||
      static_cast<int64_t>(s.slot_init.size()) != s.num_slots) {
    return Status::Invalid("cannot restore table '" + m.cfg.name +
                           "': the checkpoint's keys, values, slots, frequencies and versions disagree in size");
  }
  if (s.num_slots < 0 || s.num_slots > 2)
    return Status::Invalid("cannot restore table '" + m.cfg.name + "': at most 2 optimizer slots are supported");
  DeviceGuard g(m.device);
  std::lock_guard<std::mutex> l(m.mu);
  SOK_CUDA_RETURN(cudaDeviceSynchronize());
  m.mixed = false;
  m.note_stream(stream);
  m.free_arrays(&m.t);
  m.capacity = 0;
  m.num_slots = s.num_slots;
  m.slot_kind = s.num_slots > 0 ? s.slot_kind : -1;
  m.slot_init = s.slot_init;
  const int64_t cap = capacity_for(std::max<int64_t>(std::max<int64_t>(n, m.cfg.initial_capacity), 1),
                                   m.opt.max_load_factor);
  SOK_RETURN_IF_ERROR(m.alloc_arrays(cap, d * (1 + s.num_slots), &m.t, stream));
  m.capacity = cap;
  SOK_CUDA_RETURN(cudaMemsetAsync(m.d_counters, 0, 2 * sizeof(int64_t), stream));
  m.upper = n;
  if (n == 0) {
    SOK_CUDA_RETURN(cudaStreamSynchronize(stream));
    return Status::OK();
  }
  auto al = [](size_t b) { return (b + 255) & ~size_t(255); };
  const size_t kb = n * sizeof(K), vb = n * d * sizeof(float), sb = n * s.num_slots * d * sizeof(float) + 4,
               fb = n * sizeof(int64_t);
  Temp tmp;
  SOK_RETURN_IF_ERROR(tmp.alloc(m.alloc, al(kb) + al(vb) + al(sb) + 2 * al(fb) + al(sizeof(int)), stream));
  char* base = tmp.as<char>();
  K* keys = reinterpret_cast<K*>(base);
  float* values = reinterpret_cast<float*>(base + al(kb));
  float* slot_vals = reinterpret_cast<float*>(base + al(kb) + al(vb));
  int64_t* freqs = reinterpret_cast<int64_t*>(base + al(kb) + al(vb) + al(sb));
  int64_t* versions = reinterpret_cast<int64_t*>(base + al(kb) + al(vb) + al(sb) + al(fb));
  int* dup = reinterpret_cast<int*>(base + al(kb) + al(vb) + al(sb) + 2 * al(fb));
  SOK_CUDA_RETURN(cudaMemcpyAsync(keys, s.keys.data(), kb, cudaMemcpyHostToDevice, stream));
  SOK_CUDA_RETURN(cudaMemcpyAsync(values, s.values.data(), vb, cudaMemcpyHostToDevice, stream));
  if (s.num_slots > 0)
    SOK_CUDA_RETURN(cudaMemcpyAsync(slot_vals, s.slots.data(), n * s.num_slots * d * sizeof(float),
                                    cudaMemcpyHostToDevice, stream));
  SOK_CUDA_RETURN(cudaMemcpyAsync(freqs, s.freqs.data(), fb, cudaMemcpyHostToDevice, stream));
  SOK_CUDA_RETURN(cudaMemcpyAsync(versions, s.versions.data(), fb, cudaMemcpyHostToDevice, stream));
  SOK_CUDA_RETURN(cudaMemsetAsync(dup, 0, sizeof(int), stream));
  k_import<K><<<grid_for(n * kTile, kBlock), kBlock, 0, stream>>>(m.t, keys, values, slot_vals, freqs, versions,
                                                                  s.num_slots, n, m.d_counters, dup, m.d_fail);
  SOK_LAUNCH_CHECK();
  int h_dup = 0;
  SOK_CUDA_RETURN(cudaMemcpyAsync(&h_dup, dup, sizeof(int), cudaMemcpyDeviceToHost, stream));
  SOK_CUDA_RETURN(cudaStreamSynchronize(stream));
  if (h_dup != 0)
    return Status::Invalid("cannot restore table '" + m.cfg.name + "': a key appears twice in the checkpoint");
  return Status::OK();
}

template <typename K>
Status GpuEmbeddingTable<K>::reserve(int64_t num_keys, cudaStream_t stream) {
  Impl& m = *impl_;
  DeviceGuard g(m.device);
  std::lock_guard<std::mutex> l(m.mu);
  m.note_stream(stream);
  if (static_cast<double>(num_keys) <= m.opt.max_load_factor * static_cast<double>(m.capacity))
    return Status::OK();
  int64_t live = 0, erased = 0;
  SOK_RETURN_IF_ERROR(m.sync_counts(stream, &live, &erased));
  SOK_RETURN_IF_ERROR(m.rehash(capacity_for(std::max(num_keys, live), m.opt.max_load_factor), stream));
  m.upper = live;
  return Status::OK();
}

template class GpuEmbeddingTable<int32_t>;
template class GpuEmbeddingTable<int64_t>;

}  // namespace gpu
}  // namespace sok
