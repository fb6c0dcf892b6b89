// The allocators, CUDA error statuses and the bad-index records of gpu_api.h.
#include <cuda_runtime.h>
#include <unistd.h>

#include <mutex>
#include <string>
#include <vector>

#include "addons/sparse_operation_kit/core/cuda/gpu_api.h"
#include "addons/sparse_operation_kit/core/cuda/runtime.h"

namespace sok {
namespace gpu {

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

namespace {
class PinnedHostAllocator : public DeviceAllocator {
 public:
  void* allocate(size_t bytes, cudaStream_t) override {
    void* p = nullptr;
    if (cudaHostAlloc(&p, bytes, cudaHostAllocMapped | cudaHostAllocPortable) != cudaSuccess) {
      cudaGetLastError();
      return nullptr;
    }
    void* d = nullptr;  // the same address under unified addressing (every 64-bit platform)
    if (cudaHostGetDevicePointer(&d, p, 0) != cudaSuccess || d != p) {
      cudaGetLastError();
      cudaFreeHost(p);
      return nullptr;
    }
    return p;
  }
  void deallocate(void* p, size_t, cudaStream_t) override { cudaFreeHost(p); }
  std::string describe_free_memory() override {
    const long pages = sysconf(_SC_AVPHYS_PAGES), size = sysconf(_SC_PAGE_SIZE);
    if (pages < 0 || size < 0) return "free host memory unknown";
    return std::to_string(static_cast<int64_t>(pages) * size) + " bytes of host memory free";
  }
};
}  // namespace

DeviceAllocator* pinned_host_storage_allocator() {
  static PinnedHostAllocator a;
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

Status check_lookup_errors(const GpuLookupError* d_err, const std::vector<std::string>& what,
                           cudaStream_t stream) {
  std::vector<GpuLookupError> h(what.size());
  if (h.empty()) return Status::OK();
  SOK_CUDA_RETURN(cudaMemcpyAsync(h.data(), d_err, h.size() * sizeof(GpuLookupError),
                                  cudaMemcpyDeviceToHost, stream));
  SOK_CUDA_RETURN(cudaStreamSynchronize(stream));
  for (size_t i = 0; i < h.size(); ++i) SOK_RETURN_IF_ERROR(describe_lookup_error(h[i], what[i]));
  return Status::OK();
}

}  // namespace gpu
}  // namespace sok
