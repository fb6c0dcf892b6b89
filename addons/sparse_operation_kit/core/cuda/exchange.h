// The exchange's index work on the GPU: core/exchange.h's functions with the same semantics, on
// device pointers, ordered on `stream`, with no host synchronisation (the layouts come from host
// counts the caller already has; the plan's counts stay on the device).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "addons/sparse_operation_kit/core/cuda/gpu_api.h"
#include "addons/sparse_operation_kit/core/exchange.h"
#include "addons/sparse_operation_kit/core/status.h"

namespace sok {
namespace gpu {
namespace exchange {

using sok::exchange::BlockLayout;
using sok::exchange::TableSpec;

// keys[t], counts[t] (counts[t] may be null) device pointers; sizes host; valid (may be null)
// [n] on the device: the padding after each table's first valid[t] keys is not requested.
Status plan(const std::vector<TableSpec>& tables, int world,
            const std::vector<const int64_t*>& keys, const std::vector<const int64_t*>& counts,
            const int64_t* sizes, const int64_t* valid, int64_t signature, int64_t* request,
            int64_t* matrix, int64_t* row_at, cudaStream_t stream,
            DeviceAllocator* alloc = nullptr);

// The owner's keys (core/exchange.h's owner_keys): one dedup of every table. `allocate` gets
// each table's number of entries and returns the outputs (keys[t], counts[t]: sizes[t] entries;
// row_pos: sum(sizes) * world; valid: [n] on the device, the distinct counts). Exact: the sizes
// are the distinct counts, read with ONE copy to the host and a wait; padded: the received
// counts (host), so nothing waits.
struct OwnerKeysOut {
  std::vector<int64_t*> keys, counts;
  int64_t* row_pos = nullptr;
  int64_t* valid = nullptr;
};
using AllocateOwnerKeys =
    std::function<Status(const std::vector<int64_t>& sizes, OwnerKeysOut* out)>;
// host_staging: pinned host memory of owner_keys_staging_bytes(n) bytes for the dedup's
// argument upload, valid until the stream has passed the call, or nullptr (pageable: the driver
// may wait for the stream, which a padded call otherwise never does).
Status owner_keys(const std::vector<TableSpec>& tables, const BlockLayout& layout,
                  const int64_t* received, bool padded, const AllocateOwnerKeys& allocate,
                  cudaStream_t stream, DeviceAllocator* alloc = nullptr,
                  void* host_staging = nullptr);
size_t owner_keys_staging_bytes(int num_tables);

Status rows_to_blocks(const std::vector<int64_t>& dims, const int64_t* distinct, int world,
                      const int64_t* row_pos, const std::vector<const float*>& rows, float* flat,
                      cudaStream_t stream);
Status rows_from_blocks(const std::vector<int64_t>& dims, const int64_t* distinct, int world,
                        const int64_t* row_pos, const float* flat, const std::vector<float*>& rows,
                        cudaStream_t stream);

Status gather_rows(const std::vector<int64_t>& dims, const int64_t* sizes, const int64_t* row_at,
                   const float* returned, const std::vector<float*>& out, cudaStream_t stream);
Status scatter_rows(const std::vector<int64_t>& dims, const int64_t* sizes, const int64_t* row_at,
                    const std::vector<const float*>& d_out, float* d_returned, cudaStream_t stream);

}  // namespace exchange
}  // namespace gpu
}  // namespace sok
