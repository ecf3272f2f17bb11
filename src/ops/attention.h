// Scaled dot-product attention, flash style: never builds a Tq x Tk matrix (MODEL.md §3).
//   out[b,h,i] = Σ_j softmax_j(s_ij) v[b,h/G,j],   s_ij = scale·q[b,h,i]·k[b,h/G,j] + bias_ij
// with G = Hq / Hkv query heads per kv head (MHA, GQA, MQA). Query i sits at absolute position
// q_offset + i; with `causal` it sees keys j <= q_offset + i, so a prefill that continues a cache
// (q_offset = cached length) and single-token decode (Tq = 1, q_offset = Tk - 1) are the same op.
// Optional admission-gate bias (MODEL.md §12.4): bias_ij = key_bias[b, j] when
// (q_offset + i) - j > bias_window, else 0.
// A query that sees no key (e.g. Tk = 0, or q_offset + i < 0 with `causal`) outputs 0, its
// logsumexp is -inf, and it passes no gradient. Softmax statistics are f32 (f64 for f64 inputs).
#pragma once
#include <vector>

#include "core/tensor.h"
#include "ops/dispatch.h"

namespace myriad::ops {

// q [B, Hq, Tq, Dk], k [B, Hkv, Tk, Dk], v [B, Hkv, Tk, Dv] -> [B, Hq, Tq, Dv] in q's dtype.
// k and v may be strided views (only the last dimension must be unit-stride, else it is copied):
// the absorbed MLA decode passes k = latent cache [B, 1, S, 576] and v = its first 512 channels.
// key_bias: [B, Tk] in q's dtype or f32, or undefined. Differentiable in q, k, v and key_bias.
Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, double scale, bool causal,
                 int64_t q_offset = 0, const Tensor& key_bias = {}, int64_t bias_window = 0);

// Attention over paged caches, every sequence in one call (the absorbed MLA decode, MODEL.md
// §3.3): sequence b's keys are the first lengths[b] rows of its pages, pages[b][k] a
// [block_tokens, C] tensor holding keys [k·block_tokens, (k + 1)·block_tokens) (every page of
// every sequence the same shape and q's dtype). Key j is the first Dk channels of its row, value j
// the first dv (keys and values share the latent, one kv head). q [B, Hq, Tq, Dk] ->
// [B, Hq, Tq, dv] in q's dtype; query i of sequence b sits at position lengths[b] - Tq + i and sees
// keys j <= that position. It equals attention(q[b], concat of b's pages, ..., causal,
// lengths[b] - Tq) for each b; kernels read the pages in place (no gather). Backends without a
// paged kernel (the reference) run exactly that. No gradient: caches are for inference.
Tensor paged_attention(const Tensor& q, const std::vector<std::vector<Tensor>>& pages,
                       const std::vector<int64_t>& lengths, int64_t dv, double scale);

// ---- kernels ----
// q, k, v (and dout) are 4-d views with unit-stride last dimensions and any other strides; out
// and the gradients are contiguous; lse [B, Hq, Tq] is f32 (f64 for f64 inputs); bias is [B, Tk]
// contiguous or undefined (then dbias is too).
struct AttentionParams {
  double scale = 1.0;
  bool causal = false;
  int64_t q_offset = 0;
  int64_t bias_window = 0;
};
using AttentionKernel = void (*)(const AttentionParams& p, const Tensor& q, const Tensor& k,
                                 const Tensor& v, const Tensor& bias, Tensor& out, Tensor& lse);
// Overwrites dq, dk, dv and dbias (when defined), given the forward's out and lse.
using AttentionBackwardKernel = void (*)(const AttentionParams& p, const Tensor& q, const Tensor& k,
                                         const Tensor& v, const Tensor& bias, const Tensor& out,
                                         const Tensor& lse, const Tensor& dout, Tensor& dq,
                                         Tensor& dk, Tensor& dv, Tensor& dbias);
KernelTable<AttentionKernel>& attention_kernels();
KernelTable<AttentionBackwardKernel>& attention_backward_kernels();

// The paged caches of paged_attention: key j of sequence b is row j % block_tokens of
// page[first[b] + j / block_tokens] (a row of row_stride elements of q's dtype); its first Dk
// elements are the key, its first dv the value. q is a 4-d view with a unit-stride last dimension,
// out [B, Hq, Tq, dv] and lse [B, Hq, Tq] are contiguous; query i of b sits at
// length[b] - Tq + i (p.causal is set, p.q_offset unused).
struct PagedKv {
  std::vector<const void*> page;
  std::vector<int64_t> first, length;  // per sequence
  int64_t block_tokens = 0, row_stride = 0, dv = 0;
};
using PagedAttentionKernel = void (*)(const AttentionParams& p, const Tensor& q, const PagedKv& kv,
                                      Tensor& out, Tensor& lse);
KernelTable<PagedAttentionKernel>& paged_attention_kernels();

// Whether key j is visible to the query at absolute position qpos, and whether the bias applies.
inline bool attention_visible(const AttentionParams& p, int64_t qpos, int64_t j) {
  return !p.causal || j <= qpos;
}
inline bool attention_biased(const AttentionParams& p, int64_t qpos, int64_t j) {
  return qpos - j > p.bias_window;
}

}  // namespace myriad::ops
