#include "ops/attention.h"

#include <omp.h>

#include <cmath>

#include "tests/ops/op_test.h"

namespace myriad::testing {
namespace {

class Attention : public OpTest {};
MYRIAD_OP_TEST_SUITE(Attention);

struct Case {
  int64_t B, Hq, Hkv, Tq, Tk, Dk, Dv;
  bool causal;
  int64_t q_offset;
  std::string str() const {
    return cat("B", B, " Hq", Hq, " Hkv", Hkv, " Tq", Tq, " Tk", Tk, " Dk", Dk, " Dv", Dv,
               causal ? " causal" : "", " off", q_offset);
  }
};

std::vector<Tensor> make_qkv(const Case& c, uint64_t seed) {
  return {randn({c.B, c.Hq, c.Tq, c.Dk}, seed).requires_grad_(),
          randn({c.B, c.Hkv, c.Tk, c.Dk}, seed + 1).requires_grad_(),
          randn({c.B, c.Hkv, c.Tk, c.Dv}, seed + 2).requires_grad_()};
}

OpFn attn_fn(const Case& c, double scale) {
  return [c, scale](const std::vector<Tensor>& x) {
    return ops::attention(x[0], x[1], x[2], scale, c.causal, c.q_offset);
  };
}

TEST_P(Attention, MatchesReference) {
  const std::vector<Case> cases = {
      {1, 1, 1, 1, 1, 8, 8, false, 0},        // one query, one key
      {1, 1, 1, 1, 1, 8, 8, true, 0},         //
      {2, 4, 2, 65, 65, 16, 24, true, 0},     // GQA, partial tiles
      {2, 4, 2, 65, 65, 16, 24, false, 0},    //
      {1, 3, 1, 1, 70, 5, 7, true, 69},       // decode, odd head dims
      {1, 2, 2, 20, 150, 32, 32, true, 130},  // prefill continuing a cache
      {1, 2, 1, 130, 130, 64, 64, true, 0},   // several tiles each way
      {1, 2, 1, 30, 100, 16, 16, false, 5},   // non-causal ignores q_offset
      {2, 6, 3, 7, 9, 3, 1, true, 2},         // tiny dims
  };
  uint64_t seed = 1;
  for (const Case& c : cases) {
    expect_matches_reference_all("attention " + c.str(), attn_fn(c, 1.0 / std::sqrt(c.Dk)),
                                 make_qkv(c, seed), backend());
    seed += 10;
  }
}

// The absorbed MLA decode: MQA over a [B, 1, S, 576] latent cache whose first 512 channels are
// the values (a strided view, not a copy); three query heads share it.
TEST_P(Attention, AbsorbedMlaOverLatentCache) {
  const double tau = 1.0 / std::sqrt(192.0);
  for (auto [tq, off] : {std::pair<int64_t, int64_t>{1, 64}, {5, 60}, {65, 0}}) {
    Tensor q = randn({2, 3, tq, 576}, 3 + tq, 0.5).requires_grad_();
    Tensor cache = randn({2, 1, 65, 576}, 4 + tq).requires_grad_();
    expect_matches_reference_all(
        cat("absorbed MLA Tq", tq),
        [tau, off](const std::vector<Tensor>& x) {
          Tensor v = ops::slice(x[1], 3, 0, 512);
          EXPECT_FALSE(v.is_contiguous());
          return ops::attention(x[0], x[1], v, tau, true, off);
        },
        {q, cache}, backend());
  }
}

TEST_P(Attention, StridedQueryAndKeys) {
  // q, k, v as [B, T, H, D] projections viewed as [B, H, T, D] (no copies).
  Tensor q = randn({2, 33, 4, 16}, 20).requires_grad_();
  Tensor k = randn({2, 40, 2, 16}, 21).requires_grad_();
  Tensor v = randn({2, 40, 2, 8}, 22).requires_grad_();
  expect_matches_reference_all(
      "transposed views",
      [](const std::vector<Tensor>& x) {
        return ops::attention(ops::transpose(x[0], 1, 2), ops::transpose(x[1], 1, 2),
                              ops::transpose(x[2], 1, 2), 0.25, true, 7);
      },
      {q, k, v}, backend());
}

TEST_P(Attention, AdmissionBias) {
  // logit += key_bias[b, j] when (query position − j) > window (MODEL.md §12.4).
  for (int64_t window : {0, 3, 40, 1000}) {
    Case c{2, 4, 2, 70, 70, 16, 16, true, 0};
    std::vector<Tensor> xs = make_qkv(c, 30);
    xs.push_back(randu({2, 70}, 31, -3.0, 0.0).requires_grad_());
    expect_matches_reference_all(
        cat("bias window ", window),
        [window](const std::vector<Tensor>& x) {
          return ops::attention(x[0], x[1], x[2], 0.25, true, 0, x[3], window);
        },
        xs, backend());
  }
  // An f32 bias with bf16 q, k, v (the gate is kept in fp32).
  const Device dev = device_of(backend());
  Tensor q = randn({1, 2, 9, 8}, 32).to(DType::BF16).to(dev);
  Tensor k = randn({1, 1, 9, 8}, 33).to(DType::BF16).to(dev);
  Tensor bias = randu({1, 9}, 34, -2.0, 0.0).to(dev).requires_grad_();
  Tensor y = ops::attention(q, k, k, 0.3, true, 0, bias, 1);
  Tensor want;
  {
    ops::ReferenceMode ref;
    want = ops::attention(q.to(DType::F32).to(kCPU), k.to(DType::F32).to(kCPU),
                          k.to(DType::F32).to(kCPU), 0.3, true, 0, bias.detach().to(kCPU), 1);
  }
  std::vector<double> got = y.to_doubles(), w = want.to_doubles();
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], w[i], 2e-2 * (1 + std::abs(w[i])));
  y.backward(Tensor::ones(y.shape(), DType::BF16, dev));
  EXPECT_EQ(bias.grad().dtype(), DType::F32);
}

// Row by row, a cache-continuing prefill and single-token decode reproduce full causal attention.
TEST_P(Attention, PrefillThenDecodeEqualsFullCausal) {
  const Device dev = device_of(backend());
  const int64_t T = 70, P = 40;
  Tensor q = randn({1, 4, T, 32}, 40).to(dev), k = randn({1, 2, T, 32}, 41).to(dev),
         v = randn({1, 2, T, 24}, 42).to(dev);
  std::vector<double> full = ops::attention(q, k, v, 0.2, true).to_doubles();
  auto keys = [&](const Tensor& t, int64_t n) { return ops::slice(t, 2, 0, n); };
  auto expect_rows = [&](const Tensor& y, int64_t i0, const std::string& what) {
    const int64_t tq = y.shape()[2];
    std::vector<double> got = y.to_doubles();
    for (int64_t h = 0; h < 4; ++h)
      for (int64_t i = 0; i < tq; ++i)
        for (int64_t d = 0; d < 24; ++d)
          EXPECT_NEAR(got[(h * tq + i) * 24 + d], full[(h * T + i0 + i) * 24 + d], 1e-5)
              << what << " head " << h << " row " << i0 + i;
  };
  // Prefill of the first P tokens, then the rest as one chunk continuing the cache.
  expect_rows(ops::attention(ops::slice(q, 2, 0, P), keys(k, P), keys(v, P), 0.2, true, 0), 0,
              "prefill");
  expect_rows(ops::attention(ops::slice(q, 2, P, T), k, v, 0.2, true, P), P, "second chunk");
  // Decode one token at a time: query i against keys [0, i].
  for (int64_t i = P; i < T; ++i)
    expect_rows(
        ops::attention(ops::slice(q, 2, i, i + 1), keys(k, i + 1), keys(v, i + 1), 0.2, true, i), i,
        "decode");
}

TEST_P(Attention, QueriesWithoutVisibleKeysOutputZero) {
  const Device dev = device_of(backend());
  for (DType t : {DType::F32, DType::BF16}) {
    // Causal with q_offset = -3: queries 0..2 sit before every key.
    Tensor q = randn({1, 2, 6, 8}, 50).to(t).to(dev).requires_grad_();
    Tensor k = randn({1, 1, 6, 8}, 51).to(t).to(dev).requires_grad_();
    Tensor v = randn({1, 1, 6, 8}, 52).to(t).to(dev).requires_grad_();
    Tensor y = ops::attention(q, k, v, 0.3, true, -3);
    y.backward(randn(y.shape(), 53).to(t).to(dev));
    std::vector<double> out = y.to_doubles(), gq = q.grad().to_doubles();
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t i = 0; i < 6; ++i)
        for (int64_t d = 0; d < 8; ++d) {
          const int64_t x = (h * 6 + i) * 8 + d;
          ASSERT_TRUE(std::isfinite(out[x]) && std::isfinite(gq[x]));
          if (i < 3) {
            EXPECT_EQ(out[x], 0.0);
            EXPECT_EQ(gq[x], 0.0);
          }
        }
    // Keys after position 2 are seen by no query, so they get no gradient.
    std::vector<double> gk = k.grad().to_doubles();
    for (int64_t x = 3 * 8; x < 6 * 8; ++x) EXPECT_EQ(gk[x], 0.0);
    // No keys at all.
    Tensor k0 = Tensor::zeros({1, 1, 0, 8}, t, dev), v0 = Tensor::zeros({1, 1, 0, 8}, t, dev);
    for (double o : ops::attention(q, k0, v0, 0.3, false).to_doubles()) EXPECT_EQ(o, 0.0);
  }
}

TEST_P(Attention, ThreadCountDoesNotChangeResults) {
  // 1 thread takes the unsplit paths; 7 threads split the keys of the few work items.
  Case c{1, 4, 1, 3, 300, 32, 16, true, 297};
  std::vector<Tensor> xs = make_qkv(c, 60);
  std::vector<std::vector<double>> runs;
  const int keep = omp_get_max_threads();
  for (int n : {1, 7}) {
    omp_set_num_threads(n);
    std::vector<Tensor> x;
    for (const Tensor& t : xs) x.push_back(t.detach().to(device_of(backend())).requires_grad_());
    Tensor y = ops::attention(x[0], x[1], x[2], 0.2, true, c.q_offset);
    y.backward(randn(y.shape(), 61).to(device_of(backend())));
    runs.push_back(y.to_doubles());
    for (const Tensor& t : x) {
      std::vector<double> g = t.grad().to_doubles();
      runs.back().insert(runs.back().end(), g.begin(), g.end());
    }
  }
  omp_set_num_threads(keep);
  for (size_t i = 0; i < runs[0].size(); ++i) EXPECT_NEAR(runs[0][i], runs[1][i], 1e-5) << i;
}

// paged_attention: sequence b's pages are pages [first[b], first[b + 1]) of one store
// [P, bt, C] (rows past a sequence's length hold garbage it must not read).
std::vector<std::vector<Tensor>> page_tables(const Tensor& store, const std::vector<int64_t>& n) {
  std::vector<std::vector<Tensor>> t;
  int64_t k = 0;
  for (int64_t pages : n) {
    t.emplace_back();
    for (int64_t i = 0; i < pages; ++i, ++k)
      t.back().push_back(
          ops::reshape(ops::slice(store, 0, k, k + 1), {store.size(1), store.size(2)}));
  }
  return t;
}

TEST_P(Attention, PagedMatchesReference) {
  // lengths 1, 70 and 200 over pages of 64 keys (tiles inside pages) and of 24 (tiles across
  // pages); values 32 wide (read in place) and 20 (copied); decode and a 3-query continuation.
  for (int64_t bt : {64, 24})
    for (int64_t dv : {32, 20})
      for (int64_t tq : {1, 3}) {
        const std::vector<int64_t> len = {tq, 70, 200};
        std::vector<int64_t> n;
        int64_t total = 0;
        for (int64_t l : len) n.push_back((l + bt - 1) / bt + 1), total += n.back();  // + a spare
        Tensor q = randn({3, 4, tq, 40}, 100 + bt + dv + tq, 0.5);
        Tensor store = randn({total, bt, 40}, 200 + bt + dv + tq);
        expect_matches_reference_all(
            cat("paged bt", bt, " dv", dv, " Tq", tq),
            [&](const std::vector<Tensor>& x) {
              return ops::paged_attention(x[0], page_tables(x[1], n), len, dv, 0.3);
            },
            {q, store}, backend());
      }
}

// One sequence: the same bits as ops::attention over its gathered keys (the same tiles and key
// splits; the pages are only read in place). Batched rows equal each row alone to rounding.
TEST(AttentionPaged, EqualsGatheredAttention) {
  for (int64_t bt : {64, 24}) {
    const std::vector<int64_t> len = {1, 130, 300};
    std::vector<int64_t> n;
    int64_t total = 0;
    for (int64_t l : len) n.push_back((l + bt - 1) / bt), total += n.back();
    Tensor q = randn({3, 8, 1, 48}, 300 + bt, 0.5), store = randn({total, bt, 48}, 301 + bt);
    const auto tables = page_tables(store, n);
    Tensor all = ops::paged_attention(q, tables, len, 32, 0.2);
    for (int64_t b = 0; b < 3; ++b) {
      Tensor qb = ops::slice(q, 0, b, b + 1);
      Tensor one = ops::paged_attention(qb, {tables[b]}, {len[b]}, 32, 0.2);
      std::vector<Tensor> parts;
      for (int64_t k = 0; k < n[b]; ++k)
        parts.push_back(ops::slice(tables[b][k], 0, 0, std::min(bt, len[b] - k * bt)));
      Tensor keys = ops::unsqueeze(ops::unsqueeze(ops::concat(parts, 0), 0), 0);
      Tensor dense = ops::attention(qb, keys, ops::slice(keys, -1, 0, 32), 0.2, true, len[b] - 1);
      EXPECT_EQ(one.to_doubles(), dense.to_doubles()) << "bt " << bt << " row " << b;
      const auto a = ops::slice(all, 0, b, b + 1).to_doubles(), o = one.to_doubles();
      for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], o[i], 1e-6) << b << " " << i;
    }
  }
}

TEST(AttentionPaged, BadInput) {
  Tensor q = randn({2, 4, 1, 8}, 1);
  const auto pages = page_tables(randn({3, 4, 8}, 2), {1, 2});
  expect_error([&] { ops::paged_attention(q, pages, {1}, 8, 1); }, {"paged_attention", "lengths"});
  expect_error(
      [&] {
        ops::paged_attention(q, pages, {5, 3}, 8, 1);
      },
      {"paged_attention", "sequence 0", "holds 5"});
  expect_error(
      [&] {
        ops::paged_attention(q, pages, {0, 3}, 8, 1);
      },
      {"paged_attention", "sequence 0"});
  expect_error([&] { ops::paged_attention(q, pages, {1, 3}, 9, 1); }, {"paged_attention", "dv"});
  expect_error(
      [&] {
        ops::paged_attention(q, {{}, {}}, {1, 1}, 8, 1);
      },
      {"paged_attention", "no pages"});
  auto mixed = pages;
  mixed[1][1] = mixed[1][1].to(DType::BF16);
  expect_error([&] { ops::paged_attention(q, mixed, {1, 6}, 8, 1); }, {"paged_attention", "bf16"});
  expect_error(
      [&] {
        ops::paged_attention(q.requires_grad_(), pages, {1, 3}, 8, 1);
      },
      {"paged_attention", "inference"});
}

TEST(AttentionGrad, Gradcheck) {
  const std::vector<Case> cases = {
      {1, 2, 1, 3, 4, 3, 2, true, 1},
      {2, 2, 2, 2, 3, 2, 3, false, 0},
      {1, 3, 1, 4, 4, 2, 2, true, -1},  // query 0 sees no key
  };
  uint64_t seed = 70;
  for (const Case& c : cases) {
    expect_gradcheck("attention " + c.str(), attn_fn(c, 0.7), make_qkv(c, seed));
    seed += 10;
  }
  Case c{1, 2, 1, 5, 5, 2, 2, true, 0};
  std::vector<Tensor> xs = make_qkv(c, 90);
  xs.push_back(randu({1, 5}, 91, -2.0, 0.0).requires_grad_());
  expect_gradcheck(
      "attention with bias",
      [](const std::vector<Tensor>& x) {
        return ops::attention(x[0], x[1], x[2], 0.7, true, 0, x[3], 1);
      },
      xs);
}

TEST(AttentionErrors, BadInput) {
  Tensor q = randn({1, 4, 3, 8}, 1), k = randn({1, 2, 5, 8}, 2), v = randn({1, 2, 5, 6}, 3);
  expect_error(
      [&] {
        ops::attention(q, randn({1, 3, 5, 8}, 4), v, 1, true);
      },
      {"attention", "multiple", "[1, 3, 5, 8]"});
  expect_error(
      [&] {
        ops::attention(q, randn({1, 2, 5, 7}, 4), v, 1, true);
      },
      {"attention", "[1, 2, 5, 7]"});
  expect_error(
      [&] {
        ops::attention(q, k, randn({1, 2, 4, 6}, 5), 1, true);
      },
      {"attention", "[1, 2, 4, 6]"});
  expect_error(
      [&] {
        ops::attention(randn({4, 3, 8}, 6), k, v, 1, true);
      },
      {"attention", "[4, 3, 8]"});
  expect_error([&] { ops::attention(q, k.to(DType::BF16), v, 1, true); }, {"attention", "bf16"});
  expect_error(
      [&] {
        ops::attention(q, k, v, 1, true, 0, randn({1, 4}, 7));
      },
      {"attention", "key_bias", "[1, 4]"});
}

}  // namespace
}  // namespace myriad::testing
