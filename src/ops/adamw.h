// One AdamW step in place (TRAINING.md §1.2): moments, bias correction and decoupled weight decay,
// computed per element in f32 (as torch's AdamW does), with no fused multiply-adds, so every
// backend gives the reference's bits.
#pragma once
#include "core/tensor.h"
#include "ops/dispatch.h"

namespace myriad::ops {

// bc1 = 1 - beta1^t and bc2 = 1 - beta2^t for the step t being taken. grad_scale multiplies every
// gradient as it is read (global-norm clipping's factor, applied here instead of in a pass of its
// own over the gradients).
struct AdamwArgs {
  double lr, beta1, beta2, eps, weight_decay, bc1, bc2;
  double grad_scale = 1;
};

// For every element, with g = grad * gs (one f32 product; exact when gs = 1):
// m = b1 m + (1 - b1) g;  v = b2 v + ((1 - b2) g) g;
// w = w - lr ((m / bc1) / (sqrt(v / bc2) + eps) + wd w), each operation an f32 operation rounded
// on its own, left to right, with the constants of adamw_consts. w, m, v are updated in place; they
// are contiguous f32 of one size on one device, and grad is contiguous f32 or bf16 (read exactly as
// f32) of that size there. w_low, when given, receives the updated w rounded to its dtype (bf16,
// round to nearest even: the bits of w.to(BF16)), in the same pass: mixed precision's working copy.
// (Until 2026-12-05 the arithmetic was f64: its two divisions and square root per element made the
// step compute-bound, 51 ms for 30M parameters on 2 cores against 22 ms in f32, which moves the
// bytes at memory speed.)
void adamw_update(Tensor& w, const Tensor& g, Tensor& m, Tensor& v, const AdamwArgs& a,
                  Tensor* w_low = nullptr);

// The f32 constants every kernel uses: each double of AdamwArgs rounded once (c1 = 1 - beta1 and
// c2 = 1 - beta2 formed in f64 first).
struct AdamwConsts {
  float b1, b2, c1, c2, bc1, bc2, eps, wd, lr, gs;
};
AdamwConsts adamw_consts(const AdamwArgs& a);

// ---- kernel: the checked tensors as above (w_low null or a contiguous bf16 tensor) ----
using AdamwKernel = void (*)(Tensor& w, const Tensor& g, Tensor& m, Tensor& v, const AdamwArgs& a,
                             Tensor* w_low);
KernelTable<AdamwKernel>& adamw_kernels();

}  // namespace myriad::ops
