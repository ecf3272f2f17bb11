// Softmax and log-softmax along one dimension, statistics in f32 or wider.
#pragma once
#include "core/tensor.h"
#include "ops/dispatch.h"

namespace myriad::ops {

// Contiguous results of x's shape and dtype (f32 math for f32/bf16). A dimension other than the
// last is moved last (a transposed copy) and back.
Tensor softmax(const Tensor& x, int64_t dim = -1);
Tensor log_softmax(const Tensor& x, int64_t dim = -1);

// ---- kernels: rows of a contiguous [rows, n] tensor (x, y, gy, gx share shape and dtype) ----
using SoftmaxKernel = void (*)(const Tensor& x, Tensor& y, bool log);
// gx = y * (gy - sum(gy * y)) for softmax; gx = gy - exp(y) * sum(gy) for log-softmax.
using SoftmaxBackwardKernel = void (*)(const Tensor& y, const Tensor& gy, Tensor& gx, bool log);
KernelTable<SoftmaxKernel>& softmax_kernels();
KernelTable<SoftmaxBackwardKernel>& softmax_backward_kernels();

}  // namespace myriad::ops
