// Cross-entropy, plain and fused with the output projection. The fused form walks the rows in
// chunks, computing each chunk's logits, its log-sum-exp and its gradient contribution, so the
// [N, V] logits are never stored whole (MODEL.md §2).
#pragma once
#include "core/tensor.h"
#include "ops/dispatch.h"

namespace myriad::ops {

constexpr int64_t kIgnoreIndex = -100;

// logits [N, V], targets [N] (i32/i64; kIgnoreIndex skipped) -> mean loss over counted rows, a
// 0-d f32 tensor (f64 for f64 logits). Targets outside [0, V) are an error; when every row is
// ignored the loss and its gradient are 0.
Tensor cross_entropy(const Tensor& logits, const Tensor& targets);
// h [N, D], w [V, D] (the LM head), targets [N] -> the same mean loss as
// cross_entropy(linear(h, w), targets), in f32, with dh and dw computed chunk by chunk during
// the forward (when gradients are needed) and scaled in the backward. For bf16 h and w the logits
// are bf16 GEMM outputs (f32 accumulation), softmax and dw accumulate in f32, and the returned
// gradients are bf16. weights [N] (optional, finite and >= 0; not differentiated): the loss is
// then the weighted mean sum_r w_r loss_r / sum_r w_r over counted rows.
Tensor linear_cross_entropy(const Tensor& h, const Tensor& w, const Tensor& targets,
                            int64_t chunk_rows = 1024, const Tensor& weights = Tensor());

// ---- kernel: per-row loss and, in place, dlogits = softmax - onehot for one chunk ----
// logits [n, V] (f32; f64 on the reference path; bf16 too on the CPU kernel, which computes in
// f32 and rounds the gradient back) contiguous, is overwritten with
// d(loss_row)/d(logits) when grad is true; loss [n] (logits' dtype) receives -log softmax at the
// target (0 for ignored rows, whose gradient row is 0).
using CrossEntropyRowsKernel = void (*)(Tensor& logits, const Tensor& targets, Tensor& loss,
                                        bool grad);
KernelTable<CrossEntropyRowsKernel>& cross_entropy_rows_kernels();

}  // namespace myriad::ops
