// What a kernel can read from and write to pinned, mapped host memory at random rows: the limit of
// the tiered tables' host tier, whose rows the kernels read in place (cuda/gpu_tiered_table.h).
// Rows of 128 bytes (dim 16 with one optimizer slot, as the tiered benchmarks' Adagrad rows), a
// tile of 8 threads per row as the table's kernels, random distinct rows; per access pattern the
// host bytes moved per second, against the copy engine's pinned bandwidth:
//   COPY h2d_gbs=.. d2h_gbs=..
//   READ pattern=.. rows=.. ms=.. gbs=.. vs_copy=..
// Patterns:
//   value64      4 lanes read the row's first 64 bytes (a lookup reads the value)
//   value_slot   4 lanes read the value, then the slot, 64 bytes each (the update's reads)
//   row128       8 lanes read the whole 128-byte row at once
//   rmw_split    value_slot, then both written back (the update as the kernels do it)
//   rmw_row128   row128, then the row written back at once
// Usage: host_read_bench [rows_in_table=4000000] [rows_read=420000]
// Build and run (a GPU machine, from the repo root):
//   cmake -G Ninja -S benchmarks/gpu -B /tmp/tb && ninja -C /tmp/tb host_read_bench &&
//   /tmp/tb/host_read_bench
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "harness/gpu/cuda_util.h"

namespace {

constexpr int kTile = 8;
constexpr int kBlock = 256;
constexpr int kRowFloats = 32;  // 128 bytes

enum Pattern { kValue64, kValueSlot, kRow128, kRmwSplit, kRmwRow128 };
const char* pattern_name(Pattern p) {
  switch (p) {
    case kValue64: return "value64";
    case kValueSlot: return "value_slot";
    case kRow128: return "row128";
    case kRmwSplit: return "rmw_split";
    case kRmwRow128: return "rmw_row128";
  }
  return "?";
}

template <Pattern P>
__global__ void
__launch_bounds__(kBlock)
    k_access(float* rows, const int64_t* pick, int64_t n, float4* out) {
  const int64_t i = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / kTile;
  const int lane = threadIdx.x % kTile;
  if (i >= n) return;
  float4* row = reinterpret_cast<float4*>(rows + pick[i] * kRowFloats);
  float4* o = out + i * (kRowFloats / 4);
  if (P == kValue64) {
    if (lane < 4) o[lane] = __ldcg(row + lane);
  } else if (P == kValueSlot || P == kRmwSplit) {
    if (lane < 4) {
      float4 v = __ldcg(row + lane);
      float4 s = __ldcg(row + 4 + lane);
      v.x += s.x;
      s.y += 1.f;
      o[lane] = v;
      o[4 + lane] = s;
      if (P == kRmwSplit) {
        row[lane] = v;
        row[4 + lane] = s;
      }
    }
  } else {
    float4 x = __ldcg(row + lane);
    x.x += 1.f;
    o[lane] = x;
    if (P == kRmwRow128) row[lane] = x;
  }
}

template <Pattern P>
float time_pattern(float* rows, const int64_t* pick, int64_t n, float4* out) {
  cudaEvent_t a, b;
  CUDA_OK(cudaEventCreate(&a));
  CUDA_OK(cudaEventCreate(&b));
  const int grid = static_cast<int>((n * kTile + kBlock - 1) / kBlock);
  std::vector<float> ms;
  for (int r = 0; r < 7; ++r) {
    CUDA_OK(cudaEventRecord(a));
    k_access<P><<<grid, kBlock>>>(rows, pick, n, out);
    CUDA_OK(cudaEventRecord(b));
    CUDA_OK(cudaEventSynchronize(b));
    float t = 0;
    CUDA_OK(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t);
  }
  CUDA_OK(cudaEventDestroy(a));
  CUDA_OK(cudaEventDestroy(b));
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t table_rows = argc > 1 ? std::atoll(argv[1]) : 4000000;
  const int64_t n = argc > 2 ? std::atoll(argv[2]) : 420000;
  const size_t bytes = static_cast<size_t>(table_rows) * kRowFloats * sizeof(float);
  float* rows = nullptr;
  CUDA_OK(cudaHostAlloc(&rows, bytes, cudaHostAllocMapped));
  std::fill(rows, rows + table_rows * kRowFloats, 1.f);
  float* d_rows = nullptr;
  CUDA_OK(cudaHostGetDevicePointer(&d_rows, rows, 0));
  std::vector<int64_t> all(table_rows);
  std::iota(all.begin(), all.end(), 0);
  std::mt19937_64 rng(3);
  std::shuffle(all.begin(), all.end(), rng);
  DevBuf<int64_t> pick;
  pick.upload(std::vector<int64_t>(all.begin(), all.begin() + n));
  DevBuf<float4> out(n * (kRowFloats / 4));
  DevBuf<char> dev(bytes);
  const double h2d = pinned_copy_gbs(true, rows, dev.get(), bytes);
  const double d2h = pinned_copy_gbs(false, rows, dev.get(), bytes);
  std::printf("COPY h2d_gbs=%.1f d2h_gbs=%.1f table_rows=%lld rows_read=%lld\n", h2d, d2h,
              (long long)table_rows, (long long)n);
  auto report = [&](Pattern p, float ms, int bytes_read, int bytes_written) {
    const double moved = static_cast<double>(n) * std::max(bytes_read, bytes_written);
    const double gbs = moved / (ms * 1e6);
    std::printf("READ pattern=%s rows=%lld ms=%.3f gbs=%.1f vs_copy=%.2f read_bytes=%d "
                "written_bytes=%d\n",
                pattern_name(p), (long long)n, ms, gbs, gbs / h2d, bytes_read, bytes_written);
  };
  report(kValue64, time_pattern<kValue64>(d_rows, pick.get(), n, out.get()), 64, 0);
  report(kValueSlot, time_pattern<kValueSlot>(d_rows, pick.get(), n, out.get()), 128, 0);
  report(kRow128, time_pattern<kRow128>(d_rows, pick.get(), n, out.get()), 128, 0);
  report(kRmwSplit, time_pattern<kRmwSplit>(d_rows, pick.get(), n, out.get()), 128, 128);
  report(kRmwRow128, time_pattern<kRmwRow128>(d_rows, pick.get(), n, out.get()), 128, 128);
  CUDA_OK(cudaFreeHost(rows));
  return 0;
}
