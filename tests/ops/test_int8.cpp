// Weight-only int8 (ops/int8.h): quantization by hand and its error bound, the streamed few-row
// product against the f32 product on the dequantized weight (bit for bit, both vector widths),
// against the reference, the grouped form, and the errors.
#include <cmath>

#include "backend/cpu/cpu.h"
#include "ops/int8.h"
#include "ops/matmul.h"
#include "ops/shape.h"
#include "tests/ops/op_test.h"

namespace myriad::testing {
namespace {

std::vector<int> codes(const ops::Int8Weight& w) {
  std::vector<int> r;
  const auto* q = w.q.data<uint8_t>();
  for (int64_t i = 0; i < w.q.numel(); ++i) r.push_back(static_cast<int8_t>(q[i]));
  return r;
}

TEST(Int8, QuantizesAGroupByHand) {
  // Row 0: group 0 has absmax 2.54 at j = 3 (scale 0.02); group 1 is zero. Row 1: -1.27 sets the
  // scale 0.01 and 0.005 (half a step) rounds to the even code 0, 0.015 to 2.
  std::vector<double> v(2 * 64, 0.0);
  v[3] = -2.54, v[0] = 1.0, v[1] = 0.011;
  v[64] = -1.27, v[65] = 0.005, v[66] = 0.015, v[67] = 1.0;
  const Tensor w = Tensor::from_doubles(v, {2, 64}, DType::F32);
  const ops::Int8Weight q = ops::quantize_int8(w);
  ASSERT_EQ(q.scale.shape(), (Shape{2, 2}));
  const std::vector<float> s = q.scale.to_floats();
  EXPECT_FLOAT_EQ(s[0], 2.54f / 127);
  EXPECT_EQ(s[1], 0.0f);
  EXPECT_FLOAT_EQ(s[2], 1.27f / 127);
  EXPECT_EQ(s[3], 0.0f);
  const std::vector<int> c = codes(q);
  EXPECT_EQ(c[3], -127);
  EXPECT_EQ(c[0], 50);
  EXPECT_EQ(c[1], 1);
  EXPECT_EQ(c[2], 0);
  EXPECT_EQ(c[64], -127);
  EXPECT_EQ(c[65], 0);
  EXPECT_EQ(c[66], 2);
  EXPECT_EQ(c[67], 100);
  for (int j = 32; j < 64; ++j) EXPECT_EQ(c[j], 0);
  EXPECT_EQ(q.bytes(), 2 * 64 + 4 * 4);
  // bf16 weights quantize as their f32 values.
  EXPECT_EQ(codes(ops::quantize_int8(w.to(DType::BF16))),
            codes(ops::quantize_int8(w.to(DType::BF16).to(DType::F32))));
}

TEST(Int8, DequantizedWeightIsWithinHalfAStep) {
  const Tensor w = randn({37, 96}, 3, 0.05);
  const ops::Int8Weight q = ops::quantize_int8(w);
  const std::vector<float> a = w.to_floats(), b = ops::dequantize_int8(q).to_floats(),
                           s = q.scale.to_floats();
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i)
    worst = std::max<double>(worst, std::fabs(a[i] - b[i]) / s[i / ops::kInt8Group]);
  EXPECT_LE(worst, 0.5 + 1e-5);
  EXPECT_GT(worst, 0.3);  // the rounding did something
}

// x . wd^T through ops::gemm with B stored [n, k] (trans_b): the few-row kernel for m <= 16.
// (linear passes a one-row weight's transpose as an untransposed [k, 1] B, which goes to oneDNN.)
Tensor f32_product(const Tensor& x, const Tensor& wd) {
  const int64_t m = x.size(0), n = wd.size(0), k = wd.size(1);
  if (m > ops::kInt8StreamRows) return ops::linear(x, wd);
  Tensor y = Tensor::zeros({m, n});
  ops::GemmArgs a;
  a.m = m, a.n = n, a.k = k, a.trans_b = true;
  a.a = x.data_ptr(), a.b = wd.data_ptr(), a.c = y.data_ptr();
  a.lda = k, a.ldb = k, a.ldc = n;
  ops::gemm(a);
  return y;
}

// Streamed codes give the f32 few-row kernel's bits on the dequantized weight, at every row
// count up to 16, ragged n and k, both vector widths; more rows take the dequantized GEMM.
TEST(Int8, StreamedProductEqualsF32OnTheDequantizedWeight) {
  uint64_t seed = 10;
  for (int64_t k : {32, 96, 544})
    for (int64_t n : {1, 7, 300}) {
      const ops::Int8Weight q = ops::quantize_int8(randn({n, k}, seed++, 0.1));
      const Tensor wd = ops::dequantize_int8(q);
      for (int64_t m : {1, 2, 5, 16, 17, 40})
        for (int lanes : {8, 16}) {
          cpu::force_lanes(lanes);
          const Tensor x = randn({m, k}, seed++);
          const std::vector<float> a = ops::linear_int8(x, q).to_floats();
          const std::vector<float> b = f32_product(x, wd).to_floats();
          EXPECT_EQ(a, b) << "m " << m << " n " << n << " k " << k << " lanes " << lanes;
        }
      cpu::force_lanes(0);
    }
}

TEST(Int8, MatchesTheReferenceAndKeepsLeadingDims) {
  const ops::Int8Weight q = ops::quantize_int8(randn({50, 128}, 7, 0.1));
  for (int64_t t : {1, 3, 33}) {
    const Tensor x = randn({2, t, 128}, 8 + t);
    const Tensor y = ops::linear_int8(x, q);
    ASSERT_EQ(y.shape(), (Shape{2, t, 50}));
    Tensor r;
    {
      ops::ReferenceMode ref;
      r = ops::linear_int8(x, q);
    }
    const std::vector<double> a = y.to_doubles(), b = r.to_doubles();
    for (size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(a[i], b[i], 1e-5 * (1 + std::fabs(b[i])));
  }
  // bf16 activations: widened, multiplied in f32, rounded back.
  const Tensor xb = randn({3, 128}, 9).to(DType::BF16);
  const Tensor yb = ops::linear_int8(xb, q);
  EXPECT_EQ(yb.dtype(), DType::BF16);
  EXPECT_EQ(yb.to_floats(), ops::linear_int8(xb.to(DType::F32), q).to(DType::BF16).to_floats());
}

// Every group as its own linear_int8, with empty groups, a one-token group and a group over the
// streamed row count in one call (which then runs grouped_linear on the dequantized weights).
TEST(Int8, GroupedEqualsOneProductPerGroup) {
  std::vector<ops::Int8Weight> ws;
  for (int g = 0; g < 5; ++g) ws.push_back(ops::quantize_int8(randn({24, 64}, 20 + g, 0.1)));
  std::vector<const ops::Int8Weight*> wp;
  for (const auto& w : ws) wp.push_back(&w);
  const std::vector<int64_t> offsets = {0, 0, 1, 4, 4, 25};
  const Tensor x = randn({25, 64}, 30);
  const std::vector<float> y = ops::grouped_linear_int8(x, offsets, wp).to_floats();
  ASSERT_EQ(y.size(), 25u * 24);
  for (size_t g = 0; g < ws.size(); ++g) {
    if (offsets[g] == offsets[g + 1]) continue;
    const std::vector<float> e =
        ops::linear_int8(ops::slice(x, 0, offsets[g], offsets[g + 1]), ws[g]).to_floats();
    const std::vector<float> got(y.begin() + offsets[g] * 24, y.begin() + offsets[g + 1] * 24);
    if (offsets[g + 1] - offsets[g] <= ops::kInt8StreamRows) {
      EXPECT_EQ(got, e) << "group " << g;
    } else {  // grouped_linear's oneDNN primitive of any row count: equal values, not bits
      for (size_t i = 0; i < e.size(); ++i) EXPECT_NEAR(got[i], e[i], 1e-5) << "group " << g;
    }
  }
}

// linear_int8_cat with a leading batch dimension: streamed (up to kInt8StreamRows rows), the bits
// of linear_int8 per weight, concatenated; above, the bits of linear_cat on the dequantized
// weights.
TEST(Int8, CatEqualsConcatenatedProducts) {
  std::vector<ops::Int8Weight> ws;
  for (int64_t out : {24, 3, 40}) ws.push_back(ops::quantize_int8(randn({out, 64}, 40 + out, 0.1)));
  std::vector<const ops::Int8Weight*> wp;
  for (const auto& w : ws) wp.push_back(&w);
  for (int64_t rows : {1, 5, 8, 16, 20}) {  // 2, 10 and 16 rows stream; 32 and 40 do not
    const Tensor x = randn({2, rows, 64}, 50 + rows);
    std::vector<Tensor> parts, deq;
    for (const auto& w : ws) parts.push_back(ops::linear_int8(x, w));
    for (const auto& w : ws) deq.push_back(ops::dequantize_int8(w));
    const Tensor want =
        2 * rows <= ops::kInt8StreamRows ? ops::concat(parts, -1) : ops::linear_cat(x, deq);
    const Tensor y = ops::linear_int8_cat(x, wp);
    EXPECT_EQ(y.shape(), Shape({2, rows, 67}));
    EXPECT_EQ(y.to_floats(), want.to_floats()) << "rows " << rows;
  }
  expect_error(
      [] {
        ops::linear_int8_cat(Tensor::zeros({2, 64}), {});
      },
      {"linear_int8_cat", "no weights"});
  expect_error(
      [&] {
        ops::linear_int8_cat(Tensor::zeros({2, 32}), wp);
      },
      {"linear_int8_cat", "input features differ"});
}

TEST(Int8, BadInputsNameTheOp) {
  expect_error(
      [] {
        ops::quantize_int8(Tensor::zeros({4, 40}));
      },
      {"quantize_int8", "multiple of 32"});
  expect_error([] { ops::quantize_int8(Tensor::zeros({64})); }, {"quantize_int8"});
  const ops::Int8Weight q = ops::quantize_int8(randn({8, 64}, 1));
  expect_error(
      [&] {
        ops::linear_int8(Tensor::zeros({2, 32}), q);
      },
      {"linear_int8", "input features differ"});
  expect_error(
      [&] {
        ops::linear_int8(Tensor::zeros({2, 64}).requires_grad_(), q);
      },
      {"linear_int8", "inference"});
  expect_error(
      [&] {
        ops::linear_int8(Tensor::zeros({2, 64}, DType::I64), q);
      },
      {"linear_int8", "f32 or bf16"});
  expect_error(
      [&] {
        ops::grouped_linear_int8(Tensor::zeros({3, 64}), {0, 2}, {&q});
      },
      {"grouped_linear_int8", "offsets"});
  ops::Int8Weight bad = q;
  bad.scale = Tensor::zeros({8, 3});
  expect_error(
      [&] {
        ops::linear_int8(Tensor::zeros({1, 64}), bad);
      },
      {"linear_int8", "not an int8 weight"});
}

}  // namespace
}  // namespace myriad::testing
