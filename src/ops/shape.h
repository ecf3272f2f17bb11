// Shape ops: views where the layout allows (reshape of contiguous data, transpose, permute,
// slice, squeeze, unsqueeze), copies otherwise (concat, and reshape of non-contiguous data).
// All are differentiable.
#pragma once
#include <vector>

#include "core/tensor.h"
#include "ops/dispatch.h"

namespace myriad::ops {

Tensor reshape(const Tensor& x, Shape shape);  // one dimension may be -1
Tensor flatten(const Tensor& x);               // [numel]
Tensor transpose(const Tensor& x, int64_t d0, int64_t d1);
Tensor permute(const Tensor& x, const std::vector<int64_t>& order);
// Elements [start, end) along dim (negative start/end count from the end; end is clamped).
Tensor slice(const Tensor& x, int64_t dim, int64_t start, int64_t end);
Tensor squeeze(const Tensor& x, int64_t dim);
Tensor unsqueeze(const Tensor& x, int64_t dim);
Tensor concat(const std::vector<Tensor>& xs, int64_t dim);
// Pieces of the given sizes along dim (they must add up to the dimension).
std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim);
// A contiguous copy that keeps the autograd history (contiguous() itself does not record).
Tensor contiguous(const Tensor& x);

}  // namespace myriad::ops
