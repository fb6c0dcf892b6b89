// Internal: updates of rows in host memory (a tiered table's host tier, Impl::host_rows) run by
// a second kernel. A kernel that probes the index in GPU memory and then reads and writes a row
// over PCIe holds its threads for all those round trips, so few host accesses are in flight.
// k_apply does everything but the host rows' updates and appends one job per such row;
// k_apply_host_rows runs the jobs, each tile on nothing but its row. The same split of the
// lookups (k_find_or_insert) was slower: a lookup's row access is one 64-byte read, and the job
// list's write and read cost more than they freed (benchmarks/embedding/README.md).
#pragma once

#include <cooperative_groups.h>

#include <cstdint>

#include "addons/sparse_operation_kit/core/cuda/table_layout.cuh"
#include "addons/sparse_operation_kit/core/cuda/table_many.cuh"

namespace sok {
namespace gpu {
namespace detail {

// An update of a host row: grads of the launch's part `part`.
struct ApplyJob {
  float* row;
  const float* grad;
  int64_t part;
};

static_assert(kPartsPerLaunch <= 32, "a launch's parts are bits of the masks below");

template <typename Job>
struct HostJobs {
  Job* list = nullptr;  // null: rows in host memory are served in place
  int64_t* count = nullptr;
  uint32_t host_tables = 0;  // bit p: part p's table has its rows in host memory
  uint32_t host_firsts = 0;  // bit p: so has part p's first tier
  // Whether the row of part p, in its first tier or its table, goes to the job list.
  __device__ bool defer(int p, bool in_first) const {
    return list != nullptr && (((in_first ? host_firsts : host_tables) >> p) & 1u);
  }
};

// Appends `job` (one lane per job; lanes of a warp appending together take one atomic).
template <typename Job>
__device__ __forceinline__ void append_job(const HostJobs<Job>& jobs, const Job& job) {
  namespace cg = cooperative_groups;
  cg::coalesced_group g = cg::coalesced_threads();
  unsigned long long base = 0;
  if (g.thread_rank() == 0)
    base = atomicAdd(reinterpret_cast<unsigned long long*>(jobs.count), g.size());
  base = g.shfl(base, 0);
  jobs.list[base + g.thread_rank()] = job;
}

// The job of this thread's tile (kTile threads per job), or -1 past the list's end.
__device__ __forceinline__ int64_t job_of_thread(const int64_t* count) {
  const int64_t j = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / kTile;
  return j < *count ? j : -1;
}

}  // namespace detail
}  // namespace gpu
}  // namespace sok
