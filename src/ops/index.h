// Indexing: gather, scatter-add, index-select/index-add, embedding lookup (torch semantics).
// Indices are i32 or i64 and are bounds-checked in the op layer on every backend (CUDA indices
// are copied to the host for the check): an out-of-range index raises an error naming the op, the
// index and the bound. Negative indices are out of range.
#pragma once
#include "core/tensor.h"
#include "ops/dispatch.h"

namespace myriad::ops {

// out[i][j][k] = x[i][idx[i][j][k]][k] for dim = 1 (torch.gather); idx has x's rank and the
// output's shape; every dimension but `dim` must be <= x's. Differentiable in x.
Tensor gather(const Tensor& x, int64_t dim, const Tensor& idx);
// Returns base + the scatter of src: out[i][idx[i][j][k]][k] += src[i][j][k] for dim = 1
// (torch.scatter_add). idx has base's rank, is no larger than src in any dimension and no larger
// than base outside `dim`; duplicate indices accumulate. Differentiable in base and src.
Tensor scatter_add(const Tensor& base, int64_t dim, const Tensor& idx, const Tensor& src);
// Slices of x along dim picked by a 1-d (or 0-d) idx. Differentiable in x.
Tensor index_select(const Tensor& x, int64_t dim, const Tensor& idx);
// Returns base with src's slices added at the positions idx names along dim (torch.index_add):
// src has base's shape except idx.numel() along dim. Differentiable in base and src.
Tensor index_add(const Tensor& base, int64_t dim, const Tensor& idx, const Tensor& src);
// out [n, D] with out[idx[i]] += w[i] * src[i] over i in increasing order: a MoE's experts' rows
// summed back into their tokens, weighted by the routing (one op where index_select, mul and
// index_add took three, each a pass over [M, D]). src [M, D]; idx [M] (i32 or i64, in [0, n));
// w [M] in src's dtype. Sums in f32 (f64 for f64), rounded to src's dtype once. Differentiable
// in src and w: dsrc[i] = w[i] * g[idx[i]], dw[i] = g[idx[i]] . src[i].
Tensor weighted_index_add(int64_t n, const Tensor& idx, const Tensor& src, const Tensor& w);
// weight [V, D], ids of any shape -> [..., D]; backward scatter-adds into a [V, D] gradient.
Tensor embedding(const Tensor& weight, const Tensor& ids);

// A shape read as [outer, n, inner] around dimension `dim`: the layout the kernels index.
struct IndexDims {
  int64_t outer = 1, n = 1, inner = 1;
};
inline IndexDims dims_around(const Shape& s, int64_t dim) {
  IndexDims d;
  d.n = s[dim];
  for (int64_t i = 0; i < dim; ++i) d.outer *= s[i];
  for (size_t i = dim + 1; i < s.size(); ++i) d.inner *= s[i];
  return d;
}

// ---- kernels (contiguous operands; the op layer checks shapes and index bounds) ----
// x / out, and the scatter's out / src, are read as [outer, n, inner] around `dim`, where
// outer and inner agree between the two. idx comes in one of two forms, told apart by its size:
//   - the shape of the gathered out / of src (gather, scatter_add): one index per element;
//   - 1-d with one index per slice along dim (index_select, index_add), when its numel differs.
using GatherKernel = void (*)(const Tensor& x, int64_t dim, const Tensor& idx, Tensor& out);
// out (already holding base) += scatter of src.
using ScatterAddKernel = void (*)(Tensor& out, int64_t dim, const Tensor& idx, const Tensor& src);
// out [n, D] = weight[ids[n]] (ids flattened to [n]); and grad_w [V, D] += scatter of
// grad_out [n, D] (duplicate ids accumulate).
using EmbeddingKernel = void (*)(const Tensor& weight, const Tensor& ids, Tensor& out);
using EmbeddingBackwardKernel = void (*)(const Tensor& grad_out, const Tensor& ids, Tensor& grad_w);
// out [n, D] (overwritten) = the weighted sum above; and its backward, dsrc and dw (either may
// be undefined, then not computed).
using WeightedIndexAddKernel = void (*)(const Tensor& idx, const Tensor& src, const Tensor& w,
                                        Tensor& out);
using WeightedIndexAddBackwardKernel = void (*)(const Tensor& idx, const Tensor& src,
                                                const Tensor& w, const Tensor& g, Tensor& dsrc,
                                                Tensor& dw);
KernelTable<GatherKernel>& gather_kernels();
KernelTable<WeightedIndexAddKernel>& weighted_index_add_kernels();
KernelTable<WeightedIndexAddBackwardKernel>& weighted_index_add_backward_kernels();
KernelTable<ScatterAddKernel>& scatter_add_kernels();
KernelTable<EmbeddingKernel>& embedding_kernels();
KernelTable<EmbeddingBackwardKernel>& embedding_backward_kernels();

}  // namespace myriad::ops
