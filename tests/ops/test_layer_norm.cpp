#include "ops/layer_norm.h"

#include <cmath>

#include "tests/ops/op_test.h"

namespace myriad::testing {
namespace {

// torch.nn.LayerNorm by its definition (biased variance), one row at a time, in double.
std::vector<double> layer_norm_loop(const std::vector<double>& x, const std::vector<double>& w,
                                    const std::vector<double>& b, int64_t n, double eps) {
  std::vector<double> y(x.size());
  for (size_t r = 0; r < x.size() / n; ++r) {
    double mean = 0, var = 0;
    for (int64_t i = 0; i < n; ++i) mean += x[r * n + i] / n;
    for (int64_t i = 0; i < n; ++i) var += (x[r * n + i] - mean) * (x[r * n + i] - mean) / n;
    for (int64_t i = 0; i < n; ++i)
      y[r * n + i] = (x[r * n + i] - mean) / std::sqrt(var + eps) * w[i] + b[i];
  }
  return y;
}

TEST(LayerNorm, MatchesTheDefinition) {
  uint64_t seed = 3;
  for (Shape s : {Shape{1}, Shape{5}, Shape{3, 7}, Shape{2, 3, 64}, Shape{40, 1152}}) {
    const int64_t n = s.back();
    Tensor x = randn(s, seed++, 3.0);
    x = ops::add(x, 5.0);  // a large mean: the centring must happen before the variance
    Tensor w = randu({n}, seed++, 0.5, 1.5), b = randn({n}, seed++);
    for (DType t : {DType::F32, DType::F64}) {
      std::vector<double> got = ops::layer_norm(x.to(t), w.to(t), b.to(t), 1e-5).to_doubles();
      std::vector<double> want =
          layer_norm_loop(x.to_doubles(), w.to_doubles(), b.to_doubles(), n, 1e-5);
      const double tol = t == DType::F64 ? 1e-12 : 2e-5;
      for (size_t i = 0; i < want.size(); ++i)
        ASSERT_NEAR(got[i], want[i], tol * (1 + std::abs(want[i])))
            << shape_str(s) << " " << dtype_name(t) << " element " << i;
    }
  }
  // Without weight and bias: mean 0 and variance 1 / (1 + eps / var) per row.
  std::vector<double> y = ops::layer_norm(randn({4, 256}, 9, 2.0), {}, {}, 0.0).to_doubles();
  double m = 0, v = 0;
  for (int i = 0; i < 256; ++i) m += y[i] / 256;
  for (int i = 0; i < 256; ++i) v += (y[i] - m) * (y[i] - m) / 256;
  EXPECT_NEAR(m, 0.0, 1e-6);
  EXPECT_NEAR(v, 1.0, 1e-5);
}

TEST(LayerNorm, GradientCheck) {
  Tensor x = randn({3, 6}, 21, 2.0).requires_grad_();
  Tensor w = randu({6}, 22, 0.5, 1.5).requires_grad_();
  Tensor b = randn({6}, 23).requires_grad_();
  expect_gradcheck(
      "layer_norm",
      [](const std::vector<Tensor>& v) { return ops::layer_norm(v[0], v[1], v[2], 1e-5); },
      {x, w, b});
  expect_gradcheck("layer_norm [2, 2, 5] eps 0.1",
                   [](const std::vector<Tensor>& v) { return ops::layer_norm(v[0], {}, {}, 0.1); },
                   {randn({2, 2, 5}, 24).requires_grad_()});
}

TEST(LayerNorm, Errors) {
  expect_error(
      [] {
        ops::layer_norm(randn({2, 4}, 1), randn({3}, 2), {}, 1e-5);
      },
      {"layer_norm", "weight and bias must be [4]"});
  expect_error(
      [] {
        ops::layer_norm(randn({2, 4}, 1), {}, {}, -1.0);
      },
      {"layer_norm", "eps must be non-negative"});
}

}  // namespace
}  // namespace myriad::testing
