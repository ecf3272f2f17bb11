// Top-k along the last dimension: largest first; ties keep the lower index first, and NaN ranks
// above every number (as in torch).
#pragma once
#include "core/tensor.h"
#include "ops/dispatch.h"

namespace myriad::ops {

struct TopK {
  Tensor values;   // [..., k], differentiable (the gradient scatters back to the picked slots)
  Tensor indices;  // [..., k], i64
};
// 0 <= k <= x.size(-1); x has at least one dimension.
TopK topk(const Tensor& x, int64_t k);

// ---- kernel: rows of a contiguous [rows, n] tensor ----
using TopKKernel = void (*)(const Tensor& x, int64_t k, Tensor& values, Tensor& indices);
KernelTable<TopKKernel>& topk_kernels();

// The ranking both kernels use: does (a at index ia) come before (b at index ib)?
template <class T>
inline bool topk_before(T a, int64_t ia, T b, int64_t ib) {
  bool na = a != a, nb = b != b;
  if (na || nb) return na && (!nb || ia < ib);
  return a > b || (a == b && ia < ib);
}

}  // namespace myriad::ops
