// The exchange's index work on the GPU (exchange.h). Every function is a few launches over all
// tables of a lookup: up to kGroupTables tables per launch travel in one __grid_constant__
// parameter (their pointers and block starts), so no argument is copied to the device and
// nothing waits for the device.
#include <algorithm>
#include <cstdint>
#include <cub/block/block_scan.cuh>
#include <cub/device/device_radix_sort.cuh>
#include <type_traits>

#include "addons/sparse_operation_kit/core/cuda/exchange.h"
#include "addons/sparse_operation_kit/core/cuda/runtime.h"

namespace sok {
namespace gpu {
namespace exchange {
namespace {

using detail::carve_temp;
using detail::grid_for;
using detail::kBlock;
using detail::Temp;
using detail::Workspace;

// A TF op's 26 tables take one launch of each kernel, not two (~6.4 KB of parameters).
constexpr int kGroupTables = 32;
constexpr int kGroupBlocks = 256;  // world * tables of one launch

// The tables [first, first + tables) of one launch.
struct Group {
  int first = 0, tables = 0, world = 1, n = 0;
  int64_t elem_start[kGroupTables + 1];  // first element of table g on the tables' side
  int64_t dim[kGroupTables];
  void* tensor[kGroupTables];   // rows / keys of table g
  void* tensor2[kGroupTables];  // counts of table g (owner_keys, plan)
  void* tensor3[kGroupTables];  // owner_keys: the summed counts of table g
  int64_t base[kGroupTables];   // owner_keys, rows: distinct keys of the tables before g
  int64_t target[kGroupTables], rows[kGroupTables];
  int64_t key_start[kGroupTables];  // entry of table g's first key in row_at
  int64_t table_row[kGroupBlocks];  // [g * world + q]: first row of block (q, t) in table t
  int64_t flat_elem[kGroupBlocks];  // [g * world + q]: first element of block (q, t), flat
};
static_assert(sizeof(Group) <= detail::kMaxKernelParamBytes, "kernel parameters beyond CUDA's");

// f(i) for every i in [0, total), over the whole grid.
template <typename F>
__device__ __forceinline__ void for_each_index(int64_t total, F f) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    f(i);
  }
}

// [0, c[0], c[0] + c[1], ...]: where each of n tables starts (n + 1 entries).
std::vector<int64_t> starts_of(const int64_t* counts, size_t n) {
  std::vector<int64_t> out(n + 1, 0);
  for (size_t t = 0; t < n; ++t) out[t + 1] = out[t] + counts[t];
  return out;
}

int tables_per_launch(int world) {
  return std::max(1, std::min(kGroupTables, kGroupBlocks / world));
}

__device__ __forceinline__ int table_of(const Group& g, int64_t e) {
  int t = 0;
  while (t + 1 < g.tables && g.elem_start[t + 1] <= e) ++t;
  return t;
}

// The block (q, t) holding row `row` of table t: the last q whose block starts at or before it.
__device__ __forceinline__ int block_of(const Group& g, int t, int64_t row) {
  int q = g.world - 1;
  while (q > 0 && g.table_row[t * g.world + q] > row) --q;
  return t * g.world + q;
}

// Calls launch(group) for each group of tables; per_table(group, g, t) fills table t's part and
// returns its element count (rows * dim on the tables' side).
template <typename PerTable, typename Launch>
Status for_groups(int n, int world, PerTable per_table, Launch launch) {
  const int step = tables_per_launch(world);
  for (int first = 0; first < n; first += step) {
    Group g;
    g.first = first;
    g.world = world;
    g.n = n;
    g.tables = std::min(step, n - first);
    g.elem_start[0] = 0;
    for (int i = 0; i < g.tables; ++i) {
      g.elem_start[i + 1] = g.elem_start[i] + per_table(&g, i, first + i);
    }
    if (g.elem_start[g.tables] == 0) continue;
    SOK_RETURN_IF_ERROR(launch(g, g.elem_start[g.tables]));
  }
  return Status::OK();
}

// Table t's blocks as group entry i; flat_elem holds the flat buffer's elements (dims_of_flat:
// rows of the tables' dims) or rows.
void set_blocks(Group* g, int i, int t, const BlockLayout& l, bool dims_of_flat) {
  for (int q = 0; q < l.world; ++q) {
    g->table_row[i * l.world + q] = l.table_row[q * l.n + t];
    g->flat_elem[i * l.world + q] = (dims_of_flat ? l.flat_elem : l.flat_row)[q * l.n + t];
  }
}

// Rows move in pieces of V floats: 4 (one 16-byte access) when every dim of the call is a
// multiple of 4 and every buffer is 16-byte aligned, else 1. A thread per piece instead of per
// float divides the index arithmetic (table search, 64-bit divisions) by V; the values and the
// order of every sum stay the same.
template <int V>
struct Piece;
template <>
struct Piece<1> {
  using T = float;
  __device__ static T add(T a, T b) { return a + b; }
};
template <>
struct Piece<4> {
  using T = float4;
  __device__ static T add(T a, T b) {
    return make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
  }
};

template <int V>
__device__ __forceinline__ typename Piece<V>::T& piece_at(float* base, int64_t elem) {
  return *reinterpret_cast<typename Piece<V>::T*>(base + elem);
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// V for a call over tables of `dims` whose rows live at `rows` and in `flat`.
int piece_floats(const std::vector<int64_t>& dims, const std::vector<void*>& rows,
                 const void* flat) {
  if (!aligned16(flat)) return 1;
  for (size_t t = 0; t < dims.size(); ++t) {
    if (dims[t] % 4 != 0 || !aligned16(rows[t])) return 1;
  }
  return 4;
}

// launch(std::integral_constant<int, V>) with V = v, the piece width piece_floats chose.
template <typename Launch>
void with_piece_floats(int v, const Launch& launch) {
  if (v == 4) {
    launch(std::integral_constant<int, 4>());
  } else {
    launch(std::integral_constant<int, 1>());
  }
}

// Each distinct row to its copies in the flat rows (kToBlocks), or its copies summed in rank
// order into it: one thread per piece of a distinct row (elem_start and dims count pieces).
template <bool kToBlocks, int V>
__global__ void move_rows_kernel(const __grid_constant__ Group g, const int64_t* row_pos,
                                 float* flat, int64_t total) {
  using P = Piece<V>;
  for_each_index(total, [&](int64_t e) {
    const int t = table_of(g, e);
    const int64_t at = e - g.elem_start[t], pieces = g.dim[t] / V, row = at / pieces;
    const int64_t c = (at - row * pieces) * V;
    const int64_t* pos = row_pos + (g.base[t] + row) * g.world;
    float* r = static_cast<float*>(g.tensor[t]) + row * g.dim[t] + c;
    if (kToBlocks) {
      const typename P::T v = piece_at<V>(r, 0);
      for (int q = 0; q < g.world; ++q) {
        if (pos[q] >= 0) piece_at<V>(flat, pos[q] + c) = v;
      }
    } else {
      typename P::T sum{};
      for (int q = 0; q < g.world; ++q) {
        if (pos[q] >= 0) sum = P::add(sum, piece_at<V>(flat, pos[q] + c));
      }
      piece_at<V>(r, 0) = sum;
    }
  });
}

template <bool kToBlocks>
Status move_rows(const std::vector<int64_t>& dims, const int64_t* distinct, int world,
                 const int64_t* row_pos, float* flat, const std::vector<void*>& rows,
                 cudaStream_t stream) {
  const std::vector<int64_t> base = starts_of(distinct, dims.size());
  const int v = piece_floats(dims, rows, flat);
  return for_groups(
      static_cast<int>(dims.size()), 1,
      [&](Group* g, int i, int t) {
        g->dim[i] = dims[t];
        g->tensor[i] = rows[t];
        g->base[i] = base[t];
        return distinct[t] * dims[t] / v;
      },
      [&](Group g, int64_t total) {
        g.world = world;  // grouped as for one rank: the group holds no blocks
        with_piece_floats(v, [&](auto V) {
          move_rows_kernel<kToBlocks, V.value>
              <<<grid_for(total, kBlock), kBlock, 0, stream>>>(g, row_pos, flat, total);
        });
        SOK_LAUNCH_CHECK();
        return Status::OK();
      });
}

__global__ void split_received_kernel(const __grid_constant__ Group g, const int64_t* received,
                                      int64_t total) {
  for_each_index(total, [&](int64_t e) {
    const int t = table_of(g, e);
    const int64_t row = e - g.elem_start[t];
    const int b = block_of(g, t, row);
    const int64_t j = g.flat_elem[b] + (row - g.table_row[b]);
    static_cast<int64_t*>(g.tensor[t])[row] =
        sok::exchange::local_key(received[2 * j], g.target[t], g.rows[t], g.world);
    static_cast<int64_t*>(g.tensor2[t])[row] = received[2 * j + 1];
  });
}

// owner_keys after the dedup: each received row's count added to its distinct key's, and its
// place in the flat rows recorded for that key and requester.
__global__ void owner_rows_kernel(const __grid_constant__ Group g, int64_t* row_pos,
                                  int64_t total) {
  for_each_index(total, [&](int64_t e) {
    const int t = table_of(g, e);
    const int64_t row = e - g.elem_start[t];
    const int b = block_of(g, t, row);
    const int64_t u = static_cast<const int32_t*>(g.tensor[t])[row];
    atomicAdd(reinterpret_cast<unsigned long long*>(static_cast<int64_t*>(g.tensor3[t]) + u),
              static_cast<unsigned long long>(static_cast<const int64_t*>(g.tensor2[t])[row]));
    row_pos[(g.base[t] + u) * g.world + (b - t * g.world)] =
        g.flat_elem[b] + (row - g.table_row[b]) * g.dim[t];
  });
}

// owner_keys: the distinct keys to their outputs (padding: the table's first key), the summed
// counts zeroed, no copy yet in the flat rows (row_pos -1), each table's distinct count to valid
// (zeroed before: a table without keys has no thread).
__global__ void owner_outputs_kernel(const __grid_constant__ Group g,
                                     const UniqueTableReport* reports, int64_t* valid,
                                     int64_t* row_pos, int64_t total) {
  for_each_index(total, [&](int64_t e) {
    const int t = table_of(g, e);
    const int64_t u = e - g.elem_start[t], d = reports[g.first + t].num_unique;
    static_cast<int64_t*>(g.tensor[t])[u] =
        static_cast<const int64_t*>(g.tensor2[t])[u < d ? u : 0];
    static_cast<int64_t*>(g.tensor3[t])[u] = 0;
    for (int q = 0; q < g.world; ++q) row_pos[(g.base[t] + u) * g.world + q] = -1;
    if (u == 0) valid[g.first + t] = d;
  });
}

template <bool kGather, int V>
__global__ void rows_at_kernel(const __grid_constant__ Group g, const int64_t* row_at,
                               float* returned, int64_t total) {
  for_each_index(total, [&](int64_t e) {
    const int t = table_of(g, e);
    const int64_t at = e - g.elem_start[t], pieces = g.dim[t] / V, row = at / pieces;
    const int64_t c = (at - row * pieces) * V;
    float* r = static_cast<float*>(g.tensor[t]) + row * g.dim[t] + c;
    const int64_t start = row_at[g.key_start[t] + row];
    if (start < 0) {  // padding: reads zeros, writes nothing
      if (kGather) piece_at<V>(r, 0) = typename Piece<V>::T{};
      return;
    }
    float* f = returned + start + c;
    if (kGather) {
      piece_at<V>(r, 0) = piece_at<V>(f, 0);
    } else {
      piece_at<V>(f, 0) = piece_at<V>(r, 0);
    }
  });
}

template <bool kGather>
Status rows_at(const std::vector<int64_t>& dims, const int64_t* sizes, const int64_t* row_at,
               float* returned, const std::vector<void*>& rows, cudaStream_t stream) {
  const std::vector<int64_t> key_start = starts_of(sizes, dims.size());
  const int v = piece_floats(dims, rows, returned);
  return for_groups(
      static_cast<int>(dims.size()), 1,
      [&](Group* g, int i, int t) {
        g->dim[i] = dims[t];
        g->tensor[i] = rows[t];
        g->key_start[i] = key_start[t];
        return sizes[t] * dims[t] / v;
      },
      [&](const Group& g, int64_t total) {
        with_piece_floats(v, [&](auto V) {
          rows_at_kernel<kGather, V.value>
              <<<grid_for(total, kBlock), kBlock, 0, stream>>>(g, row_at, returned, total);
        });
        SOK_LAUNCH_CHECK();
        return Status::OK();
      });
}

// plan, 1: each key's block (owner * n + table), its position, dim, key and count, flat; the
// bad-id flag. Padding (entries past valid[t], when given) goes to block world * n, past every
// real one, with nothing to request.
__global__ void plan_keys_kernel(const __grid_constant__ Group g, const int64_t* valid,
                                 uint32_t* block, int64_t* index, int64_t* dim, int64_t* key_flat,
                                 int64_t* count_flat, unsigned long long* bad, int64_t total) {
  for_each_index(total, [&](int64_t e) {
    const int t = table_of(g, e);
    const int64_t at = e - g.elem_start[t], i = g.key_start[t] + at;
    index[i] = i;
    if (valid != nullptr && at >= valid[g.first + t]) {
      block[i] = static_cast<uint32_t>(g.world * g.n);
      dim[i] = key_flat[i] = count_flat[i] = 0;
      return;
    }
    const int64_t k = static_cast<const int64_t*>(g.tensor[t])[at];
    const int64_t* counts = static_cast<const int64_t*>(g.tensor2[t]);
    block[i] =
        static_cast<uint32_t>(sok::exchange::owner_of(k, g.target[t], g.world) * g.n + g.first + t);
    dim[i] = g.dim[t];
    key_flat[i] = k;
    count_flat[i] = counts ? counts[at] : 1;
    if (sok::exchange::bad_key(k, g.rows[t])) atomicMax(bad, g.first + t + 1ull);
  });
}

// The first of the `total` sorted blocks that is at least b.
__device__ int64_t first_at_least(const uint32_t* sorted_block, int64_t total, int64_t b) {
  int64_t lo = 0, hi = total;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (sorted_block[mid] < b) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

// The bad flag (exchange.h): a static id's, or bad positions (valid[t] < 0), the highest.
__device__ int64_t bad_flag(const unsigned long long* bad, const int64_t* valid, int n) {
  int64_t flag = static_cast<int64_t>(*bad);
  if (valid == nullptr) return flag;
  for (int t = 0; t < n; ++t)
    if (valid[t] < 0) flag = max(flag, sok::exchange::bad_positions_flag(n, t));
  return flag;
}

// Where the plan's blocks lie.
struct PlanBlocks {
  int64_t* first;  // [blocks]: the block's first sorted key
  int64_t* elem;   // [blocks]: its first element among the returned rows
  int64_t* dim;    // [blocks]: its table's dim (0: no keys)
};

constexpr int kPlanBlockThreads = 512;

// plan, 2 (one thread block): each block's first key (binary search of the sorted blocks), dim
// and first returned element (a scan over the blocks, not the keys), and the [world, n + 2]
// matrix: keys per block, then [signature, bad].
__global__ void
__launch_bounds__(kPlanBlockThreads)
    plan_blocks_kernel(const uint32_t* sorted_block, const int64_t* sorted_index,
                       const int64_t* dim, int64_t total, int world, int n,
                       const unsigned long long* bad, const int64_t* valid, int64_t signature,
                       PlanBlocks out, int64_t* matrix) {
  using Scan = cub::BlockScan<int64_t, kPlanBlockThreads>;
  __shared__ typename Scan::TempStorage scan;
  __shared__ int64_t carried;
  const int64_t blocks = static_cast<int64_t>(world) * n;
  if (threadIdx.x == 0) carried = 0;
  __syncthreads();
  for (int64_t from = 0; from < blocks; from += kPlanBlockThreads) {
    const int64_t b = from + threadIdx.x;
    int64_t elems = 0;
    if (b < blocks) {
      const int64_t f = first_at_least(sorted_block, total, b);
      const int64_t keys = first_at_least(sorted_block, total, b + 1) - f;
      const int64_t d = keys > 0 ? dim[sorted_index[f]] : 0;
      out.first[b] = f;
      out.dim[b] = d;
      elems = keys * d;
      matrix[(b / n) * (n + 2) + b % n] = keys;
    }
    int64_t before, all;
    Scan(scan).ExclusiveSum(elems, before, all);
    if (b < blocks) out.elem[b] = carried + before;
    __syncthreads();  // every thread read `carried` and the scan's storage
    if (threadIdx.x == 0) carried += all;
    __syncthreads();
  }
  for (int q = threadIdx.x; q < world; q += kPlanBlockThreads) {
    matrix[q * (n + 2) + n] = signature;
    matrix[q * (n + 2) + n + 1] = bad_flag(bad, valid, n);
  }
}

// plan, 3: the request in sorted order, and where each key's row starts among the returned rows
// (they come in request order; padding: -1).
__global__ void plan_request_kernel(const uint32_t* sorted_block, const int64_t* sorted_index,
                                    const int64_t* key_flat, const int64_t* count_flat,
                                    PlanBlocks blocks_at, uint32_t blocks, int64_t* request,
                                    int64_t* row_at, int64_t total) {
  for_each_index(total, [&](int64_t j) {
    const int64_t i = sorted_index[j];
    request[2 * j] = key_flat[i];
    request[2 * j + 1] = count_flat[i];
    const uint32_t b = sorted_block[j];
    row_at[i] = b < blocks ? blocks_at.elem[b] + (j - blocks_at.first[b]) * blocks_at.dim[b] : -1;
  });
}

// The plan's temporaries, in one workspace.
struct PlanTemps {
  uint32_t *block = nullptr, *sorted_block = nullptr;
  int64_t *index = nullptr, *sorted_index = nullptr, *dim = nullptr, *key_flat = nullptr,
          *count_flat = nullptr;
  PlanBlocks blocks{};
  unsigned long long* bad = nullptr;
  void* sort_tmp = nullptr;
  size_t sort_bytes = 0;
  int end_bit = 1;
};

Status carve_plan(int64_t total, int64_t blocks, cudaStream_t stream, DeviceAllocator* alloc,
                  Temp* tmp, PlanTemps* p) {
  p->end_bit = detail::bits_for(static_cast<uint64_t>(blocks));  // the padding's block too
  SOK_CUDA_RETURN(cub::DeviceRadixSort::SortPairs(
      nullptr, p->sort_bytes, static_cast<const uint32_t*>(nullptr),
      static_cast<uint32_t*>(nullptr), static_cast<const int64_t*>(nullptr),
      static_cast<int64_t*>(nullptr), total, 0, p->end_bit, stream));
  SOK_RETURN_IF_ERROR(carve_temp(alloc, stream, tmp, [&](Workspace& w) {
    p->block = w.take<uint32_t>(total);
    p->sorted_block = w.take<uint32_t>(total);
    p->index = w.take<int64_t>(total);
    p->sorted_index = w.take<int64_t>(total);
    p->dim = w.take<int64_t>(total);
    p->key_flat = w.take<int64_t>(total);
    p->count_flat = w.take<int64_t>(total);
    p->blocks.first = w.take<int64_t>(blocks);
    p->blocks.elem = w.take<int64_t>(blocks);
    p->blocks.dim = w.take<int64_t>(blocks);
    p->bad = w.take<unsigned long long>(1);
    p->sort_tmp = w.take_bytes(p->sort_bytes);
  }));
  SOK_CUDA_RETURN(cudaMemsetAsync(p->bad, 0, sizeof(unsigned long long), stream));
  return Status::OK();
}

// plan, 1 for every group of tables.
Status plan_keys(const std::vector<TableSpec>& tables, int world,
                 const std::vector<const int64_t*>& keys, const std::vector<const int64_t*>& counts,
                 const int64_t* sizes, const int64_t* valid, const PlanTemps& p,
                 cudaStream_t stream) {
  const int n = static_cast<int>(tables.size());
  const std::vector<int64_t> key_start = starts_of(sizes, n);
  return for_groups(
      n, 1,
      [&](Group* g, int i, int t) {
        g->dim[i] = tables[t].dim;
        g->tensor[i] = const_cast<int64_t*>(keys[t]);
        g->tensor2[i] = const_cast<int64_t*>(counts[t]);
        g->target[i] = tables[t].target;
        g->rows[i] = tables[t].rows;
        g->key_start[i] = key_start[t];
        return sizes[t];
      },
      [&](Group g, int64_t part) {
        g.world = world;  // for_groups' world is 1 here: the group holds no blocks
        plan_keys_kernel<<<grid_for(part, kBlock), kBlock, 0, stream>>>(
            g, valid, p.block, p.index, p.dim, p.key_flat, p.count_flat, p.bad, part);
        SOK_LAUNCH_CHECK();
        return Status::OK();
      });
}

}  // namespace

Status plan(const std::vector<TableSpec>& tables, int world,
            const std::vector<const int64_t*>& keys, const std::vector<const int64_t*>& counts,
            const int64_t* sizes, const int64_t* valid, int64_t signature, int64_t* request,
            int64_t* matrix, int64_t* row_at, cudaStream_t stream, DeviceAllocator* alloc) {
  const int n = static_cast<int>(tables.size());
  const int64_t blocks = static_cast<int64_t>(world) * n;
  if (blocks > (1ll << 31)) return Status::Invalid("exchange: too many (rank, table) blocks");
  int64_t total = 0;
  for (int t = 0; t < n; ++t) total += sizes[t];
  Temp tmp;
  PlanTemps p;
  SOK_RETURN_IF_ERROR(carve_plan(total, blocks, stream, alloc, &tmp, &p));
  SOK_RETURN_IF_ERROR(plan_keys(tables, world, keys, counts, sizes, valid, p, stream));
  if (total > 0) {
    SOK_CUDA_RETURN(cub::DeviceRadixSort::SortPairs(p.sort_tmp, p.sort_bytes, p.block,
                                                    p.sorted_block, p.index, p.sorted_index, total,
                                                    0, p.end_bit, stream));
  }
  plan_blocks_kernel<<<1, kPlanBlockThreads, 0, stream>>>(p.sorted_block, p.sorted_index, p.dim,
                                                          total, world, n, p.bad, valid,
                                                          signature, p.blocks, matrix);
  SOK_LAUNCH_CHECK();
  if (total > 0) {
    plan_request_kernel<<<grid_for(total, kBlock), kBlock, 0, stream>>>(
        p.sorted_block, p.sorted_index, p.key_flat, p.count_flat, p.blocks,
        static_cast<uint32_t>(blocks), request, row_at, total);
    SOK_LAUNCH_CHECK();
  }
  return Status::OK();
}

namespace {

// The owner's temporaries: the received rows per table (keys, counts), their dedup.
struct OwnerTemps {
  std::vector<int64_t> start;  // [n + 1]: first received row of each table
  int64_t *keys = nullptr, *counts = nullptr, *unique = nullptr;
  int32_t* inverse = nullptr;
  UniqueTableReport* reports = nullptr;
};

// owner_keys, 1: the received rows as each table's keys (local) and counts, table by table.
Status split_received(const std::vector<TableSpec>& tables, const BlockLayout& l,
                      const int64_t* received, const OwnerTemps& o, cudaStream_t stream) {
  return for_groups(
      l.n, l.world,
      [&](Group* g, int i, int t) {
        g->tensor[i] = o.keys + o.start[t];
        g->tensor2[i] = o.counts + o.start[t];
        g->target[i] = tables[t].target;
        g->rows[i] = tables[t].rows;
        set_blocks(g, i, t, l, /*dims_of_flat=*/false);
        return l.table_rows[t];
      },
      [&](const Group& g, int64_t total) {
        split_received_kernel<<<grid_for(total, kBlock), kBlock, 0, stream>>>(g, received, total);
        SOK_LAUNCH_CHECK();
        return Status::OK();
      });
}

// owner_keys, 2: every table's dedup at once; exact (distinct not null): the distinct counts to
// the host (the one wait).
Status dedup(const BlockLayout& l, const OwnerTemps& o, cudaStream_t stream, DeviceAllocator* alloc,
             void* host_staging, std::vector<int64_t>* distinct) {
  std::vector<UniqueTable> spans(l.n);  // int64 keys without positions: owner_keys_staging_bytes
  for (int t = 0; t < l.n; ++t) {
    spans[t].keys = o.keys + o.start[t];
    spans[t].n = l.table_rows[t];
    spans[t].unique = o.unique + o.start[t];
    spans[t].inverse = o.inverse + o.start[t];
  }
  SOK_RETURN_IF_ERROR(unique_keys_multi(spans, o.reports, stream, alloc, host_staging));
  if (distinct == nullptr) return Status::OK();
  std::vector<UniqueTableReport> reports(l.n);
  SOK_CUDA_RETURN(cudaMemcpyAsync(reports.data(), o.reports, l.n * sizeof(UniqueTableReport),
                                  cudaMemcpyDeviceToHost, stream));
  SOK_CUDA_RETURN(cudaStreamSynchronize(stream));
  distinct->resize(l.n);
  for (int t = 0; t < l.n; ++t) (*distinct)[t] = reports[t].num_unique;
  return Status::OK();
}

// owner_keys, 3: distinct keys (and padding), summed counts, where each copy goes back.
Status owner_outputs(const std::vector<TableSpec>& tables, const BlockLayout& l,
                     const OwnerTemps& o, const std::vector<int64_t>& sizes,
                     const OwnerKeysOut& out, cudaStream_t stream) {
  const std::vector<int64_t> base = starts_of(sizes.data(), l.n);
  if (std::find(sizes.begin(), sizes.end(), 0) != sizes.end()) {  // tables the kernel skips
    SOK_CUDA_RETURN(cudaMemsetAsync(out.valid, 0, sizeof(int64_t) * l.n, stream));
  }
  SOK_RETURN_IF_ERROR(for_groups(
      l.n, 1,
      [&](Group* g, int i, int t) {
        g->tensor[i] = out.keys[t];
        g->tensor2[i] = o.unique + o.start[t];
        g->tensor3[i] = out.counts[t];
        g->base[i] = base[t];
        return sizes[t];
      },
      [&](Group g, int64_t total) {
        g.world = l.world;  // grouped as for one rank: the group holds no blocks
        owner_outputs_kernel<<<grid_for(total, kBlock), kBlock, 0, stream>>>(
            g, o.reports, out.valid, out.row_pos, total);
        SOK_LAUNCH_CHECK();
        return Status::OK();
      }));
  return for_groups(
      l.n, l.world,
      [&](Group* g, int i, int t) {
        g->tensor[i] = o.inverse + o.start[t];
        g->tensor2[i] = o.counts + o.start[t];
        g->tensor3[i] = out.counts[t];
        g->base[i] = base[t];
        g->dim[i] = tables[t].dim;
        set_blocks(g, i, t, l, /*dims_of_flat=*/true);
        return l.table_rows[t];
      },
      [&](const Group& g, int64_t total) {
        owner_rows_kernel<<<grid_for(total, kBlock), kBlock, 0, stream>>>(g, out.row_pos, total);
        SOK_LAUNCH_CHECK();
        return Status::OK();
      });
}

}  // namespace

size_t owner_keys_staging_bytes(int num_tables) {
  return unique_keys_multi_staging_bytes(std::vector<UniqueTable>(num_tables));
}

Status owner_keys(const std::vector<TableSpec>& tables, const BlockLayout& l,
                  const int64_t* received, bool padded, const AllocateOwnerKeys& allocate,
                  cudaStream_t stream, DeviceAllocator* alloc, void* host_staging) {
  OwnerTemps o;
  o.start = starts_of(l.table_rows.data(), l.n);
  const int64_t m = o.start[l.n];
  Temp tmp;
  SOK_RETURN_IF_ERROR(carve_temp(alloc, stream, &tmp, [&](Workspace& w) {
    o.keys = w.take<int64_t>(m);
    o.counts = w.take<int64_t>(m);
    o.unique = w.take<int64_t>(m);
    o.inverse = w.take<int32_t>(m);
    o.reports = w.take<UniqueTableReport>(l.n);
  }));
  SOK_RETURN_IF_ERROR(split_received(tables, l, received, o, stream));
  std::vector<int64_t> sizes = l.table_rows;
  SOK_RETURN_IF_ERROR(dedup(l, o, stream, alloc, host_staging, padded ? nullptr : &sizes));
  OwnerKeysOut out;
  SOK_RETURN_IF_ERROR(allocate(sizes, &out));
  return owner_outputs(tables, l, o, sizes, out, stream);
}

Status rows_to_blocks(const std::vector<int64_t>& dims, const int64_t* distinct, int world,
                      const int64_t* row_pos, const std::vector<const float*>& rows, float* flat,
                      cudaStream_t stream) {
  std::vector<void*> r(rows.size());
  for (size_t t = 0; t < rows.size(); ++t) r[t] = const_cast<float*>(rows[t]);
  return move_rows<true>(dims, distinct, world, row_pos, flat, r, stream);
}

Status rows_from_blocks(const std::vector<int64_t>& dims, const int64_t* distinct, int world,
                        const int64_t* row_pos, const float* flat, const std::vector<float*>& rows,
                        cudaStream_t stream) {
  std::vector<void*> r(rows.begin(), rows.end());
  return move_rows<false>(dims, distinct, world, row_pos, const_cast<float*>(flat), r, stream);
}

Status gather_rows(const std::vector<int64_t>& dims, const int64_t* sizes, const int64_t* row_at,
                   const float* returned, const std::vector<float*>& out, cudaStream_t stream) {
  std::vector<void*> r(out.begin(), out.end());
  return rows_at<true>(dims, sizes, row_at, const_cast<float*>(returned), r, stream);
}

Status scatter_rows(const std::vector<int64_t>& dims, const int64_t* sizes, const int64_t* row_at,
                    const std::vector<const float*>& d_out, float* d_returned,
                    cudaStream_t stream) {
  std::vector<void*> r(d_out.size());
  for (size_t t = 0; t < d_out.size(); ++t) r[t] = const_cast<float*>(d_out[t]);
  return rows_at<false>(dims, sizes, row_at, d_returned, r, stream);
}

}  // namespace exchange
}  // namespace gpu
}  // namespace sok
