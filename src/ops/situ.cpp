// SiTU-GLU and SwiGLU: checks, autograd through the fused backward kernel, and the plain
// reference kernels.
#include "ops/situ.h"

#include <cmath>

#include "core/autograd.h"
#include "ops/check.h"

namespace myriad::ops {

KernelTable<GluKernel>& glu_kernels() {
  static KernelTable<GluKernel> t("glu");
  return t;
}
KernelTable<GluBackwardKernel>& glu_backward_kernels() {
  static KernelTable<GluBackwardKernel> t("glu_backward");
  return t;
}

namespace {

// [rows, n] view of contiguous t starting `col` elements into each row of length ld.
Tensor rows_view(const Tensor& t, int64_t rows, int64_t n, int64_t ld, int64_t col) {
  return t.view_as_strided({rows, n}, {ld, 1}, t.offset() + col);
}

void check_betas(const char* name, const GluParams& p) {
  MYRIAD_CHECK(p.beta1 > 0 && p.beta2 > 0, name, ": betas must be positive, got ", p.beta1, " and ",
               p.beta2);
}

// gate and up are [rows, n] views of the contiguous tensor(s) in `src` (one fused tensor, or
// gate then up); the gradient comes back in src's layout.
Tensor glu_run(const char* name, const GluParams& p, const std::vector<Tensor>& inputs,
               const std::vector<Tensor>& src, const Shape& out_shape, int64_t rows, int64_t n) {
  const bool fused = src.size() == 1;
  const int64_t ld = fused ? 2 * n : n;
  Tensor gate = rows_view(src[0], rows, n, ld, 0);
  Tensor up = fused ? rows_view(src[0], rows, n, ld, n) : rows_view(src[1], rows, n, ld, 0);
  const Device dev = src[0].device();
  const DType t = src[0].dtype();
  Tensor out = Tensor::empty(out_shape, t, dev);
  if (out.numel() == 0) return out;
  Tensor out2 = rows_view(out, rows, n, n, 0);
  glu_kernels().get(dev, t)(p, gate, up, out2);
  if (needs_grad(inputs)) {
    record(name, out, inputs,
           [p, fused, rows, n, gate = gate.detach(), up = up.detach(),
            shapes = std::vector<Shape>{inputs[0].shape(), inputs.back().shape()}](
               const Tensor& g) -> std::vector<Tensor> {
             const Tensor gy = rows_view(g.to(gate.dtype()).contiguous(), rows, n, n, 0);
             const int64_t ld = fused ? 2 * n : n;
             Tensor gx = Tensor::empty(shapes[0], gate.dtype(), gate.device());
             Tensor gu = fused ? gx : Tensor::empty(shapes[1], gate.dtype(), gate.device());
             Tensor ggate = rows_view(gx, rows, n, ld, 0);
             Tensor gup = rows_view(gu, rows, n, ld, fused ? n : 0);
             glu_backward_kernels().get(gate.device(), gate.dtype())(p, gate, up, gy, ggate, gup);
             if (fused) return {gx};
             return {gx, gu};
           });
  }
  return out;
}

Tensor glu_pair(const char* name, const GluParams& p, const Tensor& gate, const Tensor& up) {
  check_inputs(name, {&gate, &up});
  check_floating(name, gate);
  check_same_dtype(name, {&gate, &up});
  check_betas(name, p);
  MYRIAD_CHECK(gate.dim() >= 1 && gate.shape() == up.shape(), name,
               ": gate and up must have one shape with at least one dimension, got ",
               descs({&gate, &up}));
  const int64_t n = gate.shape().back();
  const int64_t rows = n ? gate.numel() / n : 0;
  return glu_run(name, p, {gate, up}, {gate.contiguous(), up.contiguous()}, gate.shape(), rows, n);
}

Tensor glu_fused(const char* name, const GluParams& p, const Tensor& x) {
  check_inputs(name, {&x});
  check_floating(name, x);
  check_betas(name, p);
  MYRIAD_CHECK(x.dim() >= 1 && x.shape().back() % 2 == 0, name,
               ": expected [..., 2I] with the gate first, got ", x.desc());
  const int64_t n = x.shape().back() / 2;
  const int64_t rows = n ? x.numel() / (2 * n) : 0;
  Shape out_shape = x.shape();
  out_shape.back() = n;
  return glu_run(name, p, {x}, {x.contiguous()}, out_shape, rows, n);
}

}  // namespace

Tensor situ_glu(const Tensor& gate, const Tensor& up, double beta1, double beta2) {
  return glu_pair("situ_glu", {GluKind::Situ, beta1, beta2}, gate, up);
}
Tensor swiglu(const Tensor& gate, const Tensor& up) {
  return glu_pair("swiglu", {GluKind::Swiglu, 1.0, 1.0}, gate, up);
}
Tensor situ_glu_fused(const Tensor& gate_up, double beta1, double beta2) {
  return glu_fused("situ_glu_fused", {GluKind::Situ, beta1, beta2}, gate_up);
}
Tensor swiglu_fused(const Tensor& gate_up) {
  return glu_fused("swiglu_fused", {GluKind::Swiglu, 1.0, 1.0}, gate_up);
}

// ---- reference kernels: plain loops in double ----
namespace {

GluMath<double> glu_ref_math(const GluParams& p, double g, double u) {
  return glu_math<double>(
      p.kind, p.beta1, p.beta2, g, u, [](double x) { return 1.0 / (1.0 + std::exp(-x)); },
      [](double x) { return std::tanh(x); });
}

// Element (r, i) of a [rows, n] view with unit column stride.
int64_t at(const Tensor& t, int64_t r, int64_t i) {
  return r * t.strides()[0] + i;
}

void glu_ref(const GluParams& p, const Tensor& gate, const Tensor& up, Tensor& out) {
  const DType t = gate.dtype();
  for (int64_t r = 0; r < gate.shape()[0]; ++r)
    for (int64_t i = 0; i < gate.shape()[1]; ++i) {
      auto m = glu_ref_math(p, load_as_double(gate.data_ptr(), t, at(gate, r, i)),
                            load_as_double(up.data_ptr(), t, at(up, r, i)));
      store_from_double(out.data_ptr(), t, at(out, r, i), m.gate * m.up);
    }
}

void glu_backward_ref(const GluParams& p, const Tensor& gate, const Tensor& up, const Tensor& gy,
                      Tensor& ggate, Tensor& gup) {
  const DType t = gate.dtype();
  for (int64_t r = 0; r < gate.shape()[0]; ++r)
    for (int64_t i = 0; i < gate.shape()[1]; ++i) {
      auto m = glu_ref_math(p, load_as_double(gate.data_ptr(), t, at(gate, r, i)),
                            load_as_double(up.data_ptr(), t, at(up, r, i)));
      const double g = load_as_double(gy.data_ptr(), t, at(gy, r, i));
      store_from_double(ggate.data_ptr(), t, at(ggate, r, i), g * m.up * m.dgate);
      store_from_double(gup.data_ptr(), t, at(gup, r, i), g * m.gate * m.dup);
    }
}

}  // namespace

MYRIAD_REGISTER_KERNEL(glu_kernels, Backend::Reference, &glu_ref);
MYRIAD_REGISTER_KERNEL(glu_backward_kernels, Backend::Reference, &glu_backward_ref);

}  // namespace myriad::ops
