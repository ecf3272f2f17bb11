#include <cmath>

#include "tests/ops/op_test.h"

namespace myriad::testing {
namespace {

class Softmax : public OpTest {};
MYRIAD_OP_TEST_SUITE(Softmax);

OpFn softmax_fn(bool log, int64_t dim) {
  return [log, dim](const std::vector<Tensor>& x) {
    return log ? ops::log_softmax(x[0], dim) : ops::softmax(x[0], dim);
  };
}
const char* name_of(bool log) {
  return log ? "log_softmax" : "softmax";
}

TEST_P(Softmax, MatchesReferenceOverLastDim) {
  // Row length 1, odd lengths, one long vocab-sized row, many short rows, a 0-d tensor.
  uint64_t seed = 1;
  for (Shape s : {Shape{}, Shape{1}, Shape{7}, Shape{3, 1}, Shape{4, 7}, Shape{5, 1000},
                  Shape{1, 50257}, Shape{700, 33}, Shape{2, 3, 17}})
    for (bool log : {false, true}) {
      Tensor x = randn(s, seed++, 3.0).requires_grad_();
      expect_matches_reference_all(std::string(name_of(log)) + " " + shape_str(s),
                                   softmax_fn(log, -1), {x}, backend());
    }
}

TEST_P(Softmax, MatchesReferenceOverOtherDims) {
  Tensor x = randn({4, 5, 6}, 3, 2.0).requires_grad_();
  for (int64_t dim : {0, 1, -2, -3})
    for (bool log : {false, true})
      expect_matches_reference_all(std::string(name_of(log)) + " dim " + std::to_string(dim),
                                   softmax_fn(log, dim), {x}, backend());
  // A non-contiguous input.
  Tensor y = randn({6, 9}, 4).requires_grad_();
  expect_matches_reference_all(
      "softmax of a transpose",
      [](const std::vector<Tensor>& v) { return ops::softmax(ops::transpose(v[0], 0, 1), 1); }, {y},
      backend());
}

TEST_P(Softmax, ExtremeValuesStayFinite) {
  std::vector<double> v = {1e4, -1e4, 0, 1e4, -1e4, -1e4, 5, 88, 89, -100, 1e4, 1e4 - 1};
  Tensor x = Tensor::from_doubles(v, {4, 3}).requires_grad_();
  for (bool log : {false, true}) {
    expect_matches_reference(std::string("extreme ") + name_of(log), softmax_fn(log, -1), {x},
                             backend());
    Tensor y = softmax_fn(log, -1)({x.detach().to(device_of(backend()))});
    for (double e : y.to_doubles()) EXPECT_TRUE(std::isfinite(e)) << name_of(log);
  }
  std::vector<double> p = ops::softmax(x.detach().to(device_of(backend()))).to_doubles();
  EXPECT_NEAR(p[0], 1.0, 1e-6);
  EXPECT_NEAR(p[1], 0.0, 1e-6);
  EXPECT_NEAR(p[10], 1.0 / (1.0 + std::exp(-1.0)), 1e-5);
}

TEST_P(Softmax, RowsSumToOneAndLogMatches) {
  for (DType t : {DType::F32, DType::BF16}) {
    Tensor x = randn({37, 301}, 8, 4.0).to(t).to(device_of(backend()));
    std::vector<double> p = ops::softmax(x).to_doubles();
    std::vector<double> lp = ops::log_softmax(x).to_doubles();
    const double tol = t == DType::F32 ? 1e-5 : 2e-2;
    for (int r = 0; r < 37; ++r) {
      double s = 0;
      for (int i = 0; i < 301; ++i) {
        s += p[r * 301 + i];
        EXPECT_NEAR(std::exp(lp[r * 301 + i]), p[r * 301 + i], tol);
      }
      EXPECT_NEAR(s, 1.0, tol) << "row " << r;
    }
  }
}

TEST(SoftmaxGrad, Gradcheck) {
  Tensor x = randn({3, 4, 5}, 21).requires_grad_();
  for (bool log : {false, true})
    for (int64_t dim : {0, 1, 2})
      expect_gradcheck(std::string(name_of(log)) + " dim " + std::to_string(dim),
                       softmax_fn(log, dim), {x});
}

TEST(SoftmaxErrors, BadInput) {
  Tensor i = Tensor::from_ints(std::vector<int64_t>{1, 2}, {2});
  expect_error([&] { ops::softmax(i); }, {"softmax", "floating"});
  expect_error([&] { ops::log_softmax(i); }, {"log_softmax", "floating"});
  Tensor x = randn({2, 3}, 1);
  expect_error([&] { ops::softmax(x, 2); }, {"softmax", "dimension 2"});
  expect_error([&] { ops::log_softmax(x, -3); }, {"log_softmax", "dimension -3"});
}

}  // namespace
}  // namespace myriad::testing
