// CUDA versions of lookup.h: unique_keys, bucketize_by_owner, pooled forward/backward, and the
// dense-table gather / fused pooled lookup. See gpu_api.h for the contracts.
#include <cuda_runtime.h>

#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_scan.cuh>

#include <algorithm>
#include <mutex>
#include <string>

#include "addons/sparse_operation_kit/core/common.h"
#include "addons/sparse_operation_kit/core/cuda/gpu_api.h"
#include "addons/sparse_operation_kit/core/cuda/gpu_common.cuh"
#include "addons/sparse_operation_kit/core/cuda/gpu_internal.h"

namespace sok {
namespace gpu {

using namespace detail;  // NOLINT

// ------------------------------------------------------------------------------------------------
// Allocator, errors.

namespace {
class StreamOrderedAllocator : public DeviceAllocator {
 public:
  void* allocate(size_t bytes, cudaStream_t stream) override {
    keep_pool_memory();
    void* p = nullptr;
    if (cudaMallocAsync(&p, bytes, stream) != cudaSuccess) {
      cudaGetLastError();
      return nullptr;
    }
    return p;
  }
  void deallocate(void* p, size_t, cudaStream_t stream) override { cudaFreeAsync(p, stream); }

 private:
  // The device's default pool gives memory back to the driver at every synchronisation unless
  // its release threshold is raised; re-mapping it each step would cost far more than the kernels.
  static void keep_pool_memory() {
    static std::mutex mu;
    static bool done[128] = {};
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 128) {
      cudaGetLastError();
      return;
    }
    std::lock_guard<std::mutex> l(mu);
    if (done[dev]) return;
    done[dev] = true;
    cudaMemPool_t pool;
    if (cudaDeviceGetDefaultMemPool(&pool, dev) == cudaSuccess) {
      uint64_t threshold = ~uint64_t{0};
      cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold);
    }
    cudaGetLastError();
  }
};
}  // namespace

namespace detail {
Tuning& tuning() {
  static Tuning t;
  return t;
}
}  // namespace detail

DeviceAllocator* default_allocator() {
  static StreamOrderedAllocator a;
  return &a;
}

namespace {
class DeviceMallocAllocator : public DeviceAllocator {
 public:
  void* allocate(size_t bytes, cudaStream_t) override {
    void* p = nullptr;
    if (cudaMalloc(&p, bytes) != cudaSuccess) {
      cudaGetLastError();
      return nullptr;
    }
    return p;
  }
  void deallocate(void* p, size_t, cudaStream_t) override { cudaFree(p); }
};
}  // namespace

DeviceAllocator* default_storage_allocator() {
  static DeviceMallocAllocator a;
  return &a;
}

std::string DeviceAllocator::describe_free_memory() {
  size_t free_bytes = 0, total = 0;
  if (cudaMemGetInfo(&free_bytes, &total) != cudaSuccess) {
    cudaGetLastError();
    return "free memory unknown";
  }
  return std::to_string(free_bytes) + " of " + std::to_string(total) + " bytes free on the device";
}

Status cuda_status(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return Status::OK();
  return Status::Invalid(std::string("CUDA error in ") + what + ": " + cudaGetErrorName(e) + " (" +
                         cudaGetErrorString(e) + ")");
}

Status reset_lookup_error(GpuLookupError* d_err, cudaStream_t stream, int count) {
  SOK_CUDA_RETURN(cudaMemsetAsync(d_err, 0xff, count * sizeof(GpuLookupError), stream));
  return Status::OK();
}

namespace {
// The message of a record read back to the host (OK if it holds no error).
Status describe_lookup_error(const GpuLookupError& h, const std::string& what) {
  if (h.packed == -1) return Status::OK();
  const int64_t pos = static_cast<int64_t>(static_cast<uint64_t>(h.packed) >> 3);
  const int64_t kind = h.packed & 7;
  std::string m = what + ": ";
  if (kind == 1) {
    m += "id " + std::to_string(h.value) + " at position " + std::to_string(pos) +
         " is outside the table's rows";
  } else if (kind == 2) {
    m += "id " + std::to_string(pos) + " belongs to sample " + std::to_string(h.value) +
         ", outside the batch";
  } else {
    m += "row_splits[" + std::to_string(pos) + "] = " + std::to_string(h.value) +
         " is not a valid split (must start at 0, not decrease, and end at the number of ids)";
  }
  return Status::Invalid(m);
}
}  // namespace

Status check_lookup_error(const GpuLookupError* d_err, const std::string& what, cudaStream_t stream) {
  return check_lookup_errors(d_err, {what}, stream);
}

Status check_lookup_errors(const GpuLookupError* d_err, const std::vector<std::string>& what,
                           cudaStream_t stream) {
  std::vector<GpuLookupError> h(what.size());
  if (h.empty()) return Status::OK();
  SOK_CUDA_RETURN(cudaMemcpyAsync(h.data(), d_err, h.size() * sizeof(GpuLookupError), cudaMemcpyDeviceToHost,
                                  stream));
  SOK_CUDA_RETURN(cudaStreamSynchronize(stream));
  for (size_t i = 0; i < h.size(); ++i) SOK_RETURN_IF_ERROR(describe_lookup_error(h[i], what[i]));
  return Status::OK();
}

namespace {

constexpr int kBlock = 256;

// Writes position/value/kind from the packed minimum (one thread).
template <typename I>
__global__ void k_finalize_error(GpuLookupError* err, const I* ids, const int64_t* seg,
                                 const int64_t* splits) {
  const unsigned long long p = static_cast<unsigned long long>(err->packed);
  if (p == ~0ull) return;
  const int64_t pos = static_cast<int64_t>(p >> 3);
  const int64_t kind = static_cast<int64_t>(p & 7);
  err->position = pos;
  err->kind = kind;
  if (kind == 1) err->value = ids ? static_cast<int64_t>(ids[pos]) : -1;
  else if (kind == 2) err->value = seg ? seg[pos] : -1;
  else err->value = splits ? splits[pos] : -1;
}

template <typename I>
Status finalize_error(GpuLookupError* err, const I* ids, const int64_t* seg, const int64_t* splits,
                      cudaStream_t s) {
  if (err == nullptr) return Status::OK();
  k_finalize_error<I><<<1, 1, 0, s>>>(err, ids, seg, splits);
  SOK_LAUNCH_CHECK();
  return Status::OK();
}

int bits_for(uint64_t max_value) {  // bits to represent values in [0, max_value]
  int b = 1;
  while (b < 64 && (max_value >> b) != 0) ++b;
  return b;
}

// ------------------------------------------------------------------------------------------------
// unique_keys: a temporary open-addressing set of input positions (the set stores positions, the
// key is read back from the input, so no key value is reserved). Order of first appearance comes
// from keeping the minimum position per key and a scan over "first occurrence" flags.

constexpr uint32_t kNoPos = 0xffffffffu;

// Equal keys of one warp insert once (through their lowest lane, whose position is the lowest);
// the minimum position is only lowered when needed, so hot keys hardly contend.
template <typename K>
__global__ void k_unique_insert(const K* keys, int64_t n, uint32_t* table, uint64_t mask,
                                int64_t* pos_of) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const bool valid = i < n;
  const K key = valid ? keys[i] : K(0);
  const unsigned active = __ballot_sync(0xffffffffu, valid);
  if (!valid) return;
  const unsigned peers = __match_any_sync(active, key);
  const int leader = __ffs(peers) - 1;
  uint64_t pos = hash_key(key) & mask;
  if ((threadIdx.x & 31) == leader) {
    while (true) {
      uint32_t cur = ld_relaxed_u32(table + pos);
      if (cur == kNoPos) {
        cur = atomicCAS(table + pos, kNoPos, static_cast<uint32_t>(i));
        if (cur == kNoPos) break;
      }
      if (keys[cur] == key) {
        if (cur > static_cast<uint32_t>(i)) atomicMin(table + pos, static_cast<uint32_t>(i));
        break;
      }
      pos = (pos + 1) & mask;
    }
  }
  pos = __shfl_sync(peers, pos, leader);
  pos_of[i] = static_cast<int64_t>(pos);
}

__global__ void k_unique_flags(const uint32_t* table, const int64_t* pos_of, int64_t n,
                               int32_t* flags) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  flags[i] = table[pos_of[i]] == static_cast<uint32_t>(i) ? 1 : 0;
}

template <typename K>
__global__ void k_unique_emit(const K* keys, int64_t n, const int32_t* flags, const int32_t* upos,
                              uint32_t* table, const int64_t* pos_of, K* unique, int64_t* counts,
                              int64_t* num_unique) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  if (flags[i]) {
    const int32_t u = upos[i];
    unique[u] = keys[i];
    table[pos_of[i]] = static_cast<uint32_t>(u);
    if (counts) counts[u] = 0;
  }
  if (i == n - 1) *num_unique = static_cast<int64_t>(upos[i]) + flags[i];
}

// Counting aggregated per warp (match_any): one atomic per distinct key per warp. (A per-block
// shared-memory aggregation was measured slower on H200: 0.26 vs 0.12 ms for 1M uniform ids.)
__global__ void k_unique_inverse(const uint32_t* table, const int64_t* pos_of, int64_t n,
                                 int32_t* inverse, int64_t* counts) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const bool valid = i < n;
  const int32_t u = valid ? static_cast<int32_t>(table[pos_of[i]]) : -1;
  if (valid) inverse[i] = u;
  if (counts == nullptr) return;
  const unsigned active = __ballot_sync(0xffffffffu, valid);
  if (!valid) return;
  const unsigned peers = __match_any_sync(active, u);
  if ((threadIdx.x & 31) == __ffs(peers) - 1)
    atomicAdd(reinterpret_cast<unsigned long long*>(counts + u),
              static_cast<unsigned long long>(__popc(peers)));
}

}  // namespace

template <typename K>
Status unique_keys(const K* keys, int64_t n, K* unique, int32_t* inverse, int64_t* counts,
                   int64_t* d_num_unique, cudaStream_t stream, DeviceAllocator* alloc) {
  if (n <= 0) {
    SOK_CUDA_RETURN(cudaMemsetAsync(d_num_unique, 0, sizeof(int64_t), stream));
    return Status::OK();
  }
  if (n >= (int64_t{1} << 31) - 1) return Status::Invalid("unique_keys: more than 2^31-2 keys");
  int64_t cap = 16;
  while (cap < 2 * n) cap <<= 1;
  size_t scan_bytes = 0;
  SOK_CUDA_RETURN(cub::DeviceScan::ExclusiveSum(nullptr, scan_bytes, static_cast<int32_t*>(nullptr),
                                                static_cast<int32_t*>(nullptr), static_cast<int>(n),
                                                stream));
  const size_t table_b = cap * sizeof(uint32_t), pos_b = n * sizeof(int64_t),
               flags_b = n * sizeof(int32_t);
  auto al = [](size_t b) { return (b + 255) & ~size_t(255); };
  Temp tmp;
  SOK_RETURN_IF_ERROR(tmp.alloc(alloc, al(table_b) + al(pos_b) + 2 * al(flags_b) + al(scan_bytes), stream));
  char* base = tmp.as<char>();
  uint32_t* table = reinterpret_cast<uint32_t*>(base);
  base += al(table_b);
  int64_t* pos_of = reinterpret_cast<int64_t*>(base);
  base += al(pos_b);
  int32_t* flags = reinterpret_cast<int32_t*>(base);
  base += al(flags_b);
  int32_t* upos = reinterpret_cast<int32_t*>(base);
  base += al(flags_b);
  void* scan_tmp = base;
  SOK_CUDA_RETURN(cudaMemsetAsync(table, 0xff, table_b, stream));
  const int g = grid_for(n, kBlock);
  k_unique_insert<K><<<g, kBlock, 0, stream>>>(keys, n, table, static_cast<uint64_t>(cap - 1), pos_of);
  SOK_LAUNCH_CHECK();
  k_unique_flags<<<g, kBlock, 0, stream>>>(table, pos_of, n, flags);
  SOK_LAUNCH_CHECK();
  SOK_CUDA_RETURN(cub::DeviceScan::ExclusiveSum(scan_tmp, scan_bytes, flags, upos,
                                                static_cast<int>(n), stream));
  k_unique_emit<K><<<g, kBlock, 0, stream>>>(keys, n, flags, upos, table, pos_of, unique, counts,
                                             d_num_unique);
  SOK_LAUNCH_CHECK();
  k_unique_inverse<<<g, kBlock, 0, stream>>>(table, pos_of, n, inverse, counts);
  SOK_LAUNCH_CHECK();
  return Status::OK();
}

// ------------------------------------------------------------------------------------------------
// bucketize_by_owner: a stable radix sort of owner ranks (keys past the device count sort last).

namespace {
// Owner ranks; counts per rank aggregated per block in shared memory (world <= 256) so the few
// rank counters see one atomic per block.
template <typename K>
__global__ void __launch_bounds__(256) k_owner(const K* keys, int64_t n, const int64_t* d_n, int world,
                                               uint32_t* owner, int64_t* idx, int64_t* counts) {
  __shared__ unsigned s_cnt[256];
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t m = effective_n(n, d_n);
  const bool in = i < n;
  const bool valid = i < m;
  const uint32_t o = valid ? static_cast<uint32_t>(floor_mod(keys[i], world)) : static_cast<uint32_t>(world);
  if (in) {
    owner[i] = o;
    idx[i] = i;
  }
  const bool small = world <= 256;
  if (small) {
    s_cnt[threadIdx.x] = 0;
    __syncthreads();
  }
  const unsigned active = __ballot_sync(0xffffffffu, valid);
  if (valid) {
    const unsigned peers = __match_any_sync(active, o);
    if ((threadIdx.x & 31) == __ffs(peers) - 1) {
      if (small) atomicAdd(&s_cnt[o], static_cast<unsigned>(__popc(peers)));
      else atomicAdd(reinterpret_cast<unsigned long long*>(counts + o), static_cast<unsigned long long>(__popc(peers)));
    }
  }
  if (small) {
    __syncthreads();
    if (threadIdx.x < world && s_cnt[threadIdx.x] != 0)
      atomicAdd(reinterpret_cast<unsigned long long*>(counts + threadIdx.x),
                static_cast<unsigned long long>(s_cnt[threadIdx.x]));
  }
}
}  // namespace

template <typename K>
Status bucketize_by_owner(const K* keys, int64_t n, const int64_t* d_n, int world_size,
                          int64_t* order, int64_t* counts, cudaStream_t stream,
                          DeviceAllocator* alloc) {
  if (world_size <= 0) return Status::Invalid("bucketize_by_owner: world_size must be positive");
  SOK_CUDA_RETURN(cudaMemsetAsync(counts, 0, sizeof(int64_t) * world_size, stream));
  if (n <= 0) return Status::OK();
  if (n >= (int64_t{1} << 31)) return Status::Invalid("bucketize_by_owner: too many keys");
  const int bits = bits_for(static_cast<uint64_t>(world_size));
  size_t sort_bytes = 0;
  SOK_CUDA_RETURN(cub::DeviceRadixSort::SortPairs(
      nullptr, sort_bytes, static_cast<uint32_t*>(nullptr), static_cast<uint32_t*>(nullptr),
      static_cast<int64_t*>(nullptr), static_cast<int64_t*>(nullptr), static_cast<int>(n), 0, bits, stream));
  auto al = [](size_t b) { return (b + 255) & ~size_t(255); };
  const size_t ob = n * sizeof(uint32_t), ib = n * sizeof(int64_t);
  Temp tmp;
  SOK_RETURN_IF_ERROR(tmp.alloc(alloc, 2 * al(ob) + al(ib) + al(sort_bytes), stream));
  char* base = tmp.as<char>();
  uint32_t* own_in = reinterpret_cast<uint32_t*>(base);
  uint32_t* own_out = reinterpret_cast<uint32_t*>(base + al(ob));
  int64_t* idx = reinterpret_cast<int64_t*>(base + 2 * al(ob));
  void* sort_tmp = base + 2 * al(ob) + al(ib);
  k_owner<K><<<grid_for(n, kBlock), kBlock, 0, stream>>>(keys, n, d_n, world_size, own_in, idx, counts);
  SOK_LAUNCH_CHECK();
  SOK_CUDA_RETURN(cub::DeviceRadixSort::SortPairs(sort_tmp, sort_bytes, own_in, own_out, idx, order,
                                                  static_cast<int>(n), 0, bits, stream));
  return Status::OK();
}

// ------------------------------------------------------------------------------------------------
// gather / scatter helpers.

namespace {
template <typename T>
__global__ void k_gather(const T* src, const int64_t* index, int64_t n, const int64_t* d_n, T* dst) {
  const int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (j < effective_n(n, d_n)) dst[j] = src[index[j]];
}

// One L-lane group per row; vectorised when dim % 4 == 0.
template <bool kScatter>
__global__ void k_move_rows(const float* src, int64_t dim, const int64_t* index, int64_t n,
                            const int64_t* d_n, float* dst) {
  constexpr int L = 8;
  const int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t j = t / L;
  const int l = static_cast<int>(t % L);
  if (j >= effective_n(n, d_n)) return;
  const int64_t r = index[j];
  const float* s = src + (kScatter ? j : r) * dim;
  float* d = dst + (kScatter ? r : j) * dim;
  if ((dim & 3) == 0) {
    for (int64_t c = 4 * l; c < dim; c += 4 * L)
      *reinterpret_cast<float4*>(d + c) = *reinterpret_cast<const float4*>(s + c);
  } else {
    for (int64_t c = l; c < dim; c += L) d[c] = s[c];
  }
}
}  // namespace

template <typename T>
Status gather(const T* src, const int64_t* index, int64_t n, const int64_t* d_n, T* dst,
              cudaStream_t stream) {
  if (n <= 0) return Status::OK();
  k_gather<T><<<grid_for(n, kBlock), kBlock, 0, stream>>>(src, index, n, d_n, dst);
  SOK_LAUNCH_CHECK();
  return Status::OK();
}

Status gather_rows(const float* src, int64_t dim, const int64_t* index, int64_t n,
                   const int64_t* d_n, float* dst, cudaStream_t stream) {
  if (n <= 0 || dim <= 0) return Status::OK();
  k_move_rows<false><<<grid_for(n * 8, kBlock), kBlock, 0, stream>>>(src, dim, index, n, d_n, dst);
  SOK_LAUNCH_CHECK();
  return Status::OK();
}

Status scatter_rows(const float* src, int64_t dim, const int64_t* index, int64_t n,
                    const int64_t* d_n, float* dst, cudaStream_t stream) {
  if (n <= 0 || dim <= 0) return Status::OK();
  k_move_rows<true><<<grid_for(n * 8, kBlock), kBlock, 0, stream>>>(src, dim, index, n, d_n, dst);
  SOK_LAUNCH_CHECK();
  return Status::OK();
}

// ------------------------------------------------------------------------------------------------
// Segments -> a CSR view: row_splits plus, for unsorted (or partly invalid) segment ids, a
// permutation that lists the ids of each sample. The choice is made on the device (flag), so
// no host round trip is needed.

namespace {

struct CsrView {
  const int64_t* splits = nullptr;  // [batch + 1]
  const int64_t* perm = nullptr;    // [n], used when *use_perm != 0
  const int* use_perm = nullptr;
  int64_t n = 0;

  __device__ __forceinline__ void range(int64_t b, int64_t* a, int64_t* e) const {
    int64_t x = splits[b], y = splits[b + 1];
    x = x < 0 ? 0 : (x > n ? n : x);
    y = y < x ? x : (y > n ? n : y);
    *a = x;
    *e = y;
  }
  __device__ __forceinline__ bool permuted() const { return use_perm != nullptr && *use_perm != 0; }
};

__device__ __forceinline__ int64_t id_at(const CsrView& v, bool permuted, int64_t j) {
  return permuted ? v.perm[j] : j;
}

__global__ void k_seg_count(const int64_t* seg, int64_t n, int64_t batch, int64_t* counts,
                            int* flag, GpuLookupError* err) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const bool in = i < n;
  const int64_t s = in ? seg[i] : -1;
  const bool good = in && s >= 0 && s < batch;
  if (in && !good) {
    report_error(err, i, 2);
    atomicOr(flag, 1);
  }
  if (in && i > 0 && seg[i - 1] > s) atomicOr(flag, 1);
  const unsigned active = __ballot_sync(0xffffffffu, good);
  if (!good) return;
  const unsigned peers = __match_any_sync(active, s);
  if ((threadIdx.x & 31) == __ffs(peers) - 1)
    atomicAdd(reinterpret_cast<unsigned long long*>(counts + s),
              static_cast<unsigned long long>(__popc(peers)));
}

__global__ void k_fill_perm(const int64_t* seg, int64_t n, int64_t batch, const int64_t* splits,
                            unsigned long long* cursor, const int* flag, int64_t* perm) {
  if (*flag == 0) return;
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const int64_t s = seg[i];
  if (s < 0 || s >= batch) return;
  perm[splits[s] + static_cast<int64_t>(atomicAdd(cursor + s, 1ull))] = i;
}

// Owns the temporaries of a CSR view built from segment ids.
struct CsrHolder {
  Temp tmp;
  CsrView view;
};

Status build_csr(const Segments& seg, int64_t n, int64_t batch, GpuLookupError* err,
                 cudaStream_t s, DeviceAllocator* alloc, CsrHolder* h) {
  h->view.n = n;
  // No ids at all: an empty segment_ids tensor may come as a null pointer.
  if (seg.segment_ids != nullptr && seg.row_splits != nullptr)
    return Status::Invalid("pooled lookup: give exactly one of segment_ids and row_splits");
  if (seg.segment_ids == nullptr && seg.row_splits == nullptr && n > 0)
    return Status::Invalid("pooled lookup: give exactly one of segment_ids and row_splits");
  if (seg.row_splits != nullptr) {  // validated inside the pooled kernel
    h->view.splits = seg.row_splits;
    return Status::OK();
  }
  size_t scan_bytes = 0;
  SOK_CUDA_RETURN(cub::DeviceScan::ExclusiveSum(nullptr, scan_bytes, static_cast<int64_t*>(nullptr),
                                                static_cast<int64_t*>(nullptr),
                                                static_cast<int64_t>(batch + 1), s));
  auto al = [](size_t b) { return (b + 255) & ~size_t(255); };
  const size_t cb = (batch + 1) * sizeof(int64_t), pb = (n > 0 ? n : 1) * sizeof(int64_t);
  SOK_RETURN_IF_ERROR(h->tmp.alloc(alloc, 3 * al(cb) + al(pb) + al(sizeof(int)) + al(scan_bytes), s));
  char* base = h->tmp.as<char>();
  int64_t* counts = reinterpret_cast<int64_t*>(base);
  int64_t* splits = reinterpret_cast<int64_t*>(base + al(cb));
  unsigned long long* cursor = reinterpret_cast<unsigned long long*>(base + 2 * al(cb));
  int64_t* perm = reinterpret_cast<int64_t*>(base + 3 * al(cb));
  int* flag = reinterpret_cast<int*>(base + 3 * al(cb) + al(pb));
  void* scan_tmp = base + 3 * al(cb) + al(pb) + al(sizeof(int));
  SOK_CUDA_RETURN(cudaMemsetAsync(counts, 0, cb, s));
  SOK_CUDA_RETURN(cudaMemsetAsync(cursor, 0, cb, s));
  SOK_CUDA_RETURN(cudaMemsetAsync(flag, 0, sizeof(int), s));
  if (n > 0) {
    k_seg_count<<<grid_for(n, kBlock), kBlock, 0, s>>>(seg.segment_ids, n, batch, counts, flag, err);
    SOK_LAUNCH_CHECK();
  }
  SOK_CUDA_RETURN(cub::DeviceScan::ExclusiveSum(scan_tmp, scan_bytes, counts, splits,
                                                static_cast<int64_t>(batch + 1), s));
  if (n > 0) {
    k_fill_perm<<<grid_for(n, kBlock), kBlock, 0, s>>>(seg.segment_ids, n, batch, splits, cursor,
                                                       flag, perm);
    SOK_LAUNCH_CHECK();
  }
  h->view.splits = splits;
  h->view.perm = perm;
  h->view.use_perm = flag;
  return Status::OK();
}

// ------------------------------------------------------------------------------------------------
// Pooled forward. One warp per sample; the warp is cut into S = 32 / L groups of L lanes, each
// lane holding VEC consecutive columns. The ids come 32 at a time in one coalesced load (lane q
// holds id q of the chunk, and the next chunk's ids are loaded before this chunk's rows), then
// group k reads the rows of ids k, k+S, ... of the chunk, up to 8 rows per lane in flight, and
// the groups are summed with shuffles at the end.

template <typename I>
struct RowSrc {
  const float* rows;
  int64_t num_rows;
  const I* idx;
  int64_t dim;
  GpuLookupError* err;
  // Row of id i, or -1 (reported when `report`).
  __device__ __forceinline__ int64_t index(int64_t i, bool report) const {
    const int64_t r = static_cast<int64_t>(idx[i]);
    if (r < 0 || r >= num_rows) {
      if (report) report_error(err, i, 1);
      return -1;
    }
    return r;
  }
};

template <int VEC>
struct Vec {
  float v[VEC];
};

template <int VEC>
__device__ __forceinline__ Vec<VEC> load_vec(const float* p) {
  Vec<VEC> r;
  if constexpr (VEC == 4) {
    const float4 x = __ldg(reinterpret_cast<const float4*>(p));
    r.v[0] = x.x;
    r.v[1] = x.y;
    r.v[2] = x.z;
    r.v[3] = x.w;
  } else {
    r.v[0] = __ldg(p);
  }
  return r;
}

template <int VEC>
__device__ __forceinline__ void store_vec(float* p, const float* v) {
  if constexpr (VEC == 4) {
    *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
  } else {
    p[0] = v[0];
  }
}

// Variant 1: each group loads its own ids (U per lane in flight, one id load ahead of its rows).
template <int L, int VEC, int U, typename I>
__device__ __forceinline__ void pooled_v1_body(const RowSrc<I>& src, const CsrView& csr,
                                               const float* weights, int64_t batch, int64_t dim,
                                               int combiner, float* out) {
  constexpr int S = 32 / L;
  const int lane = threadIdx.x & 31;
  const int64_t b = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) >> 5;
  if (b >= batch) return;
  int64_t a, e;
  csr.range(b, &a, &e);
  const bool perm = csr.permuted();
  const int sub = lane / L, l = lane % L;
  float scale = 1.f;
  if (combiner != static_cast<int>(Combiner::kSum)) {
    double acc = 0.0;
    for (int64_t j = a + lane; j < e; j += 32) {
      const int64_t i = id_at(csr, perm, j);
      if (src.index(i, false) < 0) continue;
      const double w = weights ? weights[i] : 1.0;
      acc += combiner == static_cast<int>(Combiner::kMean) ? w : w * w;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    const double denom = combiner == static_cast<int>(Combiner::kMean) ? acc : sqrt(acc);
    scale = denom == 0.0 ? 0.f : static_cast<float>(1.0 / denom);
  }
  for (int64_t cb = 0; cb < dim; cb += L * VEC) {
    const int64_t c0 = cb + l * VEC;
    const bool cv = c0 < dim;
    float acc[VEC];
#pragma unroll
    for (int k = 0; k < VEC; ++k) acc[k] = 0.f;
    for (int64_t j0 = a + sub; j0 < e; j0 += S * U) {
      int64_t rr[U];
      float wv[U];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int64_t j = j0 + static_cast<int64_t>(u) * S;
        rr[u] = -1;
        wv[u] = 0.f;
        if (j < e) {
          const int64_t i = id_at(csr, perm, j);
          rr[u] = src.index(i, cb == 0 && l == 0);
          wv[u] = weights ? weights[i] : 1.f;
        }
      }
      Vec<VEC> x[U];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        if (rr[u] >= 0 && cv) x[u] = load_vec<VEC>(src.rows + rr[u] * dim + c0);
        else {
#pragma unroll
          for (int k = 0; k < VEC; ++k) x[u].v[k] = 0.f;
        }
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
#pragma unroll
        for (int k = 0; k < VEC; ++k) acc[k] += wv[u] * x[u].v[k];
      }
    }
#pragma unroll
    for (int o = L; o < 32; o <<= 1) {
#pragma unroll
      for (int k = 0; k < VEC; ++k) acc[k] += __shfl_xor_sync(0xffffffffu, acc[k], o);
    }
    if (sub == 0 && cv) {
#pragma unroll
      for (int k = 0; k < VEC; ++k) acc[k] *= scale;
      store_vec<VEC>(out + b * dim + c0, acc);
    }
  }
}

// Variant 2: 32 ids per coalesced warp load, shuffled to the groups, next chunk prefetched.
template <int L, int VEC, typename I>
__device__ __forceinline__ void pooled_v2_body(const RowSrc<I>& src, const CsrView& csr,
                                               const float* weights, int64_t batch, int64_t dim,
                                               int combiner, float* out) {
  constexpr int S = 32 / L;       // groups per warp
  constexpr int PER = 32 / S;     // ids of a 32-id chunk per group (= L)
  constexpr int U = PER < 8 ? PER : 8;  // rows in flight per lane
  const int lane = threadIdx.x & 31;
  const int64_t b = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) >> 5;
  if (b >= batch) return;
  int64_t a, e;
  csr.range(b, &a, &e);
  const bool perm = csr.permuted();
  const int sub = lane / L, l = lane % L;
  for (int64_t cb = 0; cb < dim; cb += L * VEC) {
    const int64_t c0 = cb + l * VEC;
    const bool cv = c0 < dim;
    const bool report = cb == 0;
    float acc[VEC];
#pragma unroll
    for (int k = 0; k < VEC; ++k) acc[k] = 0.f;
    double wsum = 0.0;
    // Row and weight of id (j0 + lane), prefetched one chunk ahead.
    auto fetch = [&](int64_t j0, int64_t* r, float* w) {
      const int64_t j = j0 + lane;
      *r = -1;
      *w = 0.f;
      if (j < e) {
        const int64_t i = id_at(csr, perm, j);
        *r = src.index(i, report);
        if (*r >= 0) *w = weights ? weights[i] : 1.f;
      }
    };
    int64_t r_cur;
    float w_cur;
    fetch(a, &r_cur, &w_cur);
    for (int64_t j0 = a; j0 < e; j0 += 32) {
      int64_t r_next = -1;
      float w_next = 0.f;
      if (j0 + 32 < e) fetch(j0 + 32, &r_next, &w_next);
      if (combiner != static_cast<int>(Combiner::kSum) && r_cur >= 0)
        wsum += combiner == static_cast<int>(Combiner::kMean) ? static_cast<double>(w_cur)
                                                               : static_cast<double>(w_cur) * w_cur;
#pragma unroll
      for (int u0 = 0; u0 < PER; u0 += U) {
        Vec<VEC> x[U];
        float wv[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
          const int q = (u0 + u) * S + sub;
          const int64_t rr = __shfl_sync(0xffffffffu, r_cur, q);
          wv[u] = __shfl_sync(0xffffffffu, w_cur, q);
          if (rr >= 0 && cv) {
            x[u] = load_vec<VEC>(src.rows + rr * dim + c0);
          } else {
#pragma unroll
            for (int k = 0; k < VEC; ++k) x[u].v[k] = 0.f;
          }
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
#pragma unroll
          for (int k = 0; k < VEC; ++k) acc[k] += wv[u] * x[u].v[k];
        }
      }
      r_cur = r_next;
      w_cur = w_next;
    }
#pragma unroll
    for (int o = L; o < 32; o <<= 1) {
#pragma unroll
      for (int k = 0; k < VEC; ++k) acc[k] += __shfl_xor_sync(0xffffffffu, acc[k], o);
    }
    float scale = 1.f;
    if (combiner != static_cast<int>(Combiner::kSum)) {
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) wsum += __shfl_xor_sync(0xffffffffu, wsum, o);
      const double denom = combiner == static_cast<int>(Combiner::kMean) ? wsum : sqrt(wsum);
      scale = denom == 0.0 ? 0.f : static_cast<float>(1.0 / denom);
    }
    if (sub == 0 && cv) {
#pragma unroll
      for (int k = 0; k < VEC; ++k) acc[k] *= scale;
      store_vec<VEC>(out + b * dim + c0, acc);
    }
  }
}

// Error checks fused into the pooled kernel (one launch instead of three): each warp validates
// its sample's user row splits, and the last block to finish writes position/value/kind from the
// packed minimum (the classic last-block pattern; the record's counter is reset by that block).
struct Checks {
  const int64_t* splits = nullptr;  // user row splits to validate, or null
  const int64_t* seg = nullptr;     // segment ids (for the value of a kind-2 report), or null
  int64_t n = 0;
};

template <typename I>
__device__ __forceinline__ void check_splits_of(const RowSrc<I>& src, const Checks& ck, int64_t b,
                                                int64_t batch) {
  const int64_t* sp = ck.splits;
  if (sp[b + 1] < sp[b]) report_error(src.err, b + 1, 3);
  if (b == 0 && sp[0] != 0) report_error(src.err, 0, 3);
  if (b == batch - 1 && sp[batch] != ck.n) report_error(src.err, batch, 3);
}

template <typename I>
__device__ __forceinline__ void finish_block(const RowSrc<I>& src, const Checks& ck) {
  __syncthreads();
  if (threadIdx.x != 0) return;
  GpuLookupError* err = src.err;
  __threadfence();
  const unsigned long long ticket = atomicAdd(reinterpret_cast<unsigned long long*>(&err->blocks_done), 1ull);
  if (ticket != static_cast<unsigned long long>(gridDim.x) - 2ull) return;  // counter starts at ~0
  __threadfence();
  const unsigned long long p = static_cast<unsigned long long>(ld_relaxed_i64(&err->packed));
  if (p != ~0ull) {
    const int64_t pos = static_cast<int64_t>(p >> 3);
    const int64_t kind = static_cast<int64_t>(p & 7);
    err->position = pos;
    err->kind = kind;
    if (kind == 1) err->value = static_cast<int64_t>(src.idx[pos]);
    else if (kind == 2) err->value = ck.seg ? ck.seg[pos] : -1;
    else err->value = ck.splits ? ck.splits[pos] : -1;
  }
  err->blocks_done = -1;
}

template <int L, int VEC, int U, int V, typename I>
__global__ void __launch_bounds__(256) k_pooled_forward(RowSrc<I> src, CsrView csr, const float* weights,
                                                        int64_t batch, int64_t dim, int combiner, float* out,
                                                        Checks ck) {
  const int64_t b = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) >> 5;
  if (b < batch) {
    if (src.err != nullptr && ck.splits != nullptr && (threadIdx.x & 31) == 0) check_splits_of(src, ck, b, batch);
    if (V == 2) pooled_v2_body<L, VEC, I>(src, csr, weights, batch, dim, combiner, out);
    else pooled_v1_body<L, VEC, U, I>(src, csr, weights, batch, dim, combiner, out);
  }
  if (src.err != nullptr) finish_block(src, ck);
}

template <typename I>
Status pooled_forward_impl(const RowSrc<I>& src, const CsrView& csr, const float* weights,
                           int64_t batch, int64_t dim, Combiner combiner, float* out,
                           cudaStream_t s, const Checks& ck) {
  if (batch <= 0 || dim <= 0) {
    if (src.err != nullptr) return finalize_error<I>(src.err, src.idx, ck.seg, ck.splits, s);
    return Status::OK();
  }
  const int grid = grid_for(batch * 32, kBlock);
  const int c = static_cast<int>(combiner);
  const bool v4 = (dim % 4) == 0 && (reinterpret_cast<uintptr_t>(src.rows) % 16) == 0 &&
                  (reinterpret_cast<uintptr_t>(out) % 16) == 0;
  const int lanes = v4 ? static_cast<int>(std::min<int64_t>(dim / 4, 32)) : static_cast<int>(std::min<int64_t>(dim, 32));
  const int L = lanes <= 8 ? 8 : (lanes <= 16 && v4 ? 16 : 32);
  // Default (measured on H200, benchmarks/gpu/RESULTS.md): 8 rows in flight per lane when a
  // row takes at most 16 lanes (dim <= 64), 4 for wider rows.
  const int tv = detail::tuning().pooled_variant;
  const int variant = (tv >= 1 && tv <= 3) ? tv : (L <= 16 ? 3 : 1);
#define SOK_POOL(LL, VV)                                                                                   \
  do {                                                                                                     \
    if (variant == 2)                                                                                      \
      k_pooled_forward<LL, VV, 4, 2, I><<<grid, kBlock, 0, s>>>(src, csr, weights, batch, dim, c, out, ck); \
    else if (variant == 3)                                                                                 \
      k_pooled_forward<LL, VV, 8, 1, I><<<grid, kBlock, 0, s>>>(src, csr, weights, batch, dim, c, out, ck); \
    else                                                                                                   \
      k_pooled_forward<LL, VV, 4, 1, I><<<grid, kBlock, 0, s>>>(src, csr, weights, batch, dim, c, out, ck); \
  } while (0)
  if (v4) {
    if (L == 8) SOK_POOL(8, 4);
    else if (L == 16) SOK_POOL(16, 4);
    else SOK_POOL(32, 4);
  } else {
    if (L == 8) SOK_POOL(8, 1);
    else SOK_POOL(32, 1);
  }
#undef SOK_POOL
  SOK_LAUNCH_CHECK();
  return Status::OK();
}

}  // namespace

Status pooled_forward(const float* rows, int64_t dim, int64_t num_rows, const int32_t* inverse,
                      Segments seg, const float* weights, int64_t n, int64_t batch,
                      Combiner combiner, float* out, cudaStream_t stream, GpuLookupError* d_err,
                      DeviceAllocator* alloc) {
  CsrHolder h;
  SOK_RETURN_IF_ERROR(build_csr(seg, n, batch, d_err, stream, alloc, &h));
  RowSrc<int32_t> src{rows, num_rows, inverse, dim, d_err};
  Checks ck;
  ck.splits = seg.row_splits;
  ck.seg = seg.segment_ids;
  ck.n = n;
  return pooled_forward_impl(src, h.view, weights, batch, dim, combiner, out, stream, ck);
}

template <typename I>
Status static_pooled_forward(const float* table, int64_t num_rows, int64_t dim, const I* ids,
                             Segments seg, const float* weights, int64_t n, int64_t batch,
                             Combiner combiner, float* out, GpuLookupError* d_err,
                             cudaStream_t stream, DeviceAllocator* alloc) {
  if (d_err == nullptr) return Status::Invalid("static_pooled_forward: an error record is required");
  CsrHolder h;
  SOK_RETURN_IF_ERROR(build_csr(seg, n, batch, d_err, stream, alloc, &h));
  RowSrc<I> src{table, num_rows, ids, dim, d_err};
  Checks ck;
  ck.splits = seg.row_splits;
  ck.seg = seg.segment_ids;
  ck.n = n;
  return pooled_forward_impl(src, h.view, weights, batch, dim, combiner, out, stream, ck);
}

// ------------------------------------------------------------------------------------------------
// Dense gather with a range check.

namespace {
template <typename I>
__global__ void k_gather_static(const float* table, int64_t num_rows, int64_t dim, const I* ids,
                                int64_t n, float* out, GpuLookupError* err) {
  constexpr int L = 8;
  const int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t i = t / L;
  const int l = static_cast<int>(t % L);
  if (i >= n) return;
  const int64_t r = static_cast<int64_t>(ids[i]);
  float* d = out + i * dim;
  if (r < 0 || r >= num_rows) {
    if (l == 0) report_error(err, i, 1);
    for (int64_t c = l; c < dim; c += L) d[c] = 0.f;
    return;
  }
  const float* s = table + r * dim;
  if ((dim & 3) == 0) {
    for (int64_t c = 4 * l; c < dim; c += 4 * L)
      *reinterpret_cast<float4*>(d + c) = __ldg(reinterpret_cast<const float4*>(s + c));
  } else {
    for (int64_t c = l; c < dim; c += L) d[c] = __ldg(s + c);
  }
}
}  // namespace

template <typename I>
Status gather_static(const float* table, int64_t num_rows, int64_t dim, const I* ids, int64_t n,
                     float* out, GpuLookupError* d_err, cudaStream_t stream) {
  if (d_err == nullptr) return Status::Invalid("gather_static: an error record is required");
  if (n <= 0 || dim <= 0) return Status::OK();
  k_gather_static<I><<<grid_for(n * 8, kBlock), kBlock, 0, stream>>>(table, num_rows, dim, ids, n,
                                                                     out, d_err);
  SOK_LAUNCH_CHECK();
  return finalize_error<I>(d_err, ids, nullptr, nullptr, stream);
}

// ------------------------------------------------------------------------------------------------
// sum_rows_by_group (backward aggregation and the optimizer's duplicate summing): stable radix
// sort of (group, id), then fixed chunks of kChunk sorted ids; a group inside one chunk is written
// directly, a group crossing chunks leaves one partial per chunk, summed in order afterwards.

namespace detail {
namespace {

constexpr int kChunk = 64;

__global__ void k_group_prep(const int32_t* group, const int64_t* src_row, int64_t num_src_rows,
                             int64_t n, int64_t G, uint32_t* keys, int32_t* vals) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const int64_t g = group[i];
  bool valid = g >= 0 && g < G;
  if (valid && src_row != nullptr) {
    const int64_t r = src_row[i];
    valid = r >= 0 && (num_src_rows <= 0 || r < num_src_rows);
  }
  keys[i] = valid ? static_cast<uint32_t>(g) : static_cast<uint32_t>(G);
  vals[i] = static_cast<int32_t>(i);
}

__global__ void k_group_bounds(const uint32_t* keys, int64_t n, int64_t G, int32_t* start, int32_t* end,
                               int64_t* nvalid) {
  const int64_t p = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (p >= n) return;
  const uint32_t g = keys[p];
  if (g >= G) return;
  if (p == 0 || keys[p - 1] != g) start[g] = static_cast<int32_t>(p);
  if (p == n - 1 || keys[p + 1] != g) end[g] = static_cast<int32_t>(p + 1);
  if (p == n - 1 || keys[p + 1] >= G) *nvalid = p + 1;  // valid ids form a prefix (G sorts last)
}

struct GroupSrc {
  const float* src;
  const int64_t* src_row;
  const float* weights;
  const float* scale;
  int64_t dim;
  __device__ __forceinline__ void at(int32_t i, int64_t* row, float* w) const {
    const int64_t r = src_row ? src_row[i] : static_cast<int64_t>(i);
    float x = weights ? weights[i] : 1.f;
    if (scale) x *= scale[r];
    *w = x;
    *row = r;
  }
};

// One L-lane tile per chunk of kChunk sorted ids. The chunk's (group, source row, weight) are
// staged in shared memory first (coalesced loads, no dependent index loads in the sum loop), then
// rows are loaded 4 at a time across group boundaries and summed in id order. A group that lies
// in the chunk is written to out; one that began earlier leaves partial [2c], one that goes on
// leaves partial [2c+1] and is listed for the fixup.
template <int L, int VEC>
__global__ void __launch_bounds__(256) k_group_chunks(GroupSrc gs, const uint32_t* keys, const int32_t* vals,
                                                      int64_t n, const int64_t* nvalid, float* partials,
                                                      float* out, int32_t* split_list, int* split_count) {
  constexpr int TPB = 256 / L;
  __shared__ int32_t s_g[TPB][kChunk];
  __shared__ int64_t s_r[TPB][kChunk];
  __shared__ float s_w[TPB][kChunk];
  const int tb = threadIdx.x / L, l = threadIdx.x % L;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * TPB + tb;
  const int64_t nv = *nvalid;
  const int64_t p0 = c * kChunk;
  const int64_t p1 = p0 + kChunk < nv ? p0 + kChunk : nv;
  const int m = p0 < nv ? static_cast<int>(p1 - p0) : 0;
  for (int e = l; e < m; e += L) {
    const int32_t i = vals[p0 + e];
    int64_t r;
    float w;
    gs.at(i, &r, &w);
    s_g[tb][e] = static_cast<int32_t>(keys[p0 + e]);
    s_r[tb][e] = r;
    s_w[tb][e] = w;
  }
  __syncthreads();
  if (m == 0) return;
  const int64_t prev_key = p0 > 0 ? static_cast<int64_t>(keys[p0 - 1]) : -1;
  const int64_t next_key = p1 < nv ? static_cast<int64_t>(keys[p1]) : -1;
  const int64_t dim = gs.dim;
  for (int64_t cb = 0; cb < dim; cb += L * VEC) {
    const int64_t c0 = cb + l * VEC;
    const bool cv = c0 < dim;
    int32_t cur = s_g[tb][0];
    bool first = true;
    float acc[VEC];
#pragma unroll
    for (int k = 0; k < VEC; ++k) acc[k] = 0.f;
    auto flush = [&](bool last) {
      const bool before = first && prev_key == cur;
      const bool after = last && next_key == cur;
      float* dst;
      if (!before && !after) dst = out + static_cast<int64_t>(cur) * dim;
      else if (before) dst = partials + (2 * c) * dim;
      else {
        dst = partials + (2 * c + 1) * dim;
        if (cb == 0 && l == 0) split_list[atomicAdd(split_count, 1)] = cur;
      }
      if (cv) store_vec<VEC>(dst + c0, acc);
    };
    for (int e0 = 0; e0 < m; e0 += 4) {
      Vec<VEC> x[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        if (e0 + u < m && cv) x[u] = load_vec<VEC>(gs.src + s_r[tb][e0 + u] * dim + c0);
        else {
#pragma unroll
          for (int k = 0; k < VEC; ++k) x[u].v[k] = 0.f;
        }
      }
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        if (e0 + u < m) {
          const int32_t g = s_g[tb][e0 + u];
          if (g != cur) {
            flush(false);
            cur = g;
            first = false;
#pragma unroll
            for (int k = 0; k < VEC; ++k) acc[k] = 0.f;
          }
          const float w = s_w[tb][e0 + u];
#pragma unroll
          for (int k = 0; k < VEC; ++k) acc[k] += w * x[u].v[k];
        }
      }
    }
    flush(true);
  }
}

// Rows no id names are zero.
__global__ void k_group_zero(const int32_t* start, int64_t G, const int64_t* d_G, int64_t dim, float* out) {
  const int64_t g = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (g >= effective_n(G, d_G) || start[g] >= 0) return;
  for (int64_t c = 0; c < dim; ++c) out[g * dim + c] = 0.f;
}

// Groups that cross chunks: one block per group (grid-stride over the list), its 8 warps sum
// fixed strided subsets of the partials, then warp 0 adds the 8 sums in order (deterministic).
template <int VEC>
__global__ void __launch_bounds__(256) k_group_fixup(const int32_t* split_list, const int* split_count,
                                                     const int32_t* start, const int32_t* end,
                                                     const float* partials, int64_t dim, float* out) {
  constexpr int W = 8;
  __shared__ float red[W][32 * VEC];
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  const int count = *split_count;
  for (int j = blockIdx.x; j < count; j += gridDim.x) {
    const int32_t g = split_list[j];
    const int64_t cs = start[g] / kChunk, ce = (static_cast<int64_t>(end[g]) - 1) / kChunk;
    const int64_t K = ce - cs + 1;  // partial 0: [2cs+1]; partial k >= 1: [2(cs+k)]
    for (int64_t cb = 0; cb < dim; cb += 32 * VEC) {
      const int64_t c0 = cb + lane * VEC;
      const bool cv = c0 < dim;
      float acc[VEC];
#pragma unroll
      for (int k = 0; k < VEC; ++k) acc[k] = 0.f;
      for (int64_t k0 = w; k0 < K; k0 += 4 * W) {
        Vec<VEC> x[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) {
          const int64_t k = k0 + u * W;
          if (k < K && cv) {
            const int64_t slot = k == 0 ? 2 * cs + 1 : 2 * (cs + k);
            x[u] = load_vec<VEC>(partials + slot * dim + c0);
          } else {
#pragma unroll
            for (int q = 0; q < VEC; ++q) x[u].v[q] = 0.f;
          }
        }
#pragma unroll
        for (int u = 0; u < 4; ++u) {
#pragma unroll
          for (int q = 0; q < VEC; ++q) acc[q] += x[u].v[q];
        }
      }
#pragma unroll
      for (int q = 0; q < VEC; ++q) red[w][lane * VEC + q] = acc[q];
      __syncthreads();
      if (w == 0 && cv) {
        float t[VEC];
#pragma unroll
        for (int q = 0; q < VEC; ++q) {
          t[q] = red[0][lane * VEC + q];
          for (int ww = 1; ww < W; ++ww) t[q] += red[ww][lane * VEC + q];
        }
        store_vec<VEC>(out + static_cast<int64_t>(g) * dim + c0, t);
      }
      __syncthreads();
    }
  }
}

template <int L, int VEC>
Status launch_group_kernels(const GroupSrc& gs, const uint32_t* keys, const int32_t* vals, int64_t n,
                            const int64_t* nvalid, int64_t G, const int64_t* d_G, const int32_t* start,
                            const int32_t* end, float* partials, int32_t* split_list, int* split_count,
                            float* out, cudaStream_t s) {
  constexpr int TPB = 256 / L;
  const int64_t chunks = ceil_div(n, kChunk);
  if (chunks > 0) {
    k_group_chunks<L, VEC><<<grid_for(chunks, TPB), 256, 0, s>>>(gs, keys, vals, n, nvalid, partials, out,
                                                                   split_list, split_count);
    SOK_LAUNCH_CHECK();
  }
  k_group_zero<<<grid_for(G, kBlock), kBlock, 0, s>>>(start, G, d_G, gs.dim, out);
  SOK_LAUNCH_CHECK();
  int dev = 0, sms = 132;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  k_group_fixup<VEC><<<4 * sms, 256, 0, s>>>(split_list, split_count, start, end, partials, gs.dim, out);
  SOK_LAUNCH_CHECK();
  return Status::OK();
}

}  // namespace

Status sum_rows_by_group(const float* src, int64_t dim, const int32_t* group, const int64_t* src_row,
                         int64_t num_src_rows, const float* weights, const float* scale, int64_t n,
                         int64_t num_groups, const int64_t* d_num_groups, float* out,
                         cudaStream_t stream, DeviceAllocator* alloc) {
  if (num_groups <= 0 || dim <= 0) return Status::OK();
  if (n >= (int64_t{1} << 31) - 1 || num_groups >= (int64_t{1} << 31) - 1)
    return Status::Invalid("sum_rows_by_group: more than 2^31-2 ids or rows");
  const int64_t nn = n > 0 ? n : 0;
  const int bits = bits_for(static_cast<uint64_t>(num_groups));
  size_t sort_bytes = 0;
  if (nn > 0) {
    SOK_CUDA_RETURN(cub::DeviceRadixSort::SortPairs(
        nullptr, sort_bytes, static_cast<uint32_t*>(nullptr), static_cast<uint32_t*>(nullptr),
        static_cast<int32_t*>(nullptr), static_cast<int32_t*>(nullptr), static_cast<int>(nn), 0,
        bits, stream));
  }
  auto al = [](size_t b) { return (b + 255) & ~size_t(255); };
  const int64_t chunks = ceil_div(nn, kChunk);
  const size_t kb = (nn + 1) * sizeof(uint32_t), gb = num_groups * sizeof(int32_t),
               pb = (2 * chunks + 1) * dim * sizeof(float), lb = (chunks + 1) * sizeof(int32_t);
  Temp tmp;
  SOK_RETURN_IF_ERROR(tmp.alloc(alloc, 4 * al(kb) + 2 * al(gb) + al(pb) + al(lb) + al(16) + al(sort_bytes), stream));
  char* base = tmp.as<char>();
  uint32_t* keys_in = reinterpret_cast<uint32_t*>(base);
  uint32_t* keys_out = reinterpret_cast<uint32_t*>(base + al(kb));
  int32_t* vals_in = reinterpret_cast<int32_t*>(base + 2 * al(kb));
  int32_t* vals_out = reinterpret_cast<int32_t*>(base + 3 * al(kb));
  base += 4 * al(kb);
  int32_t* start = reinterpret_cast<int32_t*>(base);
  int32_t* end = reinterpret_cast<int32_t*>(base + al(gb));
  base += 2 * al(gb);
  float* partials = reinterpret_cast<float*>(base);
  base += al(pb);
  int32_t* split_list = reinterpret_cast<int32_t*>(base);
  base += al(lb);
  int64_t* nvalid = reinterpret_cast<int64_t*>(base);
  int* split_count = reinterpret_cast<int*>(base + 8);
  base += al(16);
  void* sort_tmp = base;
  SOK_CUDA_RETURN(cudaMemsetAsync(start, 0xff, gb, stream));
  SOK_CUDA_RETURN(cudaMemsetAsync(nvalid, 0, 16, stream));  // nvalid and split_count
  if (nn > 0) {
    k_group_prep<<<grid_for(nn, kBlock), kBlock, 0, stream>>>(group, src_row, num_src_rows, nn,
                                                              num_groups, keys_in, vals_in);
    SOK_LAUNCH_CHECK();
    SOK_CUDA_RETURN(cub::DeviceRadixSort::SortPairs(sort_tmp, sort_bytes, keys_in, keys_out, vals_in,
                                                    vals_out, static_cast<int>(nn), 0, bits, stream));
    k_group_bounds<<<grid_for(nn, kBlock), kBlock, 0, stream>>>(keys_out, nn, num_groups, start, end, nvalid);
    SOK_LAUNCH_CHECK();
  }
  GroupSrc gs{src, src_row, weights, scale, dim};
  const bool v4 = (dim % 4) == 0 && (reinterpret_cast<uintptr_t>(src) % 16) == 0 &&
                  (reinterpret_cast<uintptr_t>(out) % 16) == 0;
#define SOK_GROUP_LAUNCH(L, V)                                                                       \
  return launch_group_kernels<L, V>(gs, keys_out, vals_out, nn, nvalid, num_groups, d_num_groups, start, \
                                    end, partials, split_list, split_count, out, stream)
  if (v4) {
    const int64_t lanes = dim / 4;
    if (lanes <= 8) SOK_GROUP_LAUNCH(8, 4);
    if (lanes <= 16) SOK_GROUP_LAUNCH(16, 4);
    SOK_GROUP_LAUNCH(32, 4);
  }
  if (dim <= 8) SOK_GROUP_LAUNCH(8, 1);
  SOK_GROUP_LAUNCH(32, 1);
#undef SOK_GROUP_LAUNCH
}

}  // namespace detail

// ------------------------------------------------------------------------------------------------
// Pooled backward.

namespace {

__global__ void k_segment_scale(CsrView csr, const float* weights, int64_t batch, int combiner,
                                float* scale) {
  const int lane = threadIdx.x & 31;
  const int64_t b = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) >> 5;
  if (b >= batch) return;
  int64_t a, e;
  csr.range(b, &a, &e);
  const bool perm = csr.permuted();
  double acc = 0.0;
  for (int64_t j = a + lane; j < e; j += 32) {
    const int64_t i = id_at(csr, perm, j);
    const double w = weights ? weights[i] : 1.0;
    acc += combiner == static_cast<int>(Combiner::kMean) ? w : w * w;
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  if (lane == 0) {
    const double denom = combiner == static_cast<int>(Combiner::kMean) ? acc : sqrt(acc);
    scale[b] = denom == 0.0 ? 0.f : static_cast<float>(1.0 / denom);
  }
}

// Segment of every id from row splits (ids outside every sample keep -1).
__global__ void k_splits_to_segments(CsrView csr, int64_t batch, int64_t* seg) {
  const int lane = threadIdx.x & 31;
  const int64_t b = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) >> 5;
  if (b >= batch) return;
  int64_t a, e;
  csr.range(b, &a, &e);
  for (int64_t j = a + lane; j < e; j += 32) seg[j] = b;
}

}  // namespace

Status pooled_backward(const float* grad_out, int64_t dim, const int32_t* inverse, Segments seg,
                       const float* weights, int64_t n, int64_t batch, Combiner combiner,
                       int64_t num_rows, const int64_t* d_num_rows, float* grad_rows,
                       cudaStream_t stream, DeviceAllocator* alloc) {
  if (num_rows <= 0 || dim <= 0) return Status::OK();
  CsrHolder h;
  SOK_RETURN_IF_ERROR(build_csr(seg, n, batch, nullptr, stream, alloc, &h));
  auto al = [](size_t b) { return (b + 255) & ~size_t(255); };
  const bool need_scale = combiner != Combiner::kSum;
  const bool need_seg = seg.segment_ids == nullptr;
  const size_t sb = (batch > 0 ? batch : 1) * sizeof(float), gb = (n > 0 ? n : 1) * sizeof(int64_t);
  Temp tmp;
  SOK_RETURN_IF_ERROR(tmp.alloc(alloc, al(sb) + al(gb), stream));
  float* scale = need_scale ? tmp.as<float>() : nullptr;
  int64_t* seg_of = reinterpret_cast<int64_t*>(tmp.as<char>() + al(sb));
  if (need_scale && batch > 0) {
    k_segment_scale<<<grid_for(batch * 32, kBlock), kBlock, 0, stream>>>(h.view, weights, batch,
                                                                         static_cast<int>(combiner), scale);
    SOK_LAUNCH_CHECK();
  }
  const int64_t* src_row = seg.segment_ids;
  if (need_seg) {
    SOK_CUDA_RETURN(cudaMemsetAsync(seg_of, 0xff, gb, stream));
    if (batch > 0) {
      k_splits_to_segments<<<grid_for(batch * 32, kBlock), kBlock, 0, stream>>>(h.view, batch, seg_of);
      SOK_LAUNCH_CHECK();
    }
    src_row = seg_of;
  }
  return detail::sum_rows_by_group(grad_out, dim, inverse, src_row, batch, weights, scale, n,
                                   num_rows, d_num_rows, grad_rows, stream, alloc);
}

// ------------------------------------------------------------------------------------------------
// Unordered pooled backward: atomics instead of a sort.

namespace {

// sums[b] = sum over the ids of sample b of w (mean) or w^2 (sqrtn).
__global__ void k_weight_sums(const int64_t* seg, const float* weights, int64_t n, int64_t batch, bool squares,
                              float* sums) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t b = seg[i];
    if (b < 0 || b >= batch) continue;
    const float w = weights ? weights[i] : 1.f;
    atomicAdd(&sums[b], squares ? w * w : w);
  }
}

// grad_rows[inverse[i], c] += scale_i * grad_out[seg[i], c], one thread per (id, column).
__global__ void k_backward_unordered(const float* grad_out, int64_t dim, const int32_t* inverse, const int64_t* seg,
                                     const float* weights, int64_t n, int64_t batch, int64_t num_rows,
                                     const float* sums, int combiner, float* grad_rows) {
  const int64_t total = n * dim;
  for (int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; t < total;
       t += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = t / dim, c = t - i * dim;
    const int64_t b = seg[i], r = inverse[i];
    if (b < 0 || b >= batch || r < 0 || r >= num_rows) continue;
    float s = weights ? weights[i] : 1.f;
    if (combiner == static_cast<int>(Combiner::kMean)) {
      s = sums[b] == 0.f ? 0.f : s / sums[b];
    } else if (combiner == static_cast<int>(Combiner::kSqrtn)) {
      s = sums[b] == 0.f ? 0.f : s / sqrtf(sums[b]);
    }
    atomicAdd(&grad_rows[r * dim + c], s * grad_out[b * dim + c]);
  }
}

}  // namespace

Status pooled_backward_unordered(const float* grad_out, int64_t dim, const int32_t* inverse,
                                 const int64_t* segment_ids, const float* weights, int64_t n, int64_t batch,
                                 Combiner combiner, int64_t num_rows, float* grad_rows, cudaStream_t stream,
                                 DeviceAllocator* alloc) {
  if (num_rows <= 0 || dim <= 0) return Status::OK();
  SOK_CUDA_RETURN(cudaMemsetAsync(grad_rows, 0, static_cast<size_t>(num_rows) * dim * sizeof(float), stream));
  if (n <= 0 || batch <= 0) return Status::OK();
  Temp sums;
  if (combiner != Combiner::kSum) {
    SOK_RETURN_IF_ERROR(sums.alloc(alloc, batch * sizeof(float), stream));
    SOK_CUDA_RETURN(cudaMemsetAsync(sums.as<float>(), 0, batch * sizeof(float), stream));
    k_weight_sums<<<grid_for(n, kBlock), kBlock, 0, stream>>>(segment_ids, weights, n, batch,
                                                              combiner == Combiner::kSqrtn, sums.as<float>());
    SOK_LAUNCH_CHECK();
  }
  k_backward_unordered<<<grid_for(n * dim, kBlock), kBlock, 0, stream>>>(
      grad_out, dim, inverse, segment_ids, weights, n, batch, num_rows,
      combiner != Combiner::kSum ? sums.as<float>() : nullptr, static_cast<int>(combiner), grad_rows);
  SOK_LAUNCH_CHECK();
  return Status::OK();
}

// ------------------------------------------------------------------------------------------------
// Instantiations.

template Status unique_keys<int32_t>(const int32_t*, int64_t, int32_t*, int32_t*, int64_t*, int64_t*,
                                     cudaStream_t, DeviceAllocator*);
template Status unique_keys<int64_t>(const int64_t*, int64_t, int64_t*, int32_t*, int64_t*, int64_t*,
                                     cudaStream_t, DeviceAllocator*);
template Status bucketize_by_owner<int32_t>(const int32_t*, int64_t, const int64_t*, int, int64_t*,
                                            int64_t*, cudaStream_t, DeviceAllocator*);
template Status bucketize_by_owner<int64_t>(const int64_t*, int64_t, const int64_t*, int, int64_t*,
                                            int64_t*, cudaStream_t, DeviceAllocator*);
template Status gather<int32_t>(const int32_t*, const int64_t*, int64_t, const int64_t*, int32_t*, cudaStream_t);
template Status gather<int64_t>(const int64_t*, const int64_t*, int64_t, const int64_t*, int64_t*, cudaStream_t);
template Status gather_static<int32_t>(const float*, int64_t, int64_t, const int32_t*, int64_t, float*,
                                       GpuLookupError*, cudaStream_t);
template Status gather_static<int64_t>(const float*, int64_t, int64_t, const int64_t*, int64_t, float*,
                                       GpuLookupError*, cudaStream_t);
template Status static_pooled_forward<int32_t>(const float*, int64_t, int64_t, const int32_t*, Segments,
                                               const float*, int64_t, int64_t, Combiner, float*,
                                               GpuLookupError*, cudaStream_t, DeviceAllocator*);
template Status static_pooled_forward<int64_t>(const float*, int64_t, int64_t, const int64_t*, Segments,
                                               const float*, int64_t, int64_t, Combiner, float*,
                                               GpuLookupError*, cudaStream_t, DeviceAllocator*);

}  // namespace gpu
}  // namespace sok
