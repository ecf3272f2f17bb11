// Core: dtypes, devices, allocator, tensors and views, autograd mechanics, random numbers.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <iterator>
#include <limits>

#include "core/autograd.h"
#include "core/random.h"
#include "ops/ops.h"

namespace myriad {
namespace {

template <class F>
void expect_error(F&& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "expected an error mentioning " << parts.at(0);
  } catch (const Error& e) {
    for (const auto& p : parts)
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what() << " lacks " << p;
  }
}

TEST(DType, Bf16RoundsToNearestEven) {
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f)), 1.0f);
  // 1 + 2^-8 is exactly halfway between two bf16 values: ties go to the even mantissa (1.0).
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f + 0x1p-8f)), 1.0f);
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f + 0x1p-8f + 0x1p-12f)), 1.0f + 0x1p-7f);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_TRUE(std::isinf(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::infinity()))));
}

// A contiguous tensor cast between f32 and bf16 (the threaded, vectorised copy kernel) gives
// f32_to_bf16 / bf16_to_f32 of every element, NaN, infinities, ties and -0 included.
TEST(DType, TensorCastEqualsScalarBf16Conversion) {
  const int64_t n = (1 << 17) + 3;  // several threads' chunks and a ragged tail
  std::vector<float> v(static_cast<size_t>(n));
  const float special[] = {std::numeric_limits<float>::quiet_NaN(),
                           -std::numeric_limits<float>::quiet_NaN(),
                           std::numeric_limits<float>::infinity(),
                           -std::numeric_limits<float>::infinity(),
                           -0.0f,
                           1.0f + 0x1p-8f,
                           1.0f + 0x1p-7f + 0x1p-8f,
                           std::numeric_limits<float>::max(),
                           std::numeric_limits<float>::denorm_min()};
  uint32_t x = 12345;
  for (size_t i = 0; i < v.size(); ++i) {
    x = x * 1664525u + 1013904223u;
    v[i] = i % 97 < std::size(special) ? special[i % 97] : std::bit_cast<float>(x);
  }
  const Tensor f = Tensor::from_floats(v, {n});
  const Tensor h = f.to(DType::BF16);
  const Tensor back = h.to(DType::F32);
  const auto* hp = static_cast<const uint16_t*>(h.data_ptr());
  const float* bp = back.data<float>();
  for (size_t i = 0; i < v.size(); ++i) {
    ASSERT_EQ(hp[i], f32_to_bf16(v[i])) << i << " " << v[i];
    ASSERT_EQ(std::bit_cast<uint32_t>(bp[i]), std::bit_cast<uint32_t>(bf16_to_f32(hp[i]))) << i;
  }
}

// Strided copies (contiguous() of permuted views) put every element where its index says, with
// rows split over the threads so a chunk starts in the middle of the leading dimensions: rows of
// 30 strided elements, and rows of 2 contiguous elements (memcpy) whose source rows are apart.
TEST(TensorCopy, PermutedViewsCopyElementByElement) {
  std::vector<float> v(40 * 30 * 50 * 3);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i);
  const Tensor x = Tensor::from_floats(v, {40, 30, 50, 3});
  const std::vector<float> y = ops::contiguous(ops::permute(x, {2, 0, 3, 1})).to_floats();
  for (int64_t i = 0, at = 0; i < 50; ++i)
    for (int64_t j = 0; j < 40; ++j)
      for (int64_t k = 0; k < 3; ++k)
        for (int64_t l = 0; l < 30; ++l, ++at)
          ASSERT_EQ(y[at], v[((j * 30 + l) * 50 + i) * 3 + k])
              << i << " " << j << " " << k << " " << l;
  std::vector<float> w(3 * 9000 * 2);
  for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(i);
  const std::vector<float> z =
      ops::contiguous(ops::transpose(Tensor::from_floats(w, {3, 9000, 2}), 0, 1)).to_floats();
  for (int64_t i = 0, at = 0; i < 9000; ++i)
    for (int64_t j = 0; j < 3; ++j)
      for (int64_t k = 0; k < 2; ++k, ++at) ASSERT_EQ(z[at], w[(j * 9000 + i) * 2 + k]) << i;
}

TEST(DType, F16RoundTripAndLimits) {
  for (float v : {0.0f, 1.0f, -2.5f, 65504.0f, 6.103515625e-05f, 5.960464477539063e-08f, 0.1f})
    EXPECT_NEAR(f16_to_f32(f32_to_f16(v)), v, std::abs(v) * 1e-3 + 1e-8) << v;
  EXPECT_TRUE(std::isinf(f16_to_f32(f32_to_f16(70000.0f))));
  EXPECT_EQ(f16_to_f32(f32_to_f16(5.960464477539063e-08f)),
            5.960464477539063e-08f);        // min subnormal
  for (uint32_t h = 0; h < 0x7c00; h += 7)  // every finite half survives f16 -> f32 -> f16
    EXPECT_EQ(f32_to_f16(f16_to_f32(static_cast<uint16_t>(h))), h);
  EXPECT_EQ(dtype_from_name("bf16"), DType::BF16);
  expect_error([] { dtype_from_name("f8"); }, {"unknown dtype", "f8"});
}

TEST(DeviceParse, NamesAndErrors) {
  EXPECT_EQ(Device::parse("cpu"), kCPU);
  EXPECT_EQ(Device::parse("cuda:3"), cuda(3));
  EXPECT_EQ(Device::parse("cuda"), cuda(0));
  expect_error([] { Device::parse("gpu"); }, {"unknown device", "gpu"});
  expect_error([] { Device::parse("cuda:x"); }, {"cuda:x"});
}

TEST(Allocator, CpuArenaReusesBlocks) {
  Allocator& a = allocator_for(DeviceType::CPU);
  a.empty_cache();
  AllocatorStats s0 = a.stats();
  { Tensor t = Tensor::empty({1000, 1000}); }
  AllocatorStats s1 = a.stats();
  { Tensor t = Tensor::empty({1000, 1000}); }  // same size class: served from the cache
  AllocatorStats s2 = a.stats();
  EXPECT_EQ(s1.os_allocs, s0.os_allocs + 1);
  EXPECT_EQ(s2.os_allocs, s1.os_allocs);
  EXPECT_EQ(s2.in_use, s0.in_use);
  EXPECT_GE(s2.peak, s0.in_use + 4000000);
  Tensor t = Tensor::empty({3});
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data_ptr()) % 64, 0u);
}

TEST(Allocator, MissingBackendNamesDevice) {
  if (has_allocator(DeviceType::CUDA)) GTEST_SKIP() << "a CUDA device is present";
  expect_error([] { Tensor::empty({2}, DType::F32, cuda(0)); }, {"cuda", "not available"});
}

TEST(Tensor, ViewsShareStorage) {
  Tensor t = Tensor::arange(12, DType::F32);
  Tensor v = ops::reshape(t, {3, 4});
  Tensor s = ops::slice(v, 1, 1, 3);  // columns 1..2
  EXPECT_EQ(s.shape(), (Shape{3, 2}));
  EXPECT_EQ(s.contiguous().to_doubles(), (std::vector<double>{1, 2, 5, 6, 9, 10}));
  s.fill_(-1);
  EXPECT_EQ(t.to_doubles()[1], -1);  // a view writes through
  Tensor p = ops::permute(ops::reshape(Tensor::arange(24, DType::F32), {2, 3, 4}), {2, 0, 1});
  EXPECT_EQ(p.shape(), (Shape{4, 2, 3}));
  EXPECT_EQ(p.contiguous().to_doubles()[1], 4);  // p[0][0][1] = x[0][1][0]
  auto parts = ops::split(v, {1, 2}, 0);
  EXPECT_EQ(ops::concat(parts, 0).to_doubles(), v.to_doubles());
}

TEST(Tensor, StridedCopiesOfEveryDtype) {
  // contiguous() of views copies row by row: memcpy where both rows are contiguous, typed strided
  // loops of 1, 2, 4 and 8 bytes elsewhere. Values 0..23 are exact in every dtype.
  for (DType dt :
       {DType::U8, DType::BF16, DType::F16, DType::F32, DType::I32, DType::I64, DType::F64}) {
    Tensor x = ops::reshape(Tensor::arange(24, DType::F32).to(dt), {2, 3, 4});
    Tensor p = ops::permute(x, {2, 0, 1}).contiguous();  // p[i][j][k] = x[j][k][i]
    ASSERT_EQ(p.dtype(), dt);
    std::vector<double> want;
    for (int i = 0; i < 4; ++i)
      for (int j = 0; j < 2; ++j)
        for (int k = 0; k < 3; ++k) want.push_back(j * 12 + k * 4 + i);
    EXPECT_EQ(p.to_doubles(), want) << dtype_name(dt);
    // Outer strided, inner contiguous; and a single column (rows of one element).
    Tensor s = ops::slice(ops::reshape(x, {4, 6}), 1, 1, 4).contiguous();
    EXPECT_EQ(s.to_doubles(), (std::vector<double>{1, 2, 3, 7, 8, 9, 13, 14, 15, 19, 20, 21}))
        << dtype_name(dt);
    Tensor c = ops::slice(ops::reshape(x, {4, 6}), 1, 5, 6).contiguous();
    EXPECT_EQ(c.to_doubles(), (std::vector<double>{5, 11, 17, 23})) << dtype_name(dt);
  }
}

TEST(Tensor, EmptyShapesAreContiguous) {
  // A zero dimension anywhere leaves nothing to lay out; contiguous() must not copy (the fuzzer
  // found a [2, 0, 3] tensor from a safetensors file that asked for a copy kernel).
  for (const Shape& s : {Shape{2, 0, 3}, Shape{0}, Shape{0, 5}, Shape{4, 0}}) {
    Tensor t = Tensor::empty(s);
    EXPECT_TRUE(t.is_contiguous()) << shape_str(s);
    EXPECT_EQ(t.contiguous().data_ptr(), t.data_ptr());
  }
}

TEST(Tensor, CastsAndTransfers) {
  Tensor t = Tensor::from_doubles(std::vector<double>{1.5, -2.25, 3.0}, {3});
  EXPECT_EQ(t.to(DType::BF16).to(DType::F64).to_doubles(), (std::vector<double>{1.5, -2.25, 3.0}));
  EXPECT_EQ(t.to(DType::I32).to_ints(), (std::vector<int64_t>{1, -2, 3}));
  EXPECT_EQ(t.to(DType::F16).to(DType::F32).to_doubles(), t.to_doubles());
  expect_error([&] { t.item(); }, {"item", "3 elements"});
}

TEST(Tensor, BadShapesAndReleased) {
  Tensor t = Tensor::zeros({2, 3});
  expect_error([&] { ops::reshape(t, {4, 2}); }, {"reshape", "[2, 3]", "[4, 2]"});
  expect_error([&] { ops::slice(t, 2, 0, 1); }, {"slice", "dimension 2"});
  expect_error([&] { ops::concat({t, Tensor::zeros({3, 3})}, 1); }, {"concat", "[3, 3]"});
  expect_error([] { Tensor::empty({-1}); }, {"negative"});
  Tensor r = Tensor::ones({2});
  r.release();
  EXPECT_TRUE(r.is_released());
  expect_error([&] { r.to_doubles(); }, {"released"});
  expect_error([&] { ops::exp(r); }, {"exp", "released"});
}

TEST(Autograd, AccumulatesAcrossPassesAndUses) {
  Tensor x = Tensor::from_doubles(std::vector<double>{1, 2, 3}, {3}).requires_grad_();
  Tensor y = ops::sum(ops::add(ops::mul(x, x), x));  // x used three times
  y.backward();
  EXPECT_EQ(x.grad().to_doubles(), (std::vector<double>{3, 5, 7}));
  ops::sum(x).backward();  // a second pass accumulates into .grad
  EXPECT_EQ(x.grad().to_doubles(), (std::vector<double>{4, 6, 8}));
  x.zero_grad();
  EXPECT_FALSE(x.grad().defined());
}

// A leaf's first gradient is kept as it is only when nothing else holds it: a seed, and a view
// of the seed handed on by a backward, are copied, so editing .grad in place (as optimizers do)
// changes nothing else.
TEST(Autograd, FirstLeafGradientIsCopiedUnlessUnshared) {
  const std::vector<double> ones = {1, 1, 1, 1};
  Tensor a = Tensor::zeros({4}).requires_grad_();
  Tensor seed = Tensor::ones({4});
  a.backward(seed);  // a leaf: its gradient is the seed
  a.grad().fill_(5.0);
  EXPECT_EQ(seed.to_doubles(), ones);

  Tensor b = Tensor::zeros({4}).requires_grad_();
  Tensor seed2 = Tensor::ones({2, 2});
  ops::reshape(b, {2, 2}).backward(seed2);  // the backward hands on a view of the seed
  b.grad().fill_(5.0);
  EXPECT_EQ(seed2.to_doubles(), ones);

  Tensor c = Tensor::zeros({4}).requires_grad_();
  Tensor y = ops::mul(c, 3.0);
  y.backward(Tensor::ones({4}));  // a fresh gradient nobody else holds: kept as it is
  EXPECT_EQ(c.grad().to_doubles(), (std::vector<double>{3, 3, 3, 3}));
  Tensor d = Tensor::zeros({4}).requires_grad_();
  Tensor z = ops::add(d, d);  // both inputs get the seed itself
  z.backward(seed);
  d.grad().fill_(1.0);
  EXPECT_EQ(seed.to_doubles(), ones);
  EXPECT_EQ(d.grad().to_doubles(), ones);
}

TEST(Autograd, NoGradScopeRecordsNothing) {
  Tensor x = Tensor::ones({2}).requires_grad_();
  {
    NoGradGuard ng;
    Tensor y = ops::mul(x, 2.0);
    EXPECT_FALSE(y.requires_grad());
    EXPECT_EQ(y.grad_fn(), nullptr);
  }
  EXPECT_TRUE(grad_enabled());
  EXPECT_TRUE(ops::mul(x, 2.0).requires_grad());
}

TEST(Autograd, SavedTensorsReleasedUnlessRetained) {
  Tensor x = Tensor::from_doubles(std::vector<double>{0.5, 1.5}, {2}).requires_grad_();
  Tensor y = ops::sum(ops::exp(x));
  y.backward({}, /*retain_graph=*/true);
  y.backward();  // allowed: the graph was retained
  std::vector<double> g = x.grad().to_doubles();
  EXPECT_NEAR(g[0], 2 * std::exp(0.5), 1e-6);
  expect_error([&] { y.backward(); }, {"released", "sum", "retain_graph"});
}

TEST(Autograd, DetachAndErrors) {
  Tensor x = Tensor::ones({2}).requires_grad_();
  Tensor d = ops::mul(x, 3.0).detach();
  EXPECT_FALSE(d.requires_grad());
  expect_error([&] { d.backward(); }, {"backward", "does not require grad"});
  Tensor y = ops::mul(x, 3.0);
  expect_error([&] { y.backward(); }, {"seed"});
  expect_error([] { Tensor::arange(3).requires_grad_(); }, {"floating"});
}

TEST(Autograd, ShapeOpsRouteGradients) {
  Tensor x = Tensor::arange(6, DType::F64).requires_grad_();
  Tensor m = ops::reshape(x, {2, 3});
  Tensor z = ops::sum(ops::mul(
      ops::slice(m, 1, 1, 3), Tensor::from_doubles(std::vector<double>{10, 100}, {2}, DType::F64)));
  z.backward();
  EXPECT_EQ(x.grad().to_doubles(), (std::vector<double>{0, 10, 100, 0, 10, 100}));
  Tensor w = Tensor::arange(4, DType::F64).requires_grad_();
  Tensor w2 = ops::reshape(w, {2, 2});
  Tensor cat = ops::concat({ops::mul(w2, 2.0), ops::transpose(w2, 0, 1)}, 0);  // [4, 2]
  ops::sum(ops::mul(cat, cat)).backward();  // d/dw of 4w^2 + w^2 = 10w
  EXPECT_EQ(w.grad().to_doubles(), (std::vector<double>{0, 10, 20, 30}));
}

// A slice's backward hands back only its part, which the pass adds into that part of the input's
// gradient (Node::Part): the parts of a split, overlapping slices, a slice next to a whole-tensor
// use (its gradient arriving before and after the parts), and an input that is also a gradient a
// closure returned as is, which the pass must copy before adding into it, not overwrite.
TEST(Autograd, SliceGradientsAddIntoTheirPart) {
  const auto c = [](std::vector<double> v) {
    const int64_t n = static_cast<int64_t>(v.size());
    return Tensor::from_doubles(std::move(v), {n / 2, 2}, DType::F64);
  };
  Tensor leaf =
      Tensor::from_doubles(std::vector<double>{1, 2, 3, 4, 5, 6, 7, 8}, {4, 2}, DType::F64)
          .requires_grad_();
  for (int order = 0; order < 2; ++order) {
    leaf.zero_grad();
    Tensor z = ops::mul(leaf, 2.0);  // a non-leaf node: its gradient sums every use below
    auto parts = ops::split(z, {1, 3}, 0);
    Tensor whole = ops::mul(z, c({1, 1, 1, 1, 1, 1, 1, 1}));
    Tensor l1 = ops::sum(ops::mul(parts[0], c({10, 20})));
    Tensor l2 = ops::sum(ops::mul(parts[1], c({30, 40, 50, 60, 70, 80})));
    Tensor l3 = ops::sum(ops::mul(ops::slice(z, 0, 1, 3), c({100, 100, 100, 100})));  // overlaps
    Tensor l4 = ops::sum(whole);
    // The order the uses enter the loss changes the order their gradients reach z.
    Tensor loss = order == 0 ? ops::add(ops::add(l1, l2), ops::add(l3, l4))
                             : ops::add(ops::add(l4, l3), ops::add(l2, l1));
    loss.backward();
    EXPECT_EQ(leaf.grad().to_doubles(), (std::vector<double>{22, 42, 262, 282, 302, 322, 142, 162}))
        << "order " << order;
  }
  // add's backward returns its incoming gradient to both inputs; one of them then gets a part
  // added. The other input's gradient must stay the plain incoming one.
  for (int order = 0; order < 2; ++order) {
    Tensor a =
        Tensor::from_doubles(std::vector<double>{1, 1, 1, 1}, {2, 2}, DType::F64).requires_grad_();
    Tensor b =
        Tensor::from_doubles(std::vector<double>{1, 1, 1, 1}, {2, 2}, DType::F64).requires_grad_();
    Tensor za = ops::mul(a, 1.0), zb = ops::mul(b, 1.0);
    Tensor l1 = ops::sum(ops::mul(ops::add(za, zb), c({1, 2, 3, 4})));
    // zb's second use keeps its node waiting until the slice's part has reached za.
    Tensor l2 = ops::add(ops::sum(ops::mul(zb, 0.0)),
                         ops::sum(ops::mul(ops::slice(za, 0, 0, 1), c({1000, 1000}))));
    (order == 0 ? ops::add(l1, l2) : ops::add(l2, l1)).backward();
    EXPECT_EQ(a.grad().to_doubles(), (std::vector<double>{1001, 1002, 3, 4})) << "order " << order;
    EXPECT_EQ(b.grad().to_doubles(), (std::vector<double>{1, 2, 3, 4})) << "order " << order;
  }
  // A slice of a leaf: the leaf's gradient is zero outside the part.
  Tensor w =
      Tensor::from_doubles(std::vector<double>{1, 2, 3, 4}, {2, 2}, DType::F64).requires_grad_();
  ops::sum(ops::slice(w, 1, 1, 2)).backward();
  EXPECT_EQ(w.grad().to_doubles(), (std::vector<double>{0, 1, 0, 1}));
}

// recompute(): the same values and gradients (into x and into the parameters fn closes over) as
// the plain graph, no recorded history inside, and a plain call when x needs no gradient.
TEST(Autograd, RecomputeMatchesPlainGraph) {
  auto params = [] {
    Tensor w1 = Tensor::from_doubles(std::vector<double>{0.3, -0.2, 0.5, 0.1, 0.7, -0.4}, {2, 3},
                                     DType::F64)
                    .requires_grad_();
    Tensor w2 = Tensor::from_doubles(std::vector<double>{0.2, -0.6, 0.9}, {3, 1}, DType::F64)
                    .requires_grad_();
    return std::pair{w1, w2};
  };
  const Tensor x0 =
      Tensor::from_doubles(std::vector<double>{1.0, -2.0, 0.5, 0.25}, {2, 2}, DType::F64);
  std::vector<std::vector<double>> g[2];
  double out[2];
  for (int mode = 0; mode < 2; ++mode) {
    auto [w1, w2] = params();
    Tensor a = Tensor(x0.clone()).requires_grad_();
    auto fn = [&, w1 = w1, w2 = w2](const Tensor& x) {
      return ops::matmul(ops::tanh(ops::matmul(x, w1)), w2);
    };
    Tensor h = ops::mul(a, 1.5);  // x comes out of an op, as a layer input does
    Tensor y = mode ? recompute("block", fn, h) : fn(h);
    if (mode) {
      EXPECT_EQ(y.grad_fn()->name, "block");
      EXPECT_EQ(y.grad_fn()->inputs.size(), 1u);  // no edges to w1, w2: nothing inside was kept
    }
    Tensor loss = ops::sum(ops::mul(y, y));
    out[mode] = loss.to_doubles()[0];
    loss.backward();
    g[mode] = {a.grad().to_doubles(), w1.grad().to_doubles(), w2.grad().to_doubles()};
  }
  EXPECT_DOUBLE_EQ(out[0], out[1]);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(g[0][i], g[1][i]) << "gradient " << i;
  // x without a gradient: fn runs as is, and its parameters still get gradients.
  auto [w1, w2] = params();
  Tensor y = recompute(
      "block", [&](const Tensor& x) { return ops::matmul(ops::matmul(x, w1), w2); }, x0);
  ops::sum(y).backward();
  EXPECT_TRUE(w1.grad().defined());
}

TEST(Random, PhiloxKnownAnswers) {
  // Random123's published known-answer vectors for Philox-4x32-10.
  auto a = philox4x32({0, 0, 0, 0}, {0, 0});
  EXPECT_EQ(a, (std::array<uint32_t, 4>{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}));
  auto b = philox4x32({0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, {0xffffffff, 0xffffffff});
  EXPECT_EQ(b, (std::array<uint32_t, 4>{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}));
}

TEST(Random, DeterministicAndWellDistributed) {
  Generator g1(42), g2(42), g3(43);
  Tensor a = g1.normal({100000}, 0, 1), b = g2.normal({100000}, 0, 1), c = g3.normal({4}, 0, 1);
  EXPECT_EQ(a.to_doubles(), b.to_doubles());
  EXPECT_NE(a.to_doubles()[0], c.to_doubles()[0]);
  double mean = ops::mean(a).item();
  double var = ops::mean(ops::square(a)).item() - mean * mean;
  EXPECT_NEAR(mean, 0.0, 0.02);
  EXPECT_NEAR(var, 1.0, 0.02);
  Generator g4(7);
  g4.set_state(42, 0);
  std::vector<double> av = a.to_doubles();
  EXPECT_EQ(g4.normal({5}, 0, 1).to_doubles(), std::vector<double>(av.begin(), av.begin() + 5));
  std::vector<int64_t> r = Generator(1).randint({10000}, 3, 7).to_ints();
  for (int64_t v : r) EXPECT_TRUE(v >= 3 && v < 7);
}

}  // namespace
}  // namespace myriad
