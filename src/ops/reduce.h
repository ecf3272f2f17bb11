// Reductions: sum, mean, max (with indices), L2 norm.
#pragma once
#include <vector>

#include "core/tensor.h"
#include "ops/dispatch.h"

namespace myriad::ops {

// Over `dims` (negative allowed; empty means all dimensions).
Tensor sum(const Tensor& x, std::vector<int64_t> dims = {}, bool keepdim = false);
Tensor mean(const Tensor& x, std::vector<int64_t> dims = {}, bool keepdim = false);
// sqrt(sum(x^2)) over dims.
Tensor norm(const Tensor& x, std::vector<int64_t> dims = {}, bool keepdim = false);

struct MaxResult {
  Tensor values;   // differentiable; the gradient goes to the first maximal element
  Tensor indices;  // i64
};
MaxResult max(const Tensor& x, int64_t dim, bool keepdim = false);

// ---- kernels ----
enum class ReduceOp : uint8_t { Sum, Max };
// x is contiguous and read as [outer, r, inner]; out is contiguous [outer, inner] in x's dtype
// (accumulated in f32 or wider). For Max, idx (i64 [outer, inner]) receives the first argmax.
using ReduceKernel = void (*)(ReduceOp op, const Tensor& x, int64_t outer, int64_t r, int64_t inner,
                              Tensor& out, Tensor* idx);
KernelTable<ReduceKernel>& reduce_kernels();

}  // namespace myriad::ops
