#include <cmath>
#include <limits>

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
    // A bf16 gradient, a clipping scale and the bf16 copy, against the reference.
    ops::AdamwArgs s = a;
    s.grad_scale = 0.37;
    const Tensor g16 = g0.to(DType::BF16);
    Tensor w2 = w0.clone(), m2 = m0.clone(), v2 = v0.clone(), low = Tensor::zeros({n}, DType::BF16);
    {
      ops::ReferenceMode ref;
      ops::adamw_update(w2, g16, m2, v2, s, &low);
    }
    Tensor wd2 = w0.to(cuda(0)), md2 = m0.to(cuda(0)), vd2 = v0.to(cuda(0));
    Tensor lowd = Tensor::zeros({n}, DType::BF16).to(cuda(0));
    ops::adamw_update(wd2, g16.to(cuda(0)), md2, vd2, s, &lowd);
    EXPECT_EQ(wd2.to(kCPU).to_floats(), w2.to_floats()) << "bf16 step " << step;
    EXPECT_EQ(lowd.to(kCPU).to_floats(), low.to_floats()) << "bf16 step " << step;
  }
}

// Mixed precision's inputs: a bf16 gradient is read as the f32 it widens to, grad_scale is one f32
// product per gradient (the bits of scaling the gradient first), and the bf16 copy of the weight
// gets the bits of w.to(BF16); the CPU kernel (blocks of widened gradients) agrees with the
// reference at sizes within one block, across blocks and across threads.
TEST(Adamw, Bf16GradientScaleAndCopyMatchTheF32Path) {
  uint64_t seed = 70;
  for (int64_t n : {1, 9, 1500, 100003}) {
    const Tensor w0 = randn({n}, seed++), m0 = ops::mul(randn({n}, seed++), 1e-3);
    const Tensor v0 = ops::abs(ops::mul(randn({n}, seed++), 1e-5));
    const Tensor g16 = ops::mul(randn({n}, seed++), 1e-2).to(DType::BF16);
    const float scale = 0.37f;
    std::vector<float> scaled = g16.to(DType::F32).to_floats();
    for (float& x : scaled) x *= scale;
    const Tensor g32 = Tensor::from_floats(scaled, {n});
    ops::AdamwArgs a{3e-3, 0.9, 0.95, 1e-8, 0.1, 1 - std::pow(0.9, 3), 1 - std::pow(0.95, 3)};
    Tensor w = w0.clone(), m = m0.clone(), v = v0.clone();
    ops::adamw_update(w, g32, m, v, a);  // f32 gradients scaled beforehand
    a.grad_scale = scale;
    for (int k = 0; k < 2; ++k) {
      Tensor wk = w0.clone(), mk = m0.clone(), vk = v0.clone();
      Tensor low = Tensor::zeros({n}, DType::BF16);
      if (k == 0) {
        ops::ReferenceMode ref;
        ops::adamw_update(wk, g16, mk, vk, a, &low);
      } else {
        ops::adamw_update(wk, g16, mk, vk, a, &low);
      }
      const std::string what = "n " + std::to_string(n) + (k ? " cpu" : " reference");
      EXPECT_EQ(wk.to_floats(), w.to_floats()) << what;
      EXPECT_EQ(mk.to_floats(), m.to_floats()) << what;
      EXPECT_EQ(vk.to_floats(), v.to_floats()) << what;
      EXPECT_EQ(low.to_floats(), w.to(DType::BF16).to_floats()) << what;
    }
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
  Tensor g64 = Tensor::zeros({4}, DType::F64), low32 = Tensor::zeros({4});
  Tensor low3 = Tensor::zeros({3}, DType::BF16);
  expect_error([&] { ops::adamw_update(w, g64, m, v, a); }, {"adamw_update", "f32 or bf16"});
  expect_error([&] { ops::adamw_update(w, g, m, v, a, &low32); }, {"adamw_update", "bf16 copy"});
  expect_error([&] { ops::adamw_update(w, g, m, v, a, &low3); }, {"adamw_update", "[3]"});
  ops::AdamwArgs inf = a;
  inf.grad_scale = std::numeric_limits<double>::infinity();
  expect_error([&] { ops::adamw_update(w, g, m, v, inf); }, {"adamw_update", "scale"});
}

}  // namespace
}  // namespace myriad::testing
