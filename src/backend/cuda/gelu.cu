// CUDA exact (erf) GELU and its backward over contiguous tensors: one thread per element in a
// grid-stride loop, f32 math for f32/bf16/f16 storage (f64 for f64), the reference's formulas:
//   y = x·Φ(x), Φ(x) = ½(1 + erf(x / √2));   gx = gy·(Φ(x) + x·φ(x)), φ(x) = e^(−x²/2) / √(2π).
#include <numbers>

#include "backend/cuda/kernels.cuh"
#include "ops/gelu.h"

namespace myriad::gpu {
namespace {

template <class A>
__device__ inline A phi_cdf(A v) {
  return A(0.5) * (A(1) + std::erf(v / static_cast<A>(std::numbers::sqrt2)));
}

template <class T>
__global__ void gelu_kernel(const T* x, T* y, int64_t n) {
  for (int64_t i = global_thread(); i < n; i += global_threads()) {
    const Acc<T> v = ld(x[i]);
    y[i] = st<T>(v * phi_cdf(v));
  }
}

template <class T>
__global__ void gelu_backward_kernel(const T* x, const T* gy, T* gx, int64_t n) {
  using A = Acc<T>;
  constexpr A inv_sqrt_2pi =
      static_cast<A>(0.5 * std::numbers::inv_sqrtpi * std::numbers::sqrt2);  // 1 / √(2π)
  for (int64_t i = global_thread(); i < n; i += global_threads()) {
    const A v = ld(x[i]);
    const A d = phi_cdf(v) + v * inv_sqrt_2pi * std::exp(A(-0.5) * v * v);
    gx[i] = st<T>(ld(gy[i]) * d);
  }
}

// dispatch_float plus f16, which the CPU backend (the reference loops) also takes.
template <class F>
void dispatch_gelu(const char* op, DType t, F&& f) {
  if (t == DType::F16) return f(Half{});
  dispatch_float(op, t, std::forward<F>(f));
}

void gelu_cuda(const Tensor& x, Tensor& y) {
  const int64_t n = x.numel();
  if (n == 0) return;
  dispatch_gelu("gelu", x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    launch("gelu", y.device().index, grid_for(n), kThreads, &gelu_kernel<T>, cptr<T>(x), mptr<T>(y),
           n);
  });
}

void gelu_backward_cuda(const Tensor& x, const Tensor& gy, Tensor& gx) {
  const int64_t n = x.numel();
  if (n == 0) return;
  dispatch_gelu("gelu_backward", x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    launch("gelu_backward", gx.device().index, grid_for(n), kThreads, &gelu_backward_kernel<T>,
           cptr<T>(x), cptr<T>(gy), mptr<T>(gx), n);
  });
}

}  // namespace

MYRIAD_REGISTER_KERNEL(ops::gelu_kernels, ops::Backend::CUDA, &gelu_cuda);
MYRIAD_REGISTER_KERNEL(ops::gelu_backward_kernels, ops::Backend::CUDA, &gelu_backward_cuda);

}  // namespace myriad::gpu
