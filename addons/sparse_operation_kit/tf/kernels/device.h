// What differs between the CPU and the GPU for the SOK kernels, in one place: how work is ordered
// (worker pool vs CUDA stream), where a table's memory comes from, how per-table work runs. Each
// kernel is written once as a template over CpuDevice / GpuDevice and registered for both.
#pragma once

#if GOOGLE_CUDA && !defined(EIGEN_USE_GPU)
#define EIGEN_USE_GPU
#endif

#include <array>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "addons/sparse_operation_kit/core/tiered_table.h"
#include "tensorflow/core/framework/allocator.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/platform/threadpool.h"
#include "tsl/profiler/lib/traceme.h"

#if GOOGLE_CUDA
#include <cuda_runtime_api.h>

#include "addons/sparse_operation_kit/core/cuda/gpu_api.h"
#include "addons/sparse_operation_kit/core/cuda/gpu_tiered_table.h"
#endif

namespace tensorflow {
namespace sok_kernels {

struct CpuDevice {
  static constexpr int kIndex = 0;
  static constexpr bool kTablesShareABuffer = false;  // see AllocateTableTensors
};
struct GpuDevice {
  static constexpr int kIndex = 1;
  static constexpr bool kTablesShareABuffer = true;
};

// A core error as a TensorFlow one, named after the table it concerns.
inline Status ToTf(const sok::Status& s) {
  return s.ok() ? OkStatus() : errors::InvalidArgument(s.message());
}
inline Status ToTf(const sok::Status& s, const std::string& table) {
  if (s.ok()) return OkStatus();
  // The core's table errors already start with "table '<name>'".
  if (s.message().rfind("table '", 0) == 0) return errors::InvalidArgument(s.message());
  return errors::InvalidArgument("Embedding Variable '", table, "': ", s.message());
}

// How many times each SOK kernel ran on each device in this process: op type -> [CPU, GPU]
// (tests and users check placement with it).
struct KernelRunCounts {
  std::mutex mu;
  std::map<std::string, std::array<int64_t, 2>> by_op;
  static KernelRunCounts& Get() {
    static KernelRunCounts counts;
    return counts;
  }
  void Add(const std::string& op, int device) {
    std::lock_guard<std::mutex> l(mu);
    ++by_op[op][device];
  }
};

// Base of every SOK kernel: counts the run, then computes. The computation is a TraceMe
// "name:Type" in TensorFlow's profiler, as TensorFlow's CPU ops are: its GPU ops have no host
// event, and a GPU step's host time between launches is mostly spent inside such ops.
template <typename Device>
class SokOpKernel : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) final {
    KernelRunCounts::Get().Add(type_string(), Device::kIndex);
    tsl::profiler::TraceMe trace([this] { return absl::StrCat(name(), ":", type_string()); });
    ComputeOnDevice(ctx);
  }

 protected:
  virtual void ComputeOnDevice(OpKernelContext* ctx) = 0;
};

// One tensor per table, of `shapes`, all of `dtype`. On the GPU they are parts of one buffer: one
// allocation instead of one per table (a GPU step's host time is mostly per-op, per-table work);
// each part starts 64-byte aligned, so every tensor is aligned, and the buffer lives until the
// last of them is released. On the CPU each gets its own allocation: one buffer of every table's
// rows is a fresh mapping of tens of MB there, its pages faulted in on every call (the fields100
// step ran 30% slower).
template <typename Device>
Status AllocateTableTensors(OpKernelContext* ctx, DataType dtype,
                            const std::vector<TensorShape>& shapes, std::vector<Tensor>* parts) {
  parts->resize(shapes.size());
  if (!Device::kTablesShareABuffer) {
    for (size_t i = 0; i < shapes.size(); ++i) {
      TF_RETURN_IF_ERROR(ctx->allocate_temp(dtype, shapes[i], &(*parts)[i]));
    }
    return OkStatus();
  }
  constexpr int64_t kAlign = 64;
  const int64_t elem = DataTypeSize(dtype);
  std::vector<int64_t> at(shapes.size());
  int64_t elems = 0;
  for (size_t i = 0; i < shapes.size(); ++i) {
    at[i] = elems;
    elems += (shapes[i].num_elements() * elem + kAlign - 1) / kAlign * kAlign / elem;
  }
  Tensor buffer;
  TF_RETURN_IF_ERROR(
      ctx->allocate_temp(dtype, TensorShape({std::max<int64_t>(elems, 1)}), &buffer));
  for (size_t i = 0; i < shapes.size(); ++i) {
    if (!(*parts)[i].CopyFrom(buffer.Slice(at[i], at[i] + shapes[i].num_elements()), shapes[i])) {
      return errors::Internal("a part of ", shapes[i].num_elements(),
                              " elements cannot take shape ", shapes[i].DebugString());
    }
  }
  return OkStatus();
}

// Outputs [first, first + shapes.size()): AllocateTableTensors' tensors, set as the outputs.
template <typename Device>
Status AllocateTableOutputs(OpKernelContext* ctx, int first, DataType dtype,
                            const std::vector<TensorShape>& shapes, std::vector<Tensor*>* outs) {
  std::vector<Tensor> parts;
  TF_RETURN_IF_ERROR(AllocateTableTensors<Device>(ctx, dtype, shapes, &parts));
  outs->resize(shapes.size());
  for (size_t i = 0; i < shapes.size(); ++i) {
    ctx->set_output(first + static_cast<int>(i), parts[i]);
    (*outs)[i] = ctx->mutable_output(first + static_cast<int>(i));
  }
  return OkStatus();
}

// One table's share of an op over N tables (Gather, SparseApply).
template <typename K>
struct TableCall {
  sok::Table<K>* table = nullptr;
  const K* keys = nullptr;
  int64_t n = 0;
  float* out = nullptr;             // Gather: [n, dim]
  const int64_t* counts = nullptr;  // Gather: or null (1 each)
  const float* grads = nullptr;     // SparseApply: [n, dim]
  const int64_t* d_n = nullptr;     // GPU: a device count <= n of the keys to use (or null)
};

template <typename Device>
struct OnDevice;

template <>
struct OnDevice<CpuDevice> {
  // The whole worker pool for one table's work.
  static sok::ExecContext Exec(OpKernelContext* ctx) {
    thread::ThreadPool* pool = ctx->device()->tensorflow_cpu_worker_threads()->workers;
    sok::ExecContext e;
    e.parallel_for = [pool](int64_t total, int64_t cost, const sok::RangeFn& fn) {
      pool->ParallelFor(total, cost, [&fn](int64_t b, int64_t end) { fn(b, end); });
    };
    return e;
  }

  // fn(i, exec) for every table i: several tables run in parallel, one task each (a slow or
  // preempted worker then holds up at most one table); a single table gets the whole pool.
  static void ForEachTable(OpKernelContext* ctx, int n,
                           const std::function<void(int, const sok::ExecContext&)>& fn) {
    if (n == 1) {
      fn(0, Exec(ctx));
      return;
    }
    const sok::ExecContext serial;
    thread::ThreadPool* pool = ctx->device()->tensorflow_cpu_worker_threads()->workers;
    pool->ParallelFor(n, thread::ThreadPool::SchedulingParams::Fixed(1), [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) fn(static_cast<int>(i), serial);
    });
  }

  // Only the first *valid keys of the call count (valid: this device's memory).
  template <typename K>
  static Status LimitCount(OpKernelContext*, const int64_t* valid, TableCall<K>* c) {
    if (*valid < 0 || *valid > c->n) {
      return errors::InvalidArgument("'", c->table->name(), "': ", *valid, " valid keys of ", c->n);
    }
    c->n = *valid;
    return OkStatus();
  }

  // The evaluation read / training read / optimizer step of every table, tables in parallel.
  template <typename K>
  static Status Find(OpKernelContext* ctx, const std::vector<TableCall<K>>& calls) {
    return EachCall(ctx, calls, [](const TableCall<K>& c, const sok::ExecContext& e) {
      return c.table->find(e, c.keys, c.n, c.out);
    });
  }
  template <typename K>
  static Status FindOrInsert(OpKernelContext* ctx, const std::vector<TableCall<K>>& calls) {
    return EachCall(ctx, calls, [](const TableCall<K>& c, const sok::ExecContext& e) {
      return c.table->find_or_insert(e, c.keys, c.n, c.out, c.counts);
    });
  }
  template <typename K>
  static Status Apply(OpKernelContext* ctx, const std::vector<TableCall<K>>& calls,
                      const sok::OptimizerParams& p, int64_t step, bool keys_unique,
                      bool /*keys_present: growth on the CPU needs no bound*/) {
    return EachCall(ctx, calls, [&](const TableCall<K>& c, const sok::ExecContext& e) {
      return c.table->apply_gradients(e, c.keys, c.n, c.grads, p, step, keys_unique);
    });
  }

  template <typename K>
  static Status NewTable(OpKernelContext*, const sok::TableConfig& config,
                         std::unique_ptr<sok::Table<K>>* out, std::shared_ptr<void>*) {
    return ToTf(sok::new_cpu_table<K>(config, out), config.name);
  }

 private:
  template <typename K, typename Fn>
  static Status EachCall(OpKernelContext* ctx, const std::vector<TableCall<K>>& calls, Fn fn) {
    std::vector<sok::Status> status(calls.size());
    ForEachTable(ctx, static_cast<int>(calls.size()),
                 [&](int i, const sok::ExecContext& e) { status[i] = fn(calls[i], e); });
    for (size_t i = 0; i < calls.size(); ++i)
      TF_RETURN_IF_ERROR(ToTf(status[i], calls[i].table->name()));
    return OkStatus();
  }
};

#if GOOGLE_CUDA
// TensorFlow's allocator of the device as the core's DeviceAllocator, for temporaries and table
// storage alike: tables share TensorFlow's GPU memory reservation instead of competing with it.
// Freeing at once is safe because every user of the memory runs on TF's compute stream.
class TfDeviceAllocator : public sok::gpu::DeviceAllocator {
 public:
  explicit TfDeviceAllocator(Allocator* a) : a_(a) {}
  void* allocate(size_t bytes, cudaStream_t) override {
    return a_->AllocateRaw(Allocator::kAllocatorAlignment, bytes);
  }
  void deallocate(void* p, size_t, cudaStream_t) override { a_->DeallocateRaw(p); }
  std::string describe_free_memory() override {
    absl::optional<AllocatorStats> s = a_->GetStats();
    if (!s || !s->bytes_limit) return sok::gpu::DeviceAllocator::describe_free_memory();
    return std::to_string(*s->bytes_limit - s->bytes_in_use) + " of " +
           std::to_string(*s->bytes_limit) +
           " bytes free in TensorFlow's GPU allocator, largest free block " +
           std::to_string(s->largest_free_block_bytes);
  }

 private:
  Allocator* a_;
};

// Makes the stream's device current for a scope: the core creates a table on the current device.
class ScopedStreamDevice {
 public:
  explicit ScopedStreamDevice(cudaStream_t stream) {
    int dev = -1;
    if (cudaStreamGetDevice(stream, &dev) == cudaSuccess && cudaGetDevice(&prev_) == cudaSuccess &&
        dev != prev_) {
      restore_ = cudaSetDevice(dev) == cudaSuccess;
    }
    cudaGetLastError();  // a failed query must not leak into the next CUDA error check
  }
  ~ScopedStreamDevice() {
    if (restore_) cudaSetDevice(prev_);
  }
  ScopedStreamDevice(const ScopedStreamDevice&) = delete;
  ScopedStreamDevice& operator=(const ScopedStreamDevice&) = delete;

 private:
  int prev_ = -1;
  bool restore_ = false;
};

template <>
struct OnDevice<GpuDevice> {
  // TF's compute stream of the device: every core call is ordered on it.
  static cudaStream_t Stream(OpKernelContext* ctx) { return ctx->eigen_gpu_device().stream(); }
  static sok::ExecContext Exec(OpKernelContext* ctx) {
    sok::ExecContext e;
    e.stream = Stream(ctx);
    return e;
  }
  // Only the first *valid keys of the call count (valid: device memory). Every GPU table takes
  // the count on the device (the kernels clamp it to n): no host wait.
  template <typename K>
  static Status LimitCount(OpKernelContext*, const int64_t* valid, TableCall<K>* c) {
    c->d_n = valid;
    return OkStatus();
  }

  // The evaluation read: one launch per table.
  template <typename K>
  static Status Find(OpKernelContext* ctx, const std::vector<TableCall<K>>& calls) {
    const sok::ExecContext e = Exec(ctx);
    for (const TableCall<K>& c : calls) {
      sok::Status s;
      if (c.d_n == nullptr) s = c.table->find(e, c.keys, c.n, c.out);
      else if (IsPlain(c.table)) s = Plain(c.table)->find(c.keys, c.n, c.out, Stream(ctx), c.d_n);
      else s = Tiered(c.table)->find(c.keys, c.n, c.out, Stream(ctx), c.d_n);
      TF_RETURN_IF_ERROR(ToTf(s, c.table->name()));
    }
    return OkStatus();
  }
  // The training read / the optimizer step of every table in few launches (the core fuses up to
  // 32 tables per launch: one op of 26 tables costs the host one launch, not 26). Tiered
  // tables (HBM_DRAM) are fused the same way, then each runs its placement pass.
  template <typename K>
  static Status FindOrInsert(OpKernelContext* ctx, const std::vector<TableCall<K>>& calls) {
    std::vector<TableCall<K>> plain, tiered;
    Split(calls, &plain, &tiered);
    TF_RETURN_IF_ERROR(
        ToTf(sok::gpu::GpuTieredTable<K>::find_or_insert_many(TieredCalls(tiered), Stream(ctx))));
    return ToTf(sok::gpu::GpuEmbeddingTable<K>::find_or_insert_many(GpuCalls(plain), Stream(ctx)));
  }
  template <typename K>
  static Status Apply(OpKernelContext* ctx, const std::vector<TableCall<K>>& calls,
                      const sok::OptimizerParams& p, int64_t step, bool keys_unique,
                      bool keys_present) {
    std::vector<TableCall<K>> plain, tiered;
    Split(calls, &plain, &tiered);
    TF_RETURN_IF_ERROR(ToTf(sok::gpu::GpuTieredTable<K>::apply_gradients_many(
        TieredCalls(tiered), p, step, Stream(ctx), keys_unique, keys_present)));
    return ToTf(sok::gpu::GpuEmbeddingTable<K>::apply_gradients_many(
        GpuCalls(plain), p, step, Stream(ctx), keys_unique, keys_present));
  }

  // A table in the memory of the kernel's device, allocated through TensorFlow's allocator
  // (`keep_alive` owns the allocator wrapper; the resource keeps it beyond the table).
  template <typename K>
  static Status NewTable(OpKernelContext* ctx, const sok::TableConfig& config,
                         std::unique_ptr<sok::Table<K>>* out, std::shared_ptr<void>* keep_alive) {
    auto alloc =
        std::make_shared<TfDeviceAllocator>(ctx->device()->GetAllocator(AllocatorAttributes()));
    sok::gpu::GpuTableOptions options;
    options.allocator = alloc.get();
    options.storage = alloc.get();  // HBM_DRAM's host rows come from pinned host memory
    ScopedStreamDevice on_device(Stream(ctx));
    TF_RETURN_IF_ERROR(ToTf(sok::gpu::new_gpu_table<K>(config, options, out), config.name));
    *keep_alive = alloc;
    return OkStatus();
  }

 private:
  // A one-tier table (sok::gpu::GpuTable: DRAM or HBM), not a GpuTieredTable; NewTable above
  // makes only these two, and new_gpu_table makes the tiered one for exactly these storage kinds.
  template <typename K>
  static bool IsPlain(const sok::Table<K>* t) {
    const sok::StorageKind kind = t->config().storage;
    return kind != sok::StorageKind::kHbmDram && kind != sok::StorageKind::kHbmDramSsdHash;
  }
  template <typename K>
  static sok::gpu::GpuEmbeddingTable<K>* Plain(sok::Table<K>* t) {
    return static_cast<sok::gpu::GpuTable<K>*>(t)->gpu_table();
  }
  template <typename K>
  static sok::gpu::GpuTieredTable<K>* Tiered(sok::Table<K>* t) {
    return static_cast<sok::gpu::GpuTieredTable<K>*>(t);
  }
  // The calls on one-tier tables and those on tiered tables, each in order.
  template <typename K>
  static void Split(const std::vector<TableCall<K>>& calls, std::vector<TableCall<K>>* plain,
                    std::vector<TableCall<K>>* tiered) {
    for (const TableCall<K>& c : calls) (IsPlain(c.table) ? plain : tiered)->push_back(c);
  }
  // The core's call structs (GpuEmbeddingTable<K>::Keys, GpuTieredTable<K>::Call) for the op's
  // calls; table_of gives each one's core table.
  template <typename Call, typename K, typename TableOf>
  static std::vector<Call> CoreCalls(const std::vector<TableCall<K>>& calls, TableOf table_of) {
    std::vector<Call> out(calls.size());
    for (size_t i = 0; i < calls.size(); ++i) {
      out[i].table = table_of(calls[i].table);
      out[i].keys = calls[i].keys;
      out[i].n = calls[i].n;
      out[i].out = calls[i].out;
      out[i].counts = calls[i].counts;
      out[i].grads = calls[i].grads;
      out[i].d_n = calls[i].d_n;
    }
    return out;
  }
  template <typename K>
  static std::vector<typename sok::gpu::GpuEmbeddingTable<K>::Keys> GpuCalls(
      const std::vector<TableCall<K>>& calls) {
    return CoreCalls<typename sok::gpu::GpuEmbeddingTable<K>::Keys>(calls, &Plain<K>);
  }
  template <typename K>
  static std::vector<typename sok::gpu::GpuTieredTable<K>::Call> TieredCalls(
      const std::vector<TableCall<K>>& calls) {
    return CoreCalls<typename sok::gpu::GpuTieredTable<K>::Call>(calls, &Tiered<K>);
  }
};
inline Status CudaCall(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return OkStatus();
  return errors::Internal("CUDA error in ", what, ": ", cudaGetErrorName(e), " (",
                          cudaGetErrorString(e), ")");
}

// Pinned host memory for a dedup's argument upload when the op does not wait for its stream
// (padded; a pageable upload may wait for the stream): kept by the kernel, and reused once the
// event recorded after its last upload passed (a step ago: no real wait).
class UploadStaging {
 public:
  std::mutex mu;  // one call at a time uses the buffer (UploadBuffer holds it)
  UploadStaging() = default;
  UploadStaging(const UploadStaging&) = delete;
  UploadStaging& operator=(const UploadStaging&) = delete;
  ~UploadStaging() {
    if (event_ != nullptr) cudaEventDestroy(event_);
    if (buf_ != nullptr) cudaFreeHost(buf_);
  }
  Status Get(size_t bytes, void** out) {
    if (event_ != nullptr) {
      TF_RETURN_IF_ERROR(CudaCall(cudaEventSynchronize(event_), "reusing the upload buffer"));
    } else {
      TF_RETURN_IF_ERROR(CudaCall(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming),
                                  "creating the upload buffer's event"));
    }
    if (bytes > bytes_) {
      if (buf_ != nullptr) cudaFreeHost(buf_);
      buf_ = nullptr;
      TF_RETURN_IF_ERROR(CudaCall(cudaMallocHost(&buf_, bytes), "pinning the upload buffer"));
      bytes_ = bytes;
    }
    *out = buf_;
    return OkStatus();
  }
  Status Done(cudaStream_t stream) {
    return CudaCall(cudaEventRecord(event_, stream), "recording the upload buffer's event");
  }

 private:
  void* buf_ = nullptr;
  size_t bytes_ = 0;
  cudaEvent_t event_ = nullptr;
};

// One call's upload buffer: padded (nothing waits for the stream), the kernel's staging, held
// for the call; exact, a pinned temporary, alive until the op's own wait for its stream.
class UploadBuffer {
 public:
  Status Get(OpKernelContext* ctx, UploadStaging* staging, bool padded, int64_t bytes, void** out) {
    if (padded) {
      hold_ = std::unique_lock<std::mutex>(staging->mu);
      staging_ = staging;
      return staging->Get(bytes, out);
    }
    AllocatorAttributes pinned;
    pinned.set_on_host(true);
    pinned.set_gpu_compatible(true);
    TF_RETURN_IF_ERROR(ctx->allocate_temp(DT_INT8, TensorShape({bytes}), &temp_, pinned));
    *out = temp_.flat<int8>().data();
    return OkStatus();
  }
  // The call's status; the staging's event is recorded even after an error (the upload may be
  // queued, so the buffer waits for it).
  Status Done(Status call, cudaStream_t stream) {
    if (staging_ == nullptr) return call;
    Status recorded = staging_->Done(stream);
    return call.ok() ? recorded : call;
  }

 private:
  UploadStaging* staging_ = nullptr;
  std::unique_lock<std::mutex> hold_;
  Tensor temp_;
};
#endif  // GOOGLE_CUDA

// Table names of the ops' error messages (attr table_names); "#i" when the graph gives none.
inline Status TableNames(OpKernelConstruction* c, int n, std::vector<std::string>* names) {
  TF_RETURN_IF_ERROR(c->GetAttr("table_names", names));
  if (names->empty()) {  // a graph that gives no names: tables by position
    for (int i = 0; i < n; ++i) names->push_back("#" + std::to_string(i));
  }
  if (static_cast<int>(names->size()) != n) {
    return errors::InvalidArgument(names->size(), " table names for ", n, " tables");
  }
  return OkStatus();
}

#if GOOGLE_CUDA
// Device scratch for `count` objects of T (int64 words, so 8-byte aligned).
template <typename T>
Status DeviceScratch(OpKernelContext* ctx, int64_t count, Tensor* t, T** out) {
  const int64_t words = (count * static_cast<int64_t>(sizeof(T)) + 7) / 8;
  TF_RETURN_IF_ERROR(ctx->allocate_temp(DT_INT64, TensorShape({words > 0 ? words : 1}), t));
  *out = reinterpret_cast<T*>(t->flat<int64_t>().data());
  return OkStatus();
}
#endif  // GOOGLE_CUDA

}  // namespace sok_kernels
}  // namespace tensorflow
