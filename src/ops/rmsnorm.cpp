// RMSNorm: checks, autograd through the fused backward kernel, and the plain reference kernels.
#include "ops/rmsnorm.h"

#include <cmath>
#include <vector>

#include "core/autograd.h"
#include "ops/check.h"

namespace myriad::ops {

KernelTable<RmsNormKernel>& rms_norm_kernels() {
  static KernelTable<RmsNormKernel> t("rms_norm");
  return t;
}
KernelTable<RmsNormBackwardKernel>& rms_norm_backward_kernels() {
  static KernelTable<RmsNormBackwardKernel> t("rms_norm_backward");
  return t;
}

namespace {

// rms_norm and l2norm: the checks, then x [..., n] normalised over n through the fused kernels.
Tensor norm_rows(const char* name, const Tensor& x_in, const Tensor& weight, double eps,
                 NormOf of) {
  const bool has_w = weight.defined();
  const Device dev = has_w ? check_inputs(name, {&x_in, &weight}) : check_inputs(name, {&x_in});
  check_floating(name, x_in);
  MYRIAD_CHECK(x_in.dim() >= 1, name, ": expected at least one dimension, got ", x_in.desc());
  const int64_t n = x_in.shape().back();
  if (has_w) {
    check_same_dtype(name, {&x_in, &weight});
    MYRIAD_CHECK(weight.dim() == 1 && weight.shape()[0] == n, name, ": weight must be [", n,
                 "] for x ", x_in.desc(), ", got ", weight.desc());
  }
  MYRIAD_CHECK(eps >= 0, name, ": eps must be non-negative, got ", eps);
  Tensor x = x_in.contiguous();
  Tensor w = has_w ? weight.contiguous() : Tensor();
  const int64_t rows = n ? x.numel() / n : 0;
  Tensor y = Tensor::empty(x.shape(), x.dtype(), dev);
  // rstd stays f64 for f64 input so the gradient check sees no f32 rounding.
  Tensor rstd = Tensor::empty({rows}, x.dtype() == DType::F64 ? DType::F64 : DType::F32, dev);
  if (x.numel() == 0) return y;
  Tensor x2 = x.view_as_strided({rows, n}, {n, 1}, x.offset());
  Tensor y2 = y.view_as_strided({rows, n}, {n, 1}, 0);
  rms_norm_kernels().get(dev, x.dtype())(x2, w, eps, of, y2, rstd);
  if (needs_grad({&x_in, &weight})) {
    record(name, y, {x_in, weight},
           [x2 = x2.detach(), w = w.defined() ? w.detach() : Tensor(), rstd, of,
            shape = x.shape()](const Tensor& g) -> std::vector<Tensor> {
             Tensor gy = g.to(x2.dtype()).contiguous();
             gy = gy.view_as_strided(x2.shape(), x2.strides(), gy.offset());
             Tensor gx = Tensor::empty(x2.shape(), x2.dtype(), x2.device());
             Tensor gw = w.defined() ? Tensor::empty(w.shape(), w.dtype(), w.device()) : Tensor();
             rms_norm_backward_kernels().get(x2.device(), x2.dtype())(x2, w, rstd, of, gy, gx, gw);
             return {gx.view_as_strided(shape, contiguous_strides(shape), 0), gw};
           });
  }
  return y;
}

}  // namespace

Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps) {
  return norm_rows("rms_norm", x, weight, eps, NormOf::MeanSquare);
}

Tensor l2norm(const Tensor& x, double eps) {
  return norm_rows("l2norm", x, Tensor(), eps, NormOf::SumSquare);
}

// ---- reference kernels: plain loops in double ----
namespace {

// v rounded to dtype t (x̂ is cast back to x's dtype before the weight multiply).
double round_to(DType t, double v) {
  alignas(8) unsigned char b[8];
  store_from_double(b, t, 0, v);
  return load_as_double(b, t, 0);
}

void rms_norm_ref(const Tensor& x, const Tensor& weight, double eps, NormOf of, Tensor& y,
                  Tensor& rstd) {
  const int64_t rows = x.shape()[0], n = x.shape()[1];
  const double div = of == NormOf::MeanSquare ? static_cast<double>(n) : 1.0;
  const DType t = x.dtype();
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int64_t i = 0; i < n; ++i) {
      double v = load_as_double(x.data_ptr(), t, r * n + i);
      ss += v * v;
    }
    const double rs = 1.0 / std::sqrt(ss / div + eps);
    store_from_double(rstd.data_ptr(), rstd.dtype(), r, rs);
    for (int64_t i = 0; i < n; ++i) {
      double v = round_to(t, load_as_double(x.data_ptr(), t, r * n + i) * rs);
      if (weight.defined()) v *= load_as_double(weight.data_ptr(), t, i);
      store_from_double(y.data_ptr(), t, r * n + i, v);
    }
  }
}

// With g = gy * w and x̂ = x * rstd: gx = rstd * (g - x̂ * mean(g * x̂)) (the sum for SumSquare) (the
// cast of x̂ passes the gradient straight through), gw = sum over rows of gy * cast(x̂).
void rms_norm_backward_ref(const Tensor& x, const Tensor& weight, const Tensor& rstd, NormOf of,
                           const Tensor& gy, Tensor& gx, Tensor& gw) {
  const int64_t rows = x.shape()[0], n = x.shape()[1];
  const double div = of == NormOf::MeanSquare ? static_cast<double>(n) : 1.0;
  const DType t = x.dtype();
  std::vector<double> gw_acc(gw.defined() ? n : 0, 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    const double rs = load_as_double(rstd.data_ptr(), rstd.dtype(), r);
    auto X = [&](int64_t i) { return load_as_double(x.data_ptr(), t, r * n + i) * rs; };
    auto G = [&](int64_t i) {
      double g = load_as_double(gy.data_ptr(), t, r * n + i);
      return weight.defined() ? g * load_as_double(weight.data_ptr(), t, i) : g;
    };
    double dot = 0;
    for (int64_t i = 0; i < n; ++i) dot += G(i) * X(i);
    dot /= div;
    for (int64_t i = 0; i < n; ++i) {
      store_from_double(gx.data_ptr(), t, r * n + i, rs * (G(i) - X(i) * dot));
      if (gw.defined())
        gw_acc[i] += load_as_double(gy.data_ptr(), t, r * n + i) * round_to(t, X(i));
    }
  }
  for (int64_t i = 0; i < static_cast<int64_t>(gw_acc.size()); ++i)
    store_from_double(gw.data_ptr(), gw.dtype(), i, gw_acc[i]);
}

}  // namespace

MYRIAD_REGISTER_KERNEL(rms_norm_kernels, Backend::Reference, &rms_norm_ref);
MYRIAD_REGISTER_KERNEL(rms_norm_backward_kernels, Backend::Reference, &rms_norm_backward_ref);

}  // namespace myriad::ops
