// GpuTieredTable<K>'s SSD tier (HBM_DRAM_SSDHASH; gpu_tiered_table.h, the header comment's end):
// rows on file move whole, in host batches, into the host tier before an operation that may
// update them and back down after it; a read-only find reads them from the file.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <vector>

#include "addons/sparse_operation_kit/core/cuda/gpu_tiered_table.h"
#include "addons/sparse_operation_kit/core/cuda/runtime.h"
#include "addons/sparse_operation_kit/core/cuda/table_impl.cuh"
#include "addons/sparse_operation_kit/core/cuda/tier_moves.cuh"
#include "addons/sparse_operation_kit/core/parallel.h"
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

// Before calls that may update or insert: the rows of their keys on file move into the host
// tier, whole, so that the tiers' kernels serve every key. The file work of the tables runs in
// parallel (each table's file is its own); the device work stays on the stream, in order.
template <typename K>
Status GpuTieredTable<K>::from_ssd_many(const std::vector<GpuTieredTable*>& tables,
                                        const std::vector<Span>& keys, cudaStream_t s) {
  struct Pull {
    GpuTieredTable* t;
    std::vector<K> keys;
    TableSnapshot<K> rows;  // in the host tier's slot layout
    Status st;
  };
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<Pull> pulls;
  for (size_t i = 0; i < tables.size(); ++i) {
    GpuTieredTable* t = tables[i];
    if (!t->ssd_ || t->ssd_->size() == 0 || keys[i].n <= 0) continue;
    Pull p{t, {}, {}, Status::OK()};
    SOK_RETURN_IF_ERROR(t->keys_on_host(keys[i], s, &p.keys));
    const auto& c = *t->cold_->impl_;
    p.rows.dim = t->cfg_.dim;
    p.rows.num_slots = c.num_slots;
    p.rows.slot_kind = c.slot_kind;
    p.rows.slot_init = c.slot_init;
    pulls.push_back(std::move(p));
  }
  if (pulls.empty()) return Status::OK();
  const auto t1 = std::chrono::steady_clock::now();
  parallel_each(static_cast<int64_t>(pulls.size()), [&](int64_t i) {
    Pull& p = pulls[i];
    p.st = p.t->ssd_->read(p.keys.data(), static_cast<int64_t>(p.keys.size()), &p.rows);
  });
  for (Pull& p : pulls) {
    if (p.st.ok() && !p.rows.keys.empty()) p.st = p.t->cold_->put_rows(p.rows, s);
  }
  // Off the file only once the host tier holds them: a failed move loses no row.
  parallel_each(static_cast<int64_t>(pulls.size()), [&](int64_t i) {
    Pull& p = pulls[i];
    if (p.st.ok() && !p.rows.keys.empty())
      p.st = p.t->ssd_->remove(p.rows.keys.data(), static_cast<int64_t>(p.rows.keys.size()));
  });
  const auto t2 = std::chrono::steady_clock::now();
  for (Pull& p : pulls) {
    const int64_t m = static_cast<int64_t>(p.rows.keys.size());
    if (p.st.ok() && m > 0) {
      p.t->cold_empty_ = false;
      p.t->cold_bound_ += m;
      p.t->stats_.ssd_promoted_rows += m;
    }
  }
  note_ssd_time(pulls[0].t, t0, t1, t2);
  for (Pull& p : pulls) SOK_RETURN_IF_ERROR(p.st);
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

// After calls that may have inserted: once a table's upper bound of its host tier's rows passes
// the budget plus `slack` rows, its row count is read (a sync) and, when over, its coldest rows
// (the calls' keys last) go to the file in one batch, down to the low watermark plus the slack.
// The tables' writes run in parallel.
template <typename K>
Status GpuTieredTable<K>::to_ssd_many(const std::vector<GpuTieredTable*>& tables,
                                      const std::vector<Span>& keys,
                                      const std::vector<int64_t>& slack, cudaStream_t s) {
  struct Push {
    GpuTieredTable* t;
    int64_t live, count;
    std::unique_ptr<detail::Temp> victims;
    TableSnapshot<K> rows;
    Status st;
  };
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<Push> pushes;
  for (size_t i = 0; i < tables.size(); ++i) {
    GpuTieredTable& t = *tables[i];
    if (!t.ssd_) continue;
    int64_t cap = 0, live = 0;
    SOK_RETURN_IF_ERROR(t.dram_rows(t.cold_->num_slots(), &cap));
    if (t.cold_bound_ <= cap + slack[i]) continue;
    ++t.stats_.size_syncs;
    SOK_RETURN_IF_ERROR(t.cold_->size(&live, s));
    t.cold_bound_ = live;
    if (live <= cap + slack[i]) continue;
    Push p{&t,
           live,
           live - tier_low_watermark(cap) - slack[i],
           std::make_unique<detail::Temp>(),
           {},
           Status::OK()};
    SOK_RETURN_IF_ERROR(p.victims->alloc(t.cold_->impl_->alloc, p.count * sizeof(K), s));
    SOK_RETURN_IF_ERROR(
        t.select_cold_victims(live, p.count, keys[i], p.victims->template as<K>(), s));
    SOK_RETURN_IF_ERROR(t.cold_->export_keys(p.victims->template as<K>(), p.count, &p.rows, s));
    pushes.push_back(std::move(p));
  }
  if (pushes.empty()) return Status::OK();
  const auto t1 = std::chrono::steady_clock::now();
  // On file first, out of the host tier after: a failed write loses no row.
  parallel_each(static_cast<int64_t>(pushes.size()), [&](int64_t i) {
    Push& p = pushes[i];
    p.st = p.t->ssd_->put(p.rows);
  });
  const auto t2 = std::chrono::steady_clock::now();
  for (Push& p : pushes) {
    if (!p.st.ok()) continue;
    p.st = p.t->cold_->erase(p.victims->template as<K>(), p.count, s);
    if (!p.st.ok()) continue;
    const int64_t m = static_cast<int64_t>(p.rows.keys.size());
    p.t->cold_bound_ = p.live - m;
    p.t->stats_.ssd_demoted_rows += m;
    ++p.t->stats_.ssd_batches;
  }
  note_ssd_time(pushes[0].t, t0, t1, t2);
  for (Push& p : pushes) SOK_RETURN_IF_ERROR(p.st);
  return Status::OK();
}

// The host time of a call's SSD work (t0 to now) and of its file part (t1 to t2), on the first
// table it moved (the stats a benchmark sums over the tables).
template <typename K>
void GpuTieredTable<K>::note_ssd_time(GpuTieredTable* t, Clock::time_point t0, Clock::time_point t1,
                                      Clock::time_point t2) {
  using us = std::chrono::microseconds;
  t->stats_.ssd_host_us += std::chrono::duration_cast<us>(Clock::now() - t0).count();
  t->stats_.ssd_file_us += std::chrono::duration_cast<us>(t2 - t1).count();
}

// gpu_tiered_table.cu instantiates the class; these members are defined here.
#define SOK_TIERED_SSD(K)                                                                      \
  template Status GpuTieredTable<K>::dram_rows(int, int64_t*) const;                           \
  template int64_t GpuTieredTable<K>::dram_budget_rows() const;                                \
  template Status GpuTieredTable<K>::keys_on_host(const Span&, cudaStream_t, std::vector<K>*); \
  template Status GpuTieredTable<K>::from_ssd_many(const std::vector<GpuTieredTable*>&,        \
                                                   const std::vector<Span>&, cudaStream_t);    \
  template Status GpuTieredTable<K>::find_ssd(const Span&, float*, cudaStream_t);              \
  template Status GpuTieredTable<K>::select_cold_victims(int64_t, int64_t, const Span&, K*,    \
                                                         cudaStream_t);                        \
  template Status GpuTieredTable<K>::to_ssd_many(const std::vector<GpuTieredTable*>&,          \
                                                 const std::vector<Span>&,                     \
                                                 const std::vector<int64_t>&, cudaStream_t);   \
  template void GpuTieredTable<K>::note_ssd_time(GpuTieredTable*, Clock::time_point,           \
                                                 Clock::time_point, Clock::time_point);
SOK_TIERED_SSD(int32_t)
SOK_TIERED_SSD(int64_t)
#undef SOK_TIERED_SSD

}  // namespace gpu
}  // namespace sok
