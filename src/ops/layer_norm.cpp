#include "ops/layer_norm.h"

#include "ops/check.h"
#include "ops/elementwise.h"
#include "ops/reduce.h"

namespace myriad::ops {

Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps) {
  const char* name = "layer_norm";
  check_inputs(name, {&x});
  check_floating(name, x);
  MYRIAD_CHECK(x.dim() >= 1, name, ": expected at least one dimension, got ", x.desc());
  const int64_t n = x.shape().back();
  for (const Tensor* p : {&weight, &bias}) {
    if (!p->defined()) continue;
    check_inputs(name, {&x, p});
    check_same_dtype(name, {&x, p});
    MYRIAD_CHECK(p->dim() == 1 && p->size(0) == n, name, ": weight and bias must be [", n,
                 "] for x ", x.desc(), ", got ", p->desc());
  }
  MYRIAD_CHECK(eps >= 0, name, ": eps must be non-negative, got ", eps);
  const Tensor c = sub(x, mean(x, {-1}, true));
  Tensor y = mul(c, rsqrt(add(mean(square(c), {-1}, true), eps)));
  if (weight.defined()) y = mul(y, weight);
  if (bias.defined()) y = add(y, bias);
  return y;
}

}  // namespace myriad::ops
