// Scalar formulas of the element-wise ops, shared by the reference, CPU and CUDA kernels.
#pragma once
#include <algorithm>
#include <cmath>

// Host and device under nvcc (the CUDA kernels call these formulas); plain functions elsewhere.
#if defined(__CUDACC__)
#define MYRIAD_HD __host__ __device__
// elementwise.h declares these templates host-only; nvcc warns when they become host-device.
#pragma nv_diag_suppress 20040
#else
#define MYRIAD_HD
#endif

namespace myriad::ops {

template <class T>
MYRIAD_HD inline T apply_binary(BinaryOp op, T a, T b) {
  switch (op) {
    case BinaryOp::Add:
      return a + b;
    case BinaryOp::Sub:
      return a - b;
    case BinaryOp::Mul:
      return a * b;
    case BinaryOp::Div:
      return a / b;
    case BinaryOp::Max:
      return a >= b ? a : b;
    case BinaryOp::Min:
      return a <= b ? a : b;
    case BinaryOp::Ge:
      return a >= b ? T(1) : T(0);
    case BinaryOp::Le:
      return a <= b ? T(1) : T(0);
  }
  return T(0);
}

template <class T>
MYRIAD_HD inline T stable_sigmoid(T x) {
  if (x >= T(0)) return T(1) / (T(1) + std::exp(-x));
  T e = std::exp(x);
  return e / (T(1) + e);
}

template <class T>
MYRIAD_HD inline T apply_unary(UnaryOp op, T x) {
  switch (op) {
    case UnaryOp::Neg:
      return -x;
    case UnaryOp::Exp:
      return std::exp(x);
    case UnaryOp::Log:
      return std::log(x);
    case UnaryOp::Sqrt:
      return std::sqrt(x);
    case UnaryOp::Rsqrt:
      return T(1) / std::sqrt(x);
    case UnaryOp::Square:
      return x * x;
    case UnaryOp::Abs:
      return std::abs(x);
    case UnaryOp::Sigmoid:
      return stable_sigmoid(x);
    case UnaryOp::Silu:
      return x * stable_sigmoid(x);
    case UnaryOp::Tanh:
      return std::tanh(x);
    case UnaryOp::Softplus:
      return x > T(20) ? x : std::log1p(std::exp(x));
    case UnaryOp::Relu:
      return x > T(0) ? x : T(0);
  }
  return T(0);
}

template <class T>
MYRIAD_HD inline T unary_derivative(UnaryOp op, T x, T y) {
  switch (op) {
    case UnaryOp::Neg:
      return T(-1);
    case UnaryOp::Exp:
      return y;
    case UnaryOp::Log:
      return T(1) / x;
    case UnaryOp::Sqrt:
      return T(0.5) / y;
    case UnaryOp::Rsqrt:
      return T(-0.5) * y * y * y;
    case UnaryOp::Square:
      return T(2) * x;
    case UnaryOp::Abs:
      return x > T(0) ? T(1) : (x < T(0) ? T(-1) : T(0));
    case UnaryOp::Sigmoid:
      return y * (T(1) - y);
    case UnaryOp::Silu: {
      T s = stable_sigmoid(x);
      return s * (T(1) + x * (T(1) - s));
    }
    case UnaryOp::Tanh:
      return T(1) - y * y;
    case UnaryOp::Softplus:
      return x > T(20) ? T(1) : stable_sigmoid(x);
    case UnaryOp::Relu:
      return x > T(0) ? T(1) : T(0);
  }
  return T(0);
}

}  // namespace myriad::ops

#if defined(__CUDACC__)
#pragma nv_diag_default 20040
#endif
