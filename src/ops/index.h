// Indexing: gather, scatter-add, index-select, embedding lookup. Indices are i32 or i64 and are
// bounds-checked on every backend (an out-of-range index raises an error naming the op, the
// index and the bound).
#pragma once
#include "core/tensor.h"
#include "ops/dispatch.h"

namespace myriad::ops {

// out[i][j][k] = x[i][idx[i][j][k]][k] for dim = 1 (torch.gather); idx has x's rank and the
// output's shape; every dimension but `dim` must be <= x's.
Tensor gather(const Tensor& x, int64_t dim, const Tensor& idx);
// Returns base + the scatter of src: out[i][idx[i][j][k]][k] += src[i][j][k] for dim = 1.
Tensor scatter_add(const Tensor& base, int64_t dim, const Tensor& idx, const Tensor& src);
// Rows of x along dim picked by a 1-d idx.
Tensor index_select(const Tensor& x, int64_t dim, const Tensor& idx);
// weight [V, D], ids of any shape -> [..., D]; backward scatter-adds into a [V, D] gradient.
Tensor embedding(const Tensor& weight, const Tensor& ids);

// ---- kernels (contiguous operands; the op layer checks shapes and index bounds) ----
// x, idx and out viewed as [outer, n_x, inner] / [outer, n_idx, inner] with idx broadcast the
// torch.gather way; these cover gather, scatter_add and index_select.
using GatherKernel = void (*)(const Tensor& x, int64_t dim, const Tensor& idx, Tensor& out);
// out (already holding base) += scatter of src.
using ScatterAddKernel = void (*)(Tensor& out, int64_t dim, const Tensor& idx, const Tensor& src);
// out [n, D] = weight[ids[n]]; and grad_w [V, D] += scatter of grad_out [n, D].
using EmbeddingKernel = void (*)(const Tensor& weight, const Tensor& ids, Tensor& out);
using EmbeddingBackwardKernel = void (*)(const Tensor& grad_out, const Tensor& ids, Tensor& grad_w);
KernelTable<GatherKernel>& gather_kernels();
KernelTable<ScatterAddKernel>& scatter_add_kernels();
KernelTable<EmbeddingKernel>& embedding_kernels();
KernelTable<EmbeddingBackwardKernel>& embedding_backward_kernels();

}  // namespace myriad::ops
