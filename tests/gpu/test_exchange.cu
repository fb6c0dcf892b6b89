// core/cuda/exchange.h (the exchange's index work on the GPU) vs the CPU core (core/exchange.h)
// on random tables: spread and placed, Embedding Variables and static tables, dims 1..9 (rows
// moved a float at a time) or multiples of 4 (four at a time), more tables than one launch
// takes, 2 to 8 ranks.
// Usage: test_exchange [seed (0: from the clock)] [name filter]; see test_util.cuh.
#include <cstdint>
#include <string>
#include <vector>

#include "addons/sparse_operation_kit/core/cuda/exchange.h"
#include "addons/sparse_operation_kit/core/exchange.h"
#include "tests/gpu/test_util.cuh"

using namespace sok_gpu_test;  // NOLINT
namespace ex = sok::exchange;
namespace gex = sok::gpu::exchange;

namespace {

int64_t random_dim(bool quad) {
  return quad ? 4 * (1 + static_cast<int64_t>(g_rng() % 4)) : 1 + static_cast<int64_t>(g_rng() % 9);
}

std::vector<ex::TableSpec> random_tables(int n, int world, bool quad = false) {
  std::vector<ex::TableSpec> t(n);
  for (int i = 0; i < n; ++i) {
    t[i].target = (g_rng() % 3 == 0) ? static_cast<int64_t>(g_rng() % world) : -1;
    t[i].rows = (g_rng() % 2 == 0) ? -1 : 1000;
    t[i].dim = random_dim(quad);
  }
  return t;
}

// Distinct keys of one table (a requester's, after its dedup); static tables' mostly in range.
std::vector<int64_t> distinct_keys(size_t n, int64_t low, int64_t high) {
  std::vector<int64_t> pool(static_cast<size_t>(high - low));
  for (size_t i = 0; i < pool.size(); ++i) pool[i] = low + static_cast<int64_t>(i);
  std::shuffle(pool.begin(), pool.end(), g_rng);
  pool.resize(std::min(n, pool.size()));
  return pool;
}

// padded: each table's keys are followed by padding (random keys past valid[t]) the plan skips;
// about one table in eight has bad positions (valid -1: nothing requested, the header flags it).
bool test_plan(int world, int n, bool padded = false) {
  const auto tables = random_tables(n, world);
  std::vector<std::vector<int64_t>> keys(n), counts(n);
  std::vector<int64_t> sizes(n), valid(n);
  int64_t total = 0;
  for (int t = 0; t < n; ++t) {
    keys[t] = distinct_keys(g_rng() % 300, -20, 1010);
    valid[t] = static_cast<int64_t>(keys[t].size());
    if (padded) {
      for (int64_t i = g_rng() % 50; i > 0; --i) keys[t].push_back(static_cast<int64_t>(g_rng()));
      if (g_rng() % 8 == 0) valid[t] = -1;
    }
    counts[t].resize(keys[t].size());
    for (auto& c : counts[t]) c = 1 + static_cast<int64_t>(g_rng() % 5);
    sizes[t] = static_cast<int64_t>(keys[t].size());
    total += sizes[t];
  }
  DevBuf<int64_t> dvalid = to_device(valid);
  std::vector<const int64_t*> hk(n), hc(n), dk(n), dc(n);
  std::vector<DevBuf<int64_t>> bk, bc;
  for (int t = 0; t < n; ++t) {
    hk[t] = keys[t].data();
    hc[t] = counts[t].data();
    bk.push_back(to_device(keys[t]));
    bc.push_back(to_device(counts[t]));
    dk[t] = bk.back().get();
    dc[t] = bc.back().get();
  }
  std::vector<int64_t> request(2 * total), matrix(world * (n + 2)), row_at(total);
  ex::plan(tables, world, hk.data(), hc.data(), sizes.data(), padded ? valid.data() : nullptr, 42,
           request.data(), matrix.data(), row_at.data());
  DevBuf<int64_t> drequest(2 * total), dmatrix(world * (n + 2)), drow_at(total);
  drequest.poison();
  dmatrix.poison();
  drow_at.poison();
  SOK_OK(gex::plan(tables, world, dk, dc, sizes.data(), padded ? dvalid.get() : nullptr, 42,
                   drequest.get(), dmatrix.get(), drow_at.get(), nullptr));
  bool ok = sok_test::expect_eq("request", drequest.download(2 * total), request);
  ok &= sok_test::expect_eq("matrix", dmatrix.download(world * (n + 2)), matrix);
  ok &= sok_test::expect_eq("row_at", drow_at.download(total), row_at);
  return ok;
}

// pinned: the dedup's arguments go up from pinned host memory (the TF kernel's way).
bool test_owner(int world, int n, bool quad = false, bool padded = false, bool pinned = false) {
  const auto tables = random_tables(n, world, quad);
  std::vector<int64_t> counts(world * n), received;
  std::vector<int64_t> dims(n);
  for (int t = 0; t < n; ++t) dims[t] = tables[t].dim;
  for (int q = 0; q < world; ++q) {
    for (int t = 0; t < n; ++t) {  // each requester's keys distinct, shared between requesters
      const auto k = distinct_keys(g_rng() % 200, 0, 400);
      counts[q * n + t] = static_cast<int64_t>(k.size());
      // A spread static table's owner (here the last rank) receives only keys it owns: their
      // local rows (key / world) are distinct too.
      const bool spread_static = tables[t].target < 0 && tables[t].rows >= 0;
      for (int64_t key : k) {
        received.push_back(spread_static ? key * world + world - 1 : key);
        received.push_back(1 + static_cast<int64_t>(g_rng() % 7));
      }
    }
  }
  ex::BlockLayout l;
  if (!ex::BlockLayout::Of(counts.data(), n, world, dims, &l).ok()) return false;
  ex::OwnerKeys want;
  ex::owner_keys(tables, l, received.data(), padded, &want);
  DevBuf<int64_t> drecv = to_device(received);
  std::vector<DevBuf<int64_t>> keys, cnts;
  DevBuf<int64_t> row_pos, valid(n);
  valid.poison();
  std::vector<int64_t> distinct;  // entries per table (padded: received keys)
  void* staging = nullptr;
  if (pinned) CUDA_OK(cudaMallocHost(&staging, gex::owner_keys_staging_bytes(n)));
  SOK_OK(gex::owner_keys(
      tables, l, drecv.get(), padded,
      [&](const std::vector<int64_t>& d, gex::OwnerKeysOut* out) {
        distinct = d;
        int64_t all = 0;
        for (int t = 0; t < n; ++t) {
          keys.emplace_back(d[t]);
          cnts.emplace_back(d[t]);
          keys.back().poison();
          out->keys.push_back(keys.back().get());
          out->counts.push_back(cnts.back().get());
          all += d[t];
        }
        row_pos.resize(all * world);
        out->row_pos = row_pos.get();
        out->valid = valid.get();
        return sok::Status::OK();
      },
      nullptr, nullptr, staging));
  bool ok = sok_test::expect_eq("valid", valid.download(n), want.distinct);
  if (staging != nullptr) CUDA_OK(cudaFreeHost(staging));  // the download synchronised
  for (int t = 0; t < n && ok; ++t) {
    ok &= sok_test::expect_eq("keys", keys[t].download(distinct[t]), want.keys[t]);
    ok &= sok_test::expect_eq("counts", cnts[t].download(distinct[t]), want.counts[t]);
  }
  ok &= sok_test::expect_eq("row_pos", row_pos.download(want.row_pos.size()), want.row_pos);
  // The rows out to every asking rank and their copies summed back.
  std::vector<std::vector<float>> rows(n);
  std::vector<const float*> hr(n), dr(n);
  std::vector<DevBuf<float>> br;
  for (int t = 0; t < n; ++t) {
    rows[t] = randn(distinct[t] * dims[t], 1.f);
    hr[t] = rows[t].data();
    br.push_back(to_device(rows[t]));
    dr[t] = br.back().get();
  }
  std::vector<float> flat(l.flat_elems);
  ex::rows_to_blocks(dims, distinct.data(), world, want.row_pos.data(), hr.data(), flat.data());
  DevBuf<float> dflat(l.flat_elems);
  dflat.poison();
  SOK_OK(
      gex::rows_to_blocks(dims, distinct.data(), world, row_pos.get(), dr, dflat.get(), nullptr));
  ok &= sok_test::expect_near("flat", dflat.download(l.flat_elems), flat, 0, 0);
  std::vector<std::vector<float>> back(n);
  std::vector<float*> hb(n), db(n);
  std::vector<DevBuf<float>> bb;
  for (int t = 0; t < n; ++t) {
    back[t].resize(distinct[t] * dims[t]);
    hb[t] = back[t].data();
    bb.emplace_back(back[t].size());
    db[t] = bb.back().get();
  }
  ex::rows_from_blocks(dims, distinct.data(), world, want.row_pos.data(), flat.data(), hb.data());
  SOK_OK(
      gex::rows_from_blocks(dims, distinct.data(), world, row_pos.get(), dflat.get(), db, nullptr));
  for (int t = 0; t < n; ++t) {
    ok &= sok_test::expect_near("summed", bb[t].download(back[t].size()), back[t], 0, 0);
  }
  return ok;
}

bool test_gather_scatter(int n, bool quad) {
  std::vector<int64_t> dims(n), sizes(n), order;
  int64_t elems = 0;
  for (int t = 0; t < n; ++t) {
    dims[t] = random_dim(quad);
    sizes[t] = static_cast<int64_t>(g_rng() % 100);
    for (int64_t i = 0; i < sizes[t]; ++i) order.push_back(dims[t]);
    elems += sizes[t] * dims[t];
  }
  // Rows come back in a shuffled order: row_at is where each one starts.
  std::vector<size_t> perm(order.size());
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), g_rng);
  std::vector<int64_t> row_at(order.size());
  int64_t at = 0;
  for (size_t p : perm) {
    row_at[p] = at;
    at += order[p];
  }
  const std::vector<float> returned = randn(elems, 1.f);
  DevBuf<float> dret = to_device(returned);
  DevBuf<int64_t> drow = to_device(row_at);
  std::vector<DevBuf<float>> out;
  std::vector<float*> dout(n);
  std::vector<const float*> din(n);
  for (int t = 0; t < n; ++t) {
    out.emplace_back(sizes[t] * dims[t]);
    out.back().poison();
    dout[t] = out.back().get();
    din[t] = out.back().get();
  }
  SOK_OK(gex::gather_rows(dims, sizes.data(), drow.get(), dret.get(), dout, nullptr));
  DevBuf<float> again(elems);
  again.poison();
  SOK_OK(gex::scatter_rows(dims, sizes.data(), drow.get(), din, again.get(), nullptr));
  return sok_test::expect_near("round trip", again.download(elems), returned, 0, 0);
}

}  // namespace

int main(int argc, char** argv) {
  return sok_gpu_test::gpu_test_main(argc, argv, "test_exchange", [] {
    for (int w : {2, 3, 8}) {
      for (int n : {1, 5, 20, 40}) {  // 40: two launches of 32 tables
        const std::string at = " world " + std::to_string(w) + " tables " + std::to_string(n);
        run("plan" + at, [w, n] { return test_plan(w, n); });
        run("plan padded" + at, [w, n] { return test_plan(w, n, /*padded=*/true); });
        run("owner keys and rows" + at, [w, n] { return test_owner(w, n); });
        run("owner keys padded" + at, [w, n] { return test_owner(w, n, false, true); });
      }
    }
    // 560 blocks: the plan's block scan takes two rounds of its thread block.
    run("plan world 8 tables 70", [] { return test_plan(8, 70); });
    run("plan padded world 8 tables 70", [] { return test_plan(8, 70, /*padded=*/true); });
    for (int w : {2, 8}) {
      run("owner keys and rows, dims of 4, world " + std::to_string(w) + " tables 20",
          [w] { return test_owner(w, 20, /*quad=*/true); });
      for (bool padded : {false, true}) {
        run(std::string("owner keys") + (padded ? " padded" : "") + ", pinned upload, world " +
                std::to_string(w) + " tables 20",
            [w, padded] { return test_owner(w, 20, false, padded, /*pinned=*/true); });
      }
    }
    for (bool quad : {false, true}) {
      for (int n : {1, 7, 33}) {
        run("gather and scatter rows, tables " + std::to_string(n) + (quad ? ", dims of 4" : ""),
            [n, quad] { return test_gather_scatter(n, quad); });
      }
    }
  });
}
