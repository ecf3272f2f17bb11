// AdamW's update: checks, dispatch and the reference kernel.
#include "ops/adamw.h"

#include <cmath>

#include "ops/check.h"

namespace myriad::ops {

KernelTable<AdamwKernel>& adamw_kernels() {
  static KernelTable<AdamwKernel> t("adamw_update");
  return t;
}

void adamw_update(Tensor& w, const Tensor& g, Tensor& m, Tensor& v, const AdamwArgs& a) {
  for (const Tensor* t : {static_cast<const Tensor*>(&w), &g, static_cast<const Tensor*>(&m),
                          static_cast<const Tensor*>(&v)}) {
    MYRIAD_CHECK(t->defined() && t->dtype() == DType::F32 && t->is_contiguous(),
                 "adamw_update: expected contiguous f32 tensors, got ",
                 t->defined() ? t->desc() : std::string("an undefined tensor"));
    MYRIAD_CHECK(t->numel() == w.numel() && t->device() == w.device(),
                 "adamw_update: every tensor must match the weight ", w.desc(), ", got ",
                 t->desc());
  }
  MYRIAD_CHECK(a.bc1 > 0 && a.bc2 > 0, "adamw_update: bias corrections must be positive, got ",
               a.bc1, " and ", a.bc2);
  // f32 storage: the reference kernel only in a ReferenceMode scope.
  adamw_kernels().get(w.device(), w.dtype())(w, g, m, v, a);
}

AdamwConsts adamw_consts(const AdamwArgs& a) {
  auto f = [](double x) { return static_cast<float>(x); };
  return {f(a.beta1), f(a.beta2), f(1 - a.beta1),    f(1 - a.beta2), f(a.bc1),
          f(a.bc2),   f(a.eps),   f(a.weight_decay), f(a.lr)};
}

// ---- reference kernel (this file compiles with -ffp-contract=off: no fused multiply-adds) ----
namespace {
void adamw_ref(Tensor& w, const Tensor& g, Tensor& m, Tensor& v, const AdamwArgs& args) {
  const AdamwConsts a = adamw_consts(args);
  float *W = w.data<float>(), *M = m.data<float>(), *V = v.data<float>();
  const float* G = g.data<float>();
  for (int64_t i = 0, n = w.numel(); i < n; ++i) {
    const float gi = G[i];
    const float mi = a.b1 * M[i] + a.c1 * gi;
    const float vi = a.b2 * V[i] + a.c2 * gi * gi;
    M[i] = mi;
    V[i] = vi;
    const float upd = (mi / a.bc1) / (std::sqrt(vi / a.bc2) + a.eps) + a.wd * W[i];
    W[i] = W[i] - a.lr * upd;
  }
}
}  // namespace
MYRIAD_REGISTER_KERNEL(adamw_kernels, Backend::Reference, &adamw_ref);

}  // namespace myriad::ops
