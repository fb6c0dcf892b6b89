// GpuEmbeddingTable vs the CPU core's EmbeddingTable: find / find_or_insert (every initializer,
// counter filter), duplicate keys in one batch, two streams at once, growth, insert_or_assign /
// erase, export_rows / import_rows, shrink.
// Usage: test_table [seed (0: from the clock)] [name filter]; see test_util.cuh.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "tests/gpu/test_util.cuh"

using namespace sok_gpu_test;  // NOLINT

namespace {

template <typename K>
bool test_find_or_insert(InitKind kind, int64_t dim) {
  TableConfig cfg = make_cfg(dim, kind);
  EmbeddingTable<K> cpu(cfg);
  auto gpu = make_gpu<K>(cfg);
  const std::vector<K> pool = key_pool<K>(5000);
  const bool exact = kind != InitKind::kNormal && kind != InitKind::kTruncatedNormal;
  const double rtol = exact ? 0 : 2e-6, atol = exact ? 0 : 1e-7;
  bool ok = true;
  for (int round = 0; round < 3; ++round) {
    const size_t n = 20000;
    const std::vector<K> keys = draw(pool, n);
    std::vector<float> want(n * dim);
    cpu.find_or_insert(keys.data(), n, want.data());
    DevBuf<K> dk = to_device(keys);
    DevBuf<float> dout(n * dim);
    dout.poison();
    SOK_OK(gpu->find_or_insert(dk.get(), n, dout.get(), nullptr, nullptr));
    ok &= sok_test::expect_near("find_or_insert", dout.download(), want, rtol, atol);
    // Read-only find of present and absent keys: same values, nothing inserted.
    const std::vector<K> probe = draw(key_pool<K>(3000), 3000);
    std::vector<float> fw(probe.size() * dim);
    cpu.find(probe.data(), probe.size(), fw.data());
    DevBuf<K> dp = to_device(probe);
    DevBuf<float> dfo(probe.size() * dim);
    dfo.poison();
    SOK_OK(gpu->find(dp.get(), probe.size(), dfo.get(), nullptr));
    ok &= sok_test::expect_near("find", dfo.download(), fw, rtol, atol);
    int64_t gs = 0;
    SOK_OK(gpu->size(&gs, nullptr));
    if (gs != cpu.size()) ok = FAIL("size %lld want %lld", (long long)gs, (long long)cpu.size());
  }
  ok &= expect_same_table(gpu_export(*gpu), cpu.export_rows(), rtol, atol);
  return ok;
}

template <typename K>
bool test_counter_filter() {
  TableConfig cfg = make_cfg(16, InitKind::kUniform, /*filter=*/3);
  EmbeddingTable<K> cpu(cfg);
  auto gpu = make_gpu<K>(cfg);
  const std::vector<K> pool = key_pool<K>(2000);
  bool ok = true;
  for (int round = 0; round < 5; ++round) {
    std::vector<K> keys = draw(pool, 1500);
    std::sort(keys.begin(), keys.end());
    keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
    std::shuffle(keys.begin(), keys.end(), g_rng);
    std::vector<int64_t> counts(keys.size());
    for (auto& x : counts) x = 1 + static_cast<int64_t>(g_rng() % 2);
    const size_t n = keys.size();
    std::vector<float> want(n * 16);
    cpu.find_or_insert(keys.data(), n, want.data(), counts.data());
    DevBuf<K> dk = to_device(keys);
    DevBuf<int64_t> dc = to_device(counts);
    DevBuf<float> dout(n * 16);
    dout.poison();
    SOK_OK(gpu->find_or_insert(dk.get(), n, dout.get(), dc.get(), nullptr));
    ok &= sok_test::expect_near("filtered find_or_insert", dout.download(), want, 0, 0);
    const std::vector<K> probe = draw(pool, 1000);
    std::vector<float> fw(probe.size() * 16);
    cpu.find(probe.data(), probe.size(), fw.data());
    DevBuf<K> dp = to_device(probe);
    DevBuf<float> dfo(probe.size() * 16);
    dfo.poison();
    SOK_OK(gpu->find(dp.get(), probe.size(), dfo.get(), nullptr));
    ok &= sok_test::expect_near("filtered find", dfo.download(), fw, 0, 0);
    // Updates skip the keys not admitted yet.
    OptimizerParams p;
    p.kind = OptimizerKind::kAdagrad;
    p.lr = 0.1f;
    const std::vector<float> g = randn(n * 16, 1.f);
    SOK_OK(cpu.apply_gradients(keys.data(), n, g.data(), p, round + 1));
    DevBuf<float> dg = to_device(g);
    SOK_OK(
        gpu->apply_gradients(dk.get(), n, dg.get(), p, round + 1, nullptr, /*keys_unique=*/true));
  }
  ok &= expect_same_table(gpu_export(*gpu), cpu.export_rows(), 1e-6, 1e-7);
  return ok;
}

// One batch holding few new keys many times: exactly one row per key, counts add up.
template <typename K>
bool test_duplicate_inserts() {
  TableConfig cfg = make_cfg(8, InitKind::kUniform);
  auto gpu = make_gpu<K>(cfg);
  const std::vector<K> distinct = key_pool<K>(1000);
  std::vector<K> keys;
  for (int r = 0; r < 1000; ++r) keys.insert(keys.end(), distinct.begin(), distinct.end());
  std::shuffle(keys.begin(), keys.end(), g_rng);
  DevBuf<K> dk = to_device(keys);
  DevBuf<float> dout(keys.size() * 8);
  dout.poison();
  SOK_OK(gpu->find_or_insert(dk.get(), keys.size(), dout.get(), nullptr, nullptr));
  const std::vector<float> out = dout.download();
  bool ok = true;
  size_t bad = 0;
  for (size_t i = 0; i < keys.size(); ++i)
    for (int c = 0; c < 8; ++c)
      if (out[i * 8 + c] != initial_value(cfg.init, keys[i], c, 8) && bad++ < 3)
        ok = FAIL("row %zu col %d: %g", i, c, out[i * 8 + c]);
  TableSnapshot<K> s = gpu_export(*gpu);
  if (s.keys.size() != 1000) ok = FAIL("%zu rows for 1000 keys", s.keys.size());
  std::set<K> ks(s.keys.begin(), s.keys.end());
  if (ks.size() != s.keys.size()) ok = FAIL("duplicate keys in the table");
  for (size_t i = 0; i < s.freqs.size(); ++i)
    if (s.freqs[i] != 1000) {
      ok = FAIL("key %lld freq %lld", (long long)s.keys[i], (long long)s.freqs[i]);
      break;
    }
  return ok;
}

// Two streams insert overlapping key sets at once (no growth in between).
template <typename K>
bool test_two_streams() {
  TableConfig cfg = make_cfg(16, InitKind::kUniform);
  auto gpu = make_gpu<K>(cfg);
  SOK_OK(gpu->reserve(2000000, nullptr));
  const int64_t n = 1 << 20;
  std::vector<K> a(n), b(n);
  const std::vector<K> pool = key_pool<K>(1500000);
  std::vector<K> pa(pool.begin(), pool.begin() + 1000000), pb(pool.begin() + 500000, pool.end());
  for (int64_t i = 0; i < n; ++i) {
    a[i] = pa[g_rng() % pa.size()];
    b[i] = pb[g_rng() % pb.size()];
  }
  std::unordered_map<K, int64_t> want;
  for (K k : a) ++want[k];
  for (K k : b) ++want[k];
  cudaStream_t s1, s2;
  CUDA_OK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
  CUDA_OK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
  DevBuf<K> da = to_device(a), db = to_device(b);
  DevBuf<float> oa(n * 16), ob(n * 16);
  oa.poison();
  ob.poison();
  CUDA_OK(cudaDeviceSynchronize());
  SOK_OK(gpu->find_or_insert(da.get(), n, oa.get(), nullptr, s1));
  SOK_OK(gpu->find_or_insert(db.get(), n, ob.get(), nullptr, s2));
  CUDA_OK(cudaStreamSynchronize(s1));
  CUDA_OK(cudaStreamSynchronize(s2));
  bool ok = true;
  TableSnapshot<K> s = gpu_export(*gpu);
  if (s.keys.size() != want.size()) ok = FAIL("%zu rows, want %zu", s.keys.size(), want.size());
  size_t bad = 0;
  for (size_t i = 0; i < s.keys.size(); ++i) {
    auto it = want.find(s.keys[i]);
    if (it == want.end() || it->second != s.freqs[i]) {
      if (bad++ < 3) ok = FAIL("key %lld freq %lld", (long long)s.keys[i], (long long)s.freqs[i]);
    }
    for (int c = 0; c < 16; ++c)
      if (s.values[i * 16 + c] != initial_value(cfg.init, s.keys[i], c, 16)) {
        if (bad++ < 3) ok = FAIL("key %lld value differs", (long long)s.keys[i]);
      }
  }
  const std::vector<float> va = oa.download();
  for (int64_t i = 0; i < n; i += 97)
    if (va[i * 16 + 3] != initial_value(cfg.init, a[i], 3, 16)) {
      ok = FAIL("stream 1 output %lld", (long long)i);
      break;
    }
  CUDA_OK(cudaStreamDestroy(s1));
  CUDA_OK(cudaStreamDestroy(s2));
  return ok;
}

// Start tiny, insert millions: growth loses and duplicates nothing.
bool test_growth() {
  TableConfig cfg = make_cfg(8, InitKind::kUniform, 0, 0, /*cap=*/16);
  auto gpu = make_gpu<int64_t>(cfg);
  const int64_t cap0 = gpu->capacity();
  const std::vector<int64_t> pool = key_pool<int64_t>(3000000);
  std::unordered_map<int64_t, int64_t> count;
  const int64_t batch = 500000;
  DevBuf<int64_t> dk(batch);
  DevBuf<float> dout(batch * 8);
  bool ok = true;
  for (int r = 0; r < 8; ++r) {
    std::vector<int64_t> keys = draw(pool, batch);
    for (auto k : keys) ++count[k];
    dk.upload(keys);
    dout.poison();
    SOK_OK(gpu->find_or_insert(dk.get(), batch, dout.get(), nullptr, nullptr));
    const std::vector<float> out = dout.download();
    for (int64_t i = 0; i < batch; i += 1013)
      if (out[i * 8] != initial_value(cfg.init, keys[i], 0, 8)) {
        ok = FAIL("round %d output %lld", r, (long long)i);
        break;
      }
  }
  int64_t sz = 0;
  SOK_OK(gpu->size(&sz, nullptr));
  if (sz != static_cast<int64_t>(count.size()))
    ok = FAIL("size %lld want %zu", (long long)sz, count.size());
  if (gpu->capacity() <= cap0) ok = FAIL("capacity did not grow");
  TableSnapshot<int64_t> s = gpu_export(*gpu);
  std::unordered_set<int64_t> seen;
  for (size_t i = 0; i < s.keys.size(); ++i) {
    if (!seen.insert(s.keys[i]).second) {
      ok = FAIL("duplicate key %lld", (long long)s.keys[i]);
      break;
    }
    auto it = count.find(s.keys[i]);
    if (it == count.end() || it->second != s.freqs[i]) {
      ok = FAIL("key %lld freq %lld", (long long)s.keys[i], (long long)s.freqs[i]);
      break;
    }
  }
  // Every key reads its own initial row afterwards.
  std::vector<int64_t> all;
  for (auto& kv : count) all.push_back(kv.first);
  DevBuf<int64_t> da = to_device(all);
  DevBuf<float> df(all.size() * 8);
  df.poison();
  SOK_OK(gpu->find(da.get(), all.size(), df.get(), nullptr));
  const std::vector<float> f = df.download();
  for (size_t i = 0; i < all.size(); ++i)
    for (int c = 0; c < 8; ++c)
      if (f[i * 8 + c] != initial_value(cfg.init, all[i], c, 8)) {
        return FAIL("find after growth: key %lld", (long long)all[i]);
      }
  std::printf("    growth: capacity %lld -> %lld slots, %lld keys\n", (long long)cap0,
              (long long)gpu->capacity(), (long long)sz);
  return ok;
}

template <typename K>
bool test_erase_assign() {
  TableConfig cfg = make_cfg(12, InitKind::kUniform);
  EmbeddingTable<K> cpu(cfg);
  auto gpu = make_gpu<K>(cfg);
  const std::vector<K> pool = key_pool<K>(60000);
  std::vector<K> ins(pool.begin(), pool.begin() + 50000);
  std::shuffle(ins.begin(), ins.end(), g_rng);
  const std::vector<float> vals = randn(ins.size() * 12, 1.f);
  cpu.insert_or_assign(ins.data(), ins.size(), vals.data());
  DevBuf<K> di = to_device(ins);
  DevBuf<float> dv = to_device(vals);
  SOK_OK(gpu->insert_or_assign(di.get(), ins.size(), dv.get(), nullptr));
  bool ok = expect_same_table(gpu_export(*gpu), cpu.export_rows(), 0, 0);
  // Erase: half present (some twice), some absent.
  std::vector<K> er(pool.begin() + 25000, pool.begin() + 55000);
  er.insert(er.end(), pool.begin() + 30000, pool.begin() + 31000);
  std::shuffle(er.begin(), er.end(), g_rng);
  const int64_t ce = cpu.erase(er.data(), er.size());
  DevBuf<K> de = to_device(er);
  int64_t ge = -1;
  SOK_OK(gpu->erase(de.get(), er.size(), nullptr, &ge));
  if (ge != ce) ok = FAIL("erased %lld want %lld", (long long)ge, (long long)ce);
  int64_t gs = 0;
  SOK_OK(gpu->size(&gs, nullptr));
  if (gs != cpu.size()) ok = FAIL("size %lld want %lld", (long long)gs, (long long)cpu.size());
  // find of everything: erased keys read their initial value again.
  std::vector<K> probe(pool.begin(), pool.begin() + 60000);
  std::vector<float> fw(probe.size() * 12);
  cpu.find(probe.data(), probe.size(), fw.data());
  DevBuf<K> dp = to_device(probe);
  DevBuf<float> dfo(probe.size() * 12);
  dfo.poison();
  SOK_OK(gpu->find(dp.get(), probe.size(), dfo.get(), nullptr));
  ok &= sok_test::expect_near("find after erase", dfo.download(), fw, 0, 0);
  // Re-insert some erased keys and overwrite some live ones.
  std::vector<K> again(pool.begin() + 20000, pool.begin() + 40000);
  std::vector<float> out(again.size() * 12);
  cpu.find_or_insert(again.data(), again.size(), out.data());
  DevBuf<K> dg = to_device(again);
  DevBuf<float> dgo(again.size() * 12);
  dgo.poison();
  SOK_OK(gpu->find_or_insert(dg.get(), again.size(), dgo.get(), nullptr, nullptr));
  ok &= sok_test::expect_near("find_or_insert after erase", dgo.download(), out, 0, 0);
  std::vector<K> ow(pool.begin() + 1000, pool.begin() + 3000);
  const std::vector<float> ov = randn(ow.size() * 12, 1.f);
  cpu.insert_or_assign(ow.data(), ow.size(), ov.data());
  DevBuf<K> dow = to_device(ow);
  DevBuf<float> dov = to_device(ov);
  SOK_OK(gpu->insert_or_assign(dow.get(), ow.size(), dov.get(), nullptr));
  ok &= expect_same_table(gpu_export(*gpu), cpu.export_rows(), 0, 0);
  return ok;
}

template <typename K>
bool test_export_import(int64_t chunk_bytes) {
  TableConfig cfg = make_cfg(16, InitKind::kUniform);
  EmbeddingTable<K> cpu(cfg);
  auto gpu = make_gpu<K>(cfg, 0.75, chunk_bytes);
  const std::vector<K> pool = key_pool<K>(20000);
  OptimizerParams p;
  p.kind = OptimizerKind::kAdam;
  p.lr = 0.01f;
  p.epsilon = 1e-7f;
  for (int s = 1; s <= 3; ++s) {
    const std::vector<K> keys = draw(pool, 8000);
    const std::vector<float> g = randn(keys.size() * 16, 1.f);
    p.step = s;
    SOK_OK(cpu.apply_gradients(keys.data(), keys.size(), g.data(), p, s));
    DevBuf<K> dk = to_device(keys);
    DevBuf<float> dg = to_device(g);
    SOK_OK(gpu->apply_gradients(dk.get(), keys.size(), dg.get(), p, s, nullptr));
  }
  const TableSnapshot<K> gs = gpu_export(*gpu), cs = cpu.export_rows();
  bool ok = expect_same_table(gs, cs, 1e-5, 1e-6);
  // GPU -> GPU.
  auto g2 = make_gpu<K>(cfg, 0.75, chunk_bytes);
  SOK_OK(g2->import_rows(gs, nullptr));
  ok &= expect_same_table(gpu_export(*g2), gs, 0, 0);
  // Appended after another table's rows (a tiered table's export): those first, unchanged.
  TableSnapshot<K> both = gpu_export(*g2);
  const int64_t first = static_cast<int64_t>(both.keys.size());
  SOK_OK(gpu->export_rows(&both, nullptr, /*append=*/true));
  std::vector<int64_t> head(first), tail(both.keys.size() - first);
  std::iota(head.begin(), head.end(), 0);
  std::iota(tail.begin(), tail.end(), first);
  ok &= expect_same_table(snapshot_rows(both, head), gs, 0, 0) &&
        expect_same_table(snapshot_rows(both, tail), gs, 0, 0);
  auto untrained = make_gpu<K>(cfg, 0.75, chunk_bytes);  // rows without slots
  const std::vector<K> some(pool.begin(), pool.begin() + 10);
  DevBuf<K> dsome = to_device(some);
  DevBuf<float> sink(some.size() * 16);
  SOK_OK(untrained->find_or_insert(dsome.get(), some.size(), sink.get(), nullptr, nullptr));
  TableSnapshot<K> mixed = gpu_export(*untrained);
  Status appended = gpu->export_rows(&mixed, nullptr, /*append=*/true);
  if (appended.ok() || appended.message().find("cannot follow") == std::string::npos)
    ok = FAIL("rows of another slot layout appended: '%s'", appended.message().c_str());
  // A picked import (a tiered import's split): those rows only, as if their snapshot were given.
  std::vector<int64_t> every_third;
  for (int64_t i = 0; i < static_cast<int64_t>(gs.keys.size()); i += 3) every_third.push_back(i);
  auto picked = make_gpu<K>(cfg, 0.75, chunk_bytes);
  SOK_OK(picked->import_rows(gs, nullptr, &every_third));
  ok &= expect_same_table(gpu_export(*picked), snapshot_rows(gs, every_third), 0, 0);
  // CPU -> GPU, then both keep training identically (slots restored, kind known).
  auto g3 = make_gpu<K>(cfg, 0.75, chunk_bytes);
  SOK_OK(g3->import_rows(cs, nullptr));
  ok &= expect_same_table(gpu_export(*g3), cs, 0, 0);
  const std::vector<K> keys = draw(pool, 5000);
  const std::vector<float> g = randn(keys.size() * 16, 1.f);
  p.step = 4;
  SOK_OK(cpu.apply_gradients(keys.data(), keys.size(), g.data(), p, 4));
  DevBuf<K> dk = to_device(keys);
  DevBuf<float> dg = to_device(g);
  SOK_OK(g3->apply_gradients(dk.get(), keys.size(), dg.get(), p, 4, nullptr));
  ok &= expect_same_table(gpu_export(*g3), cpu.export_rows(), 1e-5, 1e-6);
  // GPU -> CPU.
  EmbeddingTable<K> c2(cfg);
  SOK_OK(c2.import_rows(gs));
  ok &= expect_same_table(c2.export_rows(), gs, 0, 0);
  // Errors: duplicate key, wrong dim, optimizer mismatch.
  TableSnapshot<K> dup = gs;
  dup.keys[1] = dup.keys[0];
  auto g4 = make_gpu<K>(cfg, 0.75, chunk_bytes);
  Status st = g4->import_rows(dup, nullptr);
  if (st.ok() || st.message().find("appears twice") == std::string::npos)
    ok = FAIL("duplicate import: '%s'", st.message().c_str());
  dup = gs;  // the last key repeats the first: in another chunk when chunks are small
  dup.keys.back() = dup.keys[0];
  auto g5 = make_gpu<K>(cfg, 0.75, chunk_bytes);
  st = g5->import_rows(dup, nullptr);
  if (st.ok() || st.message().find("appears twice") == std::string::npos)
    ok = FAIL("duplicate import, first and last key: '%s'", st.message().c_str());
  TableSnapshot<K> wrong = gs;
  wrong.dim = 8;
  st = g4->import_rows(wrong, nullptr);
  if (st.ok() || st.message().find("dimension") == std::string::npos)
    ok = FAIL("dim mismatch: '%s'", st.message().c_str());
  OptimizerParams q;
  q.kind = OptimizerKind::kAdagrad;
  st = gpu->apply_gradients(dk.get(), keys.size(), dg.get(), q, 5, nullptr);
  if (st.ok() || st.message().find("already carries") == std::string::npos)
    ok = FAIL("optimizer mismatch: '%s'", st.message().c_str());
  // Empty snapshot.
  TableSnapshot<K> empty;
  empty.dim = 16;
  st = g4->import_rows(empty, nullptr);
  int64_t sz = -1;
  SOK_OK(g4->size(&sz, nullptr));
  if (!st.ok() || sz != 0)
    ok = FAIL("empty import: '%s' size %lld", st.message().c_str(), (long long)sz);
  return ok;
}

// shrink() by age (steps_to_live, versions from SGD steps) and by L2 norm (values assigned): the
// same keys go as from the CPU table, and the rest stay; chunk_bytes > 0 reads the victims'
// fields in chunks of that many bytes.
template <typename K>
bool test_shrink(bool by_norm, int64_t chunk_bytes) {
  const int64_t dim = 8;
  TableConfig cfg = make_cfg(dim, InitKind::kUniform);
  const std::vector<K> pool = key_pool<K>(30000);
  const std::vector<float> vals = randn(pool.size() * dim, 1.f);
  if (by_norm) {
    std::vector<double> weights(pool.size());  // DeepRec's L2 weight: half the squared norm
    for (size_t i = 0; i < pool.size(); ++i) {
      double sq = 0;
      for (int64_t c = 0; c < dim; ++c) sq += double(vals[i * dim + c]) * vals[i * dim + c];
      weights[i] = 0.5 * sq;
    }
    std::nth_element(weights.begin(), weights.begin() + weights.size() / 3, weights.end());
    cfg.l2_weight_threshold = static_cast<float>(weights[weights.size() / 3]);  // a third go
  } else {
    cfg.steps_to_live = 3;
  }
  EmbeddingTable<K> cpu(cfg);
  auto gpu = make_gpu<K>(cfg, 0.75, chunk_bytes);
  DevBuf<K> dk = to_device(pool);
  DevBuf<float> dv = to_device(vals);
  cpu.insert_or_assign(pool.data(), pool.size(), vals.data());
  SOK_OK(gpu->insert_or_assign(dk.get(), pool.size(), dv.get(), nullptr));
  OptimizerParams p;
  p.kind = OptimizerKind::kSGD;
  p.lr = 0.f;  // versions move, values stay: the norm rule sees the assigned values
  for (int s = 1; s <= 6 && !by_norm; ++s) {  // each step updates a sixth of the keys
    const std::vector<K> keys(pool.begin() + (s - 1) * 5000, pool.begin() + s * 5000);
    const std::vector<float> g(keys.size() * dim, 1.f);
    p.step = s;
    SOK_OK(cpu.apply_gradients(keys.data(), keys.size(), g.data(), p, s));
    DevBuf<K> dks = to_device(keys);
    DevBuf<float> dg = to_device(g);
    SOK_OK(gpu->apply_gradients(dks.get(), keys.size(), dg.get(), p, s, nullptr));
  }
  const int64_t want = cpu.shrink(7);
  int64_t got = -1;
  SOK_OK(gpu->shrink(7, nullptr, &got));
  bool ok = true;
  if (got != want || want == 0 || want == static_cast<int64_t>(pool.size()))
    ok = FAIL("shrink removed %lld, want %lld (some, not all)", (long long)got, (long long)want);
  return ok && expect_same_table(gpu_export(*gpu), cpu.export_rows(), 0, 0);
}

}  // namespace

int main(int argc, char** argv) {
  return sok_gpu_test::gpu_test_main(argc, argv, "test_table", [] {
    for (InitKind k : {InitKind::kConstant, InitKind::kUniform, InitKind::kNormal,
                       InitKind::kTruncatedNormal, InitKind::kMatrix}) {
      run(std::string("find_or_insert/find vs CPU int64 ") + kname(k) + " dim 32",
          [k] { return test_find_or_insert<int64_t>(k, 32); });
      run(std::string("find_or_insert/find vs CPU int32 ") + kname(k) + " dim 7",
          [k] { return test_find_or_insert<int32_t>(k, 7); });
    }
    run("counter filter int64 (find/find_or_insert/apply)",
        [] { return test_counter_filter<int64_t>(); });
    run("counter filter int32 (find/find_or_insert/apply)",
        [] { return test_counter_filter<int32_t>(); });
    run("1M-id batch of 1000 new keys x1000: one row per key int64",
        [] { return test_duplicate_inserts<int64_t>(); });
    run("1M-id batch of 1000 new keys x1000: one row per key int32",
        [] { return test_duplicate_inserts<int32_t>(); });
    run("two streams insert overlapping keys at once int64",
        [] { return test_two_streams<int64_t>(); });
    run("two streams insert overlapping keys at once int32",
        [] { return test_two_streams<int32_t>(); });
    run("growth: capacity 16 -> 4M inserts, find after", [] { return test_growth(); });
    run("insert_or_assign / erase / re-insert vs CPU int64",
        [] { return test_erase_assign<int64_t>(); });
    run("insert_or_assign / erase / re-insert vs CPU int32",
        [] { return test_erase_assign<int32_t>(); });
    run("export/import round trips (GPU<->GPU, CPU<->GPU) + errors int64",
        [] { return test_export_import<int64_t>(0); });
    run("export/import round trips (GPU<->GPU, CPU<->GPU) + errors int32",
        [] { return test_export_import<int32_t>(0); });
    // 216-byte rows (dim 16, Adam's two slots): 1,000 rows a chunk, a snapshot in many chunks.
    run("export/import in chunks of 1,000 rows int64",
        [] { return test_export_import<int64_t>(1000 * 216); });
    run("shrink by age vs CPU int64", [] { return test_shrink<int64_t>(false, 0); });
    run("shrink by L2 norm vs CPU int32", [] { return test_shrink<int32_t>(true, 0); });
    // 52-byte victim fields (dim 8, int32 keys): 1,000 rows a chunk.
    run("shrink by L2 norm in chunks of 1,000 rows int32",
        [] { return test_shrink<int32_t>(true, 1000 * 52); });
    run("shrink by age in chunks of 1,000 rows int64",
        [] { return test_shrink<int64_t>(false, 1000 * 56); });
  });
}
