#include <cmath>

#include "ops/adamw.h"
#include "tests/ops/op_test.h"

namespace myriad::testing {
namespace {

// The CPU kernel against the reference on the same inputs: the same f32 arithmetic with no fused
// multiply-adds, so the same bits, at sizes within one thread's share and across threads.
TEST(Adamw, CpuKernelEqualsReferenceBitForBit) {
  uint64_t seed = 40;
  for (int64_t n : {1, 7, 33, 100003}) {
    const Tensor w0 = randn({n}, seed++), g0 = ops::mul(randn({n}, seed++), 1e-2);
    const Tensor m0 = ops::mul(randn({n}, seed++), 1e-3);
    const Tensor v0 = ops::abs(ops::mul(randn({n}, seed++), 1e-5));
    for (int step : {1, 2, 1000}) {
      const ops::AdamwArgs a{
          3e-3, 0.9, 0.95, 1e-8, 0.1, 1 - std::pow(0.9, step), 1 - std::pow(0.95, step)};
      Tensor w[2], m[2], v[2];
      for (int k = 0; k < 2; ++k) {
        w[k] = w0.clone(), m[k] = m0.clone(), v[k] = v0.clone();
        if (k == 0) {
          ops::ReferenceMode ref;
          ops::adamw_update(w[k], g0, m[k], v[k], a);
        } else {
          ops::adamw_update(w[k], g0, m[k], v[k], a);
        }
      }
      const std::string what = "n " + std::to_string(n) + " step " + std::to_string(step);
      EXPECT_EQ(w[1].to_floats(), w[0].to_floats()) << what;
      EXPECT_EQ(m[1].to_floats(), m[0].to_floats()) << what;
      EXPECT_EQ(v[1].to_floats(), v[0].to_floats()) << what;
      EXPECT_NE(w[1].to_floats(), w0.to_floats()) << what;  // it did update
    }
  }
}

// The CUDA kernel (f32 arithmetic in round-to-nearest intrinsics, no fused multiply-adds) gives
// the reference's bits too.
TEST(Adamw, CudaKernelEqualsReferenceBitForBit) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device visible";
  const int64_t n = 100003;
  const Tensor w0 = randn({n}, 50), g0 = ops::mul(randn({n}, 51), 1e-2);
  const Tensor m0 = ops::mul(randn({n}, 52), 1e-3);
  const Tensor v0 = ops::abs(ops::mul(randn({n}, 53), 1e-5));
  for (int step : {1, 1000}) {
    const ops::AdamwArgs a{
        3e-3, 0.9, 0.95, 1e-8, 0.1, 1 - std::pow(0.9, step), 1 - std::pow(0.95, step)};
    Tensor w = w0.clone(), m = m0.clone(), v = v0.clone();
    {
      ops::ReferenceMode ref;
      ops::adamw_update(w, g0, m, v, a);
    }
    Tensor wd = w0.to(cuda(0)), md = m0.to(cuda(0)), vd = v0.to(cuda(0));
    ops::adamw_update(wd, g0.to(cuda(0)), md, vd, a);
    EXPECT_EQ(wd.to(kCPU).to_floats(), w.to_floats()) << "step " << step;
    EXPECT_EQ(md.to(kCPU).to_floats(), m.to_floats()) << "step " << step;
    EXPECT_EQ(vd.to(kCPU).to_floats(), v.to_floats()) << "step " << step;
  }
}

TEST(Adamw, OneElementByHand) {
  // Step 1 from zero moments: m = 0.1 g, v = 0.05 g^2, m/bc1 = g, v/bc2 = g^2, so the update is
  // g / (|g| + eps) + wd w = 1 + 0.1 * 2 (g = 0.5, w = 2).
  Tensor w = Tensor::full({1}, 2.0), g = Tensor::full({1}, 0.5);
  Tensor m = Tensor::zeros({1}), v = Tensor::zeros({1});
  ops::adamw_update(w, g, m, v, {0.01, 0.9, 0.95, 0.0, 0.1, 1 - 0.9, 1 - 0.95});
  EXPECT_FLOAT_EQ(m.to_floats()[0], 0.05f);
  EXPECT_FLOAT_EQ(v.to_floats()[0], 0.0125f);
  EXPECT_FLOAT_EQ(w.to_floats()[0], 2.0f - 0.01f * 1.2f);
}

TEST(Adamw, BadInputsNameTheOp) {
  Tensor w = Tensor::zeros({4}), g = Tensor::zeros({4}), m = Tensor::zeros({4});
  Tensor v3 = Tensor::zeros({3}), vb = Tensor::zeros({4}, DType::BF16), v = Tensor::zeros({4});
  const ops::AdamwArgs a{1e-3, 0.9, 0.95, 1e-8, 0.0, 0.1, 0.05};
  expect_error([&] { ops::adamw_update(w, g, m, v3, a); }, {"adamw_update", "[3]"});
  expect_error([&] { ops::adamw_update(w, g, m, vb, a); }, {"adamw_update", "contiguous f32"});
  expect_error(
      [&] {
        ops::adamw_update(w, g, m, v, {1e-3, 0.9, 0.95, 1e-8, 0.0, 0.0, 0.05});
      },
      {"adamw_update", "bias corrections"});
}

}  // namespace
}  // namespace myriad::testing
