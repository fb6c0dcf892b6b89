// GpuTieredTable<K>'s SSD tier (HBM_DRAM_SSDHASH; gpu_tiered_table.h, the header comment's end):
// rows on file move whole, in host batches, into the host tier before an operation that may
// update them and back down after it; a read-only find reads them from the file.
#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

#include "addons/sparse_operation_kit/core/cuda/gpu_tiered_table.h"
#include "addons/sparse_operation_kit/core/cuda/runtime.h"
#include "addons/sparse_operation_kit/core/cuda/table_impl.cuh"
#include "addons/sparse_operation_kit/core/cuda/tier_moves.cuh"
#include "addons/sparse_operation_kit/core/tier_policy.h"

namespace sok {
namespace gpu {

using detail::DeviceGuard;

template <typename K>
Status GpuTieredTable<K>::dram_rows(int num_slots, int64_t* rows) const {
  return tier_budget_rows(cfg_, "DRAM", cfg_.dram_bytes, num_slots, rows);
}

template <typename K>
int64_t GpuTieredTable<K>::dram_budget_rows() const {
  int64_t rows = 0;
  if (ssd_ && !dram_rows(cold_->num_slots(), &rows).ok()) rows = 0;
  return rows;
}

// A call's keys on the host, only the counted ones: the file's index is there (one stream sync).
template <typename K>
Status GpuTieredTable<K>::keys_on_host(const Span& keys, cudaStream_t s, std::vector<K>* out) {
  DeviceGuard g(cold_->impl_->device);
  out->resize(keys.n);
  int64_t count = keys.n;
  SOK_CUDA_RETURN(
      cudaMemcpyAsync(out->data(), keys.keys, keys.n * sizeof(K), cudaMemcpyDeviceToHost, s));
  if (keys.d_n != nullptr)
    SOK_CUDA_RETURN(cudaMemcpyAsync(&count, keys.d_n, sizeof(count), cudaMemcpyDeviceToHost, s));
  SOK_CUDA_RETURN(cudaStreamSynchronize(s));
  out->resize(std::max<int64_t>(0, std::min(count, keys.n)));
  ++stats_.ssd_key_syncs;
  return Status::OK();
}

// Before a call that may update or insert: the rows of its keys on file move into the host tier,
// whole, so that the tiers' kernels serve every key.
template <typename K>
Status GpuTieredTable<K>::from_ssd(const Span& keys, cudaStream_t s) {
  if (!ssd_ || ssd_->size() == 0 || keys.n <= 0) return Status::OK();
  std::vector<K> h;
  SOK_RETURN_IF_ERROR(keys_on_host(keys, s, &h));
  const int64_t n = static_cast<int64_t>(h.size());
  const auto& c = *cold_->impl_;
  TableSnapshot<K> rows;  // in the host tier's slot layout
  rows.dim = cfg_.dim;
  rows.num_slots = c.num_slots;
  rows.slot_kind = c.slot_kind;
  rows.slot_init = c.slot_init;
  SOK_RETURN_IF_ERROR(ssd_->read(h.data(), n, &rows));
  const int64_t m = static_cast<int64_t>(rows.keys.size());
  if (m == 0) return Status::OK();
  SOK_RETURN_IF_ERROR(cold_->put_rows(rows, s));
  // Off the file only once the host tier holds them: a failed move loses no row.
  SOK_RETURN_IF_ERROR(ssd_->remove(rows.keys.data(), m));
  cold_empty_ = false;
  cold_bound_ += m;
  stats_.ssd_promoted_rows += m;
  return Status::OK();
}

// A read-only find: the output rows of keys on file get their rows; nothing moves.
template <typename K>
Status GpuTieredTable<K>::find_ssd(const Span& keys, float* out, cudaStream_t s) {
  if (!ssd_ || ssd_->size() == 0 || keys.n <= 0) return Status::OK();
  std::vector<K> h;
  SOK_RETURN_IF_ERROR(keys_on_host(keys, s, &h));
  const int64_t n = static_cast<int64_t>(h.size());
  std::vector<int64_t> pos;
  std::vector<float> rows;
  SOK_RETURN_IF_ERROR(ssd_->find(h.data(), n, &pos, &rows));
  const int64_t m = static_cast<int64_t>(pos.size());
  if (m == 0) return Status::OK();
  auto& c = *cold_->impl_;
  DeviceGuard g(c.device);
  detail::Temp d_pos, d_rows;
  SOK_RETURN_IF_ERROR(d_pos.alloc(c.alloc, m * sizeof(int64_t), s));
  SOK_RETURN_IF_ERROR(d_rows.alloc(c.alloc, rows.size() * sizeof(float), s));
  SOK_CUDA_RETURN(cudaMemcpyAsync(d_pos.as<int64_t>(), pos.data(), m * sizeof(int64_t),
                                  cudaMemcpyHostToDevice, s));
  SOK_CUDA_RETURN(cudaMemcpyAsync(d_rows.as<float>(), rows.data(), rows.size() * sizeof(float),
                                  cudaMemcpyHostToDevice, s));
  SOK_RETURN_IF_ERROR(
      detail::scatter_rows(d_rows.as<float>(), d_pos.as<int64_t>(), m, cfg_.dim, out, s));
  SOK_CUDA_RETURN(cudaStreamSynchronize(s));  // pos and rows (pageable) outlive the copies
  return Status::OK();
}

template <typename K>
Status GpuTieredTable<K>::select_cold_victims(int64_t live, int64_t count, const Span& keys,
                                              K* victims, cudaStream_t s) {
  auto& c = *cold_->impl_;
  DeviceGuard g(c.device);
  std::lock_guard<std::mutex> l(c.mu);
  c.note_stream(s);
  const bool lfu = cfg_.cache_strategy == CacheStrategy::kLFU;
  const Status st =
      detail::coldest_keys<K>(c.t, c.capacity, live, lfu, keys, count, victims, c.alloc, s);
  return st.ok() ? st : Status::Invalid("table '" + cfg_.name + "': " + st.message());
}

// After a call that may have inserted: once the host tier's row bound passes its budget, its row
// count is read (a sync) and, when over, its coldest rows go to the file in one batch.
template <typename K>
Status GpuTieredTable<K>::to_ssd(const Span& keys, cudaStream_t s) {
  if (!ssd_) return Status::OK();
  int64_t cap = 0, live = 0;
  SOK_RETURN_IF_ERROR(dram_rows(cold_->num_slots(), &cap));
  if (cold_bound_ <= cap) return Status::OK();
  ++stats_.size_syncs;
  SOK_RETURN_IF_ERROR(cold_->size(&live, s));
  cold_bound_ = live;
  if (live <= cap) return Status::OK();
  const int64_t count = live - tier_low_watermark(cap);
  detail::Temp victims;
  SOK_RETURN_IF_ERROR(victims.alloc(cold_->impl_->alloc, count * sizeof(K), s));
  SOK_RETURN_IF_ERROR(select_cold_victims(live, count, keys, victims.as<K>(), s));
  TableSnapshot<K> rows;
  SOK_RETURN_IF_ERROR(cold_->export_keys(victims.as<K>(), count, &rows, s));
  // On file first, out of the host tier after: a failed write loses no row.
  SOK_RETURN_IF_ERROR(ssd_->put(rows));
  SOK_RETURN_IF_ERROR(cold_->erase(victims.as<K>(), count, s));
  const int64_t m = static_cast<int64_t>(rows.keys.size());
  cold_bound_ = live - m;
  stats_.ssd_demoted_rows += m;
  ++stats_.ssd_batches;
  return Status::OK();
}

// gpu_tiered_table.cu instantiates the class; these members are defined here.
#define SOK_TIERED_SSD(K)                                                                      \
  template Status GpuTieredTable<K>::dram_rows(int, int64_t*) const;                           \
  template int64_t GpuTieredTable<K>::dram_budget_rows() const;                                \
  template Status GpuTieredTable<K>::keys_on_host(const Span&, cudaStream_t, std::vector<K>*); \
  template Status GpuTieredTable<K>::from_ssd(const Span&, cudaStream_t);                      \
  template Status GpuTieredTable<K>::find_ssd(const Span&, float*, cudaStream_t);              \
  template Status GpuTieredTable<K>::select_cold_victims(int64_t, int64_t, const Span&, K*,    \
                                                         cudaStream_t);                        \
  template Status GpuTieredTable<K>::to_ssd(const Span&, cudaStream_t);
SOK_TIERED_SSD(int32_t)
SOK_TIERED_SSD(int64_t)
#undef SOK_TIERED_SSD

}  // namespace gpu
}  // namespace sok
