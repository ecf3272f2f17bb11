#include "ops/shape.h"

#include <numeric>

#include "core/autograd.h"
#include "ops/check.h"

namespace myriad::ops {

Tensor contiguous(const Tensor& x) {
  check_inputs("contiguous", {&x});
  if (x.is_contiguous()) return x;
  Tensor out = x.detach().clone();
  record("contiguous", out, {x}, [](const Tensor& g) -> std::vector<Tensor> { return {g}; });
  return out;
}

Tensor reshape(const Tensor& x, Shape shape) {
  check_inputs("reshape", {&x});
  int64_t known = 1, infer = -1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      MYRIAD_CHECK(infer < 0, "reshape: more than one -1 in ", shape_str(shape));
      infer = static_cast<int64_t>(i);
    } else {
      MYRIAD_CHECK(shape[i] >= 0, "reshape: negative size in ", shape_str(shape));
      known *= shape[i];
    }
  }
  if (infer >= 0) {
    MYRIAD_CHECK(known > 0 && x.numel() % known == 0, "reshape: cannot view ", x.desc(), " as ",
                 shape_str(shape));
    shape[infer] = x.numel() / known;
  }
  MYRIAD_CHECK(shape_numel(shape) == x.numel(), "reshape: cannot view ", x.desc(), " as ",
               shape_str(shape), " (", x.numel(), " elements vs ", shape_numel(shape), ")");
  Tensor src = contiguous(x);
  Tensor out = src.detach().view_as_strided(shape, contiguous_strides(shape), src.offset());
  Shape in_shape = x.shape();
  record("reshape", out, {src},
         [in_shape](const Tensor& g) -> std::vector<Tensor> { return {reshape(g, in_shape)}; });
  return out;
}

Tensor flatten(const Tensor& x) {
  return reshape(x, {x.numel()});
}

Tensor permute(const Tensor& x, const std::vector<int64_t>& order) {
  check_inputs("permute", {&x});
  int64_t n = x.dim();
  MYRIAD_CHECK(static_cast<int64_t>(order.size()) == n, "permute: order of length ", order.size(),
               " for ", x.desc());
  Shape shape(n), strides(n);
  std::vector<int64_t> inverse(n, -1);
  for (int64_t i = 0; i < n; ++i) {
    int64_t d = wrap_dim("permute", order[i], n);
    MYRIAD_CHECK(inverse[d] < 0, "permute: dimension ", d, " repeated");
    inverse[d] = i;
    shape[i] = x.shape()[d];
    strides[i] = x.strides()[d];
  }
  Tensor out = x.detach().view_as_strided(shape, strides, x.offset());
  record("permute", out, {x},
         [inverse](const Tensor& g) -> std::vector<Tensor> { return {permute(g, inverse)}; });
  return out;
}

Tensor transpose(const Tensor& x, int64_t d0, int64_t d1) {
  int64_t n = x.dim();
  d0 = wrap_dim("transpose", d0, n);
  d1 = wrap_dim("transpose", d1, n);
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::swap(order[d0], order[d1]);
  return permute(x, order);
}

Tensor slice(const Tensor& x, int64_t dim, int64_t start, int64_t end) {
  check_inputs("slice", {&x});
  dim = wrap_dim("slice", dim, x.dim());
  int64_t size = x.shape()[dim];
  if (start < 0) start += size;
  if (end < 0) end += size;
  end = std::min(end, size);
  MYRIAD_CHECK(start >= 0 && start <= end, "slice: range [", start, ", ", end, ") of dimension ",
               dim, " of ", x.desc());
  Shape shape = x.shape();
  shape[dim] = end - start;
  Tensor out =
      x.detach().view_as_strided(shape, x.strides(), x.offset() + start * x.strides()[dim]);
  // The backward returns the part's gradient; the autograd pass adds it into that part of x's
  // (Node::Part), so the parts of a split share one gradient buffer.
  record("slice", out, {x}, [](const Tensor& g) -> std::vector<Tensor> { return {g}; });
  if (out.grad_fn()) out.grad_fn()->part = {dim, start, end, x.shape()};
  return out;
}

Tensor unsqueeze(const Tensor& x, int64_t dim) {
  dim = wrap_dim("unsqueeze", dim, x.dim() + 1);
  Shape s = x.shape();
  s.insert(s.begin() + dim, 1);
  return reshape(x, s);
}

Tensor squeeze(const Tensor& x, int64_t dim) {
  dim = wrap_dim("squeeze", dim, x.dim());
  MYRIAD_CHECK(x.shape()[dim] == 1, "squeeze: dimension ", dim, " of ", x.desc(), " is not 1");
  Shape s = x.shape();
  s.erase(s.begin() + dim);
  return reshape(x, s);
}

Tensor concat(const std::vector<Tensor>& xs, int64_t dim) {
  MYRIAD_CHECK(!xs.empty(), "concat: no tensors");
  const Tensor& first = xs[0];
  check_inputs("concat", {&first});
  dim = wrap_dim("concat", dim, first.dim());
  Shape shape = first.shape();
  shape[dim] = 0;
  std::vector<int64_t> sizes;
  for (const Tensor& t : xs) {
    check_inputs("concat", {&first, &t});
    check_same_dtype("concat", {&first, &t});
    bool ok = t.dim() == first.dim();
    for (int64_t d = 0; ok && d < t.dim(); ++d) ok = d == dim || t.shape()[d] == first.shape()[d];
    MYRIAD_CHECK(ok, "concat: along dimension ", dim, ", ", t.desc(), " does not fit ",
                 first.desc());
    sizes.push_back(t.shape()[dim]);
    shape[dim] += t.shape()[dim];
  }
  Tensor out = Tensor::empty(shape, first.dtype(), first.device());
  int64_t at = 0;
  for (const Tensor& t : xs) {
    Shape ps = shape;
    ps[dim] = t.shape()[dim];
    Tensor part = out.view_as_strided(ps, out.strides(), at * out.strides()[dim]);
    part.copy_(t);
    at += t.shape()[dim];
  }
  record("concat", out, xs,
         [sizes, dim](const Tensor& g) -> std::vector<Tensor> { return split(g, sizes, dim); });
  return out;
}

std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim) {
  check_inputs("split", {&x});
  dim = wrap_dim("split", dim, x.dim());
  int64_t total = std::accumulate(sizes.begin(), sizes.end(), int64_t{0});
  MYRIAD_CHECK(total == x.shape()[dim], "split: sizes add up to ", total, " but dimension ", dim,
               " of ", x.desc(), " is ", x.shape()[dim]);
  std::vector<Tensor> out;
  int64_t at = 0;
  for (int64_t s : sizes) {
    out.push_back(slice(x, dim, at, at + s));
    at += s;
  }
  return out;
}

}  // namespace myriad::ops
