// unique_keys_multi and stable_sample_order_multi (gpu_api.h): the dedup, the position checks and
// the sample order of every table of a lookup with a fixed number of launches per key dtype.
// The tables' ids form one index space (table t owns [first[t], first[t + 1])). One
// open-addressing set over (table, key) holds entries (t << 32 | local position), the lowest
// position per key winning as in unique_keys.cu; one scan over "first occurrence" numbers the
// distinct keys of all tables, and a table's unique index is that number minus the count of its
// first id. Every id then reads its key's entry once more and takes the number of the position
// the entry names (three passes over the ids: insert, scan, emit). The per-table arguments reach
// the device in one copy.
#include <cuda_runtime.h>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/iterator/transform_iterator.h>

#include <algorithm>
#include <cstring>
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_scan.cuh>
#include <vector>

#include "addons/sparse_operation_kit/core/common.h"
#include "addons/sparse_operation_kit/core/cuda/device_util.cuh"
#include "addons/sparse_operation_kit/core/cuda/gpu_api.h"
#include "addons/sparse_operation_kit/core/cuda/runtime.h"

namespace sok {
namespace gpu {

using namespace detail;  // NOLINT

namespace {

constexpr uint64_t kEmpty = ~0ull;
constexpr int64_t kMaxIds = (int64_t{1} << 31) - 2;

// One table's arguments on the device.
struct TableArgs {
  const void* keys;
  void* unique;
  int32_t* inverse;
  int64_t* counts;
  const int64_t* positions;
  const int64_t* dense_shape;
  int64_t rank;
  int64_t report;  // index of its UniqueTableReport
};

// The tables of one set of launches (one key dtype; one sort batch).
struct Group {
  const TableArgs* tables;  // device
  const int64_t* first;     // device, [num_tables + 1]
  int num_tables;
  int64_t n;  // ids of all its tables
};

// The table that owns global index i < n (empty tables own nothing).
__device__ __forceinline__ int table_of(const Group& g, int64_t i) {
  int lo = 0, hi = g.num_tables - 1;
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (__ldg(g.first + mid + 1) <= i) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

__device__ __forceinline__ uint64_t entry_of(int t, int64_t local) {
  return (static_cast<uint64_t>(t) << 32) | static_cast<uint64_t>(local);
}

// Lowers *p to v (unless already lower): most calls of a hot record skip the atomic.
__device__ __forceinline__ void lower_to(int64_t* p, int64_t v) {
  if (static_cast<uint64_t>(v) < static_cast<uint64_t>(ld_relaxed_i64(p)))
    atomicMin(reinterpret_cast<unsigned long long*>(p), static_cast<unsigned long long>(v));
}

__device__ void check_position(const TableArgs& a, int64_t l, UniqueTableReport* r) {
  const int64_t* index = a.positions + l * a.rank;
  for (int64_t d = 0; d < a.rank; ++d) {
    const int64_t v = index[d];
    if (v < 0 || v >= a.dense_shape[d]) {
      lower_to(&r->first_outside, l);
      break;
    }
  }
  if (l > 0 && index[0] < index[-a.rank]) lower_to(&r->first_unordered, l);
}

// Inserts (table, key) of every id (equal pairs of one warp through their lowest lane), checks
// its position and zeroes counts[l] at its own position l: every unique index u < num_unique <= n
// is zeroed before k_multi_emit adds to it.
template <typename K>
__global__ void k_multi_insert(Group g, uint64_t* slots, uint64_t mask, int64_t* pos_of,
                               UniqueTableReport* reports) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const bool valid = i < g.n;
  int t = 0;
  int64_t l = 0;
  K key = K(0);
  const K* keys = nullptr;
  if (valid) {
    t = table_of(g, i);
    l = i - g.first[t];
    const TableArgs& a = g.tables[t];
    keys = static_cast<const K*>(a.keys);
    key = keys[l];
    if (a.positions != nullptr) check_position(a, l, reports + a.report);
    if (a.counts != nullptr) a.counts[l] = 0;
  }
  const unsigned active = __ballot_sync(0xffffffffu, valid);
  if (!valid) return;
  const unsigned peers = __match_any_sync(active, key) & __match_any_sync(active, t);
  const int leader = __ffs(peers) - 1;
  const uint64_t entry = entry_of(t, l);
  const uint64_t h = static_cast<uint64_t>(static_cast<int64_t>(key)) ^
                     (static_cast<uint64_t>(t) * 0xD6E8FEB86659FD93ull);
  uint64_t pos = mix64(h) & mask;
  if ((threadIdx.x & 31) == leader) {
    unsigned long long* s = reinterpret_cast<unsigned long long*>(slots);
    while (true) {
      uint64_t cur = static_cast<uint64_t>(ld_relaxed_i64(reinterpret_cast<int64_t*>(s + pos)));
      if (cur == kEmpty) {
        cur = atomicCAS(s + pos, kEmpty, entry);
        if (cur == kEmpty) break;
      }
      if ((cur >> 32) == static_cast<uint64_t>(t) && keys[cur & 0xffffffffu] == key) {
        if (cur > entry) atomicMin(s + pos, entry);
        break;
      }
      pos = (pos + 1) & mask;
    }
  }
  pos = __shfl_sync(peers, pos, leader);
  pos_of[i] = static_cast<int64_t>(pos);
}

// 1 for the first occurrence of its (table, key), for the scan (index n reads 0).
struct IsFirst {
  const uint64_t* slots;
  const int64_t* pos_of;
  const int64_t* first;
  int64_t n;
  __device__ int32_t operator()(int64_t i) const {
    if (i >= n) return 0;
    const uint64_t e = slots[pos_of[i]];
    return first[e >> 32] + static_cast<int64_t>(e & 0xffffffffu) == i ? 1 : 0;
  }
};

// Each id's unique index: the number the scan gave the position its key's entry names (the
// key's first id). That id writes the key; every id counts (one atomic per distinct (table,
// key) per warp). Threads below num_tables write their table's distinct count.
template <typename K>
__global__ void k_multi_emit(Group g, const uint64_t* slots, const int64_t* pos_of,
                             const int32_t* upos, UniqueTableReport* reports) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < g.num_tables) {
    reports[g.tables[i].report].num_unique =
        g.n == 0 ? 0 : static_cast<int64_t>(upos[g.first[i + 1]] - upos[g.first[i]]);
  }
  const bool valid = i < g.n;
  int t = 0;
  uint32_t u = 0;
  int64_t* counts = nullptr;
  if (valid) {
    t = table_of(g, i);
    const int64_t start = g.first[t];
    const int64_t l = i - start;
    const int64_t first = static_cast<int64_t>(slots[pos_of[i]] & 0xffffffffu);
    u = static_cast<uint32_t>(upos[start + first] - upos[start]);
    const TableArgs& a = g.tables[t];
    a.inverse[l] = static_cast<int32_t>(u);
    if (first == l) static_cast<K*>(a.unique)[u] = static_cast<const K*>(a.keys)[l];
    counts = a.counts;
  }
  const unsigned active = __ballot_sync(0xffffffffu, valid);
  if (!valid) return;
  const unsigned peers = __match_any_sync(active, entry_of(t, u));
  if (counts != nullptr && (threadIdx.x & 31) == __ffs(peers) - 1)
    atomicAdd(reinterpret_cast<unsigned long long*>(counts + u),
              static_cast<unsigned long long>(__popc(peers)));
}

using FirstFlags = thrust::transform_iterator<IsFirst, thrust::counting_iterator<int64_t>>;

// Where the per-table arguments go in the uploaded blob: every TableArgs (groups one after the
// other), each group's `first` array, then the dense shapes.
struct Blob {
  size_t first_at, shapes_at, bytes;
};

Blob blob_layout(const std::vector<UniqueTable>& tables, int groups) {
  Blob b;
  b.first_at = tables.size() * sizeof(TableArgs);
  b.shapes_at = b.first_at + (tables.size() + groups) * sizeof(int64_t);
  int64_t dims = 0;
  for (const UniqueTable& t : tables)
    if (t.positions != nullptr) dims += t.rank;
  b.bytes = b.shapes_at + dims * sizeof(int64_t);
  return b;
}

int num_groups(const std::vector<UniqueTable>& tables) {
  bool has[2] = {false, false};
  for (const UniqueTable& t : tables) has[t.keys_int64] = true;
  return has[0] + has[1];
}

template <typename K>
Status launch_group(const Group& g, uint64_t* slots, uint64_t mask, int64_t* pos_of, int32_t* upos,
                    void* scan_tmp, size_t scan_bytes, UniqueTableReport* d_reports,
                    cudaStream_t stream) {
  if (g.n > 0) {
    k_multi_insert<K>
        <<<grid_for(g.n, kBlock), kBlock, 0, stream>>>(g, slots, mask, pos_of, d_reports);
    SOK_LAUNCH_CHECK();
    const FirstFlags flags(thrust::counting_iterator<int64_t>(0),
                           IsFirst{slots, pos_of, g.first, g.n});
    SOK_CUDA_RETURN(cub::DeviceScan::ExclusiveSum(scan_tmp, scan_bytes, flags, upos,
                                                  static_cast<int>(g.n + 1), stream));
  }
  k_multi_emit<K><<<grid_for(std::max<int64_t>(g.n, g.num_tables), kBlock), kBlock, 0, stream>>>(
      g, slots, pos_of, upos, d_reports);
  SOK_LAUNCH_CHECK();
  return Status::OK();
}

}  // namespace

size_t unique_keys_multi_staging_bytes(const std::vector<UniqueTable>& tables) {
  return blob_layout(tables, num_groups(tables)).bytes;
}

namespace {

// Group 0: int32 keys, group 1: int64 keys; members in table order.
struct Members {
  std::vector<int> of[2];
  int64_t total[2] = {0, 0};
};

Status group_members(const std::vector<UniqueTable>& tables, Members* m) {
  for (size_t i = 0; i < tables.size(); ++i) {
    const UniqueTable& t = tables[i];
    if (t.n < 0) return Status::Invalid("unique_keys_multi: negative id count");
    if (t.positions != nullptr && (t.rank < 1 || t.dense_shape == nullptr))
      return Status::Invalid("unique_keys_multi: positions need a rank >= 1 and a dense shape");
    m->of[t.keys_int64].push_back(static_cast<int>(i));
    m->total[t.keys_int64] += t.n;
    if (m->total[t.keys_int64] > kMaxIds)
      return Status::Invalid(std::string("unique_keys_multi: more than 2^31 - 2 ids in the ") +
                             (t.keys_int64 ? "int64" : "int32") + " tables of one call");
  }
  return Status::OK();
}

// The blob's host image (`host`, layout.bytes) and each group's view of the device blob.
void fill_unique_blob(const std::vector<UniqueTable>& tables, const Members& m, const Blob& layout,
                      const char* blob, char* host, Group* g) {
  TableArgs* args = reinterpret_cast<TableArgs*>(host);
  int64_t* first = reinterpret_cast<int64_t*>(host + layout.first_at);
  int64_t* shapes = reinterpret_cast<int64_t*>(host + layout.shapes_at);
  size_t a = 0, f = 0, d = 0;
  for (int k = 0; k < 2; ++k) {
    if (m.of[k].empty()) continue;
    g[k].tables = reinterpret_cast<const TableArgs*>(blob) + a;
    g[k].first = reinterpret_cast<const int64_t*>(blob + layout.first_at) + f;
    g[k].num_tables = static_cast<int>(m.of[k].size());
    g[k].n = m.total[k];
    int64_t at = 0;
    for (int i : m.of[k]) {
      const UniqueTable& t = tables[i];
      TableArgs& ta = args[a++];
      ta = TableArgs{t.keys,      t.unique, t.inverse, t.counts,
                     t.positions, nullptr,  t.rank,    static_cast<int64_t>(i)};
      if (t.positions != nullptr) {
        ta.dense_shape = reinterpret_cast<const int64_t*>(blob + layout.shapes_at) + d;
        std::memcpy(shapes + d, t.dense_shape, t.rank * sizeof(int64_t));
        d += t.rank;
      }
      first[f++] = at;
      at += t.n;
    }
    first[f++] = at;
  }
}

// Per group: hash slots (a power of two, at least twice the ids) and the scan's scratch bytes.
Status group_sizes(const Members& m, int64_t* cap, size_t* scan_bytes, cudaStream_t stream) {
  for (int k = 0; k < 2; ++k) {
    cap[k] = 0;
    scan_bytes[k] = 0;
    if (m.total[k] == 0) continue;
    cap[k] = 16;
    while (cap[k] < 2 * m.total[k]) cap[k] <<= 1;
    const FirstFlags flags(thrust::counting_iterator<int64_t>(0), IsFirst{});
    SOK_CUDA_RETURN(cub::DeviceScan::ExclusiveSum(nullptr, scan_bytes[k], flags,
                                                  static_cast<int32_t*>(nullptr),
                                                  static_cast<int>(m.total[k] + 1), stream));
  }
  return Status::OK();
}

}  // namespace

Status unique_keys_multi(const std::vector<UniqueTable>& tables, UniqueTableReport* d_reports,
                         cudaStream_t stream, DeviceAllocator* alloc, void* host_staging) {
  if (tables.empty()) return Status::OK();
  Members m;
  SOK_RETURN_IF_ERROR(group_members(tables, &m));
  const Blob layout = blob_layout(tables, num_groups(tables));
  int64_t cap[2];
  size_t scan_bytes[2];
  SOK_RETURN_IF_ERROR(group_sizes(m, cap, scan_bytes, stream));
  char* blob;
  uint64_t* slots[2];
  int64_t* pos_of[2];
  int32_t* upos[2];
  void* scan_tmp[2];
  Temp tmp;
  SOK_RETURN_IF_ERROR(carve_temp(alloc, stream, &tmp, [&](Workspace& ws) {
    blob = ws.take<char>(layout.bytes);
    for (int k = 0; k < 2; ++k) slots[k] = ws.take<uint64_t>(cap[k]);  // adjacent: one memset
    for (int k = 0; k < 2; ++k) {
      pos_of[k] = ws.take<int64_t>(m.total[k]);
      upos[k] = ws.take<int32_t>(m.total[k] + 1);
      scan_tmp[k] = ws.take_bytes(scan_bytes[k]);
    }
  }));
  std::vector<char> pageable;
  char* host = static_cast<char*>(host_staging);
  if (host == nullptr) {
    pageable.resize(layout.bytes);
    host = pageable.data();
  }
  Group g[2];
  fill_unique_blob(tables, m, layout, blob, host, g);
  SOK_CUDA_RETURN(cudaMemcpyAsync(blob, host, layout.bytes, cudaMemcpyHostToDevice, stream));
  SOK_CUDA_RETURN(
      cudaMemsetAsync(d_reports, 0xff, tables.size() * sizeof(UniqueTableReport), stream));
  if (cap[0] + cap[1] > 0) {
    char* begin = reinterpret_cast<char*>(cap[0] ? slots[0] : slots[1]);
    char* end =
        reinterpret_cast<char*>((cap[1] ? slots[1] : slots[0]) + (cap[1] ? cap[1] : cap[0]));
    SOK_CUDA_RETURN(cudaMemsetAsync(begin, 0xff, end - begin, stream));
  }
  if (!m.of[0].empty())
    SOK_RETURN_IF_ERROR(launch_group<int32_t>(g[0], slots[0], static_cast<uint64_t>(cap[0] - 1),
                                              pos_of[0], upos[0], scan_tmp[0], scan_bytes[0],
                                              d_reports, stream));
  if (!m.of[1].empty())
    SOK_RETURN_IF_ERROR(launch_group<int64_t>(g[1], slots[1], static_cast<uint64_t>(cap[1] - 1),
                                              pos_of[1], upos[1], scan_tmp[1], scan_bytes[1],
                                              d_reports, stream));
  return Status::OK();
}

// ---------------------------------------------------------------------------------------------
// Stable sample order: keys (table << sample_bits | sample), values the local positions; after a
// stable radix sort each table's ids are one run in sample order.
namespace {

__global__ void k_order_keys(Group g, int sample_bits, uint64_t* keys, int32_t* values) {
  const int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (j >= g.n) return;
  const int t = table_of(g, j);
  const int64_t l = j - g.first[t];
  const TableArgs& a = g.tables[t];
  keys[j] =
      (static_cast<uint64_t>(t) << sample_bits) | static_cast<uint64_t>(a.positions[l * a.rank]);
  values[j] = static_cast<int32_t>(l);
}

__global__ void k_order_scatter(Group g, const int32_t* sorted_values) {
  const int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (j >= g.n) return;
  const int t = table_of(g, j);
  g.tables[t].inverse[j - g.first[t]] = sorted_values[j];  // `inverse` holds the order here
}

}  // namespace

namespace {

// Consecutive tables whose (table, sample) keys fit 64 bits and ids fit the sort.
struct OrderBatch {
  size_t begin, end;
  int64_t n;
  int sample_bits, table_bits;
};

Status order_batches(const std::vector<SampleOrderTable>& tables, std::vector<OrderBatch>* out) {
  std::vector<OrderBatch>& batches = *out;
  for (size_t i = 0; i < tables.size(); ++i) {
    const SampleOrderTable& t = tables[i];
    if (t.n < 0 || t.n > kMaxIds || t.rank < 1)
      return Status::Invalid("stable_sample_order_multi: bad table arguments");
    const int sb = bits_for(static_cast<uint64_t>(std::max<int64_t>(t.num_samples - 1, 0)));
    if (!batches.empty()) {
      OrderBatch& b = batches.back();
      const size_t count = i + 1 - b.begin;
      const int s = std::max(b.sample_bits, sb);
      const int tb = bits_for(count - 1);
      if (s + tb <= 64 && b.n + t.n <= kMaxIds) {
        b.end = i + 1;
        b.n += t.n;
        b.sample_bits = s;
        b.table_bits = tb;
        continue;
      }
    }
    batches.push_back(OrderBatch{i, i + 1, t.n, sb, 0});
  }
  return Status::OK();
}

// The blob's host image and each batch's view of the device blob (as fill_unique_blob).
void fill_order_blob(const std::vector<SampleOrderTable>& tables,
                     const std::vector<OrderBatch>& batches, size_t first_at, const char* blob,
                     char* host, Group* g) {
  TableArgs* args = reinterpret_cast<TableArgs*>(host);
  int64_t* first = reinterpret_cast<int64_t*>(host + first_at);
  size_t f = 0;
  for (size_t k = 0; k < batches.size(); ++k) {
    const OrderBatch& b = batches[k];
    g[k].tables = reinterpret_cast<const TableArgs*>(blob) + b.begin;
    g[k].first = reinterpret_cast<const int64_t*>(blob + first_at) + f;
    g[k].num_tables = static_cast<int>(b.end - b.begin);
    g[k].n = b.n;
    int64_t at = 0;
    for (size_t i = b.begin; i < b.end; ++i) {
      const SampleOrderTable& t = tables[i];
      args[i] = TableArgs{nullptr, nullptr, t.order, nullptr, t.positions, nullptr, t.rank, 0};
      first[f++] = at;
      at += t.n;
    }
    first[f++] = at;
  }
}

}  // namespace

Status stable_sample_order_multi(const std::vector<SampleOrderTable>& tables, cudaStream_t stream,
                                 DeviceAllocator* alloc) {
  std::vector<OrderBatch> batches;
  SOK_RETURN_IF_ERROR(order_batches(tables, &batches));
  int64_t most = 0;
  size_t sort_bytes = 0;
  for (const OrderBatch& b : batches) {
    most = std::max(most, b.n);
    size_t bytes = 0;
    SOK_CUDA_RETURN(cub::DeviceRadixSort::SortPairs(
        nullptr, bytes, static_cast<uint64_t*>(nullptr), static_cast<uint64_t*>(nullptr),
        static_cast<int32_t*>(nullptr), static_cast<int32_t*>(nullptr), static_cast<int>(b.n), 0,
        b.sample_bits + b.table_bits, stream));
    sort_bytes = std::max(sort_bytes, bytes);
  }
  if (most == 0) return Status::OK();
  const size_t first_at = tables.size() * sizeof(TableArgs);
  const size_t blob_bytes = first_at + (tables.size() + batches.size()) * sizeof(int64_t);
  char* blob;
  uint64_t *keys_in, *keys_out;
  int32_t *values_in, *values_out;
  void* sort_tmp;
  Temp tmp;
  SOK_RETURN_IF_ERROR(carve_temp(alloc, stream, &tmp, [&](Workspace& ws) {
    blob = ws.take<char>(blob_bytes);
    keys_in = ws.take<uint64_t>(most);
    keys_out = ws.take<uint64_t>(most);
    values_in = ws.take<int32_t>(most);
    values_out = ws.take<int32_t>(most);
    sort_tmp = ws.take_bytes(sort_bytes);
  }));
  std::vector<char> host(blob_bytes);
  std::vector<Group> g(batches.size());
  fill_order_blob(tables, batches, first_at, blob, host.data(), g.data());
  SOK_CUDA_RETURN(cudaMemcpyAsync(blob, host.data(), blob_bytes, cudaMemcpyHostToDevice, stream));
  for (size_t k = 0; k < batches.size(); ++k) {
    if (g[k].n == 0) continue;
    const int grid = grid_for(g[k].n, kBlock);
    k_order_keys<<<grid, kBlock, 0, stream>>>(g[k], batches[k].sample_bits, keys_in, values_in);
    SOK_LAUNCH_CHECK();
    size_t bytes = sort_bytes;
    SOK_CUDA_RETURN(cub::DeviceRadixSort::SortPairs(
        sort_tmp, bytes, keys_in, keys_out, values_in, values_out, static_cast<int>(g[k].n), 0,
        batches[k].sample_bits + batches[k].table_bits, stream));
    k_order_scatter<<<grid, kBlock, 0, stream>>>(g[k], values_out);
    SOK_LAUNCH_CHECK();
  }
  return Status::OK();
}

// ---------------------------------------------------------------------------------------------
// The plan's view of the dedup's reports (unique_valid_counts).
namespace {

__global__ void k_valid_counts(const UniqueTableReport* reports, int n, int64_t* valid) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t < n) valid[t] = reports[t].first_outside >= 0 ? -1 : reports[t].num_unique;
}

}  // namespace

Status unique_valid_counts(const UniqueTableReport* d_reports, int n, int64_t* valid,
                           cudaStream_t stream) {
  if (n == 0) return Status::OK();
  k_valid_counts<<<grid_for(n, kBlock), kBlock, 0, stream>>>(d_reports, n, valid);
  SOK_LAUNCH_CHECK();
  return Status::OK();
}

}  // namespace gpu
}  // namespace sok
