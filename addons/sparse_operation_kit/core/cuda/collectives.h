// Collectives between GPUs over NCCL, for the exchange of keys, rows and gradients between ranks
// and the data-parallel all-reduce (framework-free: no TensorFlow header).
//
// NCCL is loaded at run time (libnccl.so.2, or $SOK_NCCL_LIBRARY): the library still loads on a
// machine without NCCL, and the communicator is only needed with several GPUs. Every collective is
// enqueued on the caller's stream. A host wait (the only one: the per-peer counts of a variable
// all-to-all) is bounded: a rank that is dead or runs a different collective makes every waiting
// rank abort its communicator and return an error within the communicator's timeout.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "addons/sparse_operation_kit/core/status.h"

namespace sok {
namespace gpu {

constexpr int kNcclUniqueIdBytes = 128;  // NCCL_UNIQUE_ID_BYTES

// The element types the all-reduce takes (values of NCCL's ncclDataType_t).
enum class NcclType : int { kInt32 = 2, kInt64 = 4, kFloat16 = 6, kFloat32 = 7, kFloat64 = 8 };

// Empty if NCCL can be used in this process, else why not.
std::string nccl_unavailable_reason();
// "major.minor.patch" of the loaded NCCL (empty if none).
std::string nccl_version();

// A fresh id for a new communicator; rank 0 makes it, every rank passes it to Create.
Status nccl_unique_id(std::string* id);

class Communicator {
 public:
  // Joins the communicator `id` as `rank` of `world` on CUDA device `device`. Blocks until all
  // ranks joined (NCCL's own bootstrap), then connects every pair of ranks with a tiny all-to-all,
  // so that NCCL's buffers are allocated now rather than at the first lookup.
  static Status Create(const std::string& id, int rank, int world, int device, double timeout_s,
                       std::unique_ptr<Communicator>* out);
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  // Held for the whole of one collective op: NCCL needs the calls of one communicator in the
  // same order on every rank, so two ops must not interleave theirs.
  std::unique_lock<std::mutex> lock() { return std::unique_lock<std::mutex>(mu_); }
  int rank() const { return rank_; }
  int world() const { return world_; }
  int device() const { return device_; }

  // Sends send_counts[p * k, (p + 1) * k) to rank p and receives recv_counts[p * k, ...) from
  // every rank p (int64, device memory), then copies both to host_counts[0, 2 * world * k)
  // (pinned host memory) and waits for the copy: the sizes a variable all-to-all needs on the
  // host to allocate its output.
  Status exchange_counts(const int64_t* send_counts, int64_t* recv_counts, int k,
                         int64_t* host_counts, cudaStream_t stream);
  // exchange_counts for a [world, k] count matrix whose width k the ranks may disagree on (a
  // program that passed different tables): k travels with the counts in one fixed-size message
  // per peer, so the NCCL calls always match and one host wait serves both. widths[p] = rank p's
  // k; when any differs from ours, the counts are not exchanged (the caller reports the widths).
  // A matrix wider than kHeaderColumns - 1 sends its remaining columns in a second exchange.
  Status exchange_count_matrix(const int64_t* send_counts, int64_t* recv_counts, int k,
                               int64_t* host_counts, int64_t* widths, cudaStream_t stream);
  static constexpr int kHeaderColumns = 64;
  // The variable all-to-all of `row_bytes`-byte rows: send_rows[p] rows from `send` (grouped by
  // destination, rank order) to rank p; recv_rows[p] rows from rank p into `recv`, in rank order.
  // The counts are host values (exchange_counts); the rank's own part goes through NCCL too.
  Status all_to_all(const void* send, const int64_t* send_rows, void* recv,
                    const int64_t* recv_rows, size_t row_bytes, cudaStream_t stream);
  // out[j] = sum (or mean) over ranks of in[j], for `count` elements; several calls between
  // group_start() and group_end() make one NCCL launch.
  Status all_reduce(const void* in, void* out, size_t count, NcclType type, bool mean,
                    cudaStream_t stream);
  Status group_start();
  Status group_end();

  // The process's communicator on `device`, or null (one per device: set by Create's caller).
  static Communicator* on_device(int device);
  static Status install(std::unique_ptr<Communicator> comm);

 private:
  Communicator() = default;
  Status check(int result, const char* what);
  Status wait(cudaEvent_t event, const char* what);

  void* comm_ = nullptr;  // ncclComm_t
  // exchange_count_matrix's messages: [world, kHeaderColumns] to send and received (device), the
  // host's copy of both, and the widths staged for the device (pinned host).
  int64_t* header_ = nullptr;
  int64_t* header_host_ = nullptr;
  int64_t* widths_host_ = nullptr;
  int rank_ = 0, world_ = 1, device_ = -1;
  double timeout_s_ = 300;
  bool aborted_ = false;
  std::mutex mu_;
};

}  // namespace gpu
}  // namespace sok
