// NCCL through dlopen: only the handful of entry points SOK uses, declared here with NCCL's
// stable C ABI (ncclComm_t is an opaque pointer, ncclUniqueId 128 bytes, the enums ints).
#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <map>
#include <mutex>
#include <thread>

#include "addons/sparse_operation_kit/core/cuda/collectives.h"
#include "addons/sparse_operation_kit/core/cuda/gpu_api.h"

namespace sok {
namespace gpu {
namespace {

struct UniqueId {
  char internal[kNcclUniqueIdBytes];
};
using Comm = void*;
constexpr int kNcclSuccess = 0;
constexpr int kNcclInProgress = 7;
constexpr int kNcclInt8 = 0;
constexpr int kNcclInt64 = 4;
constexpr int kNcclSum = 0;
constexpr int kNcclAvg = 4;

struct Nccl {
  int (*GetVersion)(int*) = nullptr;
  int (*GetUniqueId)(UniqueId*) = nullptr;
  int (*CommInitRank)(Comm*, int, UniqueId, int) = nullptr;
  int (*CommDestroy)(Comm) = nullptr;
  int (*CommAbort)(Comm) = nullptr;
  int (*CommGetAsyncError)(Comm, int*) = nullptr;
  const char* (*GetErrorString)(int) = nullptr;
  int (*Send)(const void*, size_t, int, int, Comm, cudaStream_t) = nullptr;
  int (*Recv)(void*, size_t, int, int, Comm, cudaStream_t) = nullptr;
  int (*AllReduce)(const void*, void*, size_t, int, int, Comm, cudaStream_t) = nullptr;
  int (*GroupStart)() = nullptr;
  int (*GroupEnd)() = nullptr;
  std::string error;  // why it could not be loaded
  int version = 0;
};

template <typename F>
bool Bind(void* lib, const char* name, F* fn, std::string* error) {
  *fn = reinterpret_cast<F>(dlsym(lib, name));
  if (*fn == nullptr && error->empty()) *error = std::string("libnccl has no symbol ") + name;
  return *fn != nullptr;
}

const Nccl& Load() {
  static const Nccl nccl = [] {
    Nccl n;
    const char* env = std::getenv("SOK_NCCL_LIBRARY");
    const char* path = env != nullptr && *env != '\0' ? env : "libnccl.so.2";
    void* lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      const char* why = dlerror();
      n.error = std::string("cannot load NCCL (") + path + "): " + (why ? why : "unknown error");
      return n;
    }
    std::string& e = n.error;
    Bind(lib, "ncclGetVersion", &n.GetVersion, &e);
    Bind(lib, "ncclGetUniqueId", &n.GetUniqueId, &e);
    Bind(lib, "ncclCommInitRank", &n.CommInitRank, &e);
    Bind(lib, "ncclCommDestroy", &n.CommDestroy, &e);
    Bind(lib, "ncclCommAbort", &n.CommAbort, &e);
    Bind(lib, "ncclCommGetAsyncError", &n.CommGetAsyncError, &e);
    Bind(lib, "ncclGetErrorString", &n.GetErrorString, &e);
    Bind(lib, "ncclSend", &n.Send, &e);
    Bind(lib, "ncclRecv", &n.Recv, &e);
    Bind(lib, "ncclAllReduce", &n.AllReduce, &e);
    Bind(lib, "ncclGroupStart", &n.GroupStart, &e);
    Bind(lib, "ncclGroupEnd", &n.GroupEnd, &e);
    if (e.empty() && n.GetVersion(&n.version) != kNcclSuccess) e = "ncclGetVersion failed";
    // ncclAvg (the mean all-reduce) and ncclSend/Recv need NCCL >= 2.10.
    if (e.empty() && n.version < 21000) {
      e = "NCCL " + std::to_string(n.version) + " is older than 2.10";
    }
    return n;
  }();
  return nccl;
}

std::string ErrorString(int result) {
  const Nccl& n = Load();
  return n.GetErrorString ? n.GetErrorString(result) : std::to_string(result);
}

std::mutex& RegistryMu() {
  static std::mutex mu;
  return mu;
}
std::map<int, std::unique_ptr<Communicator>>& Registry() {
  static auto* comms = new std::map<int, std::unique_ptr<Communicator>>();  // never destroyed:
  return *comms;  // NCCL may be unloaded before static destructors run at exit
}

}  // namespace

std::string nccl_unavailable_reason() { return Load().error; }

std::string nccl_version() {
  const Nccl& n = Load();
  if (!n.error.empty()) return "";
  return std::to_string(n.version / 10000) + "." + std::to_string(n.version / 100 % 100) + "." +
         std::to_string(n.version % 100);
}

Status nccl_unique_id(std::string* id) {
  const Nccl& n = Load();
  if (!n.error.empty()) return Status::Invalid(n.error);
  UniqueId uid;
  int r = n.GetUniqueId(&uid);
  if (r != kNcclSuccess) return Status::Invalid("ncclGetUniqueId: " + ErrorString(r));
  id->assign(uid.internal, kNcclUniqueIdBytes);
  return Status::OK();
}

Status Communicator::Create(const std::string& id, int rank, int world, int device,
                            double timeout_s, std::unique_ptr<Communicator>* out) {
  const Nccl& n = Load();
  if (!n.error.empty()) return Status::Invalid(n.error);
  if (id.size() != kNcclUniqueIdBytes) {
    return Status::Invalid("NCCL unique id of " + std::to_string(id.size()) + " bytes, not " +
                           std::to_string(kNcclUniqueIdBytes));
  }
  if (world < 1 || rank < 0 || rank >= world) {
    return Status::Invalid("NCCL communicator: rank " + std::to_string(rank) + " of " +
                           std::to_string(world));
  }
  Status s = cuda_status(cudaSetDevice(device), "cudaSetDevice for the NCCL communicator");
  if (!s.ok()) return s;
  UniqueId uid;
  std::copy(id.begin(), id.end(), uid.internal);
  std::unique_ptr<Communicator> c(new Communicator());
  c->rank_ = rank;
  c->world_ = world;
  c->device_ = device;
  c->timeout_s_ = timeout_s;
  int r = n.CommInitRank(&c->comm_, world, uid, rank);
  if (r != kNcclSuccess) {
    return Status::Invalid("ncclCommInitRank (rank " + std::to_string(rank) + " of " +
                           std::to_string(world) + ", GPU " + std::to_string(device) +
                           "): " + ErrorString(r));
  }
  // Connect every pair now (NCCL connects peers at their first send): its buffers come out of
  // the GPU's free memory before the program's first step.
  const size_t header = sizeof(int64_t) * world * kHeaderColumns;
  s = cuda_status(cudaMalloc(&c->header_, 2 * header), "cudaMalloc of the count headers");
  if (s.ok()) s = cuda_status(cudaMallocHost(&c->header_host_, 2 * header), "cudaMallocHost");
  if (s.ok()) {
    s = cuda_status(cudaMallocHost(&c->widths_host_, header), "cudaMallocHost of the widths");
  }
  if (!s.ok()) return s;
  cudaStream_t stream;
  s = cuda_status(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  if (!s.ok()) return s;
  int64_t* d = c->header_;
  s = cuda_status(cudaMemsetAsync(d, 0, sizeof(int64_t) * world, stream), "memset");
  if (s.ok()) s = c->exchange_counts(d, d + world, 1, c->header_host_, stream);
  if (s.ok()) s = cuda_status(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  cudaStreamDestroy(stream);
  if (!s.ok()) return s;
  *out = std::move(c);
  return Status::OK();
}

Communicator::~Communicator() {
  if (comm_ != nullptr && !aborted_) Load().CommDestroy(comm_);
  cudaFree(header_);
  cudaFreeHost(header_host_);
  cudaFreeHost(widths_host_);
}

Status Communicator::check(int result, const char* what) {
  if (result == kNcclSuccess || result == kNcclInProgress) return Status::OK();
  return Status::Invalid(std::string(what) + " (NCCL, rank " + std::to_string(rank_) + " of " +
                         std::to_string(world_) + "): " + ErrorString(result));
}

Status Communicator::wait(cudaEvent_t event, const char* what) {
  const Nccl& n = Load();
  const auto start = std::chrono::steady_clock::now();
  for (int spin = 0;; ++spin) {
    cudaError_t e = cudaEventQuery(event);
    if (e == cudaSuccess) return Status::OK();
    if (e != cudaErrorNotReady) return cuda_status(e, what);
    int async = kNcclSuccess;
    if (n.CommGetAsyncError(comm_, &async) == kNcclSuccess && async != kNcclSuccess &&
        async != kNcclInProgress) {
      n.CommAbort(comm_);
      aborted_ = true;
      return Status::Invalid(std::string(what) + ": NCCL failed on rank " + std::to_string(rank_) +
                             ": " + ErrorString(async));
    }
    const double waited =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (waited > timeout_s_) {
      // The peers never matched this collective: a rank died, stalled or ran a different one.
      n.CommAbort(comm_);
      aborted_ = true;
      return Status::Invalid(
          std::string(what) + ": rank " + std::to_string(rank_) + " of " + std::to_string(world_) +
          " waited " + std::to_string(static_cast<int>(waited)) +
          " s for the other ranks (a rank died, stalled or ran a different collective, such as "
          "another library's collective left unordered with SOK's); the NCCL communicator is "
          "aborted");
    }
    if (spin > 1000) std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

Status Communicator::exchange_counts(const int64_t* send_counts, int64_t* recv_counts, int k,
                                     int64_t* host_counts, cudaStream_t stream) {
  if (aborted_) return Status::Invalid("the NCCL communicator was aborted by an earlier error");
  const Nccl& n = Load();
  Status s = check(n.GroupStart(), "ncclGroupStart");
  for (int p = 0; p < world_ && s.ok(); ++p) {
    s = check(n.Send(send_counts + p * k, k, kNcclInt64, p, comm_, stream), "ncclSend of counts");
    if (s.ok()) {
      s = check(n.Recv(recv_counts + p * k, k, kNcclInt64, p, comm_, stream), "ncclRecv");
    }
  }
  Status end = check(n.GroupEnd(), "ncclGroupEnd");
  if (!s.ok()) return s;
  if (!end.ok()) return end;
  const size_t values = static_cast<size_t>(world_) * k;
  const size_t bytes = sizeof(int64_t) * values;
  s = cuda_status(cudaMemcpyAsync(host_counts, send_counts, bytes, cudaMemcpyDeviceToHost, stream),
                  "copy of the send counts to the host");
  if (s.ok()) {
    s = cuda_status(
        cudaMemcpyAsync(host_counts + values, recv_counts, bytes, cudaMemcpyDeviceToHost, stream),
        "copy of the receive counts to the host");
  }
  if (!s.ok()) return s;
  cudaEvent_t done;
  s = cuda_status(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), "cudaEventCreate");
  if (!s.ok()) return s;
  s = cuda_status(cudaEventRecord(done, stream), "cudaEventRecord");
  if (s.ok()) s = wait(done, "the exchange of all-to-all sizes");
  cudaEventDestroy(done);
  return s;
}

Status Communicator::exchange_count_matrix(const int64_t* send_counts, int64_t* recv_counts, int k,
                                           int64_t* host_counts, int64_t* widths,
                                           cudaStream_t stream) {
  const int h = kHeaderColumns;
  const size_t pitch = sizeof(int64_t) * h;
  const int inline_k = std::min(k, h - 1);
  int64_t* send = header_;
  int64_t* recv = header_ + static_cast<size_t>(world_) * h;
  // Row p of the message to rank p: [k, the first inline_k counts, zeros].
  std::fill(widths_host_, widths_host_ + static_cast<size_t>(world_) * h, 0);
  for (int p = 0; p < world_; ++p) widths_host_[static_cast<size_t>(p) * h] = k;
  Status s = cuda_status(
      cudaMemcpyAsync(send, widths_host_, pitch * world_, cudaMemcpyHostToDevice, stream),
      "copy of the count widths to the GPU");
  if (s.ok() && inline_k > 0) {
    s = cuda_status(
        cudaMemcpy2DAsync(send + 1, pitch, send_counts, sizeof(int64_t) * k,
                          sizeof(int64_t) * inline_k, world_, cudaMemcpyDeviceToDevice, stream),
        "copy of the counts into their messages");
  }
  if (s.ok()) s = exchange_counts(send, recv, h, header_host_, stream);
  if (!s.ok()) return s;
  const int64_t* got = header_host_ + static_cast<size_t>(world_) * h;
  bool same = true;
  for (int p = 0; p < world_; ++p) {
    widths[p] = got[static_cast<size_t>(p) * h];
    same = same && widths[p] == k;
  }
  if (!same) return Status::OK();
  if (k > inline_k) return exchange_counts(send_counts, recv_counts, k, host_counts, stream);
  for (int p = 0; p < world_; ++p) {
    const int64_t* row = header_host_ + static_cast<size_t>(p) * h + 1;
    std::copy(row, row + k, host_counts + static_cast<size_t>(p) * k);
    std::copy(got + static_cast<size_t>(p) * h + 1, got + static_cast<size_t>(p) * h + 1 + k,
              host_counts + static_cast<size_t>(world_ + p) * k);
  }
  return cuda_status(
      cudaMemcpy2DAsync(recv_counts, sizeof(int64_t) * k, recv + 1, pitch, sizeof(int64_t) * k,
                        world_, cudaMemcpyDeviceToDevice, stream),
      "copy of the received counts out of their messages");
}

Status Communicator::all_to_all(const void* send, const int64_t* send_rows, void* recv,
                                const int64_t* recv_rows, size_t row_bytes, cudaStream_t stream) {
  if (aborted_) return Status::Invalid("the NCCL communicator was aborted by an earlier error");
  const Nccl& n = Load();
  const char* in = static_cast<const char*>(send);
  char* out = static_cast<char*>(recv);
  size_t in_at = 0, out_at = 0;
  Status s = check(n.GroupStart(), "ncclGroupStart");
  for (int p = 0; p < world_ && s.ok(); ++p) {
    const size_t in_bytes = static_cast<size_t>(send_rows[p]) * row_bytes;
    const size_t out_bytes = static_cast<size_t>(recv_rows[p]) * row_bytes;
    if (p == rank_ && in_bytes != out_bytes) {
      s = Status::Invalid("all-to-all: rank " + std::to_string(rank_) + " sends itself " +
                          std::to_string(in_bytes) + " bytes but receives " +
                          std::to_string(out_bytes));
    }
    // The rank's own part too: NCCL copies it in the kernel that moves the peers' parts, beside
    // them, where a copy of its own on `stream` would run before that kernel.
    if (s.ok() && in_bytes > 0) {
      s = check(n.Send(in + in_at, in_bytes, kNcclInt8, p, comm_, stream), "ncclSend");
    }
    if (s.ok() && out_bytes > 0) {
      s = check(n.Recv(out + out_at, out_bytes, kNcclInt8, p, comm_, stream), "ncclRecv");
    }
    in_at += in_bytes;
    out_at += out_bytes;
  }
  Status end = check(n.GroupEnd(), "ncclGroupEnd");
  return s.ok() ? end : s;
}

Status Communicator::all_reduce(const void* in, void* out, size_t count, NcclType type, bool mean,
                                cudaStream_t stream) {
  if (aborted_) return Status::Invalid("the NCCL communicator was aborted by an earlier error");
  return check(Load().AllReduce(in, out, count, static_cast<int>(type), mean ? kNcclAvg : kNcclSum,
                                comm_, stream),
               "ncclAllReduce");
}

Status Communicator::group_start() { return check(Load().GroupStart(), "ncclGroupStart"); }
Status Communicator::group_end() { return check(Load().GroupEnd(), "ncclGroupEnd"); }

Communicator* Communicator::on_device(int device) {
  std::lock_guard<std::mutex> l(RegistryMu());
  auto it = Registry().find(device);
  return it == Registry().end() ? nullptr : it->second.get();
}

Status Communicator::install(std::unique_ptr<Communicator> comm) {
  std::lock_guard<std::mutex> l(RegistryMu());
  auto& slot = Registry()[comm->device()];
  if (slot != nullptr) {
    return Status::Invalid("an NCCL communicator already exists on GPU " +
                           std::to_string(comm->device()) + " in this process");
  }
  slot = std::move(comm);
  return Status::OK();
}

}  // namespace gpu
}  // namespace sok
