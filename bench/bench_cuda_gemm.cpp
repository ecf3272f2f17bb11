// CUDA GEMM throughput through ops::matmul (checks, output allocation from the caching
// allocator, dispatch, the cached cuBLASLt plan), timed with CUDA events on the backend's
// stream. Reports TFLOP/s against the H200 figures of docs/ANCHORS.md: ~800 TFLOP/s measured for
// a PyTorch bf16 GEMM at 8192^3 and the 989 TFLOP/s dense bf16 peak. A few output elements are
// checked against a double-precision dot product on the host first, so a wrong operand order
// cannot pass as a fast one. Exits 0 printing "no CUDA device" when there is none.
//
//   bench_cuda_gemm [n ...]     (default 8192 4096: bf16 n^3, plus f32 at the first n)
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "core/random.h"
#include "ops/matmul.h"
#ifdef MYRIAD_HAVE_CUDA
#include "backend/cuda/cuda.h"
#endif

namespace myriad {
namespace {

#ifdef MYRIAD_HAVE_CUDA
constexpr double kAnchorTflops = 800.0, kPeakTflops = 989.0;

// Largest error of a few entries of c = a b against double-precision sums, relative to the
// entries' typical size (the root sum of squares of their terms): ~1e-3 for bf16 output, ~1 for
// a wrongly oriented product.
double sample_error(const Tensor& a, const Tensor& b, const Tensor& c) {
  const int64_t n = a.size(0);
  Tensor ha = a.to(kCPU).to(DType::F32), hb = b.to(kCPU).to(DType::F32);
  Tensor hc = c.to(kCPU).to(DType::F32);
  const float *pa = ha.data<float>(), *pb = hb.data<float>(), *pc = hc.data<float>();
  double worst = 0;
  for (auto [i, j] : std::vector<std::pair<int64_t, int64_t>>{
           {0, 0}, {1, 2}, {n - 1, 5}, {17, n - 3}, {n / 2, n / 3}}) {
    double s = 0, mag = 0;
    for (int64_t p = 0; p < n; ++p) {
      s += static_cast<double>(pa[i * n + p]) * pb[p * n + j];
      mag += std::pow(static_cast<double>(pa[i * n + p]) * pb[p * n + j], 2);
    }
    worst = std::max(worst, std::abs(pc[i * n + j] - s) / std::max(std::sqrt(mag), 1e-30));
  }
  return worst;
}

// Returns false when the result check fails.
bool run(int64_t n, DType dtype, int iters) {
  Generator gen(42);
  Tensor a = gen.normal({n, n}, 0.0, 1.0).to(dtype).to(cuda(0));
  Tensor b = gen.normal({n, n}, 0.0, 1.0).to(dtype).to(cuda(0));
  Tensor c = ops::matmul(a, b);  // warms the plan cache and the allocator
  const double err = sample_error(a, b, c);
  const double tol = dtype == DType::BF16 ? 2e-2 : 1e-4;
  for (int i = 0; i < 3; ++i) c = ops::matmul(a, b);
  cudaStream_t s = gpu::current_stream(0);
  cudaEvent_t start, stop;
  CUDA_CHECK(cudaEventCreate(&start));
  CUDA_CHECK(cudaEventCreate(&stop));
  CUDA_CHECK(cudaEventRecord(start, s));
  for (int i = 0; i < iters; ++i) c = ops::matmul(a, b);
  CUDA_CHECK(cudaEventRecord(stop, s));
  CUDA_CHECK(cudaEventSynchronize(stop));
  float ms = 0;
  CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
  CUDA_CHECK(cudaEventDestroy(start));
  CUDA_CHECK(cudaEventDestroy(stop));
  const double per = ms / iters, tflops = 2.0 * n * n * n / (per * 1e-3) / 1e12;
  std::printf("%-4s GEMM %lld^3: %8.3f ms  %7.1f TFLOP/s", dtype_name(dtype).data(),
              static_cast<long long>(n), per, tflops);
  if (dtype == DType::BF16)
    std::printf("  = %5.1f%% of the %.0f TFLOP/s anchor, %5.1f%% of the %.0f TFLOP/s peak",
                100 * tflops / kAnchorTflops, kAnchorTflops, 100 * tflops / kPeakTflops,
                kPeakTflops);
  std::printf("  (sample error %.1e, %s)\n", err, err <= tol ? "ok" : "WRONG");
  return err <= tol;
}
#endif

}  // namespace
}  // namespace myriad

int main(int argc, char** argv) {
#ifndef MYRIAD_HAVE_CUDA
  (void)argc, (void)argv;
  std::puts("no CUDA device (this build has no CUDA backend)");
  return 0;
#else
  using namespace myriad;
  if (!has_allocator(DeviceType::CUDA)) {
    std::puts("no CUDA device");
    return 0;
  }
  std::vector<int64_t> sizes;
  for (int i = 1; i < argc; ++i) sizes.push_back(std::atoll(argv[i]));
  if (sizes.empty()) sizes = {8192, 4096};
  bool ok = true;
  try {
    for (int64_t n : sizes) ok &= run(n, DType::BF16, n >= 8192 ? 50 : 200);
    ok &= run(sizes[0], DType::F32, 10);
  } catch (const Error& e) {
    std::fprintf(stderr, "bench_cuda_gemm: %s\n", e.what());
    return 1;
  }
  return ok ? 0 : 1;
#endif
}
