#include <cmath>

#include "tests/ops/op_test.h"

namespace myriad::testing {
namespace {

class RmsNorm : public OpTest {};
MYRIAD_OP_TEST_SUITE(RmsNorm);

OpFn rms_fn(double eps) {
  return [eps](const std::vector<Tensor>& v) {
    return ops::rms_norm(v[0], v.size() > 1 ? v[1] : Tensor(), eps);
  };
}

TEST_P(RmsNorm, MatchesReference) {
  uint64_t seed = 1;
  for (Shape s : {Shape{1}, Shape{1, 1}, Shape{3, 7}, Shape{4, 1000}, Shape{1, 4096},
                  Shape{2, 3, 17}, Shape{3000, 64}}) {
    Tensor x = randn(s, seed++, 2.0).requires_grad_();
    Tensor w = randu({s.back()}, seed++, 0.5, 1.5).requires_grad_();
    expect_matches_reference_all("rms_norm " + shape_str(s), rms_fn(1e-5), {x, w}, backend());
    expect_matches_reference_all("rms_norm no weight " + shape_str(s), rms_fn(1e-6), {x},
                                 backend());
    expect_matches_reference_all(
        "l2norm " + shape_str(s), [](const std::vector<Tensor>& v) { return ops::l2norm(v[0]); },
        {x}, backend());
  }
}

TEST_P(RmsNorm, NonContiguousInputAndLargeEps) {
  Tensor x = randn({9, 5}, 3).requires_grad_();
  Tensor w = randn({9}, 4).requires_grad_();
  expect_matches_reference_all(
      "rms_norm of a transpose",
      [](const std::vector<Tensor>& v) {
        return ops::rms_norm(ops::transpose(v[0], 0, 1), v[1], 0.5);
      },
      {x, w}, backend());
}

// MODEL.md: x̂ is computed in f32, cast back to bf16, and only then multiplied by the weight.
TEST_P(RmsNorm, Bf16RoundsBeforeTheWeight) {
  const int64_t rows = 5, n = 33;
  Tensor x = randn({rows, n}, 7, 3.0).to(DType::BF16);
  Tensor w = randu({n}, 8, 0.3, 3.0).to(DType::BF16);
  std::vector<float> xv = x.to_floats(), wv = w.to_floats();
  std::vector<float> want(rows * n);
  for (int64_t r = 0; r < rows; ++r) {
    float ss = 0;
    for (int64_t i = 0; i < n; ++i) ss += xv[r * n + i] * xv[r * n + i];
    float rs = 1.0f / std::sqrt(ss / n + 1e-5f);
    for (int64_t i = 0; i < n; ++i) {
      float xhat = bf16_to_f32(f32_to_bf16(xv[r * n + i] * rs));
      want[r * n + i] = bf16_to_f32(f32_to_bf16(xhat * wv[i]));
    }
  }
  Device dev = device_of(backend());
  std::vector<float> got = ops::rms_norm(x.to(dev), w.to(dev), 1e-5).to_floats();
  std::vector<float> ref;
  {
    ops::ReferenceMode ref_mode;
    ref = ops::rms_norm(x, w, 1e-5).to_floats();
  }
  int mismatches = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    // f32 vs double sums may flip a rounding: allow one bf16 ulp, but count the differences.
    EXPECT_NEAR(got[i], want[i], std::abs(want[i]) * (1.0 / 128)) << i;
    EXPECT_NEAR(ref[i], want[i], std::abs(want[i]) * (1.0 / 128)) << i;
    mismatches += got[i] != want[i];
  }
  EXPECT_LE(mismatches, static_cast<int>(want.size() / 20));
}

TEST_P(RmsNorm, NormalisesToUnitRms) {
  Tensor x = randn({8, 512}, 9, 5.0).to(device_of(backend()));
  std::vector<double> y = ops::rms_norm(x, Tensor(), 0.0).to_doubles();
  for (int r = 0; r < 8; ++r) {
    double ss = 0;
    for (int i = 0; i < 512; ++i) ss += y[r * 512 + i] * y[r * 512 + i];
    EXPECT_NEAR(ss / 512, 1.0, 1e-4);
  }
}

TEST(RmsNormGrad, Gradcheck) {
  Tensor x = randn({3, 6}, 11).requires_grad_();
  Tensor w = randu({6}, 12, 0.5, 1.5).requires_grad_();
  expect_gradcheck("rms_norm", rms_fn(1e-5), {x, w});
  expect_gradcheck("rms_norm no weight", rms_fn(1e-5), {x});
  expect_gradcheck("l2norm, eps 0.1",
                   [](const std::vector<Tensor>& v) { return ops::l2norm(v[0], 0.1); }, {x});
  Tensor x3 = randn({2, 2, 5}, 13).requires_grad_();
  Tensor w3 = randn({5}, 14).requires_grad_();
  expect_gradcheck("rms_norm 3-d, eps 0.1", rms_fn(0.1), {x3, w3});
}

TEST(RmsNormErrors, BadInput) {
  Tensor x = randn({2, 3}, 1);
  expect_error([&] { ops::rms_norm(x, randn({4}, 2), 1e-5); }, {"rms_norm", "[3]", "[4]"});
  expect_error([&] { ops::rms_norm(x, randn({1, 3}, 2), 1e-5); }, {"rms_norm", "[1, 3]"});
  expect_error([&] { ops::rms_norm(x, randn({3}, 2).to(DType::BF16), 1e-5); },
               {"rms_norm", "dtype"});
  Tensor i = Tensor::from_ints(std::vector<int64_t>{1, 2}, {2});
  expect_error([&] { ops::rms_norm(i, Tensor(), 1e-5); }, {"rms_norm", "floating"});
  expect_error([&] { ops::rms_norm(x, Tensor(), -1.0); }, {"rms_norm", "eps"});
  expect_error([&] { ops::rms_norm(Tensor::full({}, 1.0), Tensor(), 1e-5); }, {"rms_norm"});
}

}  // namespace
}  // namespace myriad::testing
