// CUDA AdamW step in place (TRAINING.md §1.2): one thread per element in a grid-stride loop, the
// reference's f64 arithmetic from f32 storage. Every operation is an explicit round-to-nearest
// intrinsic (__dmul_rn, __dadd_rn, ...), which nvcc never contracts into a fused multiply-add,
// so each element gets the reference's (and the CPU kernel's) bits.
#include "backend/cuda/kernels.cuh"
#include "ops/adamw.h"

namespace myriad::gpu {
namespace {

// The step's constants as the reference forms them on the host.
struct AdamwConsts {
  double b1, b2, c1, c2, bc1, bc2, eps, wd, lr;
};

__global__ void adamw_kernel(float* __restrict__ w, const float* __restrict__ g,
                             float* __restrict__ m, float* __restrict__ v, AdamwConsts a,
                             int64_t n) {
  for (int64_t i = global_thread(); i < n; i += global_threads()) {
    const double gi = g[i], wi = w[i];
    // m = b1 m + (1 - b1) g;  v = b2 v + ((1 - b2) g) g
    const double mi = __dadd_rn(__dmul_rn(a.b1, static_cast<double>(m[i])), __dmul_rn(a.c1, gi));
    const double vi =
        __dadd_rn(__dmul_rn(a.b2, static_cast<double>(v[i])), __dmul_rn(__dmul_rn(a.c2, gi), gi));
    m[i] = static_cast<float>(mi);
    v[i] = static_cast<float>(vi);
    // upd = (m / bc1) / (sqrt(v / bc2) + eps) + wd w;  w = w - lr upd
    const double den = __dadd_rn(__dsqrt_rn(__ddiv_rn(vi, a.bc2)), a.eps);
    const double upd = __dadd_rn(__ddiv_rn(__ddiv_rn(mi, a.bc1), den), __dmul_rn(a.wd, wi));
    w[i] = static_cast<float>(__dsub_rn(wi, __dmul_rn(a.lr, upd)));
  }
}

void adamw_cuda(Tensor& w, const Tensor& g, Tensor& m, Tensor& v, const ops::AdamwArgs& a) {
  MYRIAD_CHECK(w.dtype() == DType::F32, "adamw_update: the cuda kernel takes f32 tensors, got ",
               w.desc());
  const int64_t n = w.numel();
  if (n == 0) return;
  const AdamwConsts c{a.beta1, a.beta2, 1 - a.beta1,    1 - a.beta2, a.bc1,
                      a.bc2,   a.eps,   a.weight_decay, a.lr};
  launch("adamw_update", w.device().index, grid_for(n), kThreads, &adamw_kernel, mptr<float>(w),
         cptr<float>(g), mptr<float>(m), mptr<float>(v), c, n);
}

}  // namespace

MYRIAD_REGISTER_KERNEL(ops::adamw_kernels, ops::Backend::CUDA, &adamw_cuda);

}  // namespace myriad::gpu
