// CUDA element-wise kernels: f32 and bf16 computed in f32 (f64 in f64) with the scalar formulas
// the reference uses (ops/elementwise_math.h). Binary operands are strided views of the output's
// shape (stride 0 where broadcast); the rest are contiguous.
#include <cmath>

#include "backend/cuda/kernels.cuh"
#include "ops/elementwise.h"

namespace myriad::gpu {
namespace {
using ops::BinaryOp;
using ops::UnaryOp;

template <class T>
__global__ void binary_kernel(BinaryOp op, const T* a, const T* b, T* out, Layout<2> l, int64_t n) {
  for (int64_t i = global_thread(); i < n; i += global_threads()) {
    int64_t off[2];
    l.offsets(i, off);
    out[i] = st<T>(ops::apply_binary(op, ld(a[off[0]]), ld(b[off[1]])));
  }
}

// a may alias out (mul_).
template <class T>
__global__ void scalar_kernel(BinaryOp op, const T* a, Acc<T> s, bool reversed, T* out, int64_t n) {
  for (int64_t i = global_thread(); i < n; i += global_threads()) {
    Acc<T> x = ld(a[i]);
    out[i] = st<T>(reversed ? ops::apply_binary(op, s, x) : ops::apply_binary(op, x, s));
  }
}

template <class T>
__global__ void pow_kernel(const T* a, Acc<T> p, T* out, int64_t n) {
  for (int64_t i = global_thread(); i < n; i += global_threads())
    out[i] = st<T>(std::pow(ld(a[i]), p));
}

template <class T>
__global__ void unary_kernel(UnaryOp op, const T* x, T* out, int64_t n) {
  for (int64_t i = global_thread(); i < n; i += global_threads())
    out[i] = st<T>(ops::apply_unary(op, ld(x[i])));
}

template <class T>
__global__ void unary_backward_kernel(UnaryOp op, const T* x, const T* y, const T* gy, T* gx,
                                      int64_t n) {
  for (int64_t i = global_thread(); i < n; i += global_threads())
    gx[i] = st<T>(ld(gy[i]) * ops::unary_derivative(op, ld(x[i]), ld(y[i])));
}

template <class T>
__global__ void axpy_kernel(T* a, const T* b, Acc<T> alpha, int64_t n) {
  for (int64_t i = global_thread(); i < n; i += global_threads())
    a[i] = st<T>(ld(a[i]) + alpha * ld(b[i]));
}

void binary_cuda(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out) {
  const char* name = ops::op_name(op);
  const int64_t n = out.numel();
  if (n == 0) return;
  const Layout<2> l = make_layout<2>(name, out.shape(), {&a.strides(), &b.strides()});
  dispatch_float(name, out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    launch(name, out.device().index, grid_for(n), kThreads, &binary_kernel<T>, op, cptr<T>(a),
           cptr<T>(b), mptr<T>(out), l, n);
  });
}

void scalar_cuda(BinaryOp op, const Tensor& a, double s, bool reversed, Tensor& out) {
  const char* name = ops::op_name(op);
  const int64_t n = out.numel();
  if (n == 0) return;
  dispatch_float(name, out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    launch(name, out.device().index, grid_for(n), kThreads, &scalar_kernel<T>, op, cptr<T>(a),
           static_cast<Acc<T>>(s), reversed, mptr<T>(out), n);
  });
}

void pow_cuda(const Tensor& a, double p, Tensor& out) {
  const int64_t n = out.numel();
  if (n == 0) return;
  dispatch_float("pow", out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    launch("pow", out.device().index, grid_for(n), kThreads, &pow_kernel<T>, cptr<T>(a),
           static_cast<Acc<T>>(p), mptr<T>(out), n);
  });
}

void unary_cuda(UnaryOp op, const Tensor& x, Tensor& out) {
  const char* name = ops::op_name(op);
  const int64_t n = out.numel();
  if (n == 0) return;
  dispatch_float(name, out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    launch(name, out.device().index, grid_for(n), kThreads, &unary_kernel<T>, op, cptr<T>(x),
           mptr<T>(out), n);
  });
}

void unary_backward_cuda(UnaryOp op, const Tensor& x, const Tensor& y, const Tensor& gy,
                         Tensor& gx) {
  const char* name = ops::op_name(op);
  const int64_t n = gx.numel();
  if (n == 0) return;
  dispatch_float(name, gx.dtype(), [&](auto tag) {
    using T = decltype(tag);
    launch(name, gx.device().index, grid_for(n), kThreads, &unary_backward_kernel<T>, op,
           cptr<T>(x), cptr<T>(y), cptr<T>(gy), mptr<T>(gx), n);
  });
}

void axpy_cuda(Tensor& a, const Tensor& b, double alpha) {
  const int64_t n = a.numel();
  if (n == 0) return;
  dispatch_float("add_", a.dtype(), [&](auto tag) {
    using T = decltype(tag);
    launch("add_", a.device().index, grid_for(n), kThreads, &axpy_kernel<T>, mptr<T>(a), cptr<T>(b),
           static_cast<Acc<T>>(alpha), n);
  });
}

}  // namespace

MYRIAD_REGISTER_KERNEL(ops::binary_kernels, ops::Backend::CUDA, &binary_cuda);
MYRIAD_REGISTER_KERNEL(ops::scalar_kernels, ops::Backend::CUDA, &scalar_cuda);
MYRIAD_REGISTER_KERNEL(ops::pow_kernels, ops::Backend::CUDA, &pow_cuda);
MYRIAD_REGISTER_KERNEL(ops::unary_kernels, ops::Backend::CUDA, &unary_cuda);
MYRIAD_REGISTER_KERNEL(ops::unary_backward_kernels, ops::Backend::CUDA, &unary_backward_cuda);
MYRIAD_REGISTER_KERNEL(ops::axpy_kernels, ops::Backend::CUDA, &axpy_cuda);

}  // namespace myriad::gpu
