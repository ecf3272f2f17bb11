// GELU activations as torch.nn.functional.gelu computes them.
#pragma once
#include "core/tensor.h"
#include "ops/dispatch.h"

namespace myriad::ops {

// approximate="tanh" (gelu_pytorch_tanh): 0.5·x·(1 + tanh(sqrt(2/π)·(x + 0.044715·x³))). A
// composite of differentiable ops.
Tensor gelu_tanh(const Tensor& x);
// The exact form (nn.GELU()): x·Φ(x) = 0.5·x·(1 + erf(x / sqrt(2))). Fused; the backward is
// gy·(Φ(x) + x·φ(x)) with φ the standard normal density.
Tensor gelu(const Tensor& x);

// ---- kernels: x, y, gy, gx contiguous, one shape and dtype ----
using GeluKernel = void (*)(const Tensor& x, Tensor& y);
using GeluBackwardKernel = void (*)(const Tensor& x, const Tensor& gy, Tensor& gx);
KernelTable<GeluKernel>& gelu_kernels();
KernelTable<GeluBackwardKernel>& gelu_backward_kernels();

}  // namespace myriad::ops
