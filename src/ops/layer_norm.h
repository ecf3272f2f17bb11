// LayerNorm over the last dimension (torch.nn.LayerNorm): y = (x - mean) / sqrt(var + eps) · weight
// + bias, with the biased variance. A composite of differentiable ops (autograd gives the
// backward); the statistics are computed in x's dtype, so use f32 or f64 for parity.
#pragma once
#include "core/tensor.h"

namespace myriad::ops {

// x [..., n]; weight and bias [n] (either may be undefined: no scale / no shift).
Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps);

}  // namespace myriad::ops
