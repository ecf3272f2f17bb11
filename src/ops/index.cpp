// Indexing ops: argument and index-bound checks, autograd records, and the reference kernels.
#include "ops/index.h"

#include <cstring>
#include <vector>

#include "core/autograd.h"
#include "ops/check.h"
#include "ops/shape.h"

namespace myriad::ops {

KernelTable<GatherKernel>& gather_kernels() {
  static KernelTable<GatherKernel> t("gather");
  return t;
}
KernelTable<WeightedIndexAddKernel>& weighted_index_add_kernels() {
  static KernelTable<WeightedIndexAddKernel> t("weighted_index_add");
  return t;
}
KernelTable<WeightedIndexAddBackwardKernel>& weighted_index_add_backward_kernels() {
  static KernelTable<WeightedIndexAddBackwardKernel> t("weighted_index_add_backward");
  return t;
}
KernelTable<ScatterAddKernel>& scatter_add_kernels() {
  static KernelTable<ScatterAddKernel> t("scatter_add");
  return t;
}
KernelTable<EmbeddingKernel>& embedding_kernels() {
  static KernelTable<EmbeddingKernel> t("embedding");
  return t;
}
KernelTable<EmbeddingBackwardKernel>& embedding_backward_kernels() {
  static KernelTable<EmbeddingBackwardKernel> t("embedding_backward");
  return t;
}

namespace {

int64_t index_at(const Tensor& idx, int64_t i) {
  return idx.dtype() == DType::I64 ? idx.data<int64_t>()[i] : idx.data<int32_t>()[i];
}

// Throws naming the op, the first index outside [0, bound) and the bound. Indices on a device
// are copied to the host for the scan.
void check_bounds(const char* op, const char* word, const Tensor& idx, int64_t bound,
                  const std::string& what) {
  Tensor h = idx.device().is_cpu() ? idx.contiguous() : idx.to(kCPU);
  const int64_t n = h.numel();
  auto scan = [&](const auto* p) {
    bool ok = true;
    for (int64_t i = 0; i < n; ++i) ok &= (p[i] >= 0) & (p[i] < bound);  // vectorises
    if (ok) return;
    for (int64_t i = 0; i < n; ++i)
      MYRIAD_CHECK(p[i] >= 0 && p[i] < bound, op, ": ", word, " ", static_cast<int64_t>(p[i]),
                   " out of range [0, ", bound, ") ", what);
  };
  if (h.dtype() == DType::I64)
    scan(h.data<int64_t>());
  else
    scan(h.data<int32_t>());
}

// A view of x limited to `sizes` in every dimension but `keep` (-1: every dimension).
Tensor fit(const Tensor& x, Shape sizes, int64_t keep) {
  if (keep >= 0) sizes[keep] = x.shape()[keep];
  return sizes == x.shape() ? x : x.view_as_strided(sizes, x.strides(), x.offset());
}

// Zeros of `shape` with t in its leading corner (the backward of fit()).
Tensor pad_to(const Tensor& t, const Shape& shape) {
  if (t.shape() == shape) return t;
  Tensor out = Tensor::zeros(shape, t.dtype(), t.device());
  out.view_as_strided(t.shape(), out.strides(), 0).copy_(t);
  return out;
}

// The unchecked ops (idx contiguous and in range); the backward closures call these.
Tensor scatter_add_impl(const Tensor& base, int64_t dim, const Tensor& idx, const Tensor& src);
Tensor index_add_impl(const Tensor& base, int64_t dim, const Tensor& idx, const Tensor& src);

Tensor gather_impl(const Tensor& x, int64_t dim, const Tensor& idx) {
  Tensor xs = fit(x.detach(), idx.shape(), dim).contiguous();
  Tensor out = Tensor::empty(idx.shape(), x.dtype(), x.device());
  gather_kernels().get(x.device(), x.dtype())(xs, dim, idx, out);
  if (needs_grad({&x}))
    record("gather", out, {x},
           [shape = x.shape(), dim, idx](const Tensor& g) -> std::vector<Tensor> {
             return {scatter_add_impl(Tensor::zeros(shape, g.dtype(), g.device()), dim, idx, g)};
           });
  return out;
}

Tensor scatter_add_impl(const Tensor& base, int64_t dim, const Tensor& idx, const Tensor& src) {
  Tensor out = base.detach().clone();
  Tensor s = fit(src.detach(), idx.shape(), -1).contiguous();
  ScatterAddKernel kernel = scatter_add_kernels().get(out.device(), out.dtype());
  Shape region = idx.shape();
  region[dim] = base.shape()[dim];
  if (region == out.shape()) {
    kernel(out, dim, idx, s);
  } else {  // idx covers only part of base outside dim: scatter into a copy of that part
    Tensor view = out.view_as_strided(region, out.strides(), 0);
    Tensor part = view.clone();
    kernel(part, dim, idx, s);
    view.copy_(part);
  }
  if (needs_grad({&base, &src}))
    record("scatter_add", out, {base, src},
           [dim, idx, src_shape = src.shape()](const Tensor& g) -> std::vector<Tensor> {
             return {g, pad_to(gather_impl(g, dim, idx), src_shape)};
           });
  return out;
}

Tensor index_select_impl(const Tensor& x, int64_t dim, const Tensor& idx) {
  Shape shape = x.shape();
  shape[dim] = idx.numel();
  Tensor out = Tensor::empty(shape, x.dtype(), x.device());
  gather_kernels().get(x.device(), x.dtype())(x.detach().contiguous(), dim, idx, out);
  if (needs_grad({&x}))
    record("index_select", out, {x},
           [shape = x.shape(), dim, idx](const Tensor& g) -> std::vector<Tensor> {
             return {index_add_impl(Tensor::zeros(shape, g.dtype(), g.device()), dim, idx, g)};
           });
  return out;
}

Tensor index_add_impl(const Tensor& base, int64_t dim, const Tensor& idx, const Tensor& src) {
  Tensor out = base.detach().clone();
  scatter_add_kernels().get(out.device(), out.dtype())(out, dim, idx, src.detach().contiguous());
  if (needs_grad({&base, &src}))
    record("index_add", out, {base, src}, [dim, idx](const Tensor& g) -> std::vector<Tensor> {
      return {g, index_select_impl(g, dim, idx)};
    });
  return out;
}

// idx as a contiguous 1-d tensor (a 0-d idx is one index).
Tensor index_vector(const char* op, const Tensor& idx) {
  MYRIAD_CHECK(idx.dim() <= 1, op, ": index must be 1-d, got ", idx.desc());
  Tensor c = idx.contiguous();
  return c.view_as_strided({c.numel()}, {1}, c.offset());
}

}  // namespace

Tensor gather(const Tensor& x, int64_t dim, const Tensor& idx) {
  check_inputs("gather", {&x, &idx});
  check_index_dtype("gather", idx);
  MYRIAD_CHECK(x.dim() >= 1 && idx.dim() == x.dim(),
               "gather: index must have the input's rank (at least 1), got ", descs({&x, &idx}));
  dim = wrap_dim("gather", dim, x.dim());
  for (int64_t d = 0; d < x.dim(); ++d)
    MYRIAD_CHECK(d == dim || idx.shape()[d] <= x.shape()[d], "gather: index ", idx.desc(),
                 " is larger than the input ", x.desc(), " in dimension ", d);
  check_bounds("gather", "index", idx, x.shape()[dim],
               cat("along dimension ", dim, " of ", x.desc()));
  return gather_impl(x, dim, idx.contiguous());
}

Tensor scatter_add(const Tensor& base, int64_t dim, const Tensor& idx, const Tensor& src) {
  check_inputs("scatter_add", {&base, &idx, &src});
  check_index_dtype("scatter_add", idx);
  check_floating("scatter_add", base);
  check_same_dtype("scatter_add", {&base, &src});
  MYRIAD_CHECK(base.dim() >= 1 && idx.dim() == base.dim() && src.dim() == base.dim(),
               "scatter_add: base, index and src must share a rank (at least 1), got ",
               descs({&base, &idx, &src}));
  dim = wrap_dim("scatter_add", dim, base.dim());
  for (int64_t d = 0; d < base.dim(); ++d)
    MYRIAD_CHECK(
        idx.shape()[d] <= src.shape()[d] && (d == dim || idx.shape()[d] <= base.shape()[d]),
        "scatter_add: index ", idx.desc(), " does not fit base ", base.desc(), " and src ",
        src.desc(), " in dimension ", d);
  check_bounds("scatter_add", "index", idx, base.shape()[dim],
               cat("along dimension ", dim, " of ", base.desc()));
  return scatter_add_impl(base, dim, idx.contiguous(), src);
}

Tensor index_select(const Tensor& x, int64_t dim, const Tensor& idx) {
  check_inputs("index_select", {&x, &idx});
  check_index_dtype("index_select", idx);
  MYRIAD_CHECK(x.dim() >= 1, "index_select: expected at least 1 dimension, got ", x.desc());
  dim = wrap_dim("index_select", dim, x.dim());
  Tensor iv = index_vector("index_select", idx);
  check_bounds("index_select", "index", iv, x.shape()[dim],
               cat("along dimension ", dim, " of ", x.desc()));
  return index_select_impl(x, dim, iv);
}

Tensor index_add(const Tensor& base, int64_t dim, const Tensor& idx, const Tensor& src) {
  check_inputs("index_add", {&base, &idx, &src});
  check_index_dtype("index_add", idx);
  check_floating("index_add", base);
  check_same_dtype("index_add", {&base, &src});
  MYRIAD_CHECK(base.dim() >= 1, "index_add: expected at least 1 dimension, got ", base.desc());
  dim = wrap_dim("index_add", dim, base.dim());
  Tensor iv = index_vector("index_add", idx);
  Shape want = base.shape();
  want[dim] = iv.numel();
  MYRIAD_CHECK(src.shape() == want, "index_add: src ", src.desc(), " should have shape ",
               shape_str(want), " for base ", base.desc(), " and index ", idx.desc());
  check_bounds("index_add", "index", iv, base.shape()[dim],
               cat("along dimension ", dim, " of ", base.desc()));
  return index_add_impl(base, dim, iv, src);
}

Tensor weighted_index_add(int64_t n, const Tensor& idx, const Tensor& src, const Tensor& w) {
  const char* op = "weighted_index_add";
  const Device dev = check_inputs(op, {&idx, &src, &w});
  check_index_dtype(op, idx);
  check_floating(op, src);
  check_same_dtype(op, {&src, &w});
  MYRIAD_CHECK(n >= 0, op, ": the number of output rows must be non-negative, got ", n);
  MYRIAD_CHECK(src.dim() == 2 && idx.dim() == 1 && w.dim() == 1 && idx.numel() == src.size(0) &&
                   w.numel() == src.size(0),
               op, ": expected src [M, D], idx [M] and w [M], got ", descs({&src, &idx, &w}));
  check_bounds(op, "index", idx, n, cat("of ", n, " output rows"));
  const Backend b = backend_for(dev, src.dtype());
  const Tensor ic = idx.contiguous(), sc = src.detach().contiguous(), wc = w.detach().contiguous();
  Tensor out = Tensor::empty({n, src.size(1)}, src.dtype(), dev);
  weighted_index_add_kernels().get(b)(ic, sc, wc, out);
  if (needs_grad({&src, &w})) {
    const bool gs = needs_grad({&src}), gw = needs_grad({&w});
    record(op, out, {src, w}, [ic, sc, wc, gs, gw](const Tensor& g) -> std::vector<Tensor> {
      const Tensor gc = g.to(sc.dtype()).contiguous();
      Tensor dsrc = gs ? Tensor::empty(sc.shape(), sc.dtype(), sc.device()) : Tensor();
      Tensor dw = gw ? Tensor::empty(wc.shape(), wc.dtype(), wc.device()) : Tensor();
      weighted_index_add_backward_kernels().get(sc.device(), sc.dtype())(ic, sc, wc, gc, dsrc, dw);
      return {dsrc, dw};
    });
  }
  return out;
}

Tensor embedding(const Tensor& weight, const Tensor& ids) {
  Device dev = check_inputs("embedding", {&weight, &ids});
  check_index_dtype("embedding", ids);
  check_dim("embedding", weight, 2);
  check_floating("embedding", weight);
  const int64_t V = weight.shape()[0], D = weight.shape()[1], n = ids.numel();
  check_bounds("embedding", "id", ids, V,
               cat("for a vocabulary of V = ", V, " (weight ", weight.desc(), ")"));
  Tensor flat = ids.contiguous();
  flat = flat.view_as_strided({n}, {1}, flat.offset());
  Tensor out = Tensor::empty({n, D}, weight.dtype(), dev);
  embedding_kernels().get(dev, weight.dtype())(weight.detach().contiguous(), flat, out);
  Shape shape = ids.shape();
  shape.push_back(D);
  out = out.view_as_strided(shape, contiguous_strides(shape), 0);
  if (needs_grad({&weight}))
    record("embedding", out, {weight}, [V, D, n, flat](const Tensor& g) -> std::vector<Tensor> {
      Tensor gw = Tensor::zeros({V, D}, g.dtype(), g.device());
      Tensor gc = g.contiguous();
      gc = gc.view_as_strided({n, D}, {D, 1}, gc.offset());
      embedding_backward_kernels().get(g.device(), g.dtype())(gc, flat, gw);
      return {gw};
    });
  return out;
}

// ---- reference kernels: plain loops (copies move raw elements; sums accumulate in double) ----
namespace {

void gather_ref(const Tensor& x, int64_t dim, const Tensor& idx, Tensor& out) {
  const IndexDims dx = dims_around(x.shape(), dim), dout = dims_around(out.shape(), dim);
  const bool per_slice = idx.numel() != out.numel();
  const size_t es = dtype_size(x.dtype());
  const char* px = static_cast<const char*>(x.data_ptr());
  char* po = static_cast<char*>(out.data_ptr());
  for (int64_t o = 0; o < dout.outer; ++o)
    for (int64_t j = 0; j < dout.n; ++j)
      for (int64_t i = 0; i < dout.inner; ++i) {
        int64_t e = (o * dout.n + j) * dout.inner + i;
        int64_t k = index_at(idx, per_slice ? j : e);
        std::memcpy(po + e * es, px + ((o * dx.n + k) * dx.inner + i) * es, es);
      }
}

void scatter_add_ref(Tensor& out, int64_t dim, const Tensor& idx, const Tensor& src) {
  const IndexDims dout = dims_around(out.shape(), dim), ds = dims_around(src.shape(), dim);
  const bool per_slice = idx.numel() != src.numel();
  std::vector<double> acc(out.numel());
  for (int64_t e = 0; e < out.numel(); ++e) acc[e] = load_as_double(out.data_ptr(), out.dtype(), e);
  for (int64_t o = 0; o < ds.outer; ++o)
    for (int64_t j = 0; j < ds.n; ++j)
      for (int64_t i = 0; i < ds.inner; ++i) {
        int64_t e = (o * ds.n + j) * ds.inner + i;
        int64_t k = index_at(idx, per_slice ? j : e);
        acc[(o * dout.n + k) * dout.inner + i] += load_as_double(src.data_ptr(), src.dtype(), e);
      }
  for (int64_t e = 0; e < out.numel(); ++e)
    store_from_double(out.data_ptr(), out.dtype(), e, acc[e]);
}

void weighted_index_add_ref(const Tensor& idx, const Tensor& src, const Tensor& w, Tensor& out) {
  const int64_t M = src.shape()[0], D = src.shape()[1];
  std::vector<double> acc(out.numel(), 0.0);
  for (int64_t i = 0; i < M; ++i) {
    const double wi = load_as_double(w.data_ptr(), w.dtype(), i);
    for (int64_t d = 0; d < D; ++d)
      acc[index_at(idx, i) * D + d] += wi * load_as_double(src.data_ptr(), src.dtype(), i * D + d);
  }
  for (int64_t e = 0; e < out.numel(); ++e)
    store_from_double(out.data_ptr(), out.dtype(), e, acc[e]);
}

void weighted_index_add_backward_ref(const Tensor& idx, const Tensor& src, const Tensor& w,
                                     const Tensor& g, Tensor& dsrc, Tensor& dw) {
  const int64_t M = src.shape()[0], D = src.shape()[1];
  for (int64_t i = 0; i < M; ++i) {
    const int64_t r = index_at(idx, i);
    const double wi = load_as_double(w.data_ptr(), w.dtype(), i);
    double dot = 0;
    for (int64_t d = 0; d < D; ++d) {
      const double gv = load_as_double(g.data_ptr(), g.dtype(), r * D + d);
      dot += gv * load_as_double(src.data_ptr(), src.dtype(), i * D + d);
      if (dsrc.defined()) store_from_double(dsrc.data_ptr(), dsrc.dtype(), i * D + d, wi * gv);
    }
    if (dw.defined()) store_from_double(dw.data_ptr(), dw.dtype(), i, dot);
  }
}

void embedding_ref(const Tensor& weight, const Tensor& ids, Tensor& out) {
  const int64_t D = weight.shape()[1];
  const size_t row = D * dtype_size(weight.dtype());
  for (int64_t r = 0; r < ids.numel(); ++r)
    std::memcpy(static_cast<char*>(out.data_ptr()) + r * row,
                static_cast<const char*>(weight.data_ptr()) + index_at(ids, r) * row, row);
}

void embedding_backward_ref(const Tensor& grad_out, const Tensor& ids, Tensor& grad_w) {
  const int64_t D = grad_w.shape()[1];
  std::vector<double> acc(grad_w.numel());
  for (int64_t e = 0; e < grad_w.numel(); ++e)
    acc[e] = load_as_double(grad_w.data_ptr(), grad_w.dtype(), e);
  for (int64_t r = 0; r < ids.numel(); ++r)
    for (int64_t d = 0; d < D; ++d)
      acc[index_at(ids, r) * D + d] +=
          load_as_double(grad_out.data_ptr(), grad_out.dtype(), r * D + d);
  for (int64_t e = 0; e < grad_w.numel(); ++e)
    store_from_double(grad_w.data_ptr(), grad_w.dtype(), e, acc[e]);
}

}  // namespace

MYRIAD_REGISTER_KERNEL(gather_kernels, Backend::Reference, &gather_ref);
MYRIAD_REGISTER_KERNEL(scatter_add_kernels, Backend::Reference, &scatter_add_ref);
MYRIAD_REGISTER_KERNEL(weighted_index_add_kernels, Backend::Reference, &weighted_index_add_ref);
MYRIAD_REGISTER_KERNEL(weighted_index_add_backward_kernels, Backend::Reference,
                       &weighted_index_add_backward_ref);
MYRIAD_REGISTER_KERNEL(embedding_kernels, Backend::Reference, &embedding_ref);
MYRIAD_REGISTER_KERNEL(embedding_backward_kernels, Backend::Reference, &embedding_backward_ref);

}  // namespace myriad::ops
