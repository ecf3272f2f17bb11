// Softmax and log-softmax: checks, autograd (through the fused backward kernel), and the plain
// reference kernels. The kernels see rows of a contiguous [rows, n] tensor, so a dimension other
// than the last is moved last (transpose + contiguous, both differentiable) and moved back.
#include "ops/softmax.h"

#include <cmath>
#include <limits>

#include "core/autograd.h"
#include "ops/check.h"
#include "ops/shape.h"

namespace myriad::ops {

KernelTable<SoftmaxKernel>& softmax_kernels() {
  static KernelTable<SoftmaxKernel> t("softmax");
  return t;
}
KernelTable<SoftmaxBackwardKernel>& softmax_backward_kernels() {
  static KernelTable<SoftmaxBackwardKernel> t("softmax_backward");
  return t;
}

namespace {

// Softmax over the last dimension of x.
Tensor softmax_last(const char* name, const Tensor& x_in, bool log) {
  Tensor x = x_in.contiguous();
  Device dev = x.device();
  Tensor y = Tensor::empty(x.shape(), x.dtype(), dev);
  if (x.numel() == 0) return y;
  softmax_kernels().get(dev, x.dtype())(x, y, log);
  if (needs_grad({&x_in})) {
    record(name, y, {x_in}, [log, y = y.detach()](const Tensor& g) -> std::vector<Tensor> {
      Tensor gx = Tensor::empty(y.shape(), y.dtype(), y.device());
      softmax_backward_kernels().get(y.device(), y.dtype())(y, g.to(y.dtype()).contiguous(), gx,
                                                            log);
      return {gx};
    });
  }
  return y;
}

Tensor softmax_dim(const char* name, const Tensor& x, int64_t dim, bool log) {
  check_inputs(name, {&x});
  check_floating(name, x);
  const int64_t rank = x.dim();
  const int64_t d = wrap_dim(name, dim, std::max<int64_t>(rank, 1));  // a 0-d x takes 0 or -1
  if (rank == 0 || d == rank - 1) return softmax_last(name, x, log);
  Tensor y = softmax_last(name, contiguous(transpose(x, d, rank - 1)), log);
  return contiguous(transpose(y, d, rank - 1));
}

// ---- reference kernels: plain loops in double ----

// Rows and row length of a kernel operand (a 0-d tensor is one row of one).
std::pair<int64_t, int64_t> rows_of(const Tensor& t) {
  int64_t n = t.dim() ? t.shape().back() : 1;
  return {n ? t.numel() / n : 0, n};
}

void softmax_ref(const Tensor& x, Tensor& y, bool log) {
  auto [rows, n] = rows_of(x);
  const DType t = x.dtype();
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t base = r * n;
    double m = -std::numeric_limits<double>::infinity();
    for (int64_t i = 0; i < n; ++i) m = std::max(m, load_as_double(x.data_ptr(), t, base + i));
    double s = 0;
    for (int64_t i = 0; i < n; ++i) s += std::exp(load_as_double(x.data_ptr(), t, base + i) - m);
    const double lse = m + std::log(s);
    for (int64_t i = 0; i < n; ++i) {
      double v = load_as_double(x.data_ptr(), t, base + i);
      store_from_double(y.data_ptr(), t, base + i, log ? v - lse : std::exp(v - m) / s);
    }
  }
}

void softmax_backward_ref(const Tensor& y, const Tensor& gy, Tensor& gx, bool log) {
  auto [rows, n] = rows_of(y);
  const DType t = y.dtype();
  auto Y = [&](int64_t i) { return load_as_double(y.data_ptr(), t, i); };
  auto G = [&](int64_t i) { return load_as_double(gy.data_ptr(), t, i); };
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t base = r * n;
    double s = 0;  // sum(gy * y) for softmax, sum(gy) for log-softmax
    for (int64_t i = base; i < base + n; ++i) s += log ? G(i) : G(i) * Y(i);
    for (int64_t i = base; i < base + n; ++i)
      store_from_double(gx.data_ptr(), t, i, log ? G(i) - std::exp(Y(i)) * s : Y(i) * (G(i) - s));
  }
}

}  // namespace

Tensor softmax(const Tensor& x, int64_t dim) {
  return softmax_dim("softmax", x, dim, false);
}
Tensor log_softmax(const Tensor& x, int64_t dim) {
  return softmax_dim("log_softmax", x, dim, true);
}

MYRIAD_REGISTER_KERNEL(softmax_kernels, Backend::Reference, &softmax_ref);
MYRIAD_REGISTER_KERNEL(softmax_backward_kernels, Backend::Reference, &softmax_backward_ref);

}  // namespace myriad::ops
