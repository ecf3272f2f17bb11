// Inclusive prefix sum along one dimension (accumulated in f32 or wider).
#pragma once
#include "core/tensor.h"
#include "ops/dispatch.h"

namespace myriad::ops {

// out[..., i, ...] = sum_{j <= i} x[..., j, ...] along dim; the backward is the reverse scan.
Tensor cumsum(const Tensor& x, int64_t dim);

// ---- kernel: x, out contiguous, read as [outer, n, inner]; reverse scans from the end ----
using CumsumKernel = void (*)(const Tensor& x, int64_t outer, int64_t n, int64_t inner,
                              bool reverse, Tensor& out);
KernelTable<CumsumKernel>& cumsum_kernels();

}  // namespace myriad::ops
