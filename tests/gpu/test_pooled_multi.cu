// Fused multi-table pooled forward / atomic backward (pooled_forward_multi,
// pooled_backward_multi_unordered; segments known in range) vs the CPU core, and pooled_backward
// over dense_row_splits.
// Usage: test_pooled_multi [seed (0: from the clock)] [name filter]; see test_util.cuh.
#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "tests/gpu/test_util.cuh"

using namespace sok_gpu_test;  // NOLINT

namespace {

// One table of a multi-table case: its ids, its sample order (empty: sorted) and its buffers.
struct MultiCase {
  LookupCase c;
  Combiner comb = Combiner::kSum;
  bool weighted = false;
  std::vector<int32_t> order;
  std::vector<float> gout, want_out, want_grad;
  DevBuf<float> rows, w, out, gout_d, grad;
  DevBuf<int32_t> inv, order_d;
  DevBuf<int64_t> seg;
};

// The ids of c in a random order (the segment ids no longer sorted) and the stable permutation
// listing them in sample order.
void shuffle_ids(LookupCase* c, std::vector<int32_t>* order) {
  std::vector<size_t> p(c->n);
  std::iota(p.begin(), p.end(), 0);
  std::shuffle(p.begin(), p.end(), g_rng);
  LookupCase d = *c;
  for (int64_t i = 0; i < c->n; ++i) {
    d.seg[i] = c->seg[p[i]];
    d.inverse[i] = c->inverse[p[i]];
    d.weights[i] = c->weights[p[i]];
  }
  *c = d;
  order->resize(c->n);
  std::iota(order->begin(), order->end(), 0);
  std::stable_sort(order->begin(), order->end(),
                   [&](int32_t a, int32_t b) { return c->seg[a] < c->seg[b]; });
}

// A dense table's ids: `per` ids in every sample (segment ids i / per, for the CPU reference).
LookupCase make_dense_case(int64_t batch, int64_t num_rows, int64_t dim, int per) {
  LookupCase c = make_case(batch, num_rows, dim, 0);
  std::uniform_int_distribution<int32_t> row(0, static_cast<int32_t>(num_rows - 1));
  std::uniform_real_distribution<float> w(0.f, 1.f);
  for (int64_t b = 0; b < batch; ++b) {
    for (int j = 0; j < per; ++j) {
      c.seg.push_back(b);
      c.inverse.push_back(row(g_rng));
      c.weights.push_back(b == 5 ? 0.f : w(g_rng));  // sample 5: zero weight sum
    }
  }
  c.n = static_cast<int64_t>(c.seg.size());
  return c;
}

enum class DenseTables { kNone, kSome, kAll };

// num_tables tables cycling through dims {1, 16, 33, 128}, the three combiners, weighted or not,
// every third one shuffled (with its order); table 2 has no ids at all, table 3 no samples.
// dense: kSome makes every fifth table (from table 4) dense, kAll every table; dense tables
// hold 1 or 3 ids per sample (no segment ids given to the kernels).
// bad: table 0 gets out-of-range rows, table 1 (shuffled) out-of-range order entries (the last
// two, where they keep the view sorted) and table 5 (sorted) segment ids -1 and batch + 3 (first
// and last, idem), which the kernels must skip: the reference is the CPU core on the remaining
// ids.
bool test_pooled_multi(int num_tables, bool bad, DenseTables dense_tables = DenseTables::kNone) {
  const int64_t dims[] = {1, 16, 33, 128};
  std::vector<MultiCase> t(num_tables);
  std::vector<PooledTable> desc(num_tables);
  bool ok = true;
  for (int k = 0; k < num_tables; ++k) {
    MultiCase& m = t[k];
    const int64_t dim = dims[k % 4];
    m.comb = static_cast<Combiner>(k % 3);
    m.weighted = (k / 3) % 2 == 1;
    const bool dense =
        dense_tables == DenseTables::kAll || (dense_tables == DenseTables::kSome && k % 5 == 4);
    if (dense && k != 2 && k != 3) {
      m.c = make_dense_case(97 + 13 * k, 211, dim, (k / 5) % 2 == 0 ? 3 : 1);
    } else {
      m.c = k == 2 ? make_case(40, 9, dim, 0) : make_case(k == 3 ? 0 : 97 + 13 * k, 211, dim, 12);
    }
    if (k % 3 == 1 && !dense) shuffle_ids(&m.c, &m.order);
    std::vector<int32_t> inv = m.c.inverse, order = m.order;
    std::vector<int64_t> seg = m.c.seg;
    // The ids the kernels may use (bad ones dropped), for the CPU reference.
    std::vector<bool> keep(m.c.n, true);
    if (bad && k == 0 && m.c.n > 2) {
      inv[0] = -3;
      inv[m.c.n / 2] = static_cast<int32_t>(m.c.num_rows);
      keep[0] = keep[m.c.n / 2] = false;
    }
    if (bad && k == 1 && m.c.n > 2) {
      keep[order[m.c.n - 2]] = keep[order[m.c.n - 1]] = false;
      order[m.c.n - 2] = -1;
      order[m.c.n - 1] = static_cast<int32_t>(m.c.n + 5);
    }
    if (bad && k == 5 && m.c.n > 2) {
      keep[0] = keep[m.c.n - 1] = false;
      seg[0] = -1;
      seg[m.c.n - 1] = m.c.batch + 3;
    }
    LookupCase ref;
    ref.batch = m.c.batch;
    ref.num_rows = m.c.num_rows;
    for (int64_t i = 0; i < m.c.n; ++i) {
      if (!keep[i]) continue;
      ref.seg.push_back(m.c.seg[i]);
      ref.inverse.push_back(m.c.inverse[i]);
      ref.weights.push_back(m.c.weights[i]);
    }
    ref.n = static_cast<int64_t>(ref.seg.size());
    m.gout = randn(m.c.batch * dim, 1.f);
    m.want_out.resize(m.c.batch * dim);
    m.want_grad.resize(m.c.num_rows * dim);
    const float* cw = m.weighted ? ref.weights.data() : nullptr;
    pooled_forward(m.c.rows.data(), dim, ref.inverse.data(), ref.seg.data(), cw, ref.n, ref.batch,
                   m.comb, m.want_out.data());
    pooled_backward(m.gout.data(), dim, ref.inverse.data(), ref.seg.data(), cw, ref.n, ref.batch,
                    m.comb, ref.num_rows, m.want_grad.data());
    m.rows.upload(m.c.rows);
    m.w.upload(m.c.weights);
    m.inv.upload(inv);
    m.seg.upload(seg);
    m.order_d.upload(order);
    m.gout_d.upload(m.gout);
    m.out.resize(m.c.batch * dim);
    m.grad.resize(m.c.num_rows * dim);
    m.out.poison();
    m.grad.poison();
    PooledTable& d = desc[k];
    d.inverse = m.inv.get();
    d.segment_ids = dense ? nullptr : m.seg.get();
    d.order = order.empty() ? nullptr : m.order_d.get();
    d.weights = m.weighted ? m.w.get() : nullptr;
    d.n = m.c.n;
    d.batch = m.c.batch;
    d.num_rows = m.c.num_rows;
    d.dim = dim;
    d.combiner = m.comb;
  }
  std::vector<PooledTable> fwd = desc, bwd = desc;
  for (int k = 0; k < num_tables; ++k) {
    fwd[k].src = t[k].rows.get();
    fwd[k].out = t[k].out.get();
    bwd[k].src = t[k].gout_d.get();
    bwd[k].out = t[k].grad.get();
  }
  SOK_OK(pooled_forward_multi(fwd.data(), num_tables, nullptr));
  SOK_OK(pooled_backward_multi_unordered(bwd.data(), num_tables, nullptr, default_allocator()));
  for (int k = 0; k < num_tables; ++k) {
    const std::string f = "forward of table " + std::to_string(k);
    const std::string b = "backward of table " + std::to_string(k);
    ok &= sok_test::expect_near(f.c_str(), t[k].out.download(), t[k].want_out, 1e-5, 1e-5);
    ok &= sok_test::expect_near(b.c_str(), t[k].grad.download(), t[k].want_grad, 1e-5, 1e-5);
  }
  return ok;
}

// Rows read in place from one flat buffer through row_at (the exchange's returned rows): every
// table's rows at shuffled places, row 0 of each table absent (row_at -1: reads zeros, takes no
// gradient). The reference is the CPU core on rows with row 0 zeroed, its row grads put at the
// same places. Dims all multiples of 4 (float4 access) or not.
bool test_pooled_multi_row_at(bool x4) {
  const std::vector<int64_t> dims =
      x4 ? std::vector<int64_t>{4, 16, 8, 12, 128} : std::vector<int64_t>{4, 3, 16, 1, 33};
  const int n_tables = static_cast<int>(dims.size());
  std::vector<LookupCase> cases;
  std::vector<std::pair<int, int64_t>> places;  // (table, row) of each row present, flat order
  for (int k = 0; k < n_tables; ++k) {
    cases.push_back(make_case(61 + 7 * k, 23, dims[k], 6));
    for (int64_t r = 1; r < cases[k].num_rows; ++r) places.push_back({k, r});
  }
  std::shuffle(places.begin(), places.end(), g_rng);
  std::vector<std::vector<int64_t>> row_at(n_tables);
  for (int k = 0; k < n_tables; ++k) row_at[k].assign(cases[k].num_rows, -1);
  int64_t floats = 0;
  for (const auto& [k, r] : places) {
    row_at[k][r] = floats;
    floats += dims[k];
  }
  std::vector<float> flat(floats), want_flat_grad(floats);
  std::vector<std::vector<float>> want_out(n_tables), gout(n_tables);
  std::vector<DevBuf<float>> out(n_tables), gout_d(n_tables), w(n_tables);
  std::vector<DevBuf<int32_t>> inv(n_tables);
  std::vector<DevBuf<int64_t>> seg(n_tables), at(n_tables);
  std::vector<PooledTable> fwd(n_tables), bwd(n_tables);
  for (int k = 0; k < n_tables; ++k) {
    LookupCase& c = cases[k];
    const int64_t dim = dims[k];
    std::fill(c.rows.begin(), c.rows.begin() + dim, 0.f);  // row 0 reads zeros
    for (int64_t r = 1; r < c.num_rows; ++r)
      std::copy(c.rows.begin() + r * dim, c.rows.begin() + (r + 1) * dim,
                flat.begin() + row_at[k][r]);
    const Combiner comb = static_cast<Combiner>(k % 3);
    want_out[k].resize(c.batch * dim);
    gout[k] = randn(c.batch * dim, 1.f);
    std::vector<float> grad(c.num_rows * dim);
    pooled_forward(c.rows.data(), dim, c.inverse.data(), c.seg.data(), c.weights.data(), c.n,
                   c.batch, comb, want_out[k].data());
    pooled_backward(gout[k].data(), dim, c.inverse.data(), c.seg.data(), c.weights.data(), c.n,
                    c.batch, comb, c.num_rows, grad.data());
    for (int64_t r = 1; r < c.num_rows; ++r)
      std::copy(grad.begin() + r * dim, grad.begin() + (r + 1) * dim,
                want_flat_grad.begin() + row_at[k][r]);
    out[k].resize(c.batch * dim);
    out[k].poison();
    gout_d[k].upload(gout[k]);
    w[k].upload(c.weights);
    inv[k].upload(c.inverse);
    seg[k].upload(c.seg);
    at[k].upload(row_at[k]);
    PooledTable& d = fwd[k];
    d.inverse = inv[k].get();
    d.segment_ids = seg[k].get();
    d.weights = w[k].get();
    d.n = c.n;
    d.batch = c.batch;
    d.num_rows = c.num_rows;
    d.dim = dim;
    d.combiner = comb;
    d.row_at = at[k].get();
    d.row_at_x4 = x4;
    bwd[k] = d;
  }
  DevBuf<float> flat_d, flat_grad(floats);
  flat_d.upload(flat);
  CUDA_OK(cudaMemset(flat_grad.get(), 0, floats * sizeof(float)));  // the caller zeroes
  for (int k = 0; k < n_tables; ++k) {
    fwd[k].src = flat_d.get();
    fwd[k].out = out[k].get();
    bwd[k].src = gout_d[k].get();
    bwd[k].out = flat_grad.get();
  }
  SOK_OK(pooled_forward_multi(fwd.data(), n_tables, nullptr));
  SOK_OK(pooled_backward_multi_unordered(bwd.data(), n_tables, nullptr, default_allocator()));
  bool ok = true;
  for (int k = 0; k < n_tables; ++k) {
    const std::string f = "forward of table " + std::to_string(k);
    ok &= sok_test::expect_near(f.c_str(), out[k].download(), want_out[k], 1e-5, 1e-5);
  }
  return ok &&
         sok_test::expect_near("flat row grads", flat_grad.download(), want_flat_grad, 1e-5, 1e-5);
}

// check_table's error for a dense table whose ids do not fill every sample equally.
bool test_pooled_multi_bad_dense() {
  DevBuf<float> rows(4 * 8), out(4 * 8);
  DevBuf<int32_t> inv(10);
  PooledTable d;
  d.src = rows.get();
  d.out = out.get();
  d.inverse = inv.get();
  d.n = 10;
  d.batch = 4;
  d.num_rows = 4;
  d.dim = 8;
  const Status s = pooled_forward_multi(&d, 1, nullptr);
  const bool ok = !s.ok() && s.message().find("k ids per sample of batch 4") != std::string::npos;
  if (!ok) std::printf("  got: %s\n", s.ok() ? "OK" : s.message().c_str());
  return ok;
}

// pooled_backward over dense_row_splits (3 ids per sample) vs the CPU core on segment ids i / 3.
bool test_dense_row_splits(Combiner comb) {
  const int64_t dim = 16;
  LookupCase c = make_dense_case(301, 97, dim, 3);
  const std::vector<float> gout = randn(c.batch * dim, 1.f);
  std::vector<float> want(c.num_rows * dim);
  pooled_backward(gout.data(), dim, c.inverse.data(), c.seg.data(), c.weights.data(), c.n, c.batch,
                  comb, c.num_rows, want.data());
  DevBuf<float> g, w, grad(c.num_rows * dim);
  DevBuf<int32_t> inv;
  DevBuf<int64_t> splits(c.batch + 1);
  g.upload(gout);
  w.upload(c.weights);
  inv.upload(c.inverse);
  grad.poison();
  SOK_OK(dense_row_splits(c.batch, 3, splits.get(), nullptr));
  Segments seg;
  seg.row_splits = splits.get();
  SOK_OK(pooled_backward(g.get(), dim, inv.get(), seg, w.get(), c.n, c.batch, comb, c.num_rows,
                         nullptr, grad.get(), nullptr));
  return sok_test::expect_near("row grads", grad.download(), want, 1e-5, 1e-5);
}

}  // namespace

int main(int argc, char** argv) {
  return sok_gpu_test::gpu_test_main(argc, argv, "test_pooled_multi", [] {
    for (int tables : {4, 9, 37})  // 37: two launches of 29 + 8 tables
      run("pooled multi-table fused fwd+bwd " + std::to_string(tables) + " tables",
          [=] { return test_pooled_multi(tables, false); });
    run("pooled multi-table fused: bad rows / order entries / segment ids skipped",
        [] { return test_pooled_multi(8, true); });
    for (int tables : {9, 37})
      run("pooled multi-table fused fwd+bwd " + std::to_string(tables) + " tables, some dense",
          [=] { return test_pooled_multi(tables, false, DenseTables::kSome); });
    run("pooled multi-table fused fwd+bwd 8 tables, all dense",
        [] { return test_pooled_multi(8, false, DenseTables::kAll); });
    for (bool x4 : {true, false})
      run(std::string("pooled multi-table fused: rows read in place through row_at") +
              (x4 ? " (float4)" : " (mixed dims)"),
          [=] { return test_pooled_multi_row_at(x4); });
    run("pooled multi-table fused: a dense table of 10 ids for batch 4 is refused",
        [] { return test_pooled_multi_bad_dense(); });
    for (Combiner c : {Combiner::kSum, Combiner::kMean, Combiner::kSqrtn})
      run(std::string("pooled deterministic backward of a dense table via dense_row_splits ") +
              cname(c),
          [c] { return test_dense_row_splits(c); });
  });
}
