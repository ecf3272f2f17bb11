// Matrix products: argument checks, autograd, the mapping of strided views onto GEMM calls, and
// the plain reference GEMM kernel.
#include "ops/matmul.h"

#include <optional>

#include "core/autograd.h"
#include "core/strided.h"
#include "ops/check.h"
#include "ops/elementwise.h"
#include "ops/reduce.h"
#include "ops/shape.h"

namespace myriad::ops {

KernelTable<GemmKernel>& gemm_kernels() {
  static KernelTable<GemmKernel> t("gemm");
  return t;
}

void gemm(const GemmArgs& args) {
  MYRIAD_CHECK(args.batch >= 0 && args.m >= 0 && args.n >= 0 && args.k >= 0,
               "gemm: negative size (batch ", args.batch, ", m ", args.m, ", n ", args.n, ", k ",
               args.k, ")");
  MYRIAD_CHECK(args.batch <= 1 || args.stride_c != 0, "gemm: output batch stride is 0");
  if (args.batch == 0 || args.m == 0 || args.n == 0) return;
  GemmArgs g = args;
  // A batch against one shared B whose A and C rows are evenly spaced is one taller GEMM.
  if (g.batch > 1 && g.stride_b == 0 && !g.trans_a && g.stride_a == g.m * g.lda &&
      g.stride_c == g.m * g.ldc) {
    g.m *= g.batch;
    g.batch = 1;
  }
  if (g.batch == 1) g.stride_a = g.stride_b = g.stride_c = 0;
  gemm_kernels().get(g.device, g.dtype)(g);
}

KernelTable<GroupedGemmKernel>& grouped_gemm_kernels() {
  static KernelTable<GroupedGemmKernel> t("grouped_gemm");
  return t;
}

void grouped_gemm(const std::vector<GemmArgs>& groups) {
  std::vector<GemmArgs> work;
  for (const GemmArgs& g : groups) {
    MYRIAD_CHECK(g.batch == 1, "grouped_gemm: each group is one GEMM (batch 1), got ", g.batch);
    MYRIAD_CHECK(g.m >= 0 && g.n >= 0 && g.k >= 0, "grouped_gemm: negative size (m ", g.m, ", n ",
                 g.n, ", k ", g.k, ")");
    MYRIAD_CHECK(g.device == groups[0].device && g.dtype == groups[0].dtype,
                 "grouped_gemm: every group must share one device and dtype");
    if (g.m > 0 && g.n > 0) work.push_back(g);
  }
  if (work.empty()) return;
  const Backend b = backend_for(work[0].device, work[0].dtype);
  if (grouped_gemm_kernels().has(b)) return grouped_gemm_kernels().get(b)(work);
  for (const GemmArgs& g : work) gemm_kernels().get(b)(g);
}

namespace {

// How the last two dimensions (rows x cols) of a view map onto a GEMM operand: row-major with
// leading dimension ld, or stored transposed (column-major) with leading dimension ld.
struct MatLayout {
  bool trans;
  int64_t ld;
};

// The stride of a dimension of size 1 is irrelevant, so either layout can claim it.
std::optional<MatLayout> mat_layout(const Tensor& t) {
  const int64_t r = t.size(-2), c = t.size(-1);
  const int64_t sr = t.strides()[t.dim() - 2], sc = t.strides()[t.dim() - 1];
  if ((c == 1 || sc == 1) && (r == 1 || sr >= c)) return MatLayout{false, r == 1 ? c : sr};
  if ((r == 1 || sr == 1) && (c == 1 || sc >= r)) return MatLayout{true, c == 1 ? r : sc};
  return std::nullopt;
}

// Drops the batch dimensions of size 1 (the last two dimensions are kept).
void squeeze_batch(Shape& shape, std::vector<Shape*> strides) {
  const size_t nb = shape.size() - 2;
  size_t w = 0;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i < nb && shape[i] == 1) continue;
    shape[w] = shape[i];
    for (Shape* s : strides) (*s)[w] = (*s)[i];
    ++w;
  }
  shape.resize(w);
  for (Shape* s : strides) s->resize(w);
}

// True when batch dimensions [from, nb) of `st` are one evenly strided run.
bool collapses(const Shape& shape, const Shape& st, size_t from, size_t nb) {
  for (size_t i = from; i + 1 < nb; ++i)
    if (st[i] != st[i + 1] * shape[i + 1]) return false;
  return true;
}

// out[..., M, N] = a[..., M, K] @ b[..., K, N] (+ beta * out). a and b are views with out's
// batch shape (stride 0 where broadcast); out is contiguous. Views GEMM cannot address by
// strides alone are copied; broadcast batches stay stride 0.
void run_matmul(Tensor a, Tensor b, Tensor& out, float beta) {
  if (out.numel() == 0) return;
  std::optional<MatLayout> la = mat_layout(a), lb = mat_layout(b);
  if (!la) a = a.contiguous(), la = mat_layout(a);
  if (!lb) b = b.contiguous(), lb = mat_layout(b);
  const int64_t m = a.size(-2), k = a.size(-1), n = b.size(-1);
  Shape shape = out.shape(), sa = a.strides(), sb = b.strides(), sc = out.strides();
  squeeze_batch(shape, {&sa, &sb, &sc});
  const size_t nb = shape.size() - 2;
  // The longest run of trailing batch dimensions that both operands stride evenly becomes the
  // GEMM batch; any leading ones are looped over here.
  size_t from = nb;
  while (from > 0 && collapses(shape, sa, from - 1, nb) && collapses(shape, sb, from - 1, nb))
    --from;
  GemmArgs g;
  g.batch = 1;
  for (size_t i = from; i < nb; ++i) g.batch *= shape[i];
  g.m = m, g.n = n, g.k = k;
  g.trans_a = la->trans, g.trans_b = lb->trans;
  g.lda = la->ld, g.ldb = lb->ld, g.ldc = n;
  g.stride_a = from < nb ? sa[nb - 1] : 0;
  g.stride_b = from < nb ? sb[nb - 1] : 0;
  g.stride_c = from < nb ? sc[nb - 1] : 0;
  g.beta = beta;
  g.dtype = out.dtype();
  g.device = out.device();
  const size_t es = dtype_size(out.dtype());
  const char* pa = static_cast<const char*>(a.data_ptr());
  const char* pb = static_cast<const char*>(b.data_ptr());
  char* pc = static_cast<char*>(out.data_ptr());
  Shape outer(shape.begin(), shape.begin() + from);
  Shape oa(sa.begin(), sa.begin() + from), ob(sb.begin(), sb.begin() + from),
      oc(sc.begin(), sc.begin() + from);
  for_each_offset<3>(outer, {&oa, &ob, &oc}, [&](auto o) {
    g.a = pa + o[0] * es;
    g.b = pb + o[1] * es;
    g.c = pc + o[2] * es;
    gemm(g);
  });
}

void check_operands(const char* op, const Tensor& a, const Tensor& b) {
  check_inputs(op, {&a, &b});
  check_same_dtype(op, {&a, &b});
  check_floating(op, a);
}

Tensor matmul_impl(const char* op, const Tensor& a, const Tensor& b) {
  MYRIAD_CHECK(a.size(-1) == b.size(-2), op, ": inner dimensions differ (", shape_str(a.shape()),
               " x ", shape_str(b.shape()), ")");
  Shape batch = broadcast_shapes(op, Shape(a.shape().begin(), a.shape().end() - 2),
                                 Shape(b.shape().begin(), b.shape().end() - 2));
  const int64_t m = a.size(-2), k = a.size(-1), n = b.size(-1);
  Shape sa = batch, sb = batch, so = batch;
  sa.insert(sa.end(), {m, k});
  sb.insert(sb.end(), {k, n});
  so.insert(so.end(), {m, n});
  Tensor out = Tensor::empty(so, a.dtype(), a.device());
  run_matmul(a.shape() == sa ? a : expand(a, sa), b.shape() == sb ? b : expand(b, sb), out, 0.0f);
  if (needs_grad({&a, &b})) {
    const bool ga = needs_grad({&a}), gb = needs_grad({&b});
    record(op, out, {a, b},
           [ga, gb, ta = a.detach(), tb = b.detach()](const Tensor& g) -> std::vector<Tensor> {
             Tensor da, db;
             // dA = dC B^T and dB = A^T dC, summed over the batch dimensions that broadcast.
             if (ga) da = sum_to(matmul(g, transpose(tb, -1, -2)), ta.shape());
             if (gb && tb.dim() == 2 && ta.dim() > 2) {
               // A shared B: fold every batch into the rows, one GEMM and no reduction.
               const int64_t rows = shape_numel(Shape(ta.shape().begin(), ta.shape().end() - 1));
               db = matmul(transpose(reshape(ta, {rows, ta.size(-1)}), 0, 1),
                           reshape(g, {rows, g.size(-1)}));
             } else if (gb) {
               db = sum_to(matmul(transpose(ta, -1, -2), g), tb.shape());
             }
             return {da, db};
           });
  }
  return out;
}

}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b) {
  check_operands("matmul", a, b);
  MYRIAD_CHECK(a.dim() >= 2 && b.dim() >= 2, "matmul: operands must have rank >= 2 (",
               descs({&a, &b}), ")");
  return matmul_impl("matmul", a, b);
}

Tensor bmm(const Tensor& a, const Tensor& b) {
  check_operands("bmm", a, b);
  check_dim("bmm", a, 3);
  check_dim("bmm", b, 3);
  MYRIAD_CHECK(a.size(0) == b.size(0), "bmm: batch sizes differ (", shape_str(a.shape()), " x ",
               shape_str(b.shape()), ")");
  return matmul_impl("bmm", a, b);
}

Tensor linear(const Tensor& x, const Tensor& w, const Tensor& bias) {
  const bool has_bias = bias.defined();
  if (has_bias) {
    check_inputs("linear", {&x, &w, &bias});
    check_same_dtype("linear", {&x, &w, &bias});
  } else {
    check_inputs("linear", {&x, &w});
    check_same_dtype("linear", {&x, &w});
  }
  check_floating("linear", x);
  MYRIAD_CHECK(x.dim() >= 1, "linear: input must have rank >= 1, got ", x.desc());
  check_dim("linear", w, 2);
  const int64_t in = w.size(1), out_f = w.size(0);
  MYRIAD_CHECK(x.size(-1) == in, "linear: input features differ (x ", shape_str(x.shape()),
               ", weight ", shape_str(w.shape()), ")");
  if (has_bias)
    MYRIAD_CHECK(bias.dim() == 1 && bias.size(0) == out_f, "linear: bias ", shape_str(bias.shape()),
                 " does not match weight ", shape_str(w.shape()));
  Shape so(x.shape().begin(), x.shape().end() - 1);
  const int64_t rows = shape_numel(so);
  so.push_back(out_f);
  Tensor out = Tensor::empty(so, x.dtype(), x.device());
  Tensor out2 = out.view_as_strided({rows, out_f}, {out_f, 1}, 0);
  Tensor x2 = x.detach();
  x2 = x2.is_contiguous() ? x2.view_as_strided({rows, in}, {in, 1}, x2.offset())
                          : x2.contiguous().view_as_strided({rows, in}, {in, 1}, 0);
  // The bias is written first and the GEMM accumulates onto it (beta = 1): no extra pass.
  if (has_bias) out2.copy_(expand(bias.detach(), {rows, out_f}));
  run_matmul(x2, transpose(w.detach(), 0, 1), out2, has_bias ? 1.0f : 0.0f);
  std::vector<Tensor> inputs = {x, w};
  if (has_bias) inputs.push_back(bias);
  if (needs_grad(inputs)) {
    const bool gx = needs_grad({&x}), gw = needs_grad({&w});
    Shape sx = x.shape();
    record("linear", out, inputs,
           [gx, gw, has_bias, sx, x2 = x2.detach(), tw = w.detach()](const Tensor& g) {
             const int64_t rows = x2.size(0), out_f = tw.size(0);
             Tensor g2 = reshape(g, {rows, out_f});
             std::vector<Tensor> grads(has_bias ? 3 : 2);
             if (gx) grads[0] = reshape(matmul(g2, tw), sx);
             if (gw) grads[1] = matmul(transpose(g2, 0, 1), x2);
             if (has_bias) grads[2] = sum(g2, {0});
             return grads;
           });
  }
  return out;
}

Tensor linear_cat(const Tensor& x, const std::vector<Tensor>& w) {
  const char* op = "linear_cat";
  MYRIAD_CHECK(!w.empty(), op, ": no weights");
  check_inputs(op, {&x});
  check_floating(op, x);
  MYRIAD_CHECK(x.dim() >= 1, op, ": input must have rank >= 1, got ", x.desc());
  const int64_t in = x.size(-1);
  std::vector<int64_t> at;  // first output column of each product
  int64_t total = 0;
  for (const Tensor& wi : w) {
    check_inputs(op, {&x, &wi});
    check_same_dtype(op, {&x, &wi});
    check_dim(op, wi, 2);
    MYRIAD_CHECK(wi.size(1) == in, op, ": input features differ (x ", shape_str(x.shape()),
                 ", weight ", at.size(), " ", shape_str(wi.shape()), ")");
    at.push_back(total);
    total += wi.size(0);
  }
  Shape so(x.shape().begin(), x.shape().end() - 1);
  const int64_t rows = shape_numel(so);
  so.push_back(total);
  Tensor out = Tensor::empty(so, x.dtype(), x.device());
  const Tensor x2 = x.detach().contiguous();
  std::vector<Tensor> wc;
  for (const Tensor& wi : w) wc.push_back(wi.detach().contiguous());
  const size_t es = dtype_size(x.dtype());
  std::vector<GemmArgs> fwd;
  for (size_t i = 0; i < w.size(); ++i) {
    GemmArgs a;
    a.m = rows, a.n = wc[i].size(0), a.k = in, a.trans_b = true;
    a.a = x2.data_ptr();
    a.b = wc[i].data_ptr();
    a.c = static_cast<char*>(out.data_ptr()) + at[i] * static_cast<int64_t>(es);
    a.lda = in, a.ldb = in, a.ldc = total;
    a.dtype = x.dtype(), a.device = x.device();
    fwd.push_back(a);
  }
  if (rows <= kFewRows) {
    grouped_gemm(fwd);
  } else {
    for (const GemmArgs& a : fwd) gemm(a);
  }
  std::vector<Tensor> inputs = {x};
  inputs.insert(inputs.end(), w.begin(), w.end());
  if (needs_grad(inputs)) {
    std::vector<bool> need;
    for (const Tensor& i : inputs) need.push_back(needs_grad({&i}));
    record(op, out, inputs,
           [need, at, x2, wc, rows, in, total, es, sx = x.shape()](const Tensor& g) {
             const Tensor gy = g.to(x2.dtype()).contiguous();  // [rows, total]
             const char* pg = static_cast<const char*>(gy.data_ptr());
             std::vector<Tensor> grads(wc.size() + 1);
             GemmArgs a;
             a.dtype = x2.dtype(), a.device = x2.device();
             if (need[0]) {  // dx = sum_i dy_i W_i, accumulated product by product
               Tensor dx = Tensor::empty({rows, in}, x2.dtype(), x2.device());
               for (size_t i = 0; i < wc.size(); ++i) {
                 GemmArgs d = a;
                 d.m = rows, d.n = in, d.k = wc[i].size(0);
                 d.a = pg + at[i] * static_cast<int64_t>(es), d.lda = total;
                 d.b = wc[i].data_ptr(), d.ldb = in;
                 d.c = dx.data_ptr(), d.ldc = in;
                 d.beta = i == 0 ? 0.0f : 1.0f;
                 gemm(d);
               }
               grads[0] = reshape(dx, sx);
             }
             for (size_t i = 0; i < wc.size(); ++i) {  // dW_i = dy_i^T x
               if (!need[i + 1]) continue;
               Tensor dw = Tensor::empty(wc[i].shape(), x2.dtype(), x2.device());
               GemmArgs d = a;
               d.m = wc[i].size(0), d.n = in, d.k = rows, d.trans_a = true;
               d.a = pg + at[i] * static_cast<int64_t>(es), d.lda = total;
               d.b = x2.data_ptr(), d.ldb = in;
               d.c = dw.data_ptr(), d.ldc = in;
               gemm(d);
               grads[i + 1] = dw;
             }
             return grads;
           });
  }
  return out;
}

Tensor grouped_linear_cat(const Tensor& x, const std::vector<int64_t>& offsets,
                          const std::vector<std::vector<Tensor>>& w) {
  const char* op = w.size() == 1 ? "grouped_linear" : "grouped_linear_cat";
  check_inputs(op, {&x});
  MYRIAD_CHECK(!w.empty(), op, ": no weights");
  const size_t groups = w[0].size();
  for (const std::vector<Tensor>& set : w) {
    MYRIAD_CHECK(set.size() == groups, op, ": every set needs one weight per group (", groups,
                 "), got ", set.size());
    for (const Tensor& wg : set) {
      check_inputs(op, {&x, &wg});
      check_same_dtype(op, {&x, &wg});
    }
  }
  check_floating(op, x);
  check_dim(op, x, 2);
  MYRIAD_CHECK(groups > 0, op, ": no groups");
  MYRIAD_CHECK(offsets.size() == groups + 1 && offsets.front() == 0 && offsets.back() == x.size(0),
               op, ": offsets must run from 0 to ", x.size(0), " in ", groups + 1, " entries, got ",
               offsets.size(), " entries");
  const int64_t in = x.size(1);
  std::vector<int64_t> outs, at;  // per set: output features and first output column
  int64_t total = 0;
  for (const std::vector<Tensor>& set : w) {
    const int64_t out_s = set[0].dim() == 2 ? set[0].size(0) : -1;
    for (size_t g = 0; g < groups; ++g)
      MYRIAD_CHECK(set[g].dim() == 2 && set[g].size(0) == out_s && set[g].size(1) == in, op,
                   ": weight ", g, " is ", shape_str(set[g].shape()), ", expected [", out_s, ", ",
                   in, "]");
    outs.push_back(out_s), at.push_back(total);
    total += out_s;
  }
  for (size_t g = 0; g < groups; ++g)
    MYRIAD_CHECK(offsets[g] <= offsets[g + 1], op, ": offsets decrease at group ", g);
  const int64_t rows = x.size(0);
  const DType t = x.dtype();
  const Device dev = x.device();
  const auto es = static_cast<int64_t>(dtype_size(t));
  Tensor xc = x.detach().contiguous();
  std::vector<std::vector<Tensor>> wc(w.size());
  for (size_t s = 0; s < w.size(); ++s)
    for (const Tensor& wg : w[s]) wc[s].push_back(wg.detach().contiguous());
  Tensor out = Tensor::empty({rows, total}, t, dev);
  const auto base = [offsets, t, dev](size_t g) {
    GemmArgs a;
    a.m = offsets[g + 1] - offsets[g];
    a.dtype = t, a.device = dev;
    return a;
  };
  std::vector<GemmArgs> fwd;
  for (size_t g = 0; g < groups; ++g)
    for (size_t s = 0; s < w.size(); ++s) {
      GemmArgs a = base(g);
      a.n = outs[s], a.k = in, a.trans_b = true;
      a.a = static_cast<const char*>(xc.data_ptr()) + offsets[g] * in * es;
      a.b = wc[s][g].data_ptr();
      a.c = static_cast<char*>(out.data_ptr()) + (offsets[g] * total + at[s]) * es;
      a.lda = in, a.ldb = in, a.ldc = total;
      fwd.push_back(a);
    }
  grouped_gemm(fwd);  // in = 0 gives zeros: an empty inner dimension is part of the GEMM contract
  std::vector<Tensor> inputs = {x};
  for (const std::vector<Tensor>& set : w) inputs.insert(inputs.end(), set.begin(), set.end());
  if (needs_grad(inputs)) {
    std::vector<bool> need;
    for (const Tensor& i : inputs) need.push_back(needs_grad({&i}));
    record(op, out, inputs,
           [need, offsets, xc, wc, base, rows, in, total, outs, at, es](const Tensor& g) {
             const Tensor gy = g.to(xc.dtype()).contiguous();  // [rows, total]
             const char* pg = static_cast<const char*>(gy.data_ptr());
             const size_t groups = offsets.size() - 1;
             std::vector<Tensor> grads(1 + wc.size() * groups);
             // Set 0's dx products and every dW in one grouped call; then each later set adds
             // its dx products into dx (beta 1), one grouped call per set.
             std::vector<std::vector<GemmArgs>> work(need[0] ? wc.size() : 1);
             if (need[0]) {
               // dx_g = sum_s dy_{g,s} W_{s,g}
               grads[0] = Tensor::empty({rows, in}, xc.dtype(), xc.device());
               for (size_t s = 0; s < wc.size(); ++s)
                 for (size_t i = 0; i < groups; ++i) {
                   GemmArgs a = base(i);
                   a.n = in, a.k = outs[s];
                   a.a = pg + (offsets[i] * total + at[s]) * es, a.lda = total;
                   a.b = wc[s][i].data_ptr(), a.ldb = in;
                   a.c = static_cast<char*>(grads[0].data_ptr()) + offsets[i] * in * es;
                   a.ldc = in;
                   a.beta = s == 0 ? 0.0f : 1.0f;
                   work[s].push_back(a);
                 }
             }
             for (size_t s = 0; s < wc.size(); ++s)
               for (size_t i = 0; i < groups; ++i) {
                 const size_t slot = 1 + s * groups + i;
                 if (!need[slot]) continue;
                 // dW_{s,g} = dy_{g,s}^T x_g: [out_s, m] x [m, in]. An empty group (k = 0) gets
                 // zeros from the GEMM itself.
                 grads[slot] = Tensor::empty({outs[s], in}, xc.dtype(), xc.device());
                 GemmArgs a = base(i);
                 a.m = outs[s], a.n = in, a.k = offsets[i + 1] - offsets[i], a.trans_a = true;
                 a.a = pg + (offsets[i] * total + at[s]) * es, a.lda = total;
                 a.b = static_cast<const char*>(xc.data_ptr()) + offsets[i] * in * es;
                 a.ldb = in;
                 a.c = grads[slot].data_ptr(), a.ldc = in;
                 work[0].push_back(a);
               }
             for (const std::vector<GemmArgs>& call : work) grouped_gemm(call);
             return grads;
           });
  }
  return out;
}

Tensor grouped_linear(const Tensor& x, const std::vector<int64_t>& offsets,
                      const std::vector<Tensor>& w) {
  return grouped_linear_cat(x, offsets, {w});
}

// ---- reference kernel: a plain triple loop in double ----
namespace {

void gemm_ref(const GemmArgs& g) {
  for (int64_t bi = 0; bi < g.batch; ++bi) {
    const int64_t oa = bi * g.stride_a, ob = bi * g.stride_b, oc = bi * g.stride_c;
    for (int64_t i = 0; i < g.m; ++i)
      for (int64_t j = 0; j < g.n; ++j) {
        double s = 0;
        for (int64_t p = 0; p < g.k; ++p) {
          double x = load_as_double(g.a, g.dtype, oa + (g.trans_a ? p * g.lda + i : i * g.lda + p));
          double y = load_as_double(g.b, g.dtype, ob + (g.trans_b ? j * g.ldb + p : p * g.ldb + j));
          s += x * y;
        }
        const int64_t ci = oc + i * g.ldc + j;
        double c = g.alpha * s;
        if (g.beta != 0.0f) c += g.beta * load_as_double(g.c, g.dtype, ci);  // C may be garbage
        store_from_double(g.c, g.dtype, ci, c);
      }
  }
}

}  // namespace

MYRIAD_REGISTER_KERNEL(gemm_kernels, Backend::Reference, &gemm_ref);

}  // namespace myriad::ops
