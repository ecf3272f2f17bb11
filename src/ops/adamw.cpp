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

// ---- reference kernel ----
namespace {
void adamw_ref(Tensor& w, const Tensor& g, Tensor& m, Tensor& v, const AdamwArgs& a) {
  float *W = w.data<float>(), *M = m.data<float>(), *V = v.data<float>();
  const float* G = g.data<float>();
  for (int64_t i = 0, n = w.numel(); i < n; ++i) {
    const double gi = G[i];
    const double mi = a.beta1 * M[i] + (1 - a.beta1) * gi;
    const double vi = a.beta2 * V[i] + (1 - a.beta2) * gi * gi;
    M[i] = static_cast<float>(mi);
    V[i] = static_cast<float>(vi);
    const double upd = (mi / a.bc1) / (std::sqrt(vi / a.bc2) + a.eps) + a.weight_decay * W[i];
    W[i] = static_cast<float>(W[i] - a.lr * upd);
  }
}
}  // namespace
MYRIAD_REGISTER_KERNEL(adamw_kernels, Backend::Reference, &adamw_ref);

}  // namespace myriad::ops
