// CUDA softmax / log-softmax and their backward over the rows of a contiguous [rows, n] tensor:
// one block per row, statistics in f32 (f64 for f64), the same formulas as the reference.
#include <cmath>
#include <limits>

#include "backend/cuda/kernels.cuh"
#include "ops/softmax.h"

namespace myriad::gpu {
namespace {

template <class T>
__global__ void softmax_kernel(const T* x, T* y, int64_t rows, int64_t n, bool log) {
  using A = Acc<T>;
  __shared__ A scratch[32];
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* px = x + row * n;
    T* py = y + row * n;
    A m = -std::numeric_limits<A>::infinity();
    for (int64_t k = threadIdx.x; k < n; k += blockDim.x) {
      A v = ld(px[k]);
      m = v > m ? v : m;
    }
    m = block_max(m, scratch);
    A s = 0;
    for (int64_t k = threadIdx.x; k < n; k += blockDim.x) s += std::exp(ld(px[k]) - m);
    s = block_sum(s, scratch);
    const A lse = m + std::log(s);
    for (int64_t k = threadIdx.x; k < n; k += blockDim.x) {
      A v = ld(px[k]);
      py[k] = st<T>(log ? v - lse : std::exp(v - m) / s);
    }
  }
}

// gx = y * (gy - sum(gy * y)) for softmax; gx = gy - exp(y) * sum(gy) for log-softmax.
template <class T>
__global__ void softmax_backward_kernel(const T* y, const T* gy, T* gx, int64_t rows, int64_t n,
                                        bool log) {
  using A = Acc<T>;
  __shared__ A scratch[32];
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* py = y + row * n;
    const T* pg = gy + row * n;
    T* po = gx + row * n;
    A s = 0;
    for (int64_t k = threadIdx.x; k < n; k += blockDim.x)
      s += log ? ld(pg[k]) : ld(pg[k]) * ld(py[k]);
    s = block_sum(s, scratch);
    for (int64_t k = threadIdx.x; k < n; k += blockDim.x) {
      A g = ld(pg[k]), v = ld(py[k]);
      po[k] = st<T>(log ? g - std::exp(v) * s : v * (g - s));
    }
  }
}

// Rows and row length (a 0-d tensor is one row of one).
std::pair<int64_t, int64_t> rows_of(const Tensor& t) {
  const int64_t n = t.dim() ? t.shape().back() : 1;
  return {n ? t.numel() / n : 0, n};
}

void softmax_cuda(const Tensor& x, Tensor& y, bool log) {
  const char* name = log ? "log_softmax" : "softmax";
  auto [rows, n] = rows_of(x);
  if (rows == 0) return;
  dispatch_float(name, x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    launch(name, y.device().index, grid_for(rows, 1), row_threads(n), &softmax_kernel<T>,
           cptr<T>(x), mptr<T>(y), rows, n, log);
  });
}

void softmax_backward_cuda(const Tensor& y, const Tensor& gy, Tensor& gx, bool log) {
  const char* name = log ? "log_softmax_backward" : "softmax_backward";
  auto [rows, n] = rows_of(y);
  if (rows == 0) return;
  dispatch_float(name, y.dtype(), [&](auto tag) {
    using T = decltype(tag);
    launch(name, gx.device().index, grid_for(rows, 1), row_threads(n), &softmax_backward_kernel<T>,
           cptr<T>(y), cptr<T>(gy), mptr<T>(gx), rows, n, log);
  });
}

}  // namespace

MYRIAD_REGISTER_KERNEL(ops::softmax_kernels, ops::Backend::CUDA, &softmax_cuda);
MYRIAD_REGISTER_KERNEL(ops::softmax_backward_kernels, ops::Backend::CUDA, &softmax_backward_cuda);

}  // namespace myriad::gpu
