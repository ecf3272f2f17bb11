// Element-wise ops: argument checks, autograd records, and the plain reference kernels.
#include "ops/elementwise.h"

#include "core/autograd.h"
#include "core/strided.h"
#include "ops/check.h"
#include "ops/reduce.h"
#include "ops/shape.h"

namespace myriad::ops {

KernelTable<BinaryKernel>& binary_kernels() {
  static KernelTable<BinaryKernel> t("binary");
  return t;
}
KernelTable<ScalarKernel>& scalar_kernels() {
  static KernelTable<ScalarKernel> t("binary_scalar");
  return t;
}
KernelTable<PowKernel>& pow_kernels() {
  static KernelTable<PowKernel> t("pow");
  return t;
}
KernelTable<UnaryKernel>& unary_kernels() {
  static KernelTable<UnaryKernel> t("unary");
  return t;
}
KernelTable<UnaryBackwardKernel>& unary_backward_kernels() {
  static KernelTable<UnaryBackwardKernel> t("unary_backward");
  return t;
}
KernelTable<AxpyKernel>& axpy_kernels() {
  static KernelTable<AxpyKernel> t("axpy");
  return t;
}

const char* op_name(BinaryOp op) {
  constexpr const char* names[] = {"add", "sub", "mul", "div", "maximum", "minimum", "ge", "le"};
  return names[static_cast<int>(op)];
}
const char* op_name(UnaryOp op) {
  constexpr const char* names[] = {"neg", "exp",     "log",  "sqrt", "rsqrt",    "square",
                                   "abs", "sigmoid", "silu", "tanh", "softplus", "relu"};
  return names[static_cast<int>(op)];
}

Shape broadcast_shapes(const char* op, const Shape& a, const Shape& b) {
  size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    MYRIAD_CHECK(da == db || da == 1 || db == 1, op, ": shapes ", shape_str(a), " and ",
                 shape_str(b), " cannot be broadcast");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

Tensor expand(const Tensor& t, const Shape& shape) {
  size_t n = shape.size();
  MYRIAD_CHECK(t.dim() <= static_cast<int64_t>(n), "expand: ", t.desc(), " to ", shape_str(shape));
  Shape st(n, 0);
  size_t lead = n - t.dim();
  for (size_t i = 0; i < static_cast<size_t>(t.dim()); ++i) {
    int64_t d = t.shape()[i];
    MYRIAD_CHECK(d == shape[lead + i] || d == 1, "expand: ", t.desc(), " to ", shape_str(shape));
    st[lead + i] = d == 1 && shape[lead + i] != 1 ? 0 : t.strides()[i];
  }
  return t.view_as_strided(shape, st, t.offset());
}

Tensor sum_to(const Tensor& g, const Shape& shape) {
  if (g.shape() == shape) return g;
  std::vector<int64_t> dims;
  size_t lead = g.dim() - shape.size();
  for (size_t i = 0; i < static_cast<size_t>(g.dim()); ++i)
    if (i < lead || (shape[i - lead] == 1 && g.shape()[i] != 1)) dims.push_back(i);
  Tensor s = sum(g, dims, /*keepdim=*/true);
  return reshape(s, shape);
}

// ---- binary ----

Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b) {
  const char* name = op_name(op);
  Device dev = check_inputs(name, {&a, &b});
  check_same_dtype(name, {&a, &b});
  Shape shape = broadcast_shapes(name, a.shape(), b.shape());
  Tensor out = Tensor::empty(shape, a.dtype(), dev);
  binary_kernels().get(dev, a.dtype())(op, expand(a, shape), expand(b, shape), out);
  if (needs_grad({&a, &b})) {
    Shape sa = a.shape(), sb = b.shape();
    Tensor ta = a.detach(), tb = b.detach(), ty = out.detach();
    record(name, out, {a, b}, [op, sa, sb, ta, tb, ty](const Tensor& g) -> std::vector<Tensor> {
      switch (op) {
        case BinaryOp::Add:
          return {sum_to(g, sa), sum_to(g, sb)};
        case BinaryOp::Sub:
          return {sum_to(g, sa), sum_to(neg(g), sb)};
        case BinaryOp::Mul:
          return {sum_to(mul(g, tb), sa), sum_to(mul(g, ta), sb)};
        case BinaryOp::Div: {
          Tensor ga = div(g, tb);
          return {sum_to(ga, sa), sum_to(neg(mul(ga, ty)), sb)};
        }
        case BinaryOp::Max:
        case BinaryOp::Min: {  // the gradient goes to the selected operand (a on ties)
          Tensor is_a = binary(op == BinaryOp::Max ? BinaryOp::Ge : BinaryOp::Le, ta, tb);
          Tensor ga = mul(g, is_a);
          return {sum_to(ga, sa), sum_to(sub(g, ga), sb)};
        }
        default:
          throw Error(cat(op_name(op), " has no backward"));
      }
      return {};
    });
  }
  return out;
}

Tensor add(const Tensor& a, const Tensor& b) {
  return binary(BinaryOp::Add, a, b);
}
Tensor sub(const Tensor& a, const Tensor& b) {
  return binary(BinaryOp::Sub, a, b);
}
Tensor mul(const Tensor& a, const Tensor& b) {
  return binary(BinaryOp::Mul, a, b);
}
Tensor div(const Tensor& a, const Tensor& b) {
  return binary(BinaryOp::Div, a, b);
}
Tensor maximum(const Tensor& a, const Tensor& b) {
  return binary(BinaryOp::Max, a, b);
}
Tensor minimum(const Tensor& a, const Tensor& b) {
  return binary(BinaryOp::Min, a, b);
}
Tensor ge(const Tensor& a, const Tensor& b) {
  NoGradGuard no_grad;
  return binary(BinaryOp::Ge, a, b);
}
Tensor le(const Tensor& a, const Tensor& b) {
  NoGradGuard no_grad;
  return binary(BinaryOp::Le, a, b);
}

// ---- scalar ----

static Tensor scalar_op(BinaryOp op, const Tensor& a, double s, bool reversed) {
  const char* name = op_name(op);
  Device dev = check_inputs(name, {&a});
  check_floating(name, a);
  Tensor x = a.contiguous();
  Tensor out = Tensor::empty(a.shape(), a.dtype(), dev);
  scalar_kernels().get(dev, a.dtype())(op, x, s, reversed, out);
  if (needs_grad({&a})) {
    Tensor ty = out.detach();
    record(name, out, {a}, [op, s, reversed, ty](const Tensor& g) -> std::vector<Tensor> {
      switch (op) {
        case BinaryOp::Add:
          return {g};
        case BinaryOp::Sub:
          return {reversed ? neg(g) : g};
        case BinaryOp::Mul:
          return {mul(g, s)};
        case BinaryOp::Div:  // s / a: d/da = -s / a^2 = -y^2 / s
          return {reversed ? mul(mul(g, square(ty)), -1.0 / s) : mul(g, 1.0 / s)};
        default:
          throw Error(cat(op_name(op), " with a scalar has no backward"));
      }
    });
  }
  return out;
}

Tensor add(const Tensor& a, double s) {
  return scalar_op(BinaryOp::Add, a, s, false);
}
Tensor mul(const Tensor& a, double s) {
  return scalar_op(BinaryOp::Mul, a, s, false);
}
Tensor rsub(double s, const Tensor& a) {
  return scalar_op(BinaryOp::Sub, a, s, true);
}
Tensor rdiv(double s, const Tensor& a) {
  return scalar_op(BinaryOp::Div, a, s, true);
}

Tensor pow(const Tensor& a, double p) {
  Device dev = check_inputs("pow", {&a});
  check_floating("pow", a);
  Tensor x = a.contiguous();
  Tensor out = Tensor::empty(a.shape(), a.dtype(), dev);
  pow_kernels().get(dev, a.dtype())(x, p, out);
  if (needs_grad({&a})) {
    record("pow", out, {a}, [x = x.detach(), p](const Tensor& g) -> std::vector<Tensor> {
      return {mul(mul(g, pow(x, p - 1.0)), p)};
    });
  }
  return out;
}

// ---- unary ----

Tensor unary(UnaryOp op, const Tensor& x_in) {
  const char* name = op_name(op);
  Device dev = check_inputs(name, {&x_in});
  check_floating(name, x_in);
  Tensor x = x_in.contiguous();
  Tensor out = Tensor::empty(x.shape(), x.dtype(), dev);
  unary_kernels().get(dev, x.dtype())(op, x, out);
  if (needs_grad({&x_in})) {
    record(name, out, {x_in},
           [op, x = x.detach(), y = out.detach()](const Tensor& g) -> std::vector<Tensor> {
             Tensor gc = g.contiguous();
             Tensor gx = Tensor::empty(x.shape(), x.dtype(), x.device());
             unary_backward_kernels().get(x.device(), x.dtype())(op, x, y, gc, gx);
             return {gx};
           });
  }
  return out;
}

Tensor neg(const Tensor& x) {
  return unary(UnaryOp::Neg, x);
}
Tensor exp(const Tensor& x) {
  return unary(UnaryOp::Exp, x);
}
Tensor log(const Tensor& x) {
  return unary(UnaryOp::Log, x);
}
Tensor sqrt(const Tensor& x) {
  return unary(UnaryOp::Sqrt, x);
}
Tensor rsqrt(const Tensor& x) {
  return unary(UnaryOp::Rsqrt, x);
}
Tensor square(const Tensor& x) {
  return unary(UnaryOp::Square, x);
}
Tensor abs(const Tensor& x) {
  return unary(UnaryOp::Abs, x);
}
Tensor sigmoid(const Tensor& x) {
  return unary(UnaryOp::Sigmoid, x);
}
Tensor silu(const Tensor& x) {
  return unary(UnaryOp::Silu, x);
}
Tensor tanh(const Tensor& x) {
  return unary(UnaryOp::Tanh, x);
}
Tensor softplus(const Tensor& x) {
  return unary(UnaryOp::Softplus, x);
}
Tensor relu(const Tensor& x) {
  return unary(UnaryOp::Relu, x);
}

// ---- in place ----

void add_(Tensor& a, const Tensor& b, double alpha) {
  Device dev = check_inputs("add_", {&a, &b});
  check_same_dtype("add_", {&a, &b});
  MYRIAD_CHECK(a.shape() == b.shape(), "add_: shapes differ (", descs({&a, &b}), ")");
  MYRIAD_CHECK(a.is_contiguous(), "add_: destination must be contiguous, got ", a.desc());
  axpy_kernels().get(dev, a.dtype())(a, b.contiguous(), alpha);
}
void mul_(Tensor& a, double s) {
  Device dev = check_inputs("mul_", {&a});
  MYRIAD_CHECK(a.is_contiguous(), "mul_: destination must be contiguous, got ", a.desc());
  scalar_kernels().get(dev, a.dtype())(BinaryOp::Mul, a, s, false, a);
}

// ---- reference kernels: plain loops in double ----
namespace {

void binary_ref(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out) {
  const void* pa = a.data_ptr();
  const void* pb = b.data_ptr();
  void* po = out.data_ptr();
  DType t = out.dtype();
  for_each_offset<3>(out.shape(), {&a.strides(), &b.strides(), &out.strides()}, [&](auto o) {
    store_from_double(po, t, o[2],
                      apply_binary(op, load_as_double(pa, t, o[0]), load_as_double(pb, t, o[1])));
  });
}

void scalar_ref(BinaryOp op, const Tensor& a, double s, bool reversed, Tensor& out) {
  for (int64_t i = 0; i < a.numel(); ++i) {
    double x = load_as_double(a.data_ptr(), a.dtype(), i);
    store_from_double(out.data_ptr(), out.dtype(), i,
                      reversed ? apply_binary(op, s, x) : apply_binary(op, x, s));
  }
}

void pow_ref(const Tensor& a, double p, Tensor& out) {
  for (int64_t i = 0; i < a.numel(); ++i)
    store_from_double(out.data_ptr(), out.dtype(), i,
                      std::pow(load_as_double(a.data_ptr(), a.dtype(), i), p));
}

void unary_ref(UnaryOp op, const Tensor& x, Tensor& out) {
  for (int64_t i = 0; i < x.numel(); ++i)
    store_from_double(out.data_ptr(), out.dtype(), i,
                      apply_unary(op, load_as_double(x.data_ptr(), x.dtype(), i)));
}

void unary_backward_ref(UnaryOp op, const Tensor& x, const Tensor& y, const Tensor& gy,
                        Tensor& gx) {
  DType t = x.dtype();
  for (int64_t i = 0; i < x.numel(); ++i) {
    double d = unary_derivative(op, load_as_double(x.data_ptr(), t, i),
                                load_as_double(y.data_ptr(), t, i));
    store_from_double(gx.data_ptr(), t, i, d * load_as_double(gy.data_ptr(), t, i));
  }
}

void axpy_ref(Tensor& a, const Tensor& b, double alpha) {
  for (int64_t i = 0; i < a.numel(); ++i)
    store_from_double(a.data_ptr(), a.dtype(), i,
                      load_as_double(a.data_ptr(), a.dtype(), i) +
                          alpha * load_as_double(b.data_ptr(), b.dtype(), i));
}

Tensor grad_add(const Tensor& a, const Tensor& b) {
  return add(a, b);
}
const bool g_grad_add_set = (set_grad_add_fn(&grad_add), true);

}  // namespace

MYRIAD_REGISTER_KERNEL(binary_kernels, Backend::Reference, &binary_ref);
MYRIAD_REGISTER_KERNEL(scalar_kernels, Backend::Reference, &scalar_ref);
MYRIAD_REGISTER_KERNEL(pow_kernels, Backend::Reference, &pow_ref);
MYRIAD_REGISTER_KERNEL(unary_kernels, Backend::Reference, &unary_ref);
MYRIAD_REGISTER_KERNEL(unary_backward_kernels, Backend::Reference, &unary_backward_ref);
MYRIAD_REGISTER_KERNEL(axpy_kernels, Backend::Reference, &axpy_ref);

}  // namespace myriad::ops
