#include "ops/gelu.h"

#include <cmath>
#include <numbers>

#include "tests/ops/op_test.h"

namespace myriad::testing {
namespace {

class Gelu : public OpTest {};
MYRIAD_OP_TEST_SUITE(Gelu);

const std::vector<double> kPoints = {-30, -6, -3, -1.5, -0.7, -1e-3, 0, 1e-3, 0.5, 1, 2.5, 6, 30};

// torch.nn.functional.gelu by its definitions, in double.
double gelu_exact(double x) {
  return 0.5 * x * (1.0 + std::erf(x / std::numbers::sqrt2));
}
double gelu_tanh_formula(double x) {
  return 0.5 * x *
         (1.0 + std::tanh(std::sqrt(2.0 / std::numbers::pi) * (x + 0.044715 * x * x * x)));
}

TEST_P(Gelu, ExactMatchesReference) {
  for (Shape s : {Shape{1}, Shape{7}, Shape{3, 33}, Shape{2, 3, 65}}) {
    Tensor x = randn(s, 11, 2.0).requires_grad_();
    expect_matches_reference_all(
        "gelu " + shape_str(s), [](const std::vector<Tensor>& v) { return ops::gelu(v[0]); }, {x},
        backend());
  }
}

TEST_P(Gelu, ValuesAgainstTheDefinitions) {
  const Shape s{static_cast<int64_t>(kPoints.size())};
  for (DType t : {DType::F32, DType::F64}) {
    Tensor x = Tensor::from_doubles(kPoints, s, t);
    std::vector<double> exact = ops::gelu(x).to_doubles();
    std::vector<double> approx = ops::gelu_tanh(x).to_doubles();
    const double tol = t == DType::F64 ? 1e-14 : 1e-6;
    for (size_t i = 0; i < kPoints.size(); ++i) {
      const double v = kPoints[i];
      EXPECT_NEAR(exact[i], gelu_exact(v), tol * (1 + std::abs(v))) << "gelu(" << v << ")";
      EXPECT_NEAR(approx[i], gelu_tanh_formula(v), tol * (1 + std::abs(v)))
          << "gelu_tanh(" << v << ")";
    }
  }
  // The two forms differ by up to ~5e-4 (why the projector needs the exact one).
  EXPECT_GT(std::abs(gelu_exact(-1.5) - gelu_tanh_formula(-1.5)), 1e-4);
}

TEST(GeluGrad, FiniteDifferences) {
  Tensor x = Tensor::from_doubles(kPoints, {static_cast<int64_t>(kPoints.size())}).requires_grad_();
  Tensor r = randn({4, 9}, 5, 2.0).requires_grad_();
  for (const Tensor& in : {x, r}) {
    expect_gradcheck("gelu", [](const std::vector<Tensor>& v) { return ops::gelu(v[0]); }, {in});
    expect_gradcheck("gelu_tanh", [](const std::vector<Tensor>& v) { return ops::gelu_tanh(v[0]); },
                     {in});
  }
}

TEST(GeluErrors, NamesTheOp) {
  expect_error([] { ops::gelu(Tensor::from_ints(std::vector<int64_t>{1, 2}, {2})); }, {"gelu"});
  expect_error([] { ops::gelu_tanh(Tensor()); }, {"gelu_tanh"});
}

}  // namespace
}  // namespace myriad::testing
