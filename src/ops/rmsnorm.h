// Fused RMSNorm over the last dimension (MODEL.md §2): x̂ = x / sqrt(mean(x²) + eps) in f32,
// cast back to x's dtype, times weight.
#pragma once
#include "core/tensor.h"
#include "ops/dispatch.h"

namespace myriad::ops {

// x [..., n], weight [n] (or undefined for no weight).
Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps);

// ---- kernels: x contiguous [rows, n]; rstd f32 [rows] saved for the backward ----
using RmsNormKernel = void (*)(const Tensor& x, const Tensor& weight, double eps, Tensor& y,
                               Tensor& rstd);
// gw may be undefined when weight is; gw is overwritten (not accumulated).
using RmsNormBackwardKernel = void (*)(const Tensor& x, const Tensor& weight, const Tensor& rstd,
                                       const Tensor& gy, Tensor& gx, Tensor& gw);
KernelTable<RmsNormKernel>& rms_norm_kernels();
KernelTable<RmsNormBackwardKernel>& rms_norm_backward_kernels();

}  // namespace myriad::ops
