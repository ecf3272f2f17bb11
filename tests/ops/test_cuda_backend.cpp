// The CUDA backend's own pieces: the caching allocator, host <-> device transfers and the
// strided copy / cast / fill kernels, checked exactly against the CPU. Every test skips when no
// CUDA device is visible (the allocator is then not registered).
#include <cmath>
#include <cstring>

#include "tests/ops/op_test.h"

namespace myriad::testing {
namespace {

class CudaBackend : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!has_allocator(DeviceType::CUDA)) GTEST_SKIP() << "no CUDA device visible";
  }
};

const std::vector<DType> kAllDTypes = {DType::F32, DType::F64, DType::BF16, DType::F16,
                                       DType::I32, DType::I64, DType::U8};

// The raw bytes of a tensor, row-major, copied to the host.
std::vector<uint8_t> bytes_of(const Tensor& t) {
  Tensor h = t.to(kCPU).contiguous();
  std::vector<uint8_t> b(h.nbytes());
  if (!b.empty()) std::memcpy(b.data(), h.data_ptr(), b.size());
  return b;
}

// Same dtype, shape and values, exactly (every dtype converts to double without rounding),
// including the sign of zero; NaNs match any NaN (GPUs canonicalise NaN payloads).
void expect_same_values(const Tensor& got, const Tensor& want, const std::string& what) {
  ASSERT_EQ(got.dtype(), want.dtype()) << what;
  ASSERT_EQ(got.shape(), want.shape()) << what;
  std::vector<double> g = got.to_doubles(), w = want.to_doubles();
  size_t bad = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    bool same = (std::isnan(g[i]) && std::isnan(w[i])) ||
                (g[i] == w[i] && std::signbit(g[i]) == std::signbit(w[i]));
    if (!same && bad++ < 3)
      ADD_FAILURE() << what << ": element " << i << " is " << g[i] << ", expected " << w[i];
  }
  EXPECT_EQ(bad, 0u) << what;
}

TEST_F(CudaBackend, HostDeviceRoundTripIsExact) {
  for (DType t : kAllDTypes) {
    for (Shape s : {Shape{}, Shape{0}, Shape{1}, Shape{3, 5}, Shape{1000, 37}}) {
      Tensor h = (is_floating(t) ? randn(s, 1, 50.0) : randu(s, 1, 0.0, 250.0)).to(t);
      Tensor d = h.to(cuda(0));
      EXPECT_EQ(d.device(), cuda(0));
      EXPECT_EQ(d.dtype(), t);
      EXPECT_EQ(bytes_of(d), bytes_of(h)) << dtype_name(t) << shape_str(s);
      EXPECT_EQ(bytes_of(d.clone()), bytes_of(h)) << "device clone of " << d.desc();
    }
  }
}

TEST_F(CudaBackend, CastsMatchTheCpu) {
  // Fractions, negatives, large magnitudes; then signed zeros, infinities, NaN, exact bf16 and
  // f16 rounding ties, f16 overflow and f16 subnormals.
  const Tensor random = randn({257, 3}, 2, 50.0);
  const Tensor special = Tensor::from_doubles(
      std::vector<double>{0.0, -0.0, INFINITY, -INFINITY, NAN, 1.00390625, 1.01171875, 1.0009765625,
                          65519.0, 65520.0, 1e-7, -3.5e-8, 300.7, -2.5},
      {14});
  // Integer types only see values that fit them all (out of range casts are undefined in C++).
  const Tensor in_range = randu({129}, 3, 0.0, 250.0);
  for (const Tensor& src : {random, special, in_range}) {
    for (DType from : kAllDTypes) {
      if (!is_floating(from) && !src.same(in_range)) continue;
      Tensor a = src.to(from);
      Tensor a_d = a.to(cuda(0));
      for (DType to : kAllDTypes) {
        if (!is_floating(to) && !src.same(in_range)) continue;
        expect_same_values(a_d.to(to), a.to(to),
                           cat(dtype_name(from), " -> ", dtype_name(to), " of ", src.desc()));
      }
    }
  }
}

TEST_F(CudaBackend, StridedCopiesMatchTheCpu) {
  Tensor h = randn({4, 5, 6, 7}, 3, 10.0);
  Tensor d = h.to(cuda(0));
  // A permutation (no dimensions merge), a transposed slice with a cast, a broadcast view.
  EXPECT_EQ(bytes_of(ops::permute(d, {3, 1, 0, 2}).contiguous()),
            bytes_of(ops::permute(h, {3, 1, 0, 2}).contiguous()));
  auto sliced = [](const Tensor& t) { return ops::transpose(ops::slice(t, 2, 1, 5), 0, 3); };
  EXPECT_EQ(bytes_of(sliced(d).to(DType::BF16)), bytes_of(sliced(h).to(DType::BF16)));
  auto broadcast = [](const Tensor& t) {
    return ops::expand(ops::slice(t, 0, 0, 1), {3, 5, 6, 7});
  };
  EXPECT_EQ(bytes_of(broadcast(d).clone()), bytes_of(broadcast(h).clone()));
  // Eight dimensions that cannot merge.
  Tensor h8 = randn({2, 3, 2, 3, 2, 3, 2, 3}, 4);
  std::vector<int64_t> order = {7, 0, 6, 1, 5, 2, 4, 3};
  EXPECT_EQ(bytes_of(ops::permute(h8.to(cuda(0)), order).contiguous()),
            bytes_of(ops::permute(h8, order).contiguous()));

  // copy_ into a non-contiguous destination, converting dtype and device on the way, leaves
  // the rest of the storage alone.
  Tensor hz = Tensor::zeros({6, 8}), dz = Tensor::zeros({6, 8}, DType::F32, cuda(0));
  Tensor src = randn({3, 6}, 5).to(DType::BF16);
  auto window = [](const Tensor& t) { return ops::transpose(ops::slice(t, 1, 2, 5), 0, 1); };
  Tensor hv = window(hz), dv = window(dz);
  hv.copy_(src);
  dv.copy_(src);
  EXPECT_EQ(bytes_of(dz), bytes_of(hz));
}

TEST_F(CudaBackend, FillMatchesTheCpu) {
  for (DType t : kAllDTypes) {
    for (double v : {0.0, -0.0, 1.0, -3.75, 1.00390625, 70000.0, 200.0}) {
      if (!is_floating(t) && (v < 0 || v > 255)) continue;  // out of range: undefined
      expect_same_values(Tensor::full({5, 33}, v, t, cuda(0)), Tensor::full({5, 33}, v, t),
                         cat("full(", v, ") ", dtype_name(t)));
    }
  }
  // fill_ on a strided view writes exactly the view's elements.
  Tensor h = Tensor::zeros({7, 9}, DType::BF16), d = Tensor::zeros({7, 9}, DType::BF16, cuda(0));
  auto view = [](const Tensor& t) { return ops::transpose(ops::slice(t, 1, 3, 8), 0, 1); };
  Tensor hv = view(h), dv = view(d);
  hv.fill_(2.5);
  dv.fill_(2.5);
  EXPECT_EQ(bytes_of(d), bytes_of(h));
}

TEST_F(CudaBackend, AllocatorReusesFreedBlocks) {
  Allocator& a = allocator_for(DeviceType::CUDA);
  const Shape shape = {1 << 20};  // 4 MiB of f32: a large-block size class
  { Tensor warm = Tensor::empty(shape, DType::F32, cuda(0)); }
  AllocatorStats before = a.stats();
  EXPECT_GE(before.cached, size_t{4} << 20);
  {
    Tensor t = Tensor::empty(shape, DType::F32, cuda(0));
    AllocatorStats during = a.stats();
    EXPECT_EQ(during.allocs, before.allocs + 1);
    EXPECT_EQ(during.os_allocs, before.os_allocs) << "a cached block of that size was free";
    EXPECT_EQ(during.in_use, before.in_use + (size_t{4} << 20));
    EXPECT_EQ(during.cached, before.cached - (size_t{4} << 20));
    EXPECT_GE(during.peak, during.in_use);
  }
  AllocatorStats after = a.stats();
  EXPECT_EQ(after.in_use, before.in_use);
  EXPECT_EQ(after.cached, before.cached);
  // Small sizes round up to 512 bytes: 100 and 300 bytes share a class.
  { Tensor s = Tensor::empty({100}, DType::U8, cuda(0)); }
  AllocatorStats small = a.stats();
  { Tensor s = Tensor::empty({300}, DType::U8, cuda(0)); }
  EXPECT_EQ(a.stats().os_allocs, small.os_allocs);
  a.empty_cache();
  EXPECT_EQ(a.stats().cached, 0u);
  EXPECT_EQ(a.stats().in_use, after.in_use);
}

TEST_F(CudaBackend, ImpossibleAllocationNamesTheBytes) {
  const int64_t n = int64_t{1} << 50;  // 1 PiB
  expect_error([&] { Tensor::empty({n}, DType::U8, cuda(0)); },
               {"cuda allocator", std::to_string(n), "cuda:0"});
  // The device is still usable afterwards.
  Tensor t = Tensor::full({4}, 3.0, DType::F32, cuda(0));
  EXPECT_EQ(t.to_doubles(), (std::vector<double>{3, 3, 3, 3}));
}

TEST_F(CudaBackend, UnsupportedDTypeFailsClearly) {
  Tensor a = Tensor::ones({3}, DType::F16, cuda(0));
  expect_error([&] { ops::add(a, a); }, {"add", "f16"});
  expect_error([&] { Tensor::empty({1}, DType::F32, cuda(64)); }, {"cuda:64"});
}

}  // namespace
}  // namespace myriad::testing
