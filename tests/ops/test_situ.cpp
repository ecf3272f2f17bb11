#include "ops/situ.h"

#include "tests/ops/op_test.h"

namespace myriad::testing {
namespace {

class Glu : public OpTest {};
MYRIAD_OP_TEST_SUITE(Glu);

OpFn situ_fn() {
  return [](const std::vector<Tensor>& x) { return ops::situ_glu(x[0], x[1]); };
}
OpFn swiglu_fn() {
  return [](const std::vector<Tensor>& x) { return ops::swiglu(x[0], x[1]); };
}

// Each (g, u) pair through situ_glu on one backend and dtype, as doubles.
std::vector<double> situ_values(const std::vector<double>& g, const std::vector<double>& u,
                                ops::Backend b, DType t) {
  const Shape s{static_cast<int64_t>(g.size())};
  Tensor tg = Tensor::from_doubles(g, s, t, device_of(b));
  Tensor tu = Tensor::from_doubles(u, s, t, device_of(b));
  return ops::situ_glu(tg, tu).to_doubles();
}

// MODEL.md §8: the gate branch alone (u = 1e9 saturates the up branch at exactly β2 = 25, so
// SiTU-GLU(g, 1e9) / 25 = gate(g)), the up branch alone (g = 1e9 gives gate = β1 = 4), and the
// whole unit.
struct Golden {
  double g, u, want;
};
const std::vector<Golden> kGolden = {
    {-10, 1e9, -1.79e-4 * 25}, {-2, 1e9, -0.220343 * 25}, {-0.5, 1e9, -0.187793 * 25},
    {0.5, 1e9, 0.309619 * 25}, {2, 1e9, 1.628126 * 25},   {4, 1e9, 2.991584 * 25},
    {10, 1e9, 3.946278 * 25},  {100, 1e9, 4.0 * 25},      {1e9, 1, 0.999467 * 4},
    {1e9, 25, 19.039854 * 4},  {1e9, 100, 24.983232 * 4}, {2, 3, 4.861067},
};

void expect_golden(ops::Backend b, DType t) {
  std::vector<double> g, u;
  for (const auto& x : kGolden) g.push_back(x.g), u.push_back(x.u);
  std::vector<double> got = situ_values(g, u, b, t);
  for (size_t i = 0; i < kGolden.size(); ++i) {
    // The table has six significant digits (gate(-10) only three); the gate and up rows were
    // scaled by 25 and 4, so their tolerances scale alike.
    const double scale = kGolden[i].u == 1e9 ? 25 : kGolden[i].g == 1e9 ? 4 : 1;
    const double tol = (kGolden[i].g == -10 ? 5e-7 : 1e-5) * scale;
    EXPECT_NEAR(got[i], kGolden[i].want, tol)
        << "SiTU-GLU(" << kGolden[i].g << ", " << kGolden[i].u << ") on " << ops::backend_name(b)
        << " " << dtype_name(t);
  }
}

TEST_P(Glu, ModelSpecValues) {
  expect_golden(backend(), DType::F32);
}
TEST(GluReference, ModelSpecValues) {
  expect_golden(ops::Backend::Reference, DType::F64);
}

TEST_P(Glu, Saturation) {
  // |SiTU-GLU| < β1·β2 = 100, reached only as both inputs grow; a large negative gate is ~0.
  std::vector<double> got = situ_values({1e4, 1e4, -1e4, 50, -1e4, 0}, {1e4, -1e4, 1e4, 1e4, 0, 7},
                                        backend(), DType::F32);
  const std::vector<double> want = {100, -100, 0, 100, 0, 0};
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-4) << i;
  // Swapped betas (β1 = 25, β2 = 4) give a different saturation for these inputs.
  Tensor g = Tensor::from_doubles(std::vector<double>{10}, {1}, DType::F32, device_of(backend()));
  Tensor u = Tensor::from_doubles(std::vector<double>{100}, {1}, DType::F32, device_of(backend()));
  EXPECT_NEAR(ops::situ_glu(g, u).item(), 3.946278 * 24.983232, 1e-3);
  EXPECT_GT(std::abs(ops::situ_glu(g, u, 25, 4).item() - 3.946278 * 24.983232), 1.0);
}

TEST_P(Glu, MatchesReference) {
  uint64_t seed = 1;
  for (Shape s : {Shape{1}, Shape{7}, Shape{3, 129}, Shape{2, 3, 1100}, Shape{50001}}) {
    // Scale 8 spans the saturating ranges of both branches.
    Tensor g = randn(s, seed++, 8.0).requires_grad_();
    Tensor u = randn(s, seed++, 40.0).requires_grad_();
    expect_matches_reference_all("situ_glu " + shape_str(s), situ_fn(), {g, u}, backend());
    expect_matches_reference_all("swiglu " + shape_str(s), swiglu_fn(), {g, u}, backend());
  }
}

TEST_P(Glu, FusedMatchesSplit) {
  Tensor x = randn({5, 2, 2 * 333}, 3, 6.0).requires_grad_();
  expect_matches_reference_all(
      "situ_glu_fused", [](const std::vector<Tensor>& v) { return ops::situ_glu_fused(v[0]); }, {x},
      backend());
  expect_matches_reference_all(
      "swiglu_fused", [](const std::vector<Tensor>& v) { return ops::swiglu_fused(v[0]); }, {x},
      backend());
  // The fused form is the split form on the two halves, values and gradients.
  for (bool situ : {true, false}) {
    Tensor a = x.detach().to(device_of(backend())).requires_grad_();
    Tensor b = x.detach().to(device_of(backend()));
    std::vector<Tensor> halves = ops::split(b, {333, 333}, -1);
    Tensor g = halves[0].contiguous().requires_grad_(), u = halves[1].contiguous().requires_grad_();
    Tensor y1 = situ ? ops::situ_glu_fused(a) : ops::swiglu_fused(a);
    Tensor y2 = situ ? ops::situ_glu(g, u) : ops::swiglu(g, u);
    EXPECT_EQ(y1.shape(), (Shape{5, 2, 333}));
    EXPECT_EQ(y1.to_doubles(), y2.to_doubles());
    Tensor seed = randn(y1.shape(), 4).to(device_of(backend()));
    y1.backward(seed);
    y2.backward(seed);
    EXPECT_EQ(a.grad().to_doubles(), ops::concat({g.grad(), u.grad()}, -1).to_doubles());
  }
}

TEST_P(Glu, NonContiguousInputs) {
  Tensor g = randn({6, 5}, 5, 3.0).requires_grad_();
  Tensor u = randn({5, 6}, 6, 3.0).requires_grad_();
  expect_matches_reference_all(
      "situ_glu(g, u^T)",
      [](const std::vector<Tensor>& x) { return ops::situ_glu(x[0], ops::transpose(x[1], 0, 1)); },
      {g, u}, backend());
}

TEST(GluGrad, Gradcheck) {
  // Inputs across both branches' curved and saturating parts.
  Tensor g = Tensor::from_doubles(std::vector<double>{-9, -3, -0.7, 0, 0.4, 2.5, 6, 12}, {2, 4});
  Tensor u = Tensor::from_doubles(std::vector<double>{-60, -20, -1, 0.3, 2, 18, 30, 80}, {2, 4});
  g.requires_grad_(), u.requires_grad_();
  expect_gradcheck("situ_glu", situ_fn(), {g, u});
  expect_gradcheck("swiglu", swiglu_fn(), {g, u});
  expect_gradcheck("situ_glu betas 2, 3",
                   [](const std::vector<Tensor>& x) { return ops::situ_glu(x[0], x[1], 2.0, 3.0); },
                   {g, u});
  Tensor x = randn({3, 6}, 7, 4.0).requires_grad_();
  expect_gradcheck("situ_glu_fused",
                   [](const std::vector<Tensor>& v) { return ops::situ_glu_fused(v[0]); }, {x});
  expect_gradcheck("swiglu_fused",
                   [](const std::vector<Tensor>& v) { return ops::swiglu_fused(v[0]); }, {x});
}

TEST(GluGrad, ModelSpecDerivatives) {
  // MODEL.md §8: ∂gate/∂g = sech²(g/β1)σ(g) + β1 tanh(g/β1)σ(g)(1 − σ(g)), ∂up/∂u = sech²(u/β2).
  for (double gv : {-3.0, 0.5, 5.0})
    for (double uv : {-30.0, 2.0}) {
      Tensor g = Tensor::from_doubles(std::vector<double>{gv}, {1}, DType::F64).requires_grad_();
      Tensor u = Tensor::from_doubles(std::vector<double>{uv}, {1}, DType::F64).requires_grad_();
      ops::situ_glu(g, u).backward();
      const double s = 1 / (1 + std::exp(-gv)), tg = std::tanh(gv / 4), tu = std::tanh(uv / 25);
      const double G = 4 * tg * s, U = 25 * tu;
      EXPECT_NEAR(g.grad().item(), U * ((1 - tg * tg) * s + 4 * tg * s * (1 - s)), 1e-12);
      EXPECT_NEAR(u.grad().item(), G * (1 - tu * tu), 1e-12);
    }
}

TEST(GluErrors, BadInput) {
  Tensor a = randn({2, 3}, 1), b = randn({2, 4}, 2);
  expect_error([&] { ops::situ_glu(a, b); }, {"situ_glu", "[2, 3]", "[2, 4]"});
  expect_error([&] { ops::swiglu(a, b.to(DType::BF16)); }, {"swiglu", "bf16"});
  expect_error([&] { ops::situ_glu_fused(randn({4, 5}, 3)); }, {"situ_glu_fused", "[4, 5]"});
  expect_error([&] { ops::situ_glu(a, a, 0.0, 25.0); }, {"situ_glu", "beta"});
  Tensor i = Tensor::from_ints(std::vector<int64_t>{1, 2}, {2});
  expect_error([&] { ops::swiglu_fused(i); }, {"swiglu_fused", "floating"});
}

}  // namespace
}  // namespace myriad::testing
