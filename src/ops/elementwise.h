// Element-wise arithmetic with NumPy broadcasting, scalar forms, and the activations.
#pragma once
#include "core/tensor.h"
#include "ops/dispatch.h"

namespace myriad::ops {

// Ge and Le give 1 or 0 in the operands' dtype (masks; not differentiable).
enum class BinaryOp : uint8_t { Add, Sub, Mul, Div, Max, Min, Ge, Le };
enum class UnaryOp : uint8_t {
  Neg,
  Exp,
  Log,
  Sqrt,
  Rsqrt,
  Square,
  Abs,
  Sigmoid,
  Silu,
  Tanh,
  Softplus,
  Relu
};
const char* op_name(BinaryOp op);
const char* op_name(UnaryOp op);

Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor maximum(const Tensor& a, const Tensor& b);
Tensor minimum(const Tensor& a, const Tensor& b);
Tensor ge(const Tensor& a, const Tensor& b);  // a >= b as 1/0
Tensor le(const Tensor& a, const Tensor& b);  // a <= b as 1/0
Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b);

// y = a (op) s for a scalar s; rsub/rdiv are s - a and s / a.
Tensor add(const Tensor& a, double s);
Tensor mul(const Tensor& a, double s);
Tensor rsub(double s, const Tensor& a);
Tensor rdiv(double s, const Tensor& a);
Tensor pow(const Tensor& a, double p);

Tensor unary(UnaryOp op, const Tensor& x);
Tensor neg(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor rsqrt(const Tensor& x);
Tensor square(const Tensor& x);
Tensor abs(const Tensor& x);
Tensor sigmoid(const Tensor& x);
Tensor silu(const Tensor& x);
Tensor tanh(const Tensor& x);
Tensor softplus(const Tensor& x);  // log(1 + e^x); x when x > 20
Tensor relu(const Tensor& x);

// The shape a and b broadcast to, or an error naming the op and both shapes.
Shape broadcast_shapes(const char* op, const Shape& a, const Shape& b);
// A stride-0 view of t expanded to `shape` (no copy).
Tensor expand(const Tensor& t, const Shape& shape);
// Sums g down to `shape` over broadcast dimensions (the backward of broadcasting).
Tensor sum_to(const Tensor& g, const Shape& shape);

// In place, no autograd (optimizers, gradient clipping): a += alpha * b; a *= s.
void add_(Tensor& a, const Tensor& b, double alpha = 1.0);
void mul_(Tensor& a, double s);

// ---- kernels ----
// Operands share a dtype; a and b are views of out's shape (stride 0 where broadcast); out is
// contiguous. Scalar kernels compute out = a (op) s, or s (op) a when `reversed`.
using BinaryKernel = void (*)(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out);
using ScalarKernel = void (*)(BinaryOp op, const Tensor& a, double s, bool reversed, Tensor& out);
using PowKernel = void (*)(const Tensor& a, double p, Tensor& out);
// x contiguous, out contiguous, same shape and dtype.
using UnaryKernel = void (*)(UnaryOp op, const Tensor& x, Tensor& out);
// gx = gy * f'(x), given x, y = f(x) and gy, all contiguous with one shape.
using UnaryBackwardKernel = void (*)(UnaryOp op, const Tensor& x, const Tensor& y, const Tensor& gy,
                                     Tensor& gx);
// a += alpha * b in place, same shape, both contiguous.
using AxpyKernel = void (*)(Tensor& a, const Tensor& b, double alpha);

KernelTable<BinaryKernel>& binary_kernels();
KernelTable<ScalarKernel>& scalar_kernels();
KernelTable<PowKernel>& pow_kernels();
KernelTable<UnaryKernel>& unary_kernels();
KernelTable<UnaryBackwardKernel>& unary_backward_kernels();
KernelTable<AxpyKernel>& axpy_kernels();

// Scalar math shared by the reference and the CPU kernels (double or float).
template <class T>
T apply_binary(BinaryOp op, T a, T b);
template <class T>
T apply_unary(UnaryOp op, T x);
// d f(x) / dx, given x and y = f(x).
template <class T>
T unary_derivative(UnaryOp op, T x, T y);

}  // namespace myriad::ops

#include "ops/elementwise_math.h"
