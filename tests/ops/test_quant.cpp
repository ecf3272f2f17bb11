// Weight-only int8 and int4 (ops/quant.h): quantization by hand and its error bound, the
// streamed few-row product against the f32 product on the dequantized weight (bit for bit, both
// vector widths), against the reference, the grouped and concatenated forms, and the errors; int8
// activations against their reference (bit for bit, every kernel), by hand and within their
// error bound.
#include <cmath>
#include <optional>

#include "backend/cpu/cpu.h"
#include "ops/matmul.h"
#include "ops/quant.h"
#include "ops/shape.h"
#include "tests/ops/op_test.h"

namespace myriad::testing {
namespace {

std::vector<int> codes(const ops::QuantWeight& w) {
  std::vector<int> r;
  const auto* q = w.q.data<uint8_t>();
  for (int64_t i = 0; i < w.q.numel(); ++i) r.push_back(static_cast<int8_t>(q[i]));
  return r;
}

TEST(Quant, QuantizesAGroupByHand) {
  // Row 0: group 0 has absmax 2.54 at j = 3 (scale 0.02); group 1 is zero. Row 1: -1.27 sets the
  // scale 0.01 and 0.005 (half a step) rounds to the even code 0, 0.015 to 2.
  std::vector<double> v(2 * 64, 0.0);
  v[3] = -2.54, v[0] = 1.0, v[1] = 0.011;
  v[64] = -1.27, v[65] = 0.005, v[66] = 0.015, v[67] = 1.0;
  const Tensor w = Tensor::from_doubles(v, {2, 64}, DType::F32);
  const ops::QuantWeight q = ops::quantize_int8(w);
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

// int4 (q4_0's rule): the element of largest magnitude is code -8 exactly, so the scale carries
// its sign; codes are q + 8 in nibbles, element j low and j + 16 high in byte j of the group.
TEST(Quant, Int4QuantizesAGroupByHand) {
  std::vector<double> v(2 * 64, 0.0);
  v[0] = 0.5, v[5] = 1.6, v[17] = -0.2, v[20] = 0.1;  // group 0: extreme +1.6 -> scale -0.2
  v[64] = -0.8, v[80] = 0.7, v[81] = 0.05;            // row 1 group 0: extreme -0.8 -> scale 0.1
  const Tensor w = Tensor::from_doubles(v, {2, 64}, DType::F32);
  const ops::QuantWeight q = ops::quantize(w, 4);
  ASSERT_EQ(q.q.shape(), (Shape{2, 32}));
  EXPECT_EQ(q.in(), 64);
  EXPECT_EQ(q.bytes(), 2 * 32 + 4 * 4);
  const std::vector<float> s = q.scale.to_floats();
  EXPECT_FLOAT_EQ(s[0], -0.2f);
  EXPECT_EQ(s[1], 0.0f);
  EXPECT_FLOAT_EQ(s[2], 0.1f);
  const auto* b = q.q.data<uint8_t>();
  auto code = [&](int64_t row, int64_t j) {  // q in [-8, 7]
    const uint8_t byte = b[row * 32 + j / 32 * 16 + j % 16];
    return ((j % 32 < 16 ? byte : byte >> 4) & 15) - 8;
  };
  EXPECT_EQ(code(0, 5), -8);
  EXPECT_EQ(code(0, 0), -2);  // 0.5 / -0.2 = -2.5 -> -2 (half to even)
  EXPECT_EQ(code(0, 17), 1);  // high nibble of byte 1
  EXPECT_EQ(code(0, 20), 0);  // -0.5 -> 0
  EXPECT_EQ(code(1, 0), -8);
  EXPECT_EQ(code(1, 16), 7);  // 0.7 / 0.1 = 7
  EXPECT_EQ(code(1, 17), 0);  // 0.5 -> 0
  for (int64_t j = 32; j < 64; ++j) EXPECT_EQ(code(0, j), 0);
  // Dequantized: the extreme element exactly, the rest q · scale.
  const std::vector<float> d = ops::dequantize(q).to_floats();
  EXPECT_EQ(d[5], 1.6f);
  EXPECT_FLOAT_EQ(d[0], 0.4f);
  EXPECT_FLOAT_EQ(d[80], 0.7f);
  EXPECT_EQ(d[64], -0.8f);
}

// Within half a step, except int4's elements of the extreme's opposite sign beyond 7.5 steps,
// which clamp to code 7 (q4_0's rule): within a step there.
TEST(Quant, DequantizedWeightIsWithinHalfAStep) {
  for (int bits : {8, 4}) {
    const Tensor w = randn({37, 96}, 3, 0.05);
    const ops::QuantWeight q = ops::quantize(w, bits);
    const std::vector<float> a = w.to_floats(), b = ops::dequantize(q).to_floats(),
                             s = q.scale.to_floats();
    double worst = 0;
    int clamped = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      const double step = s[i / ops::kQuantGroup], err = std::fabs(a[i] - b[i]) / std::fabs(step);
      if (bits == 4 && a[i] / step > 7.5) {
        EXPECT_LE(err, 1.0 + 1e-5) << i;
        ++clamped;
        EXPECT_EQ(b[i], static_cast<float>(7 * step)) << i;
      } else {
        worst = std::max(worst, err);
      }
    }
    EXPECT_LE(worst, 0.5 + 1e-5) << bits;
    EXPECT_GT(worst, 0.3) << bits;  // the rounding did something
    if (bits == 4) {
      EXPECT_GT(clamped, 0);
    }
  }
}

// x . wd^T through ops::gemm with B stored [n, k] (trans_b): the few-row kernel for m <= 16.
// (linear passes a one-row weight's transpose as an untransposed [k, 1] B, which goes to oneDNN.)
Tensor f32_product(const Tensor& x, const Tensor& wd) {
  const int64_t m = x.size(0), n = wd.size(0), k = wd.size(1);
  if (m > ops::kQuantStreamRows) return ops::linear(x, wd);
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
TEST(Quant, StreamedProductEqualsF32OnTheDequantizedWeight) {
  uint64_t seed = 10;
  for (int bits : {8, 4})
    for (int64_t k : {32, 96, 544})
      for (int64_t n : {1, 7, 300}) {
        const ops::QuantWeight q = ops::quantize(randn({n, k}, seed++, 0.1), bits);
        const Tensor wd = ops::dequantize(q);
        for (int64_t m : {1, 2, 5, 16, 17, 40})
          for (int lanes : {8, 16}) {
            cpu::force_lanes(lanes);
            const Tensor x = randn({m, k}, seed++);
            const std::vector<float> a = ops::linear_quant(x, q).to_floats();
            const std::vector<float> b = f32_product(x, wd).to_floats();
            EXPECT_EQ(a, b) << "bits " << bits << " m " << m << " n " << n << " k " << k
                            << " lanes " << lanes;
          }
        cpu::force_lanes(0);
      }
}

TEST(Quant, MatchesTheReferenceAndKeepsLeadingDims) {
  for (int bits : {8, 4}) {
    const ops::QuantWeight q = ops::quantize(randn({50, 128}, 7, 0.1), bits);
    for (int64_t t : {1, 3, 33}) {
      const Tensor x = randn({2, t, 128}, 8 + t);
      const Tensor y = ops::linear_quant(x, q);
      ASSERT_EQ(y.shape(), (Shape{2, t, 50}));
      Tensor r;
      {
        ops::ReferenceMode ref;
        r = ops::linear_quant(x, q);
      }
      const std::vector<double> a = y.to_doubles(), b = r.to_doubles();
      for (size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(a[i], b[i], 1e-5 * (1 + std::fabs(b[i])));
    }
    // bf16 activations: widened, multiplied in f32, rounded back.
    const Tensor xb = randn({3, 128}, 9).to(DType::BF16);
    const Tensor yb = ops::linear_quant(xb, q);
    EXPECT_EQ(yb.dtype(), DType::BF16);
    EXPECT_EQ(yb.to_floats(), ops::linear_quant(xb.to(DType::F32), q).to(DType::BF16).to_floats());
  }
}

// The formats: (weight bits, activation bits).
const std::vector<std::pair<int, int>> kFormats = {{8, 0}, {4, 0}, {8, 8}};

// Every group as its own linear_quant, with empty groups and a one-token group in one call; with
// a group over the streamed row count the call runs grouped_linear on the dequantized weights
// (every group: f32 activations in every format).
TEST(Quant, GroupedEqualsOneProductPerGroup) {
  for (const auto& [bits, act] : kFormats)
    for (int64_t rows : {9, 25}) {
      std::vector<ops::QuantWeight> ws;
      for (int g = 0; g < 5; ++g)
        ws.push_back(ops::quantize(randn({24, 64}, 20 + g, 0.1), bits, act));
      std::vector<const ops::QuantWeight*> wp;
      for (const auto& w : ws) wp.push_back(&w);
      const std::vector<int64_t> offsets = {0, 0, 1, 4, 4, rows};
      const bool streamed = rows - 4 <= ops::kQuantStreamRows;
      const Tensor x = randn({rows, 64}, 30);
      const std::vector<float> y = ops::grouped_linear_quant(x, offsets, wp).to_floats();
      ASSERT_EQ(y.size(), static_cast<size_t>(rows) * 24);
      for (size_t g = 0; g < ws.size(); ++g) {
        if (offsets[g] == offsets[g + 1]) continue;
        const ops::QuantWeight one{ws[g].q, ws[g].scale, bits, streamed ? act : 0};
        const std::vector<float> e =
            ops::linear_quant(ops::slice(x, 0, offsets[g], offsets[g + 1]), one).to_floats();
        const std::vector<float> got(y.begin() + offsets[g] * 24, y.begin() + offsets[g + 1] * 24);
        if (offsets[g + 1] - offsets[g] <= ops::kQuantStreamRows) {
          EXPECT_EQ(got, e) << "group " << g << " bits " << bits << " act " << act << " rows "
                            << rows;
        } else {  // grouped_linear's oneDNN primitive of any row count: equal values, not bits
          for (size_t i = 0; i < e.size(); ++i) EXPECT_NEAR(got[i], e[i], 1e-5) << "group " << g;
        }
      }
    }
  // One format per call.
  const ops::QuantWeight a = ops::quantize(randn({8, 64}, 1), 8),
                         b = ops::quantize(randn({8, 64}, 2), 4);
  expect_error(
      [&] {
        ops::grouped_linear_quant(Tensor::zeros({2, 64}), {0, 1, 2}, {&a, &b});
      },
      {"grouped_linear_quant", "bits"});
  expect_error(
      [&] {
        ops::linear_quant_cat(Tensor::zeros({2, 64}), {&a, &b});
      },
      {"linear_quant_cat", "bits"});
  const ops::QuantWeight a8 = ops::quantize(randn({8, 64}, 1), 8, 8);
  expect_error(
      [&] {
        ops::grouped_linear_quant(Tensor::zeros({2, 64}), {0, 1, 2}, {&a, &a8});
      },
      {"grouped_linear_quant", "activations"});
  expect_error(
      [&] {
        ops::linear_quant_cat(Tensor::zeros({2, 64}), {&a8, &a});
      },
      {"linear_quant_cat", "activations"});
}

// linear_quant_cat with a leading batch dimension: streamed (up to kQuantStreamRows rows), the bits
// of linear_quant per weight, concatenated; above, the bits of linear_cat on the dequantized
// weights.
TEST(Quant, CatEqualsConcatenatedProducts) {
  for (const auto& [bits, act] : kFormats) {
    std::vector<ops::QuantWeight> ws;
    for (int64_t out : {24, 3, 40})
      ws.push_back(ops::quantize(randn({out, 64}, 40 + out, 0.1), bits, act));
    std::vector<const ops::QuantWeight*> wp;
    for (const auto& w : ws) wp.push_back(&w);
    for (int64_t rows : {1, 5, 8, 16, 20}) {  // 2, 10 and 16 rows stream; 32 and 40 do not
      const Tensor x = randn({2, rows, 64}, 50 + rows);
      std::vector<Tensor> parts, deq;
      for (const auto& w : ws) parts.push_back(ops::linear_quant(x, w));
      for (const auto& w : ws) deq.push_back(ops::dequantize(w));
      const Tensor want =
          2 * rows <= ops::kQuantStreamRows ? ops::concat(parts, -1) : ops::linear_cat(x, deq);
      const Tensor y = ops::linear_quant_cat(x, wp);
      EXPECT_EQ(y.shape(), Shape({2, rows, 67}));
      EXPECT_EQ(y.to_floats(), want.to_floats())
          << "bits " << bits << " act " << act << " rows " << rows;
    }
  }
  std::vector<ops::QuantWeight> ws;
  for (int64_t out : {24, 3}) ws.push_back(ops::quantize_int8(randn({out, 64}, 40 + out, 0.1)));
  std::vector<const ops::QuantWeight*> wp;
  for (const auto& w : ws) wp.push_back(&w);
  expect_error(
      [] {
        ops::linear_quant_cat(Tensor::zeros({2, 64}), {});
      },
      {"linear_quant_cat", "no weights"});
  expect_error(
      [&] {
        ops::linear_quant_cat(Tensor::zeros({2, 32}), wp);
      },
      {"linear_quant_cat", "input features differ"});
}

// int8 activations: the kernels (AVX512-VNNI at 16 lanes where the CPU has it, AVX2 at 8, the
// plain code in sanitizer builds) give the reference's bits at every streamed row count, ragged n,
// k with an odd group count (a half last block), a zero group (scale 0) and an outlier; more rows
// than stream run the f32 product on the dequantized weight.
TEST(Quant, Int8ActivationsMatchTheReferenceBitForBit) {
  uint64_t seed = 70;
  for (int64_t k : {32, 96, 544, 1024})
    for (int64_t n : {1, 7, 300}) {
      const ops::QuantWeight q = ops::quantize(randn({n, k}, seed++, 0.1), 8, 8);
      for (int64_t m : {1, 2, 5, 16, 17}) {
        Tensor x = randn({m, k}, seed++);
        if (k >= 96) {  // row 0: group 1 all zero, an outlier in group 2
          std::vector<float> v = x.to_floats();
          for (int64_t e = 32; e < 64; ++e) v[static_cast<size_t>(e)] = 0;
          v[70] = 40;
          x = Tensor::from_floats(v, {m, k});
        }
        if (m > ops::kQuantStreamRows) {
          const ops::QuantWeight w8{q.q, q.scale, 8, 0};
          EXPECT_EQ(ops::linear_quant(x, q).to_floats(), ops::linear_quant(x, w8).to_floats());
          continue;
        }
        Tensor want;
        {
          ops::ReferenceMode ref;
          want = ops::linear_quant(x, q);
        }
        for (int lanes : {8, 16}) {
          cpu::force_lanes(lanes);
          EXPECT_EQ(ops::linear_quant(x, q).to_floats(), want.to_floats())
              << "m " << m << " n " << n << " k " << k << " lanes " << lanes;
        }
        cpu::force_lanes(0);
      }
    }
}

// By hand: x and w exact multiples of their scales (0.01 and 0.02, one ±127 code per group), so
// the codes are exact and y is the integer dot times 2e-4; and on random inputs the error against
// the f32 product on the dequantized weight is within the activations' half steps,
// |y - x·w'| <= sum_g xs_g / 2 · sum_{e in g} |w'_e| (plus f32 rounding), and not zero.
TEST(Quant, Int8ActivationsByHandAndWithinHalfAStep) {
  std::vector<double> xv(64), wv(64);
  int64_t dot = 0;
  for (int e = 0; e < 64; ++e) {
    const int a = e % 2 ? 127 - 3 * e : -e, b = e % 3 ? 5 - e : 127 - e;
    const int ax = e == 0 || e == 32 ? 127 : a, bw = e == 0 || e == 32 ? -127 : b;
    xv[static_cast<size_t>(e)] = 0.01 * ax, wv[static_cast<size_t>(e)] = 0.02 * bw;
    dot += int64_t{ax} * bw;
  }
  const ops::QuantWeight q = ops::quantize(Tensor::from_doubles(wv, {1, 64}), 8, 8);
  const float y = ops::linear_quant(Tensor::from_doubles(xv, {1, 64}), q).to_floats()[0];
  EXPECT_NEAR(y, 2e-4 * static_cast<double>(dot), 1e-5 * std::fabs(2e-4 * dot));

  const int64_t k = 256, n = 40, m = 3;
  const ops::QuantWeight r = ops::quantize(randn({n, k}, 90, 0.1), 8, 8);
  const Tensor x = randn({m, k}, 91);
  const std::vector<float> got = ops::linear_quant(x, r).to_floats();
  const Tensor wd = ops::dequantize(r);
  const std::vector<float> exact = ops::linear(x, wd).to_floats(), xf = x.to_floats(),
                           wf = wd.to_floats();
  double worst = 0;
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double bound = 0;
      for (int64_t g = 0; g < k / 32; ++g) {
        double amax = 0, wsum = 0;
        for (int64_t e = g * 32; e < (g + 1) * 32; ++e) {
          amax = std::max(amax, std::fabs(double{xf[static_cast<size_t>(i * k + e)]}));
          wsum += std::fabs(double{wf[static_cast<size_t>(j * k + e)]});
        }
        bound += amax / 127 / 2 * wsum;
      }
      const double err = std::fabs(got[static_cast<size_t>(i * n + j)] -
                                   double{exact[static_cast<size_t>(i * n + j)]});
      EXPECT_LE(err, bound * (1 + 1e-4) + 1e-5) << i << " " << j;
      worst = std::max(worst, err / bound);
    }
  EXPECT_GT(worst, 0.01);  // the activations were quantized

  // A NaN or infinite activation makes its row's outputs NaN, as in f32 (other rows untouched).
  for (const float bad : {std::nanf(""), INFINITY}) {
    std::vector<float> v = x.to_floats();
    v[static_cast<size_t>(k + 40)] = bad;  // row 1, group 1
    for (int lanes : {0, 8, 16}) {         // (0: the reference)
      cpu::force_lanes(lanes);
      std::optional<ops::ReferenceMode> ref;
      if (lanes == 0) ref.emplace();
      const std::vector<float> y = ops::linear_quant(Tensor::from_floats(v, {m, k}), r).to_floats();
      for (int64_t j = 0; j < n; ++j) {
        EXPECT_TRUE(std::isnan(y[static_cast<size_t>(n + j)])) << bad << " " << j;
        EXPECT_EQ(y[static_cast<size_t>(j)], got[static_cast<size_t>(j)]) << bad << " " << j;
      }
    }
    cpu::force_lanes(0);
  }
}

// On a CUDA device (skipped without one): quantize lands the codes on the weight's device,
// dequantize and the streamed products (one, grouped, side by side) give the CPU's values within
// f32 rounding, and prefill-sized calls run the device GEMM on the dequantized weight.
TEST(Quant, CudaMatchesCpu) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device visible";
  auto near = [](const Tensor& got, const Tensor& want, const std::string& what) {
    const std::vector<double> a = got.to(kCPU).to_doubles(), b = want.to_doubles();
    ASSERT_EQ(a.size(), b.size()) << what;
    for (size_t i = 0; i < a.size(); ++i)
      ASSERT_NEAR(a[i], b[i], 1e-4 * (1 + std::fabs(b[i]))) << what << " element " << i;
  };
  for (int bits : {8, 4}) {
    const std::string what = std::to_string(bits) + " bits";
    const Tensor w = randn({72, 256}, 40 + bits, 0.1);
    const ops::QuantWeight qc = ops::quantize(w, bits);
    const ops::QuantWeight qd = ops::quantize(w.to(cuda(0)), bits);
    ASSERT_TRUE(qd.q.device().is_cuda() && qd.scale.device().is_cuda()) << what;
    EXPECT_EQ(qd.q.to(kCPU).to_doubles(), qc.q.to_doubles()) << what;
    EXPECT_EQ(ops::dequantize(qd).to(kCPU).to_floats(), ops::dequantize(qc).to_floats()) << what;
    for (int64_t rows : {1, 5, 16, 40}) {
      const Tensor x = randn({rows, 256}, 50 + rows);
      near(ops::linear_quant(x.to(cuda(0)), qd), ops::linear_quant(x, qc),
           what + ", rows " + std::to_string(rows));
    }
    const ops::QuantWeight q2c = ops::quantize(randn({40, 256}, 60, 0.1), bits);
    const ops::QuantWeight q2d = q2c.to(cuda(0));
    const Tensor x = randn({6, 256}, 61);
    near(ops::grouped_linear_quant(x.to(cuda(0)), {0, 2, 6}, {&qd, &q2d}),
         ops::grouped_linear_quant(x, {0, 2, 6}, {&qc, &q2c}), what + ", grouped");
    near(ops::linear_quant_cat(x.to(cuda(0)), {&qd, &q2d}), ops::linear_quant_cat(x, {&qc, &q2c}),
         what + ", cat");
  }
}

TEST(Quant, BadInputsNameTheOp) {
  expect_error([] { ops::quantize_int8(Tensor::zeros({4, 40})); }, {"quantize", "multiple of 32"});
  expect_error([] { ops::quantize_int8(Tensor::zeros({64})); }, {"quantize"});
  expect_error([] { ops::quantize(Tensor::zeros({4, 64}), 5); }, {"quantize", "8 or 4"});
  expect_error([] { ops::quantize(Tensor::zeros({4, 64}), 4, 8); }, {"quantize", "activation"});
  for (const float bad : {std::nanf(""), INFINITY}) {  // caught wherever it sits in its group
    std::vector<float> v(4 * 64, 1.0f);
    v[70] = bad;
    for (int bits : {8, 4})
      expect_error(
          [&] {
            ops::quantize(Tensor::from_floats(v, {4, 64}), bits);
          },
          {"quantize", "non-finite", "row 1"});
  }
  expect_error([] { ops::quantize(Tensor::zeros({4, 64}), 8, 4); }, {"quantize", "activation"});
  const ops::QuantWeight q = ops::quantize_int8(randn({8, 64}, 1));
  expect_error(
      [&] {
        ops::linear_quant(Tensor::zeros({2, 32}), q);
      },
      {"linear_quant", "input features differ"});
  expect_error(
      [&] {
        ops::linear_quant(Tensor::zeros({2, 64}).requires_grad_(), q);
      },
      {"linear_quant", "inference"});
  expect_error(
      [&] {
        ops::linear_quant(Tensor::zeros({2, 64}, DType::I64), q);
      },
      {"linear_quant", "f32 or bf16"});
  expect_error(
      [&] {
        ops::grouped_linear_quant(Tensor::zeros({3, 64}), {0, 2}, {&q});
      },
      {"grouped_linear_quant", "offsets"});
  ops::QuantWeight bad = q;
  bad.scale = Tensor::zeros({8, 3});
  expect_error(
      [&] {
        ops::linear_quant(Tensor::zeros({1, 64}), bad);
      },
      {"linear_quant", "not a quantized weight"});
  ops::QuantWeight half = q;  // int4 codes are half as wide
  half.bits = 4;
  expect_error(
      [&] {
        ops::linear_quant(Tensor::zeros({1, 128}), half);
      },
      {"linear_quant", "not a quantized weight"});
}

}  // namespace
}  // namespace myriad::testing
