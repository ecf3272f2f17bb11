// Top-k: checks, autograd (the gradient scatters back to the picked positions), and the
// reference kernel (a stable sort of each row).
#include "ops/topk.h"

#include <algorithm>
#include <numeric>
#include <vector>

#include "core/autograd.h"
#include "ops/check.h"
#include "ops/index.h"

namespace myriad::ops {

KernelTable<TopKKernel>& topk_kernels() {
  static KernelTable<TopKKernel> t("topk");
  return t;
}

TopK topk(const Tensor& x, int64_t k) {
  Device dev = check_inputs("topk", {&x});
  check_floating("topk", x);
  MYRIAD_CHECK(x.dim() >= 1, "topk: expected at least 1 dimension, got ", x.desc());
  const int64_t n = x.shape().back();
  MYRIAD_CHECK(k >= 0 && k <= n, "topk: k = ", k, " is out of range for the last dimension (", n,
               ") of ", x.desc());
  Shape shape = x.shape();
  shape.back() = k;
  TopK r{Tensor::empty(shape, x.dtype(), dev), Tensor::empty(shape, DType::I64, dev)};
  topk_kernels().get(dev, x.dtype())(x.detach().contiguous(), k, r.values, r.indices);
  if (needs_grad({&x}))
    record("topk", r.values, {x},
           [in_shape = x.shape(), idx = r.indices](const Tensor& g) -> std::vector<Tensor> {
             Tensor gx = Tensor::zeros(in_shape, g.dtype(), g.device());
             return {scatter_add(gx, -1, idx, g)};
           });
  return r;
}

// ---- reference kernel ----
namespace {
void topk_ref(const Tensor& x, int64_t k, Tensor& values, Tensor& indices) {
  const int64_t n = x.dim() ? x.shape().back() : 1, rows = n ? x.numel() / n : 0;
  std::vector<double> v(n);
  std::vector<int64_t> order(n);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < n; ++i) v[i] = load_as_double(x.data_ptr(), x.dtype(), r * n + i);
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(),
              [&](int64_t a, int64_t b) { return topk_before(v[a], a, v[b], b); });
    for (int64_t j = 0; j < k; ++j) {
      store_from_double(values.data_ptr(), values.dtype(), r * k + j, v[order[j]]);
      indices.data<int64_t>()[r * k + j] = order[j];
    }
  }
}
}  // namespace
MYRIAD_REGISTER_KERNEL(topk_kernels, Backend::Reference, &topk_ref);

}  // namespace myriad::ops
