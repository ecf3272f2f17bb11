#include <cmath>

#include "tests/ops/op_test.h"

namespace myriad::testing {
namespace {

using ops::kIgnoreIndex;

class CrossEntropy : public OpTest {};
MYRIAD_OP_TEST_SUITE(CrossEntropy);

// Random targets in [0, v) with every `ignore_every`-th row (from row 1) ignored.
Tensor targets_for(int64_t n, int64_t v, uint64_t seed, int64_t ignore_every = 0,
                   DType t = DType::I64) {
  std::vector<int64_t> tg = randint({n}, seed, 0, v).to_ints();
  if (ignore_every > 0)
    for (int64_t i = 1; i < n; i += ignore_every) tg[i] = kIgnoreIndex;
  return Tensor::from_ints(tg, {n}, t);
}

Tensor ce(const std::vector<Tensor>& x) {
  return ops::cross_entropy(x[0], x[1]);
}
OpFn lce(int64_t chunk) {
  return [chunk](const std::vector<Tensor>& x) {
    return ops::linear_cross_entropy(x[0], x[1], x[2], chunk);
  };
}
Tensor ce_of_linear(const std::vector<Tensor>& x) {
  return ops::cross_entropy(ops::linear(x[0], x[1]), x[2]);
}

TEST_P(CrossEntropy, MatchesReference) {
  struct Case {
    int64_t n, v, ignore_every;
    DType t;
  };
  uint64_t seed = 1;
  for (Case c : {Case{1, 1, 0, DType::I64}, Case{1, 7, 0, DType::I32}, Case{5, 7, 2, DType::I64},
                 Case{3, 1000, 0, DType::I32}, Case{2, 50257, 0, DType::I64},
                 Case{1, 50257, 0, DType::I32}, Case{33, 129, 3, DType::I64}}) {
    Tensor logits = randn({c.n, c.v}, seed++, 3.0).requires_grad_();
    Tensor tg = targets_for(c.n, c.v, seed++, c.ignore_every, c.t);
    expect_matches_reference_all("cross_entropy " + shape_str(logits.shape()), ce, {logits, tg},
                                 backend());
  }
}

TEST_P(CrossEntropy, EqualsMeanNegativeLogSoftmaxAtTarget) {
  Device dev = device_of(backend());
  Tensor logits = randn({9, 31}, 3, 2.0);
  Tensor tg = targets_for(9, 31, 4, 4);
  std::vector<double> lp = ops::log_softmax(logits.to(dev)).to_doubles();
  std::vector<int64_t> t = tg.to_ints();
  double sum = 0;
  int count = 0;
  for (int i = 0; i < 9; ++i)
    if (t[i] != kIgnoreIndex) sum -= lp[i * 31 + t[i]], ++count;
  EXPECT_EQ(count, 7);  // rows 1 and 5 are ignored
  EXPECT_NEAR(ops::cross_entropy(logits.to(dev), tg.to(dev)).item(), sum / count, 1e-5);
}

TEST_P(CrossEntropy, LinearMatchesReference) {
  struct Case {
    int64_t n, d, v, chunk, ignore_every;
  };
  uint64_t seed = 10;
  for (Case c : {Case{1, 1, 1, 1, 0}, Case{1, 16, 7, 4, 0}, Case{7, 16, 50, 3, 3},
                 Case{20, 32, 1001, 8, 5}, Case{5, 8, 257, 1024, 2}, Case{3, 8, 50257, 2, 0}}) {
    Tensor h = randn({c.n, c.d}, seed++).requires_grad_();
    Tensor w = randn({c.v, c.d}, seed++, 0.3).requires_grad_();
    Tensor tg = targets_for(c.n, c.v, seed++, c.ignore_every);
    expect_matches_reference_all(
        "linear_cross_entropy N " + std::to_string(c.n) + " V " + std::to_string(c.v), lce(c.chunk),
        {h, w, tg}, backend());
  }
}

// The fused op equals cross_entropy(linear(h, w)) in loss and in both gradients, whatever the
// chunking (1 row, uneven chunks, exactly N, more than N) and with ignored rows.
TEST_P(CrossEntropy, LinearEqualsUnfused) {
  const int64_t n = 13, d = 24, v = 301;
  Tensor h = randn({n, d}, 31).requires_grad_();
  Tensor w = randn({v, d}, 32, 0.3).requires_grad_();
  Tensor tg = targets_for(n, v, 33, 4);
  Device dev = device_of(backend());
  auto run = [&](const OpFn& fn, DType t) {
    Tensor hh = h.detach().to(t).to(dev).requires_grad_();
    Tensor ww = w.detach().to(t).to(dev).requires_grad_();
    Tensor loss = fn({hh, ww, tg.to(dev)});
    loss.backward();
    return std::vector<std::vector<double>>{loss.to_doubles(), hh.grad().to_doubles(),
                                            ww.grad().to_doubles()};
  };
  for (DType t : {DType::F32, DType::BF16}) {
    auto want = run(ce_of_linear, t);
    const double tol = t == DType::F32 ? 1e-5 : 2e-2;
    for (int64_t chunk : {int64_t{1}, int64_t{4}, int64_t{5}, n, n + 7, int64_t{1024}}) {
      auto got = run(lce(chunk), t);
      const char* what[] = {"loss", "dh", "dw"};
      for (int k = 0; k < 3; ++k) {
        ASSERT_EQ(got[k].size(), want[k].size());
        double scale = 0;
        for (double x : want[k]) scale = std::max(scale, std::abs(x));
        for (size_t i = 0; i < got[k].size(); ++i)
          ASSERT_NEAR(got[k][i], want[k][i], tol * std::max(scale, 1e-3))
              << what[k] << " element " << i << ", chunk " << chunk << ", " << dtype_name(t);
      }
      EXPECT_EQ(got[0].size(), 1u);
    }
  }
}

TEST_P(CrossEntropy, Bf16LinearReturnsInputDtypeGrads) {
  Device dev = device_of(backend());
  Tensor h = randn({6, 8}, 41).to(DType::BF16).to(dev).requires_grad_();
  Tensor w = randn({11, 8}, 42).to(DType::BF16).to(dev).requires_grad_();
  Tensor loss = ops::linear_cross_entropy(h, w, targets_for(6, 11, 43).to(dev), 4);
  EXPECT_EQ(loss.dtype(), DType::F32);
  loss.backward();
  EXPECT_EQ(h.grad().dtype(), DType::BF16);
  EXPECT_EQ(w.grad().dtype(), DType::BF16);
}

// bf16 on the CPU: the rows kernel reads the bf16 logits and writes the bf16 dlogits in place
// (unweighted rows). It gives the bits of the path through f32 copies, which weighted rows still
// take: weight 1 everywhere changes nothing else. Two chunks, ignored rows, a row wider than a
// vector.
TEST(CrossEntropyBf16, RowsKernelHasTheBitsOfTheF32Copies) {
  const int64_t n = 9, v = 300, d = 16;
  Tensor tg = targets_for(n, v, 81, 3);
  std::vector<double> got[2][3];
  for (int weighted = 0; weighted < 2; ++weighted) {
    Tensor h = ops::mul(randn({n, d}, 82), 2.0).to(DType::BF16).requires_grad_();
    Tensor w = randn({v, d}, 83).to(DType::BF16).requires_grad_();
    Tensor loss = weighted ? ops::linear_cross_entropy(h, w, tg, 5, Tensor::full({n}, 1.0))
                           : ops::linear_cross_entropy(h, w, tg, 5);
    loss.backward();
    got[weighted][0] = loss.to_doubles();
    got[weighted][1] = h.grad().to_doubles();
    got[weighted][2] = w.grad().to_doubles();
  }
  EXPECT_EQ(got[0][0], got[1][0]) << "loss";
  EXPECT_EQ(got[0][1], got[1][1]) << "dh";
  EXPECT_EQ(got[0][2], got[1][2]) << "dw";
  double norm = 0;
  for (double g : got[0][1]) norm += g * g;
  EXPECT_GT(norm, 0.0);
}

TEST_P(CrossEntropy, ExtremeLogitsStayFinite) {
  Device dev = device_of(backend());
  std::vector<double> v = {1e4, -1e4, 0, -1e4, 1e4, -1e4, 0, 0, 0, 1e4, 1e4, -1e4};
  Tensor logits = Tensor::from_doubles(v, {4, 3}).requires_grad_();
  Tensor tg = Tensor::from_ints(std::vector<int64_t>{1, 1, 2, 0}, {4});
  expect_matches_reference("extreme cross_entropy", ce, {logits, tg}, backend());
  Tensor x = logits.detach().to(dev).requires_grad_();
  Tensor loss = ops::cross_entropy(x, tg.to(dev));
  // Row 0: 2e4; row 1: 0; row 2: log 3; row 3: log 2.
  EXPECT_NEAR(loss.item(), (2e4 + std::log(3.0) + std::log(2.0)) / 4, 1e-2);
  loss.backward();
  for (double g : x.grad().to_doubles()) EXPECT_TRUE(std::isfinite(g));
  // Through the fused op too: h picks out rows of a large-scaled identity w.
  Tensor h = Tensor::from_doubles(std::vector<double>{1e2, -1e2, 0, -1e2, 1e2, 0}, {2, 3});
  Tensor w = Tensor::from_doubles(std::vector<double>{1e2, 0, 0, 0, 1e2, 0, 0, 0, 1e2}, {3, 3});
  h.requires_grad_();
  w.requires_grad_();
  Tensor tg2 = Tensor::from_ints(std::vector<int64_t>{1, 1}, {2});
  expect_matches_reference("extreme linear_cross_entropy", lce(1), {h, w, tg2}, backend());
  Tensor big = ops::linear_cross_entropy(h.detach().to(dev), w.detach().to(dev), tg2.to(dev));
  EXPECT_NEAR(big.item(), 2e4 / 2, 1e-2);  // row 0: 1e4 - (-1e4); row 1: 0
}

TEST_P(CrossEntropy, AllRowsIgnoredGivesZero) {
  Device dev = device_of(backend());
  Tensor logits = randn({3, 5}, 51).to(dev).requires_grad_();
  Tensor tg = Tensor::full({3}, kIgnoreIndex, DType::I64).to(dev);
  Tensor loss = ops::cross_entropy(logits, tg);
  EXPECT_EQ(loss.item(), 0.0);
  loss.backward();
  for (double g : logits.grad().to_doubles()) EXPECT_EQ(g, 0.0);
}

TEST(CrossEntropyGrad, Gradcheck) {
  Tensor logits = randn({4, 5}, 61).requires_grad_();
  Tensor tg = Tensor::from_ints(std::vector<int64_t>{2, kIgnoreIndex, 0, 4}, {4});
  expect_gradcheck("cross_entropy", ce, {logits, tg});
  Tensor h = randn({4, 3}, 62).requires_grad_();
  Tensor w = randn({5, 3}, 63).requires_grad_();
  for (int64_t chunk : {1, 3, 8}) {
    expect_gradcheck("linear_cross_entropy chunk " + std::to_string(chunk), lce(chunk), {h, w, tg});
  }
  // Only one of the two inputs requiring grad.
  expect_gradcheck("linear_cross_entropy dh only", lce(2), {h, w.detach(), tg});
  expect_gradcheck("linear_cross_entropy dw only", lce(2), {h.detach(), w, tg});
}

// Per-row weights: the weighted mean over counted rows, on every backend, and its gradient.
TEST_P(CrossEntropy, WeightedRowsAreTheWeightedMean) {
  Device dev = device_of(backend());
  const int64_t n = 7, v = 11, d = 5;
  Tensor h = randn({n, d}, 71), w = randn({v, d}, 72);
  Tensor tg = targets_for(n, v, 73, 3);  // rows 1 and 4 ignored
  Tensor wt = Tensor::from_doubles(std::vector<double>{0.5, 9.0, 1.0, 0.0, 7.0, 2.0, 1.5}, {n});
  std::vector<double> lp = ops::log_softmax(ops::linear(h, w)).to_doubles();
  std::vector<int64_t> t = tg.to_ints();
  std::vector<double> wv = wt.to_doubles();
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; ++i)
    if (t[i] != kIgnoreIndex) num -= wv[i] * lp[i * v + t[i]], den += wv[i];
  for (int64_t chunk : {2, 1024}) {
    Tensor loss = ops::linear_cross_entropy(h.to(dev), w.to(dev), tg.to(dev), chunk, wt.to(dev));
    EXPECT_NEAR(loss.item(), num / den, 1e-5) << "chunk " << chunk;
  }
  // Weight 1 everywhere is the plain mean; weight 0 on every counted row is a zero loss.
  EXPECT_NEAR(ops::linear_cross_entropy(h.to(dev), w.to(dev), tg.to(dev), 3,
                                        Tensor::full({n}, 1.0, DType::F32).to(dev))
                  .item(),
              ops::linear_cross_entropy(h.to(dev), w.to(dev), tg.to(dev), 3).item(), 1e-6);
  Tensor hz = h.to(dev).requires_grad_();
  Tensor z = ops::linear_cross_entropy(hz, w.to(dev), tg.to(dev), 3,
                                       Tensor::zeros({n}, DType::F32).to(dev));
  EXPECT_EQ(z.item(), 0.0);
  z.backward();
  for (double g : hz.grad().to_doubles()) EXPECT_EQ(g, 0.0);
}

TEST(CrossEntropyGrad, WeightedGradcheck) {
  Tensor h = randn({5, 3}, 81).requires_grad_();
  Tensor w = randn({6, 3}, 82).requires_grad_();
  Tensor tg = Tensor::from_ints(std::vector<int64_t>{2, kIgnoreIndex, 0, 5, 1}, {5});
  Tensor wt =
      Tensor::from_doubles(std::vector<double>{0.25, 3.0, 4.0, 1.0, 0.0}, {5}).to(DType::F64);
  for (int64_t chunk : {2, 8})
    expect_gradcheck("weighted linear_cross_entropy chunk " + std::to_string(chunk),
                     [chunk, wt](const std::vector<Tensor>& x) {
                       return ops::linear_cross_entropy(x[0], x[1], x[2], chunk, wt);
                     },
                     {h, w, tg});
}

TEST(CrossEntropyErrors, BadInput) {
  Tensor logits = randn({3, 5}, 1);
  Tensor tg = Tensor::from_ints(std::vector<int64_t>{0, 7, 1}, {3});
  expect_error([&] { ops::cross_entropy(logits, tg); }, {"cross_entropy", "target 7", "V = 5"});
  Tensor neg = Tensor::from_ints(std::vector<int64_t>{0, -1, 1}, {3}, DType::I32);
  expect_error([&] { ops::cross_entropy(logits, neg); }, {"cross_entropy", "target -1", "V = 5"});
  expect_error([&] { ops::cross_entropy(logits, targets_for(4, 5, 2)); },
               {"cross_entropy", "[3]", "i64[4]"});
  expect_error([&] { ops::cross_entropy(logits, randn({3}, 2)); },
               {"cross_entropy", "i32 or i64", "f32[3]"});
  expect_error(
      [&] {
        ops::cross_entropy(randn({3, 5, 1}, 2), targets_for(3, 5, 2));
      },
      {"cross_entropy", "2-d", "[3, 5, 1]"});

  Tensor h = randn({3, 4}, 3), w = randn({5, 4}, 4);
  expect_error([&] { ops::linear_cross_entropy(h, w, tg); },
               {"linear_cross_entropy", "target 7", "V = 5"});
  expect_error(
      [&] {
        ops::linear_cross_entropy(h, randn({5, 6}, 5), targets_for(3, 5, 2));
      },
      {"linear_cross_entropy", "[3, 4]", "[5, 6]"});
  expect_error([&] { ops::linear_cross_entropy(h, w, targets_for(2, 5, 2)); },
               {"linear_cross_entropy", "[3]"});
  expect_error([&] { ops::linear_cross_entropy(h, w, randn({3}, 2)); },
               {"linear_cross_entropy", "i32 or i64"});
  expect_error([&] { ops::linear_cross_entropy(h, w.to(DType::BF16), targets_for(3, 5, 2)); },
               {"linear_cross_entropy", "dtype"});
  expect_error([&] { ops::linear_cross_entropy(h, w, targets_for(3, 5, 2), 0); },
               {"linear_cross_entropy", "chunk_rows"});
  expect_error(
      [&] {
        ops::linear_cross_entropy(h, w, targets_for(3, 5, 2), 4,
                                  Tensor::from_doubles(std::vector<double>{1.0, -1.0, 1.0}, {3}));
      },
      {"linear_cross_entropy", "weight -1", "row 1"});
  expect_error([&] { ops::linear_cross_entropy(h, w, targets_for(3, 5, 2), 4, randn({2}, 3)); },
               {"linear_cross_entropy", "weights", "[3]"});
}

}  // namespace
}  // namespace myriad::testing
