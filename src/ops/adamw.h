// One AdamW step in place (TRAINING.md §1.2): moments, bias correction and decoupled weight decay,
// computed per element in f64 from f32 storage.
#pragma once
#include "core/tensor.h"
#include "ops/dispatch.h"

namespace myriad::ops {

// bc1 = 1 - beta1^t and bc2 = 1 - beta2^t for the step t being taken.
struct AdamwArgs {
  double lr, beta1, beta2, eps, weight_decay, bc1, bc2;
};

// For every element: m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2;
// w -= lr ((m / bc1) / (sqrt(v / bc2) + eps) + wd w). w, m, v are updated in place; all four
// tensors are contiguous f32 of one size on one device.
void adamw_update(Tensor& w, const Tensor& g, Tensor& m, Tensor& v, const AdamwArgs& a);

// ---- kernel: the checked tensors as above ----
using AdamwKernel = void (*)(Tensor& w, const Tensor& g, Tensor& m, Tensor& v, const AdamwArgs& a);
KernelTable<AdamwKernel>& adamw_kernels();

}  // namespace myriad::ops
