// CUDA AdamW step in place (TRAINING.md §1.2): one thread per element in a grid-stride loop, the
// reference's f32 arithmetic. Every operation is an explicit round-to-nearest intrinsic
// (__fmul_rn, __fadd_rn, __fdiv_rn, __fsqrt_rn), which nvcc never contracts into a fused
// multiply-add nor replaces with an approximation, so each element gets the reference's (and the
// CPU kernel's) bits. The gradient may be bf16 (widened exactly); the bf16 copy of the weight, when
// asked for, is written in the same pass.
#include "backend/cuda/kernels.cuh"
#include "ops/adamw.h"

namespace myriad::gpu {
namespace {

template <class G>
__global__ void adamw_kernel(float* __restrict__ w, const G* __restrict__ g, float* __restrict__ m,
                             float* __restrict__ v, uint16_t* __restrict__ low, ops::AdamwConsts a,
                             int64_t n) {
  for (int64_t i = global_thread(); i < n; i += global_threads()) {
    float gi;
    if constexpr (sizeof(G) == 2)
      gi = __fmul_rn(bf16_bits_to_float(g[i]), a.gs);
    else
      gi = __fmul_rn(g[i], a.gs);
    const float wi = w[i];
    // m = b1 m + (1 - b1) g;  v = b2 v + ((1 - b2) g) g
    const float mi = __fadd_rn(__fmul_rn(a.b1, m[i]), __fmul_rn(a.c1, gi));
    const float vi = __fadd_rn(__fmul_rn(a.b2, v[i]), __fmul_rn(__fmul_rn(a.c2, gi), gi));
    m[i] = mi;
    v[i] = vi;
    // upd = (m / bc1) / (sqrt(v / bc2) + eps) + wd w;  w = w - lr upd
    const float den = __fadd_rn(__fsqrt_rn(__fdiv_rn(vi, a.bc2)), a.eps);
    const float upd = __fadd_rn(__fdiv_rn(__fdiv_rn(mi, a.bc1), den), __fmul_rn(a.wd, wi));
    const float wn = __fsub_rn(wi, __fmul_rn(a.lr, upd));
    w[i] = wn;
    if (low) low[i] = float_to_bf16_bits(wn);
  }
}

void adamw_cuda(Tensor& w, const Tensor& g, Tensor& m, Tensor& v, const ops::AdamwArgs& a,
                Tensor* w_low) {
  MYRIAD_CHECK(w.dtype() == DType::F32, "adamw_update: the cuda kernel takes f32 tensors, got ",
               w.desc());
  const int64_t n = w.numel();
  if (n == 0) return;
  const ops::AdamwConsts c = ops::adamw_consts(a);
  uint16_t* low = w_low ? mptr<uint16_t>(*w_low) : nullptr;
  if (g.dtype() == DType::BF16)
    launch("adamw_update", w.device().index, grid_for(n), kThreads, &adamw_kernel<uint16_t>,
           mptr<float>(w), cptr<uint16_t>(g), mptr<float>(m), mptr<float>(v), low, c, n);
  else
    launch("adamw_update", w.device().index, grid_for(n), kThreads, &adamw_kernel<float>,
           mptr<float>(w), cptr<float>(g), mptr<float>(m), mptr<float>(v), low, c, n);
}

}  // namespace

MYRIAD_REGISTER_KERNEL(ops::adamw_kernels, ops::Backend::CUDA, &adamw_cuda);

}  // namespace myriad::gpu
