// AdamW's update: checks, dispatch and the reference kernel.
#include "ops/adamw.h"

#include <cmath>

#include "ops/check.h"

namespace myriad::ops {

KernelTable<AdamwKernel>& adamw_kernels() {
  static KernelTable<AdamwKernel> t("adamw_update");
  return t;
}

void adamw_update(Tensor& w, const Tensor& g, Tensor& m, Tensor& v, const AdamwArgs& a,
                  Tensor* w_low) {
  auto check = [&](const Tensor* t, bool ok_dtype, const char* what) {
    MYRIAD_CHECK(t->defined() && ok_dtype && t->is_contiguous(), "adamw_update: expected ", what,
                 ", got ", t->defined() ? t->desc() : std::string("an undefined tensor"));
    MYRIAD_CHECK(t->numel() == w.numel() && t->device() == w.device(),
                 "adamw_update: every tensor must match the weight ", w.desc(), ", got ",
                 t->desc());
  };
  for (const Tensor* t : {static_cast<const Tensor*>(&w), static_cast<const Tensor*>(&m),
                          static_cast<const Tensor*>(&v)})
    check(t, t->defined() && t->dtype() == DType::F32, "contiguous f32 tensors");
  check(&g, g.defined() && (g.dtype() == DType::F32 || g.dtype() == DType::BF16),
        "a contiguous f32 or bf16 gradient");
  if (w_low)
    check(w_low, w_low->defined() && w_low->dtype() == DType::BF16,
          "a contiguous bf16 copy of the weight");
  MYRIAD_CHECK(a.bc1 > 0 && a.bc2 > 0, "adamw_update: bias corrections must be positive, got ",
               a.bc1, " and ", a.bc2);
  MYRIAD_CHECK(std::isfinite(a.grad_scale), "adamw_update: the gradient scale must be finite, got ",
               a.grad_scale);
  // f32 storage: the reference kernel only in a ReferenceMode scope.
  adamw_kernels().get(w.device(), w.dtype())(w, g, m, v, a, w_low);
}

AdamwConsts adamw_consts(const AdamwArgs& a) {
  auto f = [](double x) { return static_cast<float>(x); };
  return {f(a.beta1), f(a.beta2), f(1 - a.beta1),    f(1 - a.beta2), f(a.bc1),
          f(a.bc2),   f(a.eps),   f(a.weight_decay), f(a.lr),        f(a.grad_scale)};
}

// ---- reference kernel (this file compiles with -ffp-contract=off: no fused multiply-adds) ----
namespace {
void adamw_ref(Tensor& w, const Tensor& g, Tensor& m, Tensor& v, const AdamwArgs& args,
               Tensor* w_low) {
  const AdamwConsts a = adamw_consts(args);
  float *W = w.data<float>(), *M = m.data<float>(), *V = v.data<float>();
  const bool bf16 = g.dtype() == DType::BF16;
  for (int64_t i = 0, n = w.numel(); i < n; ++i) {
    const float gi = (bf16 ? bf16_to_f32(g.data<uint16_t>()[i]) : g.data<float>()[i]) * a.gs;
    const float mi = a.b1 * M[i] + a.c1 * gi;
    const float vi = a.b2 * V[i] + a.c2 * gi * gi;
    M[i] = mi;
    V[i] = vi;
    const float upd = (mi / a.bc1) / (std::sqrt(vi / a.bc2) + a.eps) + a.wd * W[i];
    W[i] = W[i] - a.lr * upd;
    if (w_low) w_low->data<uint16_t>()[i] = f32_to_bf16(W[i]);
  }
}
}  // namespace
MYRIAD_REGISTER_KERNEL(adamw_kernels, Backend::Reference, &adamw_ref);

}  // namespace myriad::ops
