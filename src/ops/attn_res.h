// The AttnRes scoring primitive (MODEL.md §7; golden: fla naive_attnres with scale 1): a softmax
// over depth sources, per token, with a learned pseudo-query:
//   k_i = v_i / sqrt(mean(v_i²) + eps)        (RMSNorm without weight, over the last dim d)
//   a_i = Σ_d k_i[d]·gamma[d]·w[d]
//   out = Σ_i softmax_i(a)·v_i                (all f32, cast back to the sources' dtype)
#pragma once
#include <vector>

#include "core/tensor.h"
#include "ops/dispatch.h"

namespace myriad::ops {

// sources: one or more tensors of one shape [..., d] and dtype; w: the *_res_proj weight, [d] or
// [1, d]; gamma: the *_res_norm weight [d]. Differentiable in every source, w and gamma.
Tensor attn_res(const std::vector<Tensor>& sources, const Tensor& w, const Tensor& gamma,
                double eps = 1e-6);

// ---- kernels: sources, out, gy and gsources are contiguous [N, d]; w and gamma contiguous [d];
// all share one dtype ----
using AttnResKernel = void (*)(const std::vector<Tensor>& sources, const Tensor& w,
                               const Tensor& gamma, double eps, Tensor& out);
// Recomputes the scores; overwrites every gsources[i], gw and ggamma.
using AttnResBackwardKernel = void (*)(const std::vector<Tensor>& sources, const Tensor& w,
                                       const Tensor& gamma, double eps, const Tensor& gy,
                                       std::vector<Tensor>& gsources, Tensor& gw, Tensor& ggamma);
KernelTable<AttnResKernel>& attn_res_kernels();
KernelTable<AttnResBackwardKernel>& attn_res_backward_kernels();

}  // namespace myriad::ops
