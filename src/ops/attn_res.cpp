// AttnRes: checks, autograd through the fused backward kernel, and the plain reference kernels.
#include "ops/attn_res.h"

#include <cmath>
#include <limits>

#include "core/autograd.h"
#include "ops/check.h"

namespace myriad::ops {

KernelTable<AttnResKernel>& attn_res_kernels() {
  static KernelTable<AttnResKernel> t("attn_res");
  return t;
}
KernelTable<AttnResBackwardKernel>& attn_res_backward_kernels() {
  static KernelTable<AttnResBackwardKernel> t("attn_res_backward");
  return t;
}

Tensor attn_res(const std::vector<Tensor>& sources, const Tensor& w, const Tensor& gamma,
                double eps) {
  const char* name = "attn_res";
  MYRIAD_CHECK(!sources.empty(), name, ": needs at least one source");
  const Tensor& v0 = sources[0];
  Device dev = check_inputs(name, {&v0, &w, &gamma});
  check_floating(name, v0);
  check_same_dtype(name, {&v0, &w, &gamma});
  MYRIAD_CHECK(v0.dim() >= 1, name, ": sources must be [..., d], got ", v0.desc());
  const int64_t d = v0.shape().back();
  for (const Tensor& v : sources) {
    check_inputs(name, {&v0, &v});
    check_same_dtype(name, {&v0, &v});
    MYRIAD_CHECK(v.shape() == v0.shape(), name, ": sources must share one shape, got ",
                 descs({&v0, &v}));
  }
  MYRIAD_CHECK(w.numel() == d && w.dim() >= 1 && w.shape().back() == d, name,
               ": w must be [d] or [1, d] for sources ", v0.desc(), ", got ", w.desc());
  MYRIAD_CHECK(gamma.dim() == 1 && gamma.shape()[0] == d, name, ": gamma must be [", d,
               "] for sources ", v0.desc(), ", got ", gamma.desc());
  MYRIAD_CHECK(eps >= 0, name, ": eps must be non-negative, got ", eps);

  const int64_t rows = d ? v0.numel() / d : 0;
  auto as_rows = [&](const Tensor& t) {
    Tensor c = t.contiguous();
    return c.view_as_strided({rows, d}, {d, 1}, c.offset());
  };
  std::vector<Tensor> vs;
  for (const Tensor& v : sources) vs.push_back(as_rows(v));
  Tensor wc = w.contiguous();
  wc = wc.view_as_strided({d}, {1}, wc.offset());
  Tensor gc = gamma.contiguous();
  Tensor out = Tensor::empty(v0.shape(), v0.dtype(), dev);
  if (out.numel() == 0) return out;
  Tensor out2 = out.view_as_strided({rows, d}, {d, 1}, 0);
  attn_res_kernels().get(dev, v0.dtype())(vs, wc, gc, eps, out2);

  std::vector<Tensor> inputs = sources;
  inputs.push_back(w);
  inputs.push_back(gamma);
  if (needs_grad(inputs)) {
    std::vector<Tensor> saved;
    for (const Tensor& v : vs) saved.push_back(v.detach());
    record(name, out, inputs,
           [saved, wc = wc.detach(), gc = gc.detach(), eps, shape = v0.shape(),
            wshape = w.shape()](const Tensor& g) -> std::vector<Tensor> {
             const Tensor& v = saved[0];
             Tensor gy = g.to(v.dtype()).contiguous();
             gy = gy.view_as_strided(v.shape(), v.strides(), gy.offset());
             std::vector<Tensor> gs, grads;
             for (size_t i = 0; i < saved.size(); ++i) {
               grads.push_back(Tensor::empty(shape, v.dtype(), v.device()));
               gs.push_back(grads.back().view_as_strided(v.shape(), v.strides(), 0));
             }
             Tensor gw = Tensor::empty(wshape, v.dtype(), v.device());
             Tensor gw1 = gw.view_as_strided(wc.shape(), wc.strides(), 0);
             Tensor gg = Tensor::empty(gc.shape(), v.dtype(), v.device());
             attn_res_backward_kernels().get(v.device(), v.dtype())(saved, wc, gc, eps, gy, gs, gw1,
                                                                    gg);
             grads.push_back(gw);
             grads.push_back(gg);
             return grads;
           });
  }
  return out;
}

// ---- reference kernels: plain loops in double ----
namespace {

// Per row: the scores a_i, the inverse RMS r_i and the softmax p_i of every source.
struct RowScores {
  std::vector<double> a, r, p;
};

RowScores row_scores(const std::vector<Tensor>& vs, const std::vector<double>& c, double eps,
                     int64_t row) {
  const int64_t d = static_cast<int64_t>(c.size());
  const size_t m = vs.size();
  RowScores s{std::vector<double>(m), std::vector<double>(m), std::vector<double>(m)};
  double amax = -std::numeric_limits<double>::infinity();
  for (size_t i = 0; i < m; ++i) {
    double ss = 0, dot = 0;
    for (int64_t k = 0; k < d; ++k) {
      const double x = load_as_double(vs[i].data_ptr(), vs[i].dtype(), row * d + k);
      ss += x * x;
      dot += x * c[k];
    }
    s.r[i] = 1.0 / std::sqrt(ss / d + eps);
    s.a[i] = s.r[i] * dot;
    amax = std::max(amax, s.a[i]);
  }
  double z = 0;
  for (size_t i = 0; i < m; ++i) z += s.p[i] = std::exp(s.a[i] - amax);
  for (double& p : s.p) p /= z;
  return s;
}

std::vector<double> pseudo_query(const Tensor& w, const Tensor& gamma) {
  std::vector<double> c(w.numel());
  for (size_t k = 0; k < c.size(); ++k)
    c[k] = load_as_double(w.data_ptr(), w.dtype(), k) *
           load_as_double(gamma.data_ptr(), gamma.dtype(), k);
  return c;
}

void attn_res_ref(const std::vector<Tensor>& vs, const Tensor& w, const Tensor& gamma, double eps,
                  Tensor& out) {
  const std::vector<double> c = pseudo_query(w, gamma);
  const int64_t rows = out.shape()[0], d = out.shape()[1];
  for (int64_t r = 0; r < rows; ++r) {
    RowScores s = row_scores(vs, c, eps, r);
    for (int64_t k = 0; k < d; ++k) {
      double o = 0;
      for (size_t i = 0; i < vs.size(); ++i)
        o += s.p[i] * load_as_double(vs[i].data_ptr(), vs[i].dtype(), r * d + k);
      store_from_double(out.data_ptr(), out.dtype(), r * d + k, o);
    }
  }
}

// With c = gamma ⊙ w, dp_i = gy·v_i and da_i = p_i (dp_i − Σ_j p_j dp_j):
//   gv_i = p_i gy + da_i (r_i c − a_i r_i² v_i / d),   gc = Σ_rows Σ_i da_i r_i v_i.
void attn_res_backward_ref(const std::vector<Tensor>& vs, const Tensor& w, const Tensor& gamma,
                           double eps, const Tensor& gy, std::vector<Tensor>& gvs, Tensor& gw,
                           Tensor& ggamma) {
  const std::vector<double> c = pseudo_query(w, gamma);
  const int64_t rows = gy.shape()[0], d = gy.shape()[1];
  const DType t = gy.dtype();
  const size_t m = vs.size();
  std::vector<double> gc(d, 0.0), dp(m), da(m);
  auto V = [&](size_t i, int64_t r, int64_t k) {
    return load_as_double(vs[i].data_ptr(), t, r * d + k);
  };
  for (int64_t r = 0; r < rows; ++r) {
    RowScores s = row_scores(vs, c, eps, r);
    double mean_dp = 0;
    for (size_t i = 0; i < m; ++i) {
      dp[i] = 0;
      for (int64_t k = 0; k < d; ++k)
        dp[i] += load_as_double(gy.data_ptr(), t, r * d + k) * V(i, r, k);
      mean_dp += s.p[i] * dp[i];
    }
    for (size_t i = 0; i < m; ++i) {
      da[i] = s.p[i] * (dp[i] - mean_dp);
      for (int64_t k = 0; k < d; ++k) {
        const double g = load_as_double(gy.data_ptr(), t, r * d + k), x = V(i, r, k);
        const double gv = s.p[i] * g + da[i] * (s.r[i] * c[k] - s.a[i] * s.r[i] * s.r[i] * x / d);
        store_from_double(gvs[i].data_ptr(), t, r * d + k, gv);
        gc[k] += da[i] * s.r[i] * x;
      }
    }
  }
  for (int64_t k = 0; k < d; ++k) {
    store_from_double(gw.data_ptr(), t, k, gc[k] * load_as_double(gamma.data_ptr(), t, k));
    store_from_double(ggamma.data_ptr(), t, k, gc[k] * load_as_double(w.data_ptr(), t, k));
  }
}

}  // namespace

MYRIAD_REGISTER_KERNEL(attn_res_kernels, Backend::Reference, &attn_res_ref);
MYRIAD_REGISTER_KERNEL(attn_res_backward_kernels, Backend::Reference, &attn_res_backward_ref);

}  // namespace myriad::ops
