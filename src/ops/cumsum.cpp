// Cumulative sum: checks, autograd (the gradient of a scan is the scan in the other direction),
// and the reference kernel.
#include "ops/cumsum.h"

#include <vector>

#include "core/autograd.h"
#include "ops/check.h"

namespace myriad::ops {

KernelTable<CumsumKernel>& cumsum_kernels() {
  static KernelTable<CumsumKernel> t("cumsum");
  return t;
}

namespace {
Tensor scan(const Tensor& x, int64_t dim, bool reverse) {
  int64_t outer = 1, n = 1, inner = 1;
  if (x.dim()) {
    n = x.shape()[dim];
    for (int64_t d = 0; d < dim; ++d) outer *= x.shape()[d];
    for (int64_t d = dim + 1; d < x.dim(); ++d) inner *= x.shape()[d];
  }
  Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
  cumsum_kernels().get(x.device(), x.dtype())(x.detach().contiguous(), outer, n, inner, reverse,
                                              out);
  if (needs_grad({&x}))
    record("cumsum", out, {x}, [dim, reverse](const Tensor& g) -> std::vector<Tensor> {
      return {scan(g, dim, !reverse)};
    });
  return out;
}
}  // namespace

Tensor cumsum(const Tensor& x, int64_t dim) {
  check_inputs("cumsum", {&x});
  check_floating("cumsum", x);
  return scan(x, wrap_dim("cumsum", dim, x.dim()), false);
}

// ---- reference kernel ----
namespace {
void cumsum_ref(const Tensor& x, int64_t outer, int64_t n, int64_t inner, bool reverse,
                Tensor& out) {
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < inner; ++i) {
      double acc = 0;
      for (int64_t s = 0; s < n; ++s) {
        int64_t e = (o * n + (reverse ? n - 1 - s : s)) * inner + i;
        acc += load_as_double(x.data_ptr(), x.dtype(), e);
        store_from_double(out.data_ptr(), out.dtype(), e, acc);
      }
    }
}
}  // namespace
MYRIAD_REGISTER_KERNEL(cumsum_kernels, Backend::Reference, &cumsum_ref);

}  // namespace myriad::ops
