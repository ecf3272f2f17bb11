// Optimised CPU AdamW update: the reference's f64 arithmetic, vectorised per clone (4 doubles a
// ymm register on AVX2; the optimiser's own loop had compiled to 2-lane SSE2 with a libm sqrt
// call), threaded over element ranges. This file compiles with -ffp-contract=off, so no clone
// fuses a multiply and add that the reference rounds twice: every clone gives the reference's
// bits.
#include "ops/adamw.h"
#include "backend/cpu/cpu.h"

namespace myriad::cpu {
namespace {

MYRIAD_CPU_CLONES void adamw_span(float* __restrict W, const float* __restrict G,
                                  float* __restrict M, float* __restrict V, int64_t n,
                                  const ops::AdamwArgs& a) {
  const double b1 = a.beta1, b2 = a.beta2, c1 = 1 - a.beta1, c2 = 1 - a.beta2;
  const double bc1 = a.bc1, bc2 = a.bc2, eps = a.eps, wd = a.weight_decay, lr = a.lr;
  for (int64_t i = 0; i < n; ++i) {
    const double gi = G[i];
    const double mi = b1 * M[i] + c1 * gi;
    const double vi = b2 * V[i] + c2 * gi * gi;
    M[i] = static_cast<float>(mi);
    V[i] = static_cast<float>(vi);
    const double upd = (mi / bc1) / (__builtin_sqrt(vi / bc2) + eps) + wd * W[i];
    W[i] = static_cast<float>(W[i] - lr * upd);
  }
}

void adamw_cpu(Tensor& w, const Tensor& g, Tensor& m, Tensor& v, const ops::AdamwArgs& a) {
  float *W = w.data<float>(), *M = m.data<float>(), *V = v.data<float>();
  const float* G = g.data<float>();
  parallel_for(w.numel(), 1 << 14,
               [&](int64_t b, int64_t e) { adamw_span(W + b, G + b, M + b, V + b, e - b, a); });
}

}  // namespace

MYRIAD_REGISTER_KERNEL(ops::adamw_kernels, ops::Backend::CPU, &adamw_cpu);

}  // namespace myriad::cpu
