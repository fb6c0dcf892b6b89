// A static table's ids checked on the GPU: core/lookup.h's first_id_outside for ids in device
// memory.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "addons/sparse_operation_kit/core/status.h"

namespace sok {
namespace gpu {

// *position = the first id of ids[0, n) outside [0, rows), or -1; *id = that id. Reads the answer
// back: synchronises the stream. d_scratch: one int64 of device memory.
template <typename K>
Status first_id_outside(const K* ids, int64_t n, int64_t rows, int64_t* d_scratch,
                        cudaStream_t stream, int64_t* position, K* id);

}  // namespace gpu
}  // namespace sok
