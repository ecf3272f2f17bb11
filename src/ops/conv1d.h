// Depthwise causal 1-d convolution over time, as KDA's short convolution uses it:
//   y[b, t, c] = sum_{j<K} w[c, j] * xpad[b, t + j, c],  xpad = concat(state^T, x) along time,
// i.e. y[b, t, c] = sum_j w[c, j] * x[b, t - (K-1) + j, c] where positions before 0 read from
// `state` (the previous segment's last K-1 inputs, zeros when undefined). Processing a sequence
// in segments with the carried state equals one pass.
#pragma once
#include "core/tensor.h"
#include "ops/dispatch.h"

namespace myriad::ops {

// x [B, T, C], w [C, K], state [B, C, K-1] or undefined -> y [B, T, C]. Differentiable in x, w
// and state.
Tensor conv1d_causal(const Tensor& x, const Tensor& w, const Tensor& state = {});
// The state to carry after x: the last K-1 inputs as [B, C, K-1] (reaching into `state`, or
// zeros when it is undefined, when T < K-1). Differentiable (built from shape ops).
Tensor conv1d_next_state(const Tensor& x, const Tensor& state, int64_t kernel_size);

// ---- kernels (contiguous) ----
using Conv1dKernel = void (*)(const Tensor& x, const Tensor& w, const Tensor& state, Tensor& y);
// gx, gw, gstate overwritten; gstate undefined when there is no state.
using Conv1dBackwardKernel = void (*)(const Tensor& x, const Tensor& w, const Tensor& state,
                                      const Tensor& gy, Tensor& gx, Tensor& gw, Tensor& gstate);
KernelTable<Conv1dKernel>& conv1d_kernels();
KernelTable<Conv1dBackwardKernel>& conv1d_backward_kernels();

}  // namespace myriad::ops
