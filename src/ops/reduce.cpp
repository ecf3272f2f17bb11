#include "ops/reduce.h"

#include <algorithm>
#include <limits>

#include "core/autograd.h"
#include "ops/check.h"
#include "ops/elementwise.h"
#include "ops/index.h"
#include "ops/shape.h"

namespace myriad::ops {

KernelTable<ReduceKernel>& reduce_kernels() {
  static KernelTable<ReduceKernel> t("reduce");
  return t;
}

namespace {

// Normalised, sorted, unique dims; empty input means all.
std::vector<int64_t> norm_dims(const char* op, std::vector<int64_t> dims, int64_t rank) {
  if (dims.empty()) {
    for (int64_t d = 0; d < rank; ++d) dims.push_back(d);
    return dims;
  }
  for (auto& d : dims) d = wrap_dim(op, d, rank);
  std::sort(dims.begin(), dims.end());
  MYRIAD_CHECK(std::adjacent_find(dims.begin(), dims.end()) == dims.end(), op,
               ": repeated dimension");
  return dims;
}

Shape reduced_shape(const Shape& s, const std::vector<int64_t>& dims, bool keepdim) {
  Shape out;
  for (int64_t d = 0; d < static_cast<int64_t>(s.size()); ++d) {
    bool r = std::binary_search(dims.begin(), dims.end(), d);
    if (!r)
      out.push_back(s[d]);
    else if (keepdim)
      out.push_back(1);
  }
  return out;
}

// Runs the reduce kernel over dims, permuting them into one block first when they are not.
Tensor reduce_raw(const char* op, ReduceOp rop, const Tensor& x, const std::vector<int64_t>& dims,
                  Tensor* idx) {
  int64_t rank = x.dim();
  bool block = dims.empty() || dims.back() - dims.front() + 1 == static_cast<int64_t>(dims.size());
  Tensor src = x;
  int64_t first = dims.empty() ? 0 : dims.front();
  if (!block) {  // move reduced dims to the end
    std::vector<int64_t> order;
    for (int64_t d = 0; d < rank; ++d)
      if (!std::binary_search(dims.begin(), dims.end(), d)) order.push_back(d);
    first = static_cast<int64_t>(order.size());
    order.insert(order.end(), dims.begin(), dims.end());
    src = x.detach().view_as_strided(
        [&] {
          Shape s;
          for (auto d : order) s.push_back(x.shape()[d]);
          return s;
        }(),
        [&] {
          Shape s;
          for (auto d : order) s.push_back(x.strides()[d]);
          return s;
        }(),
        x.offset());
  }
  src = src.contiguous();
  int64_t outer = 1, r = 1, inner = 1;
  for (int64_t d = 0; d < rank; ++d) {
    int64_t n = src.shape()[d];
    if (d < first)
      outer *= n;
    else if (d < first + static_cast<int64_t>(dims.size()))
      r *= n;
    else
      inner *= n;
  }
  Tensor out = Tensor::empty({outer * inner}, x.dtype(), x.device());
  if (idx) *idx = Tensor::empty({outer * inner}, DType::I64, x.device());
  MYRIAD_CHECK(r > 0 || rop == ReduceOp::Sum, op, ": reduction over an empty dimension of ",
               x.desc());
  reduce_kernels().get(x.device(), x.dtype())(rop, src, outer, r, inner, out, idx);
  return out;
}

}  // namespace

Tensor sum(const Tensor& x, std::vector<int64_t> dims_in, bool keepdim) {
  check_inputs("sum", {&x});
  check_floating("sum", x);
  auto dims = norm_dims("sum", dims_in, x.dim());
  Shape out_shape = reduced_shape(x.shape(), dims, keepdim);
  Tensor out = reduce_raw("sum", ReduceOp::Sum, x, dims, nullptr);
  out = out.view_as_strided(out_shape, contiguous_strides(out_shape), 0);
  Shape in_shape = x.shape();
  Shape keep_shape = reduced_shape(x.shape(), dims, true);
  record("sum", out, {x}, [in_shape, keep_shape](const Tensor& g) -> std::vector<Tensor> {
    return {expand(reshape(g, keep_shape), in_shape).contiguous()};
  });
  return out;
}

Tensor mean(const Tensor& x, std::vector<int64_t> dims, bool keepdim) {
  auto nd = norm_dims("mean", dims, x.dim());
  int64_t count = 1;
  for (auto d : nd) count *= x.shape()[d];
  MYRIAD_CHECK(count > 0, "mean: reduction over an empty dimension of ", x.desc());
  return mul(sum(x, nd, keepdim), 1.0 / static_cast<double>(count));
}

Tensor norm(const Tensor& x, std::vector<int64_t> dims, bool keepdim) {
  return sqrt(sum(square(x), std::move(dims), keepdim));
}

MaxResult max(const Tensor& x, int64_t dim, bool keepdim) {
  check_inputs("max", {&x});
  check_floating("max", x);
  dim = wrap_dim("max", dim, x.dim());
  Shape out_shape = reduced_shape(x.shape(), {dim}, keepdim);
  Shape keep_shape = reduced_shape(x.shape(), {dim}, true);
  Tensor idx;
  Tensor out = reduce_raw("max", ReduceOp::Max, x, {dim}, &idx);
  out = out.view_as_strided(out_shape, contiguous_strides(out_shape), 0);
  idx = idx.view_as_strided(out_shape, contiguous_strides(out_shape), 0);
  Shape in_shape = x.shape();
  Tensor idx_keep = idx.view_as_strided(keep_shape, contiguous_strides(keep_shape), 0);
  record("max", out, {x},
         [in_shape, keep_shape, dim, idx_keep](const Tensor& g) -> std::vector<Tensor> {
           Tensor gx = Tensor::zeros(in_shape, g.dtype(), g.device());
           return {scatter_add(gx, dim, idx_keep, reshape(g, keep_shape))};
         });
  return {out, idx};
}

// ---- reference kernel ----
namespace {
void reduce_ref(ReduceOp op, const Tensor& x, int64_t outer, int64_t r, int64_t inner, Tensor& out,
                Tensor* idx) {
  const void* px = x.data_ptr();
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < inner; ++i) {
      double acc = op == ReduceOp::Sum ? 0.0 : -std::numeric_limits<double>::infinity();
      int64_t arg = 0;
      for (int64_t k = 0; k < r; ++k) {
        double v = load_as_double(px, x.dtype(), (o * r + k) * inner + i);
        if (op == ReduceOp::Sum) {
          acc += v;
        } else if (v > acc || (k == 0) || (std::isnan(v) && !std::isnan(acc))) {
          acc = v;
          arg = k;
        }
      }
      store_from_double(out.data_ptr(), out.dtype(), o * inner + i, acc);
      if (idx) idx->data<int64_t>()[o * inner + i] = arg;
    }
}
}  // namespace
MYRIAD_REGISTER_KERNEL(reduce_kernels, Backend::Reference, &reduce_ref);

}  // namespace myriad::ops
