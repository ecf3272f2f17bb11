// Optimised CPU AdamW update: the reference's f32 arithmetic, vectorised per clone (16 floats a
// zmm register on AVX-512, whose divisions and square roots round correctly as the scalar ones
// do), threaded over element ranges. This file compiles with -ffp-contract=off, so no clone fuses
// a multiply and add that the reference rounds twice: every clone gives the reference's bits.
// A bf16 gradient is widened, and the bf16 copy of the weight written, a block at a time within
// the same pass, while the block is in cache.
#include "ops/adamw.h"
#include "backend/cpu/cpu.h"
#include "backend/cpu/rows.h"

namespace myriad::cpu {
namespace {

MYRIAD_CPU_CLONES void adamw_span(float* __restrict W, const float* __restrict G,
                                  float* __restrict M, float* __restrict V, int64_t n,
                                  const ops::AdamwConsts& a) {
  const float b1 = a.b1, b2 = a.b2, c1 = a.c1, c2 = a.c2, bc1 = a.bc1, bc2 = a.bc2;
  const float eps = a.eps, wd = a.wd, lr = a.lr, gs = a.gs;
  for (int64_t i = 0; i < n; ++i) {
    const float gi = G[i] * gs;
    const float mi = b1 * M[i] + c1 * gi;
    const float vi = b2 * V[i] + c2 * gi * gi;
    M[i] = mi;
    V[i] = vi;
    const float upd = (mi / bc1) / (__builtin_sqrtf(vi / bc2) + eps) + wd * W[i];
    W[i] = W[i] - lr * upd;
  }
}

void adamw_cpu(Tensor& w, const Tensor& g, Tensor& m, Tensor& v, const ops::AdamwArgs& args,
               Tensor* w_low) {
  const ops::AdamwConsts a = ops::adamw_consts(args);
  float *W = w.data<float>(), *M = m.data<float>(), *V = v.data<float>();
  const bool g16 = g.dtype() == DType::BF16;
  const float* G = g16 ? nullptr : g.data<float>();
  const uint16_t* G16 = g16 ? g.data<uint16_t>() : nullptr;
  uint16_t* L = w_low ? w_low->data<uint16_t>() : nullptr;
  constexpr int64_t kBlock = 1024;
  parallel_for(w.numel(), 1 << 14, [&](int64_t b, int64_t e) {
    alignas(64) float buf[kBlock];
    for (int64_t s = b; s < e; s += kBlock) {
      const int64_t k = std::min(kBlock, e - s);
      if (g16) bf16_row_to_f32(G16 + s, buf, k);
      adamw_span(W + s, g16 ? buf : G + s, M + s, V + s, k, a);
      if (L) f32_row_to_bf16(W + s, L + s, k);
    }
  });
}

}  // namespace

MYRIAD_REGISTER_KERNEL(ops::adamw_kernels, ops::Backend::CPU, &adamw_cpu);

}  // namespace myriad::cpu
