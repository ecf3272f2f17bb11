#include <cstring>
#include <thread>

#include "ops/shape.h"
#include "tests/ops/op_test.h"

namespace myriad::testing {
namespace {

class Matmul : public OpTest {};
MYRIAD_OP_TEST_SUITE(Matmul);

Tensor mm(const std::vector<Tensor>& x) {
  return ops::matmul(x[0], x[1]);
}

// (M, K, N): sizes of 1 in every position, odd sizes, and one large enough to span several of
// oneDNN's blocks in each dimension.
const std::vector<std::array<int64_t, 3>> kSizes = {
    {1, 1, 1},  {1, 7, 5},    {5, 1, 3},    {3, 4, 1},       {1, 64, 33},
    {7, 13, 9}, {33, 17, 65}, {64, 64, 64}, {257, 511, 129},
};

TEST_P(Matmul, TwoDMatchesReference) {
  uint64_t seed = 1;
  for (auto [m, k, n] : kSizes) {
    Tensor a = randn({m, k}, seed++).requires_grad_();
    Tensor b = randn({k, n}, seed++).requires_grad_();
    expect_matches_reference_all("matmul " + shape_str({m, k}) + " x " + shape_str({k, n}), mm,
                                 {a, b}, backend());
  }
}

TEST_P(Matmul, GradientOfOneOperandOnly) {
  Tensor a = randn({6, 9}, 5).requires_grad_(), b = randn({9, 4}, 6);
  expect_matches_reference_all("matmul, b frozen", mm, {a, b}, backend());
  expect_matches_reference_all("matmul, a frozen", mm,
                               {b.detach().clone(), randn({4, 3}, 7).requires_grad_()}, backend());
  Tensor x = randn({2, 5, 9}, 8).requires_grad_(), w = randn({7, 9}, 9);
  expect_matches_reference_all(
      "linear, weight frozen", [](const std::vector<Tensor>& v) { return ops::linear(v[0], v[1]); },
      {x, w}, backend());
}

TEST_P(Matmul, BatchBroadcastMatchesReference) {
  const std::vector<std::pair<Shape, Shape>> cases = {
      {{2, 3, 5, 7}, {7, 4}},     // shared weight: folded into one GEMM
      {{5, 7}, {3, 7, 4}},        // shared left operand
      {{4, 1, 5, 7}, {3, 7, 6}},  // broadcast in two directions
      {{2, 1, 5, 7}, {1, 3, 7, 6}}, {{3, 5, 7}, {3, 7, 6}}, {{2, 3, 1, 9}, {2, 3, 9, 1}},
  };
  uint64_t seed = 10;
  for (auto [sa, sb] : cases) {
    Tensor a = randn(sa, seed++).requires_grad_();
    Tensor b = randn(sb, seed++).requires_grad_();
    expect_matches_reference_all("matmul " + shape_str(sa) + " x " + shape_str(sb), mm, {a, b},
                                 backend());
  }
}

TEST_P(Matmul, TransposedAndStridedViews) {
  Tensor a = randn({37, 21}, 20).requires_grad_();  // used as a^T: [21, 37]
  Tensor b = randn({45, 37}, 21).requires_grad_();  // used as b^T: [37, 45]
  auto t = [](const Tensor& x) { return ops::transpose(x, -1, -2); };
  expect_matches_reference_all(
      "a^T b^T", [&](const std::vector<Tensor>& x) { return ops::matmul(t(x[0]), t(x[1])); },
      {a, b}, backend());
  Tensor c = randn({37, 45}, 22).requires_grad_();
  expect_matches_reference_all(
      "a^T c", [&](const std::vector<Tensor>& x) { return ops::matmul(t(x[0]), x[1]); }, {a, c},
      backend());
  // Column slices: row strides wider than the rows (a padded leading dimension).
  Tensor d = randn({21, 50}, 23).requires_grad_();
  expect_matches_reference_all(
      "sliced",
      [](const std::vector<Tensor>& x) {
        return ops::matmul(ops::slice(x[0], 1, 3, 40), ops::slice(x[1], 1, 2, 30));
      },
      {d, c}, backend());
  // Batched transposes, and a batch dimension that is not the outermost in memory.
  Tensor e = randn({3, 9, 6}, 24).requires_grad_();
  Tensor f = randn({3, 11, 9}, 25).requires_grad_();
  expect_matches_reference_all(
      "batched transposes",
      [&](const std::vector<Tensor>& x) { return ops::matmul(t(x[0]), t(x[1])); }, {e, f},
      backend());
  Tensor h = randn({6, 3, 9}, 26).requires_grad_();  // [M, B, K] viewed as [B, M, K]
  expect_matches_reference_all(
      "permuted batch",
      [](const std::vector<Tensor>& x) {
        return ops::matmul(ops::permute(x[0], {1, 0, 2}), ops::transpose(x[1], 1, 2));
      },
      {h, f}, backend());
  // Neither matrix stride is 1 ([5, 4, 6] with strides (1, 30, 5)): the operand is copied.
  Tensor g = randn({4, 6, 5}, 27).requires_grad_();
  Tensor w = randn({6, 3}, 28).requires_grad_();
  expect_matches_reference_all(
      "no unit stride",
      [](const std::vector<Tensor>& x) {
        return ops::matmul(ops::permute(x[0], {2, 0, 1}), x[1]);
      },
      {g, w}, backend());
}

TEST_P(Matmul, BmmMatchesReference) {
  Tensor a = randn({4, 17, 23}, 30).requires_grad_();
  Tensor b = randn({4, 23, 19}, 31).requires_grad_();
  expect_matches_reference_all(
      "bmm", [](const std::vector<Tensor>& x) { return ops::bmm(x[0], x[1]); }, {a, b}, backend());
}

TEST_P(Matmul, LinearMatchesReference) {
  Tensor w = randn({24, 40}, 40, 0.2).requires_grad_();
  Tensor bias = randn({24}, 41).requires_grad_();
  for (Shape sx : {Shape{40}, Shape{1, 40}, Shape{13, 40}, Shape{2, 7, 40}}) {
    Tensor x = randn(sx, 42).requires_grad_();
    expect_matches_reference_all(
        "linear " + shape_str(sx),
        [](const std::vector<Tensor>& v) { return ops::linear(v[0], v[1], v[2]); }, {x, w, bias},
        backend());
    expect_matches_reference_all(
        "linear no bias " + shape_str(sx),
        [](const std::vector<Tensor>& v) { return ops::linear(v[0], v[1]); }, {x, w}, backend());
  }
  Tensor xt = randn({40, 6}, 43).requires_grad_();  // a non-contiguous input
  expect_matches_reference_all(
      "linear of a transposed input",
      [](const std::vector<Tensor>& v) {
        return ops::linear(ops::transpose(v[0], 0, 1), v[1], v[2]);
      },
      {xt, w, bias}, backend());
}

// Ragged groups as a MoE makes them: empty experts, one token, a run of 16 (the last few-row
// product) and runs beyond (oneDNN on the CPU), in one call.
Tensor grouped(const std::vector<Tensor>& v, const std::vector<int64_t>& offsets) {
  return ops::grouped_linear(v[0], offsets, std::vector<Tensor>(v.begin() + 1, v.end()));
}

TEST_P(Matmul, GroupedLinearMatchesReference) {
  const std::vector<int64_t> counts = {0, 1, 3, 0, 16, 17, 40, 2};
  std::vector<int64_t> offsets = {0};
  for (int64_t c : counts) offsets.push_back(offsets.back() + c);
  for (auto [in, out] : {std::pair<int64_t, int64_t>{24, 20}, {37, 5}, {1, 9}, {0, 9}}) {
    std::vector<Tensor> v = {randn({offsets.back(), in}, 90 + in).requires_grad_()};
    for (size_t g = 0; g < counts.size(); ++g)
      v.push_back(randn({out, in}, 100 + g, 0.3).requires_grad_());
    expect_matches_reference_all(
        "grouped_linear in " + std::to_string(in) + " out " + std::to_string(out),
        [&](const std::vector<Tensor>& x) { return grouped(x, offsets); }, v, backend());
  }
  // One group: a plain linear.
  std::vector<Tensor> one = {randn({5, 8}, 97).requires_grad_(),
                             randn({3, 8}, 98).requires_grad_()};
  expect_matches_reference_all(
      "grouped_linear one group",
      [](const std::vector<Tensor>& x) {
        return grouped(x, {0, 5});
      },
      one, backend());
}

// Two sets side by side (a MoE's gate and up projections), sets of different widths, empty
// groups included: against the reference, and equal to the sets run alone and concatenated
// (output bit for bit; gradients within rounding, since dx now sums inside the GEMMs).
TEST_P(Matmul, GroupedLinearCatEqualsItsSetsSideBySide) {
  const std::vector<int64_t> counts = {0, 1, 3, 0, 16, 17, 40, 2};
  std::vector<int64_t> offsets = {0};
  for (int64_t c : counts) offsets.push_back(offsets.back() + c);
  const size_t G = counts.size();
  const int64_t in = 24;
  std::vector<Tensor> v = {randn({offsets.back(), in}, 91).requires_grad_()};
  for (int64_t out : {20, 7})
    for (size_t g = 0; g < G; ++g)
      v.push_back(randn({out, in}, 200 + out + g, 0.3).requires_grad_());
  auto sets = [G](const std::vector<Tensor>& x) {
    std::vector<std::vector<Tensor>> w(2);
    for (size_t g = 0; g < G; ++g) w[0].push_back(x[1 + g]), w[1].push_back(x[1 + G + g]);
    return w;
  };
  expect_matches_reference_all(
      "grouped_linear_cat",
      [&](const std::vector<Tensor>& x) { return ops::grouped_linear_cat(x[0], offsets, sets(x)); },
      v, backend());
  const Device dev = device_of(backend());
  for (DType t : {DType::F32, DType::BF16}) {
    std::vector<Tensor> a, b;
    for (const Tensor& x : v) {
      a.push_back(x.detach().to(t).to(dev).requires_grad_());
      b.push_back(x.detach().to(t).to(dev).requires_grad_());
    }
    const auto wa = sets(a), wb = sets(b);
    Tensor joined = ops::grouped_linear_cat(a[0], offsets, wa);
    Tensor apart = ops::concat(
        {ops::grouped_linear(b[0], offsets, wb[0]), ops::grouped_linear(b[0], offsets, wb[1])}, -1);
    EXPECT_EQ(joined.to_doubles(), apart.to_doubles()) << dtype_name(t);
    const Tensor seed = randn(joined.shape(), 5).to(t).to(dev);
    joined.backward(seed);
    apart.backward(seed);
    const Tolerance tol = t == DType::F32 ? Tolerance{} : bf16_tolerance();
    for (size_t i = 0; i < a.size(); ++i)
      expect_close(cat("grad ", i, " ", dtype_name(t)), a[i].grad().to_doubles(),
                   b[i].grad().to_doubles(), tol);
  }
}

TEST_P(Matmul, EmptyInnerDimensionGivesZeros) {
  Device dev = device_of(backend());
  for (DType t : {DType::F32, DType::BF16}) {
    Tensor a = Tensor::empty({3, 0}, t, dev), b = Tensor::empty({0, 4}, t, dev);
    Tensor c = ops::matmul(a, b);
    ASSERT_EQ(c.shape(), (Shape{3, 4}));
    for (double v : c.to_doubles()) EXPECT_EQ(v, 0.0);
    Tensor bias = Tensor::full({4}, 2.0, t, dev);
    for (double v : ops::linear(a, Tensor::empty({4, 0}, t, dev), bias).to_doubles())
      EXPECT_EQ(v, 2.0);
    EXPECT_EQ(ops::matmul(Tensor::empty({0, 5}, t, dev), Tensor::empty({5, 2}, t, dev)).shape(),
              (Shape{0, 2}));
    // Batched against a shared weight, with gradients (the backward folds the batch into rows).
    Tensor x = Tensor::empty({2, 3, 0}, t, dev).requires_grad_();
    Tensor w = Tensor::empty({0, 4}, t, dev).requires_grad_();
    Tensor y = ops::matmul(x, w);
    y.backward(Tensor::ones(y.shape(), t, dev));
    EXPECT_EQ(w.grad().shape(), (Shape{0, 4}));
    EXPECT_EQ(x.grad().shape(), (Shape{2, 3, 0}));
  }
}

// The kernel entry point with alpha, beta, transposes, padded leading dimensions and batch
// strides (0 = broadcast), against the reference kernel on the same values.
struct GemmCase {
  int64_t batch, m, n, k;
  bool ta, tb;
  int64_t pad;  // added to every leading dimension and batch stride
  bool bcast_a, bcast_b;
  float alpha, beta;
};

TEST_P(Matmul, GemmEntryPointMatchesReference) {
  const std::vector<GemmCase> cases = {
      {1, 5, 7, 3, false, false, 0, false, false, 1.0f, 0.0f},
      {1, 33, 17, 20, true, false, 3, false, false, 0.5f, 2.0f},
      {3, 4, 6, 5, false, true, 0, true, false, -1.0f, 1.0f},
      {3, 9, 8, 7, true, true, 2, false, true, 1.0f, 0.5f},
      {2, 16, 24, 40, false, false, 5, false, false, 1.5f, 0.0f},
      {4, 6, 5, 3, false, false, 0, false, true, 1.0f, 0.0f},  // foldable into one GEMM
      // A few rows of A (one row with B stored [n, k] takes the CPU's streaming GEMV, the rest
      // oneDNN): odd sizes, ld > k, alpha / beta, batches, broadcast B.
      {1, 1, 1, 1, false, true, 0, false, false, 1.0f, 0.0f},
      {1, 1, 300, 37, false, true, 3, false, false, 1.0f, 0.0f},
      {1, 4, 7, 129, false, true, 0, false, false, 0.5f, 1.0f},
      {1, 3, 1030, 70, false, false, 2, false, false, 1.0f, 0.0f},
      {1, 2, 9, 5, false, false, 0, false, false, -1.0f, 0.5f},
      {3, 1, 66, 40, false, true, 1, false, true, 1.0f, 0.0f},
      {2, 4, 300, 9, false, false, 0, false, true, 2.0f, 1.0f},
  };
  Device dev = device_of(backend());
  uint64_t seed = 50;
  for (DType t : {DType::F32, DType::BF16}) {
    for (const GemmCase& c : cases) {
      SCOPED_TRACE(::testing::Message()
                   << dtype_name(t) << " batch " << c.batch << " m " << c.m << " n " << c.n << " k "
                   << c.k << " ta " << c.ta << " tb " << c.tb << " pad " << c.pad);
      ops::GemmArgs g;
      g.batch = c.batch, g.m = c.m, g.n = c.n, g.k = c.k, g.trans_a = c.ta, g.trans_b = c.tb;
      g.lda = (c.ta ? c.m : c.k) + c.pad;
      g.ldb = (c.tb ? c.k : c.n) + c.pad;
      g.ldc = c.n + c.pad;
      g.stride_a = c.bcast_a ? 0 : (c.ta ? c.k : c.m) * g.lda + c.pad;
      g.stride_b = c.bcast_b ? 0 : (c.tb ? c.n : c.k) * g.ldb + c.pad;
      g.stride_c = c.m * g.ldc + c.pad;
      g.alpha = c.alpha, g.beta = c.beta, g.dtype = t;
      auto extent = [&](int64_t stride, int64_t rows, int64_t ld) {
        return (c.batch - 1) * stride + rows * ld;
      };
      Tensor a = randn({extent(g.stride_a, c.ta ? c.k : c.m, g.lda)}, seed++).to(t);
      Tensor b = randn({extent(g.stride_b, c.tb ? c.n : c.k, g.ldb)}, seed++).to(t);
      Tensor c0 = randn({extent(g.stride_c, c.m, g.ldc)}, seed++).to(t);
      auto run = [&](Device d, bool reference) {
        Tensor da = a.to(d), db = b.to(d), dc = c0.clone().to(d);
        std::optional<ops::ReferenceMode> ref;
        if (reference) ref.emplace();
        ops::GemmArgs h = g;
        h.a = da.data_ptr(), h.b = db.data_ptr(), h.c = dc.data_ptr(), h.device = d;
        ops::gemm(h);
        return dc.to_doubles();
      };
      std::vector<double> want = run(kCPU, true), got = run(dev, false);
      const double tol = t == DType::F32 ? 1e-4 : 3e-2;
      for (size_t i = 0; i < want.size(); ++i)
        ASSERT_NEAR(got[i], want[i], tol * (1 + std::abs(want[i]))) << "element " << i;
    }
  }
}

TEST(MatmulGrad, Gradcheck) {
  Tensor a = randn({3, 4}, 60).requires_grad_(), b = randn({4, 2}, 61).requires_grad_();
  expect_gradcheck("matmul", mm, {a, b});
  Tensor a3 = randn({2, 1, 3, 4}, 62).requires_grad_(), b3 = randn({3, 4, 2}, 63).requires_grad_();
  expect_gradcheck("matmul broadcast", mm, {a3, b3});
  Tensor ab = randn({2, 3, 4}, 64).requires_grad_();
  expect_gradcheck("matmul shared weight", mm, {ab, b});
  expect_gradcheck(
      "matmul transposed",
      [](const std::vector<Tensor>& x) { return ops::matmul(ops::transpose(x[0], 0, 1), x[1]); },
      {randn({4, 3}, 65).requires_grad_(), b});
  Tensor c = randn({2, 4, 3}, 66).requires_grad_();
  expect_gradcheck("bmm", [](const std::vector<Tensor>& x) { return ops::bmm(x[0], x[1]); },
                   {ab, c});
  Tensor x = randn({2, 3, 4}, 67).requires_grad_(), w = randn({5, 4}, 68).requires_grad_();
  Tensor bias = randn({5}, 69).requires_grad_();
  expect_gradcheck("linear",
                   [](const std::vector<Tensor>& v) { return ops::linear(v[0], v[1], v[2]); },
                   {x, w, bias});
  expect_gradcheck("linear no bias",
                   [](const std::vector<Tensor>& v) { return ops::linear(v[0], v[1]); }, {x, w});
}

TEST(MatmulGrad, GroupedLinearGradcheck) {
  std::vector<Tensor> v = {randn({6, 4}, 70).requires_grad_()};
  for (uint64_t g = 0; g < 4; ++g) v.push_back(randn({3, 4}, 71 + g).requires_grad_());
  expect_gradcheck(
      "grouped_linear",
      [](const std::vector<Tensor>& x) {
        return grouped(x, {0, 2, 2, 5, 6});
      },
      v);
}

// Each group gets the bits a group of its rows alone gives (the MoE's outputs do not depend on
// how its experts are scheduled), in f32 and bf16, and a linear's values: not its bits, as the CPU
// runs a group's larger products through primitives of any size (backend/cpu/gemm.cpp).
bool same_bits(const Tensor& a, const Tensor& b) {
  const Tensor ca = ops::contiguous(a), cb = ops::contiguous(b);
  return ca.shape() == cb.shape() && ca.dtype() == cb.dtype() &&
         std::memcmp(ca.data_ptr(), cb.data_ptr(), ca.numel() * dtype_size(ca.dtype())) == 0;
}

// max |a - b| / max |b|
double max_rel_err(const Tensor& a, const Tensor& b) {
  const Tensor fa = ops::contiguous(a).to(DType::F32), fb = ops::contiguous(b).to(DType::F32);
  const float *pa = fa.data<float>(), *pb = fb.data<float>();
  double diff = 0, ref = 0;
  for (int64_t i = 0; i < fa.numel(); ++i) {
    diff = std::max(diff, std::abs(static_cast<double>(pa[i]) - pb[i]));
    ref = std::max(ref, std::abs(static_cast<double>(pb[i])));
  }
  return diff / std::max(ref, 1e-30);
}

TEST(MatmulCpu, GroupedLinearEqualsLinearPerGroup) {
  for (DType t : {DType::F32, DType::BF16}) {
    // 1, 0, 4 and 16 rows (one region of few-row products), 39, 24, 33 and 17 (oneDNN, dealt
    // to the threads); backward, the input's and the weights' products likewise.
    const std::vector<int64_t> offsets = {0, 1, 1, 5, 21, 60, 84, 117, 134};
    const size_t groups = offsets.size() - 1;
    Tensor x = randn({134, 33}, 80).to(t).requires_grad_();
    Tensor gy = randn({134, 19}, 79).to(t);
    std::vector<Tensor> w;
    for (uint64_t g = 0; g < groups; ++g)
      w.push_back(randn({19, 33}, 81 + g).to(t).requires_grad_());
    const Tensor y = ops::grouped_linear(x, offsets, w);
    y.backward(gy);
    const Tensor gx = x.grad();
    std::vector<Tensor> gw;
    for (Tensor& wg : w) gw.push_back(wg.grad()), wg.zero_grad();
    const double tol = t == DType::F32 ? 1e-5 : 2e-2;
    for (size_t g = 0; g < groups; ++g) {
      const int64_t a = offsets[g], b = offsets[g + 1];
      if (a == b) continue;
      Tensor xg = ops::slice(x, 0, a, b).detach().requires_grad_();
      const Tensor alone = ops::grouped_linear(xg, {0, b - a}, {w[g]});
      alone.backward(ops::slice(gy, 0, a, b));
      EXPECT_TRUE(same_bits(alone, ops::slice(y, 0, a, b))) << dtype_name(t) << " group " << g;
      EXPECT_TRUE(same_bits(xg.grad(), ops::slice(gx, 0, a, b))) << dtype_name(t) << " dx " << g;
      EXPECT_TRUE(same_bits(w[g].grad(), gw[g])) << dtype_name(t) << " dw " << g;
      w[g].zero_grad();
      Tensor xl = ops::slice(x, 0, a, b).detach().requires_grad_();
      const Tensor want = ops::linear(xl, w[g]);
      want.backward(ops::slice(gy, 0, a, b));
      EXPECT_LT(max_rel_err(want, ops::slice(y, 0, a, b)), tol) << dtype_name(t) << " group " << g;
      EXPECT_LT(max_rel_err(xl.grad(), ops::slice(gx, 0, a, b)), tol)
          << dtype_name(t) << " dx " << g;
      EXPECT_LT(max_rel_err(w[g].grad(), gw[g]), tol) << dtype_name(t) << " dw " << g;
    }
  }
}

// linear_cat against a linear per weight, concatenated: the same bits at decode's few rows (one
// grouped GEMM, the kernel linear runs), equal values above them (a GEMM per product writing its
// columns), and the gradients of x (summed over the products) and of every weight.
TEST(MatmulCpu, LinearCatEqualsConcatenatedLinears) {
  for (DType t : {DType::F32, DType::BF16})
    for (int64_t rows : {0, 1, 3, 16, 17, 40}) {
      Tensor x = randn({rows, 33}, 90 + rows).to(t).requires_grad_();
      std::vector<Tensor> w;
      for (int64_t out : {19, 5, 64})
        w.push_back(randn({out, 33}, 91 + out).to(t).requires_grad_());
      const Tensor gy = randn({rows, 88}, 92).to(t);
      const Tensor y = ops::linear_cat(x, w);
      ASSERT_EQ(y.shape(), Shape({rows, 88}));
      y.backward(gy);
      const Tensor gx = x.grad();
      std::vector<Tensor> gw;
      for (Tensor& wi : w) gw.push_back(wi.grad()), wi.zero_grad();
      x.zero_grad();
      std::vector<Tensor> parts;
      for (const Tensor& wi : w) parts.push_back(ops::linear(x, wi));
      const Tensor want = ops::concat(parts, -1);
      want.backward(gy);
      const std::string at = std::string(dtype_name(t)) + " rows " + std::to_string(rows);
      if (rows == 0) {
        EXPECT_EQ(gw[0].to_floats(), std::vector<float>(19 * 33, 0.0f)) << at;
        continue;
      }
      const double tol = t == DType::F32 ? 1e-5 : 2e-2;
      if (rows <= ops::kFewRows)
        EXPECT_TRUE(same_bits(y, want)) << at;
      else
        EXPECT_LT(max_rel_err(y, want), tol) << at;
      EXPECT_LT(max_rel_err(gx, x.grad()), tol) << at << " dx";
      for (size_t i = 0; i < w.size(); ++i)
        EXPECT_LT(max_rel_err(gw[i], w[i].grad()), tol) << at << " dw " << i;
    }
}

TEST(MatmulErrors, LinearCat) {
  const Tensor x = randn({5, 4}, 1);
  expect_error([&] { ops::linear_cat(x, {}); }, {"linear_cat", "no weights"});
  expect_error(
      [&] {
        ops::linear_cat(x, {randn({3, 4}, 2), randn({3, 5}, 3)});
      },
      {"linear_cat", "input features differ", "[3, 5]"});
  expect_error(
      [&] {
        ops::linear_cat(x, {randn({3, 4}, 2).to(DType::BF16)});
      },
      {"linear_cat", "dtype"});
}

TEST(MatmulErrors, GroupedLinear) {
  Tensor x = randn({5, 4}, 1);
  std::vector<Tensor> w = {randn({3, 4}, 2), randn({3, 4}, 3)};
  expect_error([&] { ops::grouped_linear(x, {0, 5}, w); }, {"grouped_linear", "offsets", "3"});
  expect_error([&] { ops::grouped_linear(x, {0, 2, 4}, w); }, {"grouped_linear", "offsets", "5"});
  expect_error(
      [&] {
        ops::grouped_linear(x, {0, 4, 2, 5}, {w[0], w[1], w[0]});
      },
      {"grouped_linear", "decrease", "1"});
  expect_error(
      [&] {
        ops::grouped_linear(x, {0, 2, 5}, {w[0], randn({2, 4}, 4)});
      },
      {"grouped_linear", "weight 1", "[2, 4]", "[3, 4]"});
  expect_error(
      [&] {
        ops::grouped_linear(x, {0, 2, 5}, {w[0], w[1].to(DType::BF16)});
      },
      {"grouped_linear", "dtype"});
  expect_error(
      [&] {
        ops::grouped_linear(randn({5}, 5), {0, 5}, {w[0]});
      },
      {"grouped_linear", "2-d"});
  expect_error([&] { ops::grouped_linear(x, {0}, {}); }, {"grouped_linear", "no groups"});
}

TEST(MatmulErrors, ShapesRanksDtypes) {
  Tensor a = randn({2, 3}, 1), b = randn({4, 5}, 2);
  expect_error([&] { ops::matmul(a, b); }, {"matmul", "inner", "[2, 3]", "[4, 5]"});
  expect_error([&] { ops::matmul(randn({3}, 3), randn({3, 2}, 4)); }, {"matmul", "rank", "[3]"});
  expect_error(
      [&] {
        ops::matmul(randn({2, 2, 3}, 5), randn({3, 3, 4}, 6));
      },
      {"matmul", "[2]", "[3]", "broadcast"});
  expect_error(
      [&] {
        ops::matmul(a, randn({3, 2}, 7).to(DType::BF16));
      },
      {"matmul", "dtype", "bf16"});
  Tensor i = Tensor::from_ints(std::vector<int64_t>{1, 2, 3, 4}, {2, 2});
  expect_error([&] { ops::matmul(i, i); }, {"matmul", "floating"});
  expect_error([&] { ops::bmm(a, randn({3, 2}, 8)); }, {"bmm", "3-d", "[2, 3]"});
  expect_error(
      [&] {
        ops::bmm(randn({2, 2, 3}, 9), randn({3, 3, 2}, 10));
      },
      {"bmm", "batch", "[2, 2, 3]", "[3, 3, 2]"});
  expect_error(
      [&] {
        ops::bmm(randn({2, 2, 3}, 9), randn({2, 4, 2}, 10));
      },
      {"bmm", "inner", "[2, 2, 3]", "[2, 4, 2]"});
  Tensor w = randn({4, 3}, 11);
  expect_error([&] { ops::linear(randn({2, 5}, 12), w); }, {"linear", "[2, 5]", "[4, 3]"});
  expect_error([&] { ops::linear(a, w, randn({5}, 13)); }, {"linear", "bias", "[5]", "[4, 3]"});
  expect_error([&] { ops::linear(a, randn({3}, 14)); }, {"linear", "2-d"});
  expect_error([&] { ops::linear(a, w, randn({4}, 15).to(DType::BF16)); }, {"linear", "dtype"});
}

TEST(MatmulErrors, DeviceMismatch) {
  if (!cuda_available()) GTEST_SKIP() << "a device mismatch needs a CUDA device";
  Tensor a = randn({2, 3}, 1), b = randn({3, 2}, 2).to(cuda(0));
  expect_error([&] { ops::matmul(a, b); }, {"matmul", "devices", "[2, 3]", "[3, 2]"});
  expect_error([&] { ops::linear(a, randn({4, 3}, 3).to(cuda(0))); }, {"linear", "devices"});
}

// Decode batches: a row of x . W^T is the same bits whether it is computed alone or as any row
// of a product with up to 16 rows (the engine's batched decode relies on it).
TEST(MatmulCpu, LinearRowsAreBatchInvariant) {
  for (DType t : {DType::F32, DType::BF16})
    for (int64_t k : {1, 15, 16, 37, 300}) {
      Tensor w = randn({23, k}, 7 + k).to(t), x = randn({16, k}, 8 + k).to(t);
      for (int64_t m : {2, 3, 4, 5, 8, 16}) {
        Tensor all = ops::linear(ops::slice(x, 0, 0, m), w);
        for (int64_t r = 0; r < m; ++r) {
          Tensor one = ops::linear(ops::slice(x, 0, r, r + 1), w);
          ASSERT_EQ(
              std::memcmp(one.data_ptr(), ops::contiguous(ops::slice(all, 0, r, r + 1)).data_ptr(),
                          23 * dtype_size(t)),
              0)
              << dtype_name(t) << " k " << k << " m " << m << " row " << r;
        }
      }
    }
}

// Several threads creating and running primitives at once (the cache is shared).
TEST(MatmulCpu, ConcurrentCallsAgree) {
  std::vector<Tensor> as, bs, want(8), got(8);
  for (int i = 0; i < 8; ++i) {
    as.push_back(randn({20 + i, 30}, 80 + i));
    bs.push_back(randn({30, 10 + 3 * i}, 90 + i));
  }
  std::vector<std::thread> threads;
  for (int i = 0; i < 8; ++i) threads.emplace_back([&, i] { got[i] = ops::matmul(as[i], bs[i]); });
  for (auto& th : threads) th.join();
  for (int i = 0; i < 8; ++i) {
    ops::ReferenceMode ref;
    want[i] = ops::matmul(as[i], bs[i]);
    std::vector<double> g = got[i].to_doubles(), w = want[i].to_doubles();
    for (size_t j = 0; j < w.size(); ++j) ASSERT_NEAR(g[j], w[j], 1e-4 * (1 + std::abs(w[j])));
  }
}

}  // namespace
}  // namespace myriad::testing
