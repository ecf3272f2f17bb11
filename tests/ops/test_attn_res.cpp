#include "ops/attn_res.h"

#include <cmath>

#include "tests/ops/op_test.h"

namespace myriad::testing {
namespace {

class AttnRes : public OpTest {};
MYRIAD_OP_TEST_SUITE(AttnRes);

// inputs = m sources, then w, then gamma.
OpFn attn_res_fn(size_t m, double eps = 1e-6) {
  return [m, eps](const std::vector<Tensor>& x) {
    return ops::attn_res(std::vector<Tensor>(x.begin(), x.begin() + m), x[m], x[m + 1], eps);
  };
}

std::vector<Tensor> make_inputs(size_t m, const Shape& s, uint64_t seed, bool w_row = false) {
  std::vector<Tensor> xs;
  const int64_t d = s.back();
  // Sources of different scales, so the RMS normalisation matters.
  for (size_t i = 0; i < m; ++i) xs.push_back(randn(s, seed + i, 0.5 + i).requires_grad_());
  xs.push_back(randn(w_row ? Shape{1, d} : Shape{d}, seed + 100, 0.3).requires_grad_());
  xs.push_back(randu({d}, seed + 101, 0.5, 1.5).requires_grad_());
  return xs;
}

TEST_P(AttnRes, MatchesReference) {
  uint64_t seed = 1;
  for (size_t m : {1, 2, 3, 9})
    for (Shape s : {Shape{1, 1}, Shape{3, 7}, Shape{2, 5, 130}, Shape{300, 64}}) {
      expect_matches_reference_all("attn_res m=" + std::to_string(m) + " " + shape_str(s),
                                   attn_res_fn(m), make_inputs(m, s, seed), backend());
      seed += 200;
    }
}

TEST_P(AttnRes, ProjWeightAsRowAndNonContiguousSources) {
  std::vector<Tensor> xs = make_inputs(3, {6, 40}, 5, /*w_row=*/true);
  expect_matches_reference_all("w [1, d]", attn_res_fn(3), xs, backend());
  Tensor t = randn({40, 6}, 9).requires_grad_();
  xs[1] = t;
  expect_matches_reference_all(
      "transposed source",
      [](const std::vector<Tensor>& x) {
        return ops::attn_res({x[0], ops::transpose(x[1], 0, 1), x[2]}, x[3], x[4]);
      },
      xs, backend());
}

TEST_P(AttnRes, ZeroQueryGivesUniformMean) {
  for (DType t : {DType::F32, DType::BF16}) {
    const Device dev = device_of(backend());
    std::vector<Tensor> vs;
    for (uint64_t i = 0; i < 4; ++i) vs.push_back(randn({5, 33}, 20 + i, 1.0 + i).to(t).to(dev));
    Tensor w = Tensor::zeros({1, 33}, t, dev), gamma = randu({33}, 30, 0.5, 2).to(t).to(dev);
    std::vector<double> got = ops::attn_res(vs, w, gamma).to_doubles();
    for (size_t k = 0; k < got.size(); ++k) {
      double mean = 0;
      for (const Tensor& v : vs) mean += v.to_doubles()[k] / 4;
      EXPECT_NEAR(got[k], mean, t == DType::F32 ? 1e-5 : 2e-2 * (1 + std::abs(mean))) << k;
    }
  }
}

TEST_P(AttnRes, SingleSourceReturnsItself) {
  for (DType t : {DType::F32, DType::BF16}) {
    const Device dev = device_of(backend());
    Tensor v = randn({4, 3, 50}, 40, 3.0).to(t).to(dev).requires_grad_();
    Tensor w = randn({50}, 41).to(t).to(dev).requires_grad_();
    Tensor gamma = randn({50}, 42).to(t).to(dev).requires_grad_();
    Tensor y = ops::attn_res({v}, w, gamma);
    EXPECT_EQ(y.to_doubles(), v.to_doubles());
    // The softmax over one source is constant: the gradient passes straight through to v and
    // none reaches the pseudo-query.
    Tensor seed = randn(y.shape(), 43).to(t).to(dev);
    y.backward(seed);
    EXPECT_EQ(v.grad().to_doubles(), seed.to_doubles());
    for (double g : w.grad().to_doubles()) EXPECT_NEAR(g, 0.0, 1e-6);
    for (double g : gamma.grad().to_doubles()) EXPECT_NEAR(g, 0.0, 1e-6);
  }
}

TEST(AttnResReference, MatchesNaiveFormula) {
  // fla naive_attnres, written out for two tokens and three sources (eps inside the sqrt, softmax
  // over the sources per token, scale 1).
  const int64_t n = 2, d = 3;
  std::vector<std::vector<double>> v = {
      {1, 2, 3, -1, 0.5, 2}, {0.2, -0.1, 4, 3, 3, -3}, {-2, 1, 1, 0.1, 0.2, 0.3}};
  std::vector<double> w = {0.5, -1, 2}, gamma = {1, 0.5, 1.5};
  const double eps = 0.25;  // large, so a misplaced eps shows
  std::vector<Tensor> vs;
  for (auto& x : v) vs.push_back(Tensor::from_doubles(x, {n, d}, DType::F64));
  Tensor y = ops::attn_res(vs, Tensor::from_doubles(w, {1, d}, DType::F64),
                           Tensor::from_doubles(gamma, {d}, DType::F64), eps);
  std::vector<double> got = y.to_doubles();
  for (int64_t t = 0; t < n; ++t) {
    double a[3], z = 0;
    for (int i = 0; i < 3; ++i) {
      double ms = 0, dot = 0;
      for (int k = 0; k < d; ++k) ms += v[i][t * d + k] * v[i][t * d + k] / d;
      for (int k = 0; k < d; ++k) dot += v[i][t * d + k] / std::sqrt(ms + eps) * gamma[k] * w[k];
      a[i] = dot;
    }
    for (int i = 0; i < 3; ++i) z += std::exp(a[i]);
    for (int k = 0; k < d; ++k) {
      double o = 0;
      for (int i = 0; i < 3; ++i) o += std::exp(a[i]) / z * v[i][t * d + k];
      EXPECT_NEAR(got[t * d + k], o, 1e-12);
    }
  }
}

TEST(AttnResGrad, Gradcheck) {
  for (size_t m : {1, 2, 4}) {
    std::vector<Tensor> xs = make_inputs(m, {3, 5}, 60 + m);
    expect_gradcheck("attn_res m=" + std::to_string(m), attn_res_fn(m, 1e-3), xs);
  }
  std::vector<Tensor> xs = make_inputs(3, {2, 2, 4}, 70, /*w_row=*/true);
  expect_gradcheck("attn_res [2, 2, 4], w [1, d]", attn_res_fn(3), xs);
}

TEST(AttnResErrors, BadInput) {
  Tensor a = randn({2, 8}, 1), b = randn({2, 7}, 2), w = randn({8}, 3), g = randn({8}, 4);
  expect_error([] { ops::attn_res({}, Tensor::zeros({4}), Tensor::ones({4})); },
               {"attn_res", "at least one source"});
  expect_error([&] { ops::attn_res({a, b}, w, g); }, {"attn_res", "[2, 8]", "[2, 7]"});
  expect_error([&] { ops::attn_res({a}, randn({7}, 5), g); }, {"attn_res", "w", "[7]"});
  expect_error([&] { ops::attn_res({a}, w, randn({2, 4}, 6)); }, {"attn_res", "gamma", "[2, 4]"});
  expect_error([&] { ops::attn_res({a, b.to(DType::BF16)}, w, g); }, {"attn_res", "bf16"});
}

}  // namespace
}  // namespace myriad::testing
