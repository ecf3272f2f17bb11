// Fused RMSNorm over the last dimension (MODEL.md §2): x̂ = x / sqrt(mean(x²) + eps) in f32,
// cast back to x's dtype, times weight.
#pragma once
#include "core/tensor.h"
#include "ops/dispatch.h"

namespace myriad::ops {

// x [..., n], weight [n] (or undefined for no weight).
Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps);
// x / sqrt(sum(x²) + eps) over the last dimension, computed in f32 (f64 for f64), returned in
// x's dtype: fla's l2norm of KDA's q and k, RMSNorm's kernels with the sum of squares in place
// of their mean and no weight.
Tensor l2norm(const Tensor& x, double eps = 1e-6);

// What rstd normalises by: RMSNorm's mean of squares, or l2norm's sum of squares.
enum class NormOf : uint8_t { MeanSquare, SumSquare };

// ---- kernels: x, y contiguous [rows, n]; weight [n] or undefined; rstd [rows] (f32, f64 for
// f64 x) = 1 / sqrt(mean(x²) + eps) (or sum(x²) for SumSquare), saved for the backward ----
using RmsNormKernel = void (*)(const Tensor& x, const Tensor& weight, double eps, NormOf of,
                               Tensor& y, Tensor& rstd);
// gx = rstd * (g - x̂ * mean(g * x̂)) (the sum for SumSquare) with g = gy * weight (the cast of x̂
// passes the gradient straight through); gw = sum over rows of gy * cast(x̂). gw is undefined
// when weight is, and is overwritten (not accumulated).
using RmsNormBackwardKernel = void (*)(const Tensor& x, const Tensor& weight, const Tensor& rstd,
                                       NormOf of, const Tensor& gy, Tensor& gx, Tensor& gw);
KernelTable<RmsNormKernel>& rms_norm_kernels();
KernelTable<RmsNormBackwardKernel>& rms_norm_backward_kernels();

}  // namespace myriad::ops
