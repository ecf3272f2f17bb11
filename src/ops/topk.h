// Top-k along the last dimension (largest first; ties keep the lower index first).
#pragma once
#include "core/tensor.h"
#include "ops/dispatch.h"

namespace myriad::ops {

struct TopK {
  Tensor values;   // [..., k], differentiable (the gradient scatters back to the picked slots)
  Tensor indices;  // [..., k], i64
};
TopK topk(const Tensor& x, int64_t k);

// ---- kernel: rows of a contiguous [rows, n] tensor ----
using TopKKernel = void (*)(const Tensor& x, int64_t k, Tensor& values, Tensor& indices);
KernelTable<TopKKernel>& topk_kernels();

}  // namespace myriad::ops
