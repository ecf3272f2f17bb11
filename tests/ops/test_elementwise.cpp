#include "tests/ops/op_test.h"

namespace myriad::testing {
namespace {

using ops::BinaryOp;
using ops::UnaryOp;

class Elementwise : public OpTest {};
MYRIAD_OP_TEST_SUITE(Elementwise);

// Shapes with odd sizes, length 1, broadcasting in every position, and a large one.
const std::vector<std::pair<Shape, Shape>> kBinaryShapes = {
    {{1}, {1}},           {{7}, {7}},         {{3, 5}, {3, 5}},       {{3, 5}, {5}},
    {{3, 5}, {3, 1}},     {{1, 5}, {4, 1}},   {{2, 3, 4}, {1, 3, 1}}, {{4, 1, 3}, {2, 3}},
    {{1000, 333}, {333}}, {{70001}, {70001}},
};

TEST_P(Elementwise, BinaryMatchesReference) {
  for (BinaryOp op :
       {BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Div, BinaryOp::Max, BinaryOp::Min}) {
    uint64_t seed = 1;
    for (auto [sa, sb] : kBinaryShapes) {
      Tensor a = randn(sa, seed++).requires_grad_();
      Tensor b = op == BinaryOp::Div ? randu(sb, seed++, 0.5, 2.0).requires_grad_()
                                     : randn(sb, seed++).requires_grad_();
      expect_matches_reference_all(
          std::string(ops::op_name(op)) + " " + shape_str(sa) + " x " + shape_str(sb),
          [op](const std::vector<Tensor>& x) { return ops::binary(op, x[0], x[1]); }, {a, b},
          backend());
    }
  }
}

TEST_P(Elementwise, BinaryOnNonContiguousViews) {
  Tensor a = randn({6, 5}, 3).requires_grad_();
  Tensor b = randn({5, 6}, 4).requires_grad_();
  expect_matches_reference_all(
      "add(a, b^T)",
      [](const std::vector<Tensor>& x) { return ops::add(x[0], ops::transpose(x[1], 0, 1)); },
      {a, b}, backend());
}

TEST_P(Elementwise, UnaryMatchesReference) {
  for (UnaryOp op : {UnaryOp::Neg, UnaryOp::Exp, UnaryOp::Log, UnaryOp::Sqrt, UnaryOp::Rsqrt,
                     UnaryOp::Square, UnaryOp::Abs, UnaryOp::Sigmoid, UnaryOp::Silu, UnaryOp::Tanh,
                     UnaryOp::Softplus, UnaryOp::Relu}) {
    bool positive = op == UnaryOp::Log || op == UnaryOp::Sqrt || op == UnaryOp::Rsqrt;
    for (Shape s : {Shape{1}, Shape{17}, Shape{3, 129}, Shape{100003}}) {
      Tensor x = positive ? randu(s, 5, 0.1, 4.0) : randn(s, 5, 3.0);
      x.requires_grad_();
      expect_matches_reference_all(
          std::string(ops::op_name(op)) + " " + shape_str(s),
          [op](const std::vector<Tensor>& v) { return ops::unary(op, v[0]); }, {x}, backend());
    }
  }
}

TEST_P(Elementwise, ExtremeInputsStayFinite) {
  // Large magnitudes must not overflow sigmoid/silu/softplus/tanh or exp's range reduction.
  Tensor x = Tensor::from_doubles(std::vector<double>{-100, -30, -5, 0, 5, 30, 100}, {7});
  for (UnaryOp op : {UnaryOp::Sigmoid, UnaryOp::Silu, UnaryOp::Softplus, UnaryOp::Tanh})
    expect_matches_reference(
        "extreme " + std::string(ops::op_name(op)),
        [op](const std::vector<Tensor>& v) { return ops::unary(op, v[0]); }, {x}, backend());
}

TEST_P(Elementwise, ScalarAndPow) {
  Tensor x = randu({5, 33}, 9, 0.5, 3.0).requires_grad_();
  auto check = [&](const char* name, OpFn fn) {
    expect_matches_reference_all(name, fn, {x}, backend());
  };
  check("add scalar", [](const std::vector<Tensor>& v) { return ops::add(v[0], 1.5); });
  check("mul scalar", [](const std::vector<Tensor>& v) { return ops::mul(v[0], -2.0); });
  check("rsub", [](const std::vector<Tensor>& v) { return ops::rsub(1.0, v[0]); });
  check("rdiv", [](const std::vector<Tensor>& v) { return ops::rdiv(2.0, v[0]); });
  check("pow", [](const std::vector<Tensor>& v) { return ops::pow(v[0], 1.7); });
}

TEST(ElementwiseGrad, Gradcheck) {
  Tensor a = randn({3, 4}, 11).requires_grad_();
  Tensor b = randu({4}, 12, 0.5, 2.0).requires_grad_();
  for (BinaryOp op :
       {BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Div, BinaryOp::Max, BinaryOp::Min})
    expect_gradcheck(ops::op_name(op),
                     [op](const std::vector<Tensor>& x) { return ops::binary(op, x[0], x[1]); },
                     {a, b});
  Tensor p = randu({2, 5}, 13, 0.2, 3.0).requires_grad_();
  for (UnaryOp op : {UnaryOp::Neg, UnaryOp::Exp, UnaryOp::Log, UnaryOp::Sqrt, UnaryOp::Rsqrt,
                     UnaryOp::Square, UnaryOp::Abs, UnaryOp::Sigmoid, UnaryOp::Silu, UnaryOp::Tanh,
                     UnaryOp::Softplus, UnaryOp::Relu})
    expect_gradcheck(ops::op_name(op),
                     [op](const std::vector<Tensor>& x) { return ops::unary(op, x[0]); }, {p});
  expect_gradcheck("pow", [](const std::vector<Tensor>& x) { return ops::pow(x[0], 2.5); }, {p});
  expect_gradcheck("rdiv", [](const std::vector<Tensor>& x) { return ops::rdiv(3.0, x[0]); }, {p});
}

TEST(ElementwiseErrors, ShapeDtypeDeviceReleased) {
  Tensor a = randn({2, 3}, 1), b = randn({4}, 2);
  expect_error([&] { ops::add(a, b); }, {"add", "[2, 3]", "[4]"});
  Tensor c = randn({2, 3}, 3).to(DType::BF16);
  expect_error([&] { ops::mul(a, c); }, {"mul", "dtype", "bf16"});
  Tensor i = Tensor::from_ints(std::vector<int64_t>{1, 2}, {2});
  expect_error([&] { ops::exp(i); }, {"exp", "floating"});
  Tensor r = randn({2, 3}, 4);
  r.release();
  expect_error([&] { ops::sub(a, r); }, {"sub", "released"});
}

TEST(ElementwiseInPlace, AxpyAndScale) {
  for (DType t : {DType::F32, DType::BF16}) {
    Tensor a = randn({1000}, 1).to(t), b = randn({1000}, 2).to(t);
    std::vector<double> av = a.to_doubles(), bv = b.to_doubles();
    ops::add_(a, b, 0.5);
    ops::mul_(a, 2.0);
    std::vector<double> got = a.to_doubles();
    for (size_t k = 0; k < av.size(); ++k)
      EXPECT_NEAR(got[k], 2 * (av[k] + 0.5 * bv[k]), t == DType::F32 ? 1e-5 : 5e-2);
  }
}

}  // namespace
}  // namespace myriad::testing
