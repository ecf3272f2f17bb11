// GELU: the tanh form as a composite, the exact (erf) form through its own kernels.
#include "ops/gelu.h"

#include <cmath>
#include <numbers>

#include "core/autograd.h"
#include "ops/check.h"
#include "ops/elementwise.h"

namespace myriad::ops {

KernelTable<GeluKernel>& gelu_kernels() {
  static KernelTable<GeluKernel> t("gelu");
  return t;
}
KernelTable<GeluBackwardKernel>& gelu_backward_kernels() {
  static KernelTable<GeluBackwardKernel> t("gelu_backward");
  return t;
}

Tensor gelu_tanh(const Tensor& x) {
  check_inputs("gelu_tanh", {&x});
  check_floating("gelu_tanh", x);
  const double k = std::sqrt(2.0 / std::numbers::pi);
  const Tensor inner = mul(add(x, mul(mul(square(x), x), 0.044715)), k);
  return mul(mul(x, 0.5), add(tanh(inner), 1.0));
}

Tensor gelu(const Tensor& x_in) {
  const char* name = "gelu";
  const Device dev = check_inputs(name, {&x_in});
  check_floating(name, x_in);
  const Tensor x = x_in.contiguous();
  Tensor y = Tensor::empty(x.shape(), x.dtype(), dev);
  if (x.numel() == 0) return y;
  gelu_kernels().get(dev, x.dtype())(x, y);
  if (needs_grad({&x_in})) {
    record(name, y, {x_in}, [x = x.detach()](const Tensor& g) -> std::vector<Tensor> {
      const Tensor gy = g.to(x.dtype()).contiguous();
      Tensor gx = Tensor::empty(x.shape(), x.dtype(), x.device());
      gelu_backward_kernels().get(x.device(), x.dtype())(x, gy, gx);
      return {gx};
    });
  }
  return y;
}

// ---- plain kernels in double (for every host dtype; they serve the CPU backend as well) ----
namespace {

double phi_cdf(double v) {
  return 0.5 * (1.0 + std::erf(v / std::numbers::sqrt2));
}

void gelu_ref(const Tensor& x, Tensor& y) {
  const DType t = x.dtype();
  for (int64_t i = 0; i < x.numel(); ++i) {
    const double v = load_as_double(x.data_ptr(), t, i);
    store_from_double(y.data_ptr(), t, i, v * phi_cdf(v));
  }
}

void gelu_backward_ref(const Tensor& x, const Tensor& gy, Tensor& gx) {
  const DType t = x.dtype();
  const double inv_sqrt_2pi = 0.5 * std::numbers::inv_sqrtpi * std::numbers::sqrt2;
  for (int64_t i = 0; i < x.numel(); ++i) {
    const double v = load_as_double(x.data_ptr(), t, i);
    const double d = phi_cdf(v) + v * inv_sqrt_2pi * std::exp(-0.5 * v * v);
    store_from_double(gx.data_ptr(), t, i, load_as_double(gy.data_ptr(), t, i) * d);
  }
}

}  // namespace

MYRIAD_REGISTER_KERNEL(gelu_kernels, Backend::Reference, &gelu_ref);
MYRIAD_REGISTER_KERNEL(gelu_kernels, Backend::CPU, &gelu_ref);
MYRIAD_REGISTER_KERNEL(gelu_backward_kernels, Backend::Reference, &gelu_backward_ref);
MYRIAD_REGISTER_KERNEL(gelu_backward_kernels, Backend::CPU, &gelu_backward_ref);

}  // namespace myriad::ops
