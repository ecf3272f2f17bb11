// Optimised CPU indexing kernels. Gathers (gather, index_select, embedding) move raw elements, so
// they serve every dtype; scatter-adds accumulate in f32 (f32 and bf16 values) and split the work
// so that no two threads ever write the same element: scatter_add over (outer row, column block)
// pairs, the embedding backward over (vocabulary row, column block) pairs after a counting sort of
// the ids, the weighted index_add over output rows after the same sort. Indices are i32 or i64 and
// were bounds-checked by the op layer.
#include <algorithm>
#include <vector>

#include "backend/cpu/cpu.h"
#include "backend/cpu/rows.h"
#include "ops/index.h"

namespace myriad::cpu {
namespace {
using ops::dims_around;
using ops::IndexDims;

void check_float(const char* op, DType t) {
  MYRIAD_CHECK(t == DType::F32 || t == DType::BF16, op,
               ": the cpu kernel supports f32 and bf16, not ", dtype_name(t));
}

// Calls f(ptr) with idx's data typed as int32_t or int64_t.
template <class F>
void with_index(const Tensor& idx, F&& f) {
  if (idx.dtype() == DType::I64)
    f(idx.data<int64_t>());
  else
    f(idx.data<int32_t>());
}

// Calls f(T{}) with an unsigned integer type of the element size (gathers move raw bits).
template <class F>
void with_bits(DType t, F&& f) {
  switch (dtype_size(t)) {
    case 1:
      return f(uint8_t{});
    case 2:
      return f(uint16_t{});
    case 4:
      return f(uint32_t{});
    default:
      return f(uint64_t{});
  }
}

// ---- gather / index_select ----

void gather_cpu(const Tensor& x, int64_t dim, const Tensor& idx, Tensor& out) {
  const IndexDims dx = dims_around(x.shape(), dim), dout = dims_around(out.shape(), dim);
  const bool per_slice = idx.numel() != out.numel();
  const int64_t rows = dout.outer * dout.n, inner = dout.inner;
  with_bits(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* px = static_cast<const T*>(x.data_ptr());
    T* po = static_cast<T*>(out.data_ptr());
    with_index(idx, [&](const auto* pi) {
      parallel_for(rows, std::max<int64_t>(1, 8192 / std::max<int64_t>(inner, 1)),
                   [&](int64_t b, int64_t e) {
                     for (int64_t r = b; r < e; ++r) {
                       const T* xo = px + (r / dout.n) * dx.n * inner;
                       T* dst = po + r * inner;
                       if (per_slice) {  // a whole slice moves at once
                         std::memcpy(dst, xo + pi[r % dout.n] * inner, inner * sizeof(T));
                         continue;
                       }
                       const auto* ir = pi + r * inner;
                       for (int64_t i = 0; i < inner; ++i) dst[i] = xo[ir[i] * inner + i];
                     }
                   });
    });
  });
}

// ---- scatter_add / index_add ----

MYRIAD_CPU_CLONES void add_row(float* dst, const float* src, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] += src[i];
}
MYRIAD_CPU_CLONES void add_row(float* dst, const uint16_t* src, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] += bf16_load(src[i]);
}
inline float load(float v) {
  return v;
}
inline float load(uint16_t v) {
  return bf16_load(v);
}

// acc [outer, no, inner] += scatter of src [outer, ns, inner]. A work unit is one outer row and
// one block of inner columns: it alone writes those columns of that row, visiting src in order,
// so duplicate indices accumulate deterministically without atomics (the same bits whatever the
// blocks). Blocks are halved (down to 64 columns) until there are two units per thread: an
// index_add along dim 0 (a MoE's weighted sum, the backward of its gather) has one outer row.
template <class S, class I>
void scatter_into(float* acc, const S* src, const I* idx, IndexDims dout, IndexDims ds,
                  bool per_slice) {
  const int64_t inner = ds.inner, units = 2 * static_cast<int64_t>(omp_get_max_threads());
  int64_t block = std::min<int64_t>(inner, 512);
  while (block > 64 && ds.outer * ((inner + block - 1) / block) < units) block = (block + 1) / 2;
  const int64_t nblocks = block ? (inner + block - 1) / block : 0;
  parallel_for(ds.outer * nblocks, std::max<int64_t>(1, 16384 / std::max<int64_t>(ds.n * block, 1)),
               [&](int64_t b, int64_t e) {
                 for (int64_t u = b; u < e; ++u) {
                   const int64_t o = u / nblocks, c0 = (u % nblocks) * block;
                   const int64_t m = std::min(block, inner - c0);
                   float* ao = acc + o * dout.n * inner + c0;
                   for (int64_t j = 0; j < ds.n; ++j) {
                     const int64_t e0 = (o * ds.n + j) * inner + c0;
                     if (per_slice) {
                       add_row(ao + idx[j] * inner, src + e0, m);
                       continue;
                     }
                     for (int64_t i = 0; i < m; ++i)
                       ao[idx[e0 + i] * inner + i] += load(src[e0 + i]);
                   }
                 }
               });
}

void scatter_add_cpu(Tensor& out, int64_t dim, const Tensor& idx, const Tensor& src) {
  check_float("scatter_add", out.dtype());
  const IndexDims dout = dims_around(out.shape(), dim), ds = dims_around(src.shape(), dim);
  const bool per_slice = idx.numel() != src.numel();
  const int64_t n = out.numel();
  // bf16 results accumulate in an f32 copy and are rounded once at the end.
  std::vector<float> tmp(out.dtype() == DType::BF16 ? n : 0);
  float* acc = out.dtype() == DType::F32 ? out.data<float>() : tmp.data();
  uint16_t* ob = out.dtype() == DType::BF16 ? out.data<uint16_t>() : nullptr;
  if (ob)
    parallel_for(n, 1 << 16, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) acc[i] = bf16_load(ob[i]);
    });
  with_index(idx, [&](const auto* pi) {
    if (src.dtype() == DType::F32)
      scatter_into(acc, src.data<float>(), pi, dout, ds, per_slice);
    else
      scatter_into(acc, src.data<uint16_t>(), pi, dout, ds, per_slice);
  });
  if (ob)
    parallel_for(n, 1 << 16, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) ob[i] = bf16_store(acc[i]);
    });
}

// ---- weighted_index_add: out[idx[i]] += w[i] * src[i] ----

// Each output row's source rows in increasing order (a counting sort of idx): rows [at[r],
// at[r + 1]) of `order`.
template <class I>
void rows_by_target(const I* idx, int64_t M, int64_t n, std::vector<int64_t>& at,
                    std::vector<int64_t>& order) {
  at.assign(n + 1, 0);
  for (int64_t i = 0; i < M; ++i) ++at[idx[i] + 1];
  for (int64_t r = 0; r < n; ++r) at[r + 1] += at[r];
  std::vector<int64_t> next(at.begin(), at.end() - 1);
  order.resize(M);
  for (int64_t i = 0; i < M; ++i) order[next[idx[i]]++] = i;
}

// The products are rounded before they are summed (separate functions, so no multiply-add is
// fused): f32 results have the bits of mul then index_add, and of mul's backward then sum.
MYRIAD_CPU_CLONES void scale_row(float* out, float a, const float* x, int64_t n) {
  for (int64_t d = 0; d < n; ++d) out[d] = a * x[d];
}
MYRIAD_CPU_CLONES void mul_row(float* out, const float* a, const float* b, int64_t n) {
  for (int64_t d = 0; d < n; ++d) out[d] = a[d] * b[d];
}
MYRIAD_CPU_CLONES float sum_row(const float* x, int64_t n) {
  return row_sum(x, n);
}

// Threads over output rows, each summing its sources in increasing order in f32: the same bits
// at any thread count.
void weighted_index_add_cpu(const Tensor& idx, const Tensor& src, const Tensor& w, Tensor& out) {
  check_float("weighted_index_add", src.dtype());
  const int64_t M = src.shape()[0], D = src.shape()[1], n = out.shape()[0];
  std::vector<int64_t> at, order;
  with_index(idx, [&](const auto* pi) { rows_by_target(pi, M, n, at, order); });
  RowIO in(src), o(out), wt(w);
  std::vector<float> wf(M);
  const float* pw = wt.load(0, M, wf.data());
  parallel_for(n, row_grain(D * std::max<int64_t>(1, M / std::max<int64_t>(n, 1))),
               [&](int64_t b, int64_t e) {
                 std::vector<float> acc(D), buf(in.f32 ? 0 : D), prod(D);
                 for (int64_t r = b; r < e; ++r) {
                   std::fill(acc.begin(), acc.end(), 0.0f);
                   for (int64_t q = at[r]; q < at[r + 1]; ++q) {
                     const int64_t i = order[q];
                     scale_row(prod.data(), pw[i], in.load(i, D, buf.data()), D);
                     add_row(acc.data(), prod.data(), D);
                   }
                   o.store(r, D, acc.data());
                 }
               });
}

// Threads over source rows: dsrc[i] = w[i] * g[idx[i]], dw[i] = g[idx[i]] . src[i].
void weighted_index_add_backward_cpu(const Tensor& idx, const Tensor& src, const Tensor& w,
                                     const Tensor& g, Tensor& dsrc, Tensor& dw) {
  check_float("weighted_index_add_backward", src.dtype());
  const int64_t M = src.shape()[0], D = src.shape()[1];
  RowIO in(src), gi(g), wt(w), ds(dsrc.defined() ? dsrc : src);
  std::vector<float> wf(M), dwf(dw.defined() ? M : 0);
  const float* pw = wt.load(0, M, wf.data());
  with_index(idx, [&](const auto* pi) {
    parallel_for(M, row_grain(D), [&](int64_t b, int64_t e) {
      std::vector<float> bg(gi.f32 ? 0 : D), bs(in.f32 ? 0 : D), out(D);
      for (int64_t i = b; i < e; ++i) {
        const float* gr = gi.load(pi[i], D, bg.data());
        if (dw.defined()) {
          mul_row(out.data(), gr, in.load(i, D, bs.data()), D);
          dwf[i] = sum_row(out.data(), D);
        }
        if (dsrc.defined()) {
          float* dst = ds.f32 ? ds.row_f32(i, D) : out.data();
          scale_row(dst, pw[i], gr, D);
          ds.store(i, D, dst);
        }
      }
    });
  });
  if (dw.defined()) RowIO(dw).store(0, M, dwf.data());
}

// ---- embedding ----

void embedding_cpu(const Tensor& weight, const Tensor& ids, Tensor& out) {
  const int64_t n = ids.numel();
  const size_t row = weight.shape()[1] * dtype_size(weight.dtype());
  const char* pw = static_cast<const char*>(weight.data_ptr());
  char* po = static_cast<char*>(out.data_ptr());
  with_index(ids, [&](const auto* pi) {
    parallel_for(n, std::max<int64_t>(1, (1 << 16) / std::max<size_t>(row, 1)),
                 [&](int64_t b, int64_t e) {
                   for (int64_t r = b; r < e; ++r) std::memcpy(po + r * row, pw + pi[r] * row, row);
                 });
  });
}

// grad_w[v] += sum of the grad_out rows whose id is v. A counting sort groups the rows by id
// (stably, so each sum runs in token order); then each (vocabulary row, column block) unit sums
// its group in f32 and adds it once, so no two threads touch the same element.
void embedding_backward_cpu(const Tensor& grad_out, const Tensor& ids, Tensor& grad_w) {
  check_float("embedding_backward", grad_w.dtype());
  const int64_t V = grad_w.shape()[0], D = grad_w.shape()[1], n = ids.numel();
  std::vector<int64_t> start, order;
  with_index(ids, [&](const auto* pi) { rows_by_target(pi, n, V, start, order); });
  const bool f32 = grad_w.dtype() == DType::F32;
  const int64_t block = std::min<int64_t>(D, 1024);
  const int64_t nblocks = block ? (D + block - 1) / block : 0;
  // Grain by the average work per unit (rows summed), at least a few thousand elements.
  const int64_t per_unit = std::max<int64_t>(1, n * block / std::max<int64_t>(V, 1));
  parallel_for(V * nblocks, std::max<int64_t>(1, 8192 / per_unit), [&](int64_t b, int64_t e) {
    std::vector<float> acc(block);
    for (int64_t u = b; u < e; ++u) {
      const int64_t v = u / nblocks, c0 = (u % nblocks) * block, m = std::min(block, D - c0);
      if (start[v] == start[v + 1]) continue;
      std::fill(acc.begin(), acc.begin() + m, 0.0f);
      for (int64_t k = start[v]; k < start[v + 1]; ++k) {
        if (f32)
          add_row(acc.data(), grad_out.data<float>() + order[k] * D + c0, m);
        else
          add_row(acc.data(), grad_out.data<uint16_t>() + order[k] * D + c0, m);
      }
      if (f32) {
        add_row(grad_w.data<float>() + v * D + c0, acc.data(), m);
      } else {
        uint16_t* g = grad_w.data<uint16_t>() + v * D + c0;
        for (int64_t i = 0; i < m; ++i) g[i] = bf16_store(bf16_load(g[i]) + acc[i]);
      }
    }
  });
}

}  // namespace

MYRIAD_REGISTER_KERNEL(ops::gather_kernels, ops::Backend::CPU, &gather_cpu);
MYRIAD_REGISTER_KERNEL(ops::scatter_add_kernels, ops::Backend::CPU, &scatter_add_cpu);
MYRIAD_REGISTER_KERNEL(ops::weighted_index_add_kernels, ops::Backend::CPU, &weighted_index_add_cpu);
MYRIAD_REGISTER_KERNEL(ops::weighted_index_add_backward_kernels, ops::Backend::CPU,
                       &weighted_index_add_backward_cpu);
MYRIAD_REGISTER_KERNEL(ops::embedding_kernels, ops::Backend::CPU, &embedding_cpu);
MYRIAD_REGISTER_KERNEL(ops::embedding_backward_kernels, ops::Backend::CPU, &embedding_backward_cpu);

}  // namespace myriad::cpu
