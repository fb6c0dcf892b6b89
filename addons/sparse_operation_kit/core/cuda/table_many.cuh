// Internal: kernel launches over the keys of several tables (find_or_insert_many,
// apply_gradients_many). A TF op holds some 26 tables: one launch for all of them instead of one
// per table saves the host ~26 launches per op and fills the GPU with one grid instead of 26 small
// ones. Each table's keys get whole blocks, so a block's keys, and the count of keys it inserted,
// belong to one table; the per-table parts travel as one __grid_constant__ kernel parameter.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "addons/sparse_operation_kit/core/cuda/runtime.h"
#include "addons/sparse_operation_kit/core/cuda/table_layout.cuh"
#include "addons/sparse_operation_kit/core/status.h"

namespace sok {
namespace gpu {
namespace detail {

// Up to 32 parts a launch (the job masks' bits, host_row_jobs.cuh): a TF op's 26 tables take one
// launch, not two whose second waits for the first's tail. Parts of ~190 bytes take ~6 KB of
// kernel parameters, past the classic 4 KB (kMaxKernelParamBytes).
constexpr int kPartsPerLaunch = 32;

template <typename Part>
struct PartsLaunch {
  Part part[kPartsPerLaunch];
  int32_t first_block[kPartsPerLaunch];  // blocks of the parts before this one
  int32_t count;
};

// The part whose blocks hold block x: the last one starting at or before x (parts without keys
// start where the next one does, so they are passed over).
template <typename Part>
__device__ __forceinline__ int part_of_block(const PartsLaunch<Part>& L, int32_t x) {
  int lo = 0, hi = L.count - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (L.first_block[mid] <= x) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

// This thread's key within its part (kTile threads per key).
__device__ __forceinline__ int64_t key_of_thread(int32_t first_block) {
  return ((static_cast<int64_t>(blockIdx.x) - first_block) * blockDim.x + threadIdx.x) / kTile;
}

inline int64_t blocks_for_keys(int64_t n) { return n <= 0 ? 0 : ceil_div(n * kTile, kBlock); }

// Holds the mutex of every distinct table of a call (a table may appear more than once), taken
// in address order so that two calls over overlapping tables cannot deadlock.
template <typename Impl>
class TablesLock {
 public:
  explicit TablesLock(std::vector<Impl*> impls) : impls_(std::move(impls)) {
    std::sort(impls_.begin(), impls_.end());
    impls_.erase(std::unique(impls_.begin(), impls_.end()), impls_.end());
    for (Impl* m : impls_) m->mu.lock();
  }
  ~TablesLock() {
    for (auto it = impls_.rbegin(); it != impls_.rend(); ++it) (*it)->mu.unlock();
  }
  TablesLock(const TablesLock&) = delete;
  TablesLock& operator=(const TablesLock&) = delete;

 private:
  std::vector<Impl*> impls_;
};

// Every table of one call must live on one device (the stream's).
template <typename Impl>
Status same_device(const std::vector<Impl*>& impls) {
  for (const Impl* m : impls) {
    if (m->device != impls[0]->device) {
      return Status::Invalid("tables '" + impls[0]->cfg.name + "' and '" + m->cfg.name +
                             "' live on different GPUs (" + std::to_string(impls[0]->device) +
                             ", " + std::to_string(m->device) + ") but share one call");
    }
  }
  return Status::OK();
}

// Calls launch(begin, end) for consecutive ranges of parts: at most kPartsPerLaunch, and a table
// at most once per range (two parts of one table in one grid could update a row twice at once).
template <typename Impl, typename Launch>
Status for_each_launch(const std::vector<Impl*>& impls, Launch&& launch) {
  const int count = static_cast<int>(impls.size());
  int begin = 0;
  while (begin < count) {
    int end = begin + 1;
    while (end < count && end - begin < kPartsPerLaunch &&
           std::find(impls.begin() + begin, impls.begin() + end, impls[end]) == impls.begin() + end)
      ++end;
    SOK_RETURN_IF_ERROR(launch(begin, end));
    begin = end;
  }
  return Status::OK();
}

}  // namespace detail
}  // namespace gpu
}  // namespace sok
