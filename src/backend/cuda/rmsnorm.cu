// CUDA RMSNorm (and l2norm, its sum-of-squares form) over the rows of a contiguous [rows, n]
// tensor (MODEL.md §2): x̂ = x * rstd in f32 (f64 for f64), cast to x's dtype, then times the
// weight. The backward writes gx row by row and sums gw over rows in two deterministic passes:
// per-chunk partial sums in f32, then their total.
#include <algorithm>
#include <cmath>
#include <type_traits>

#include "backend/cuda/kernels.cuh"
#include "ops/rmsnorm.h"

namespace myriad::gpu {
namespace {

// x̂ rounded to T, as the forward computes it before the weight multiply.
template <class T>
__device__ Acc<T> rounded(Acc<T> v) {
  return ld(st<T>(v));
}

template <class T>
__global__ void rms_norm_kernel(const T* x, const T* w, Acc<T> eps, Acc<T> div, T* y, Acc<T>* rstd,
                                int64_t rows, int64_t n) {
  using A = Acc<T>;
  __shared__ A scratch[32];
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* px = x + row * n;
    T* py = y + row * n;
    A ss = 0;
    for (int64_t k = threadIdx.x; k < n; k += blockDim.x) {
      A v = ld(px[k]);
      ss += v * v;
    }
    ss = block_sum(ss, scratch);
    const A rs = A(1) / std::sqrt(ss / div + eps);
    if (threadIdx.x == 0) rstd[row] = rs;
    for (int64_t k = threadIdx.x; k < n; k += blockDim.x) {
      A h = rounded<T>(ld(px[k]) * rs);
      py[k] = st<T>(w ? h * ld(w[k]) : h);
    }
  }
}

// With g = gy * w and x̂ = x * rstd: gx = rstd * (g - x̂ * sum(g * x̂) / div).
template <class T>
__global__ void rms_norm_backward_kernel(const T* x, const T* w, const Acc<T>* rstd, Acc<T> div,
                                         const T* gy, T* gx, int64_t rows, int64_t n) {
  using A = Acc<T>;
  __shared__ A scratch[32];
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* px = x + row * n;
    const T* pg = gy + row * n;
    T* po = gx + row * n;
    const A rs = rstd[row];
    A dot = 0;
    for (int64_t k = threadIdx.x; k < n; k += blockDim.x) {
      A g = w ? ld(pg[k]) * ld(w[k]) : ld(pg[k]);
      dot += g * (ld(px[k]) * rs);
    }
    dot = block_sum(dot, scratch) / div;
    for (int64_t k = threadIdx.x; k < n; k += blockDim.x) {
      A g = w ? ld(pg[k]) * ld(w[k]) : ld(pg[k]);
      po[k] = st<T>(rs * (g - ld(px[k]) * rs * dot));
    }
  }
}

constexpr int kCols = 32, kSplit = 8;

// partial[chunk, c] = sum over the chunk's rows of gy * cast(x̂); blocks of 32 columns x 8 rows.
template <class T>
__global__ void rms_norm_gw_partial_kernel(const T* x, const Acc<T>* rstd, const T* gy,
                                           Acc<T>* partial, int64_t rows, int64_t n,
                                           int64_t rows_per_chunk) {
  using A = Acc<T>;
  __shared__ A sv[kSplit][kCols];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kCols + tx, chunk = blockIdx.y;
  const int64_t r0 = chunk * rows_per_chunk, r1 = min(rows, r0 + rows_per_chunk);
  A s = 0;
  if (c < n)
    for (int64_t r = r0 + ty; r < r1; r += kSplit)
      s += ld(gy[r * n + c]) * rounded<T>(ld(x[r * n + c]) * rstd[r]);
  sv[ty][tx] = s;
  __syncthreads();
  if (ty == 0 && c < n) {
    for (int j = 1; j < kSplit; ++j) s += sv[j][tx];
    partial[chunk * n + c] = s;
  }
}

template <class T>
__global__ void rms_norm_gw_final_kernel(const Acc<T>* partial, T* gw, int64_t chunks, int64_t n) {
  for (int64_t c = global_thread(); c < n; c += global_threads()) {
    Acc<T> s = 0;
    for (int64_t j = 0; j < chunks; ++j) s += partial[j * n + c];
    gw[c] = st<T>(s);
  }
}

template <class T>
void check_stats_dtype(const char* op, const Tensor& rstd) {
  constexpr DType want = std::is_same_v<Acc<T>, double> ? DType::F64 : DType::F32;
  MYRIAD_CHECK(rstd.dtype() == want, op, ": rstd must be ", dtype_name(want), ", got ",
               rstd.desc());
}

// The divisor of the sum of squares: n for RMSNorm's mean, 1 for l2norm's sum.
template <class A>
A divisor(ops::NormOf of, int64_t n) {
  return of == ops::NormOf::MeanSquare ? static_cast<A>(n) : A(1);
}

void rms_norm_cuda(const Tensor& x, const Tensor& weight, double eps, ops::NormOf of, Tensor& y,
                   Tensor& rstd) {
  const int64_t rows = x.shape()[0], n = x.shape()[1];
  if (rows == 0) return;
  dispatch_float("rms_norm", x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    check_stats_dtype<T>("rms_norm", rstd);
    launch("rms_norm", y.device().index, grid_for(rows, 1), row_threads(n), &rms_norm_kernel<T>,
           cptr<T>(x), weight.defined() ? cptr<T>(weight) : nullptr, static_cast<Acc<T>>(eps),
           divisor<Acc<T>>(of, n), mptr<T>(y), mptr<Acc<T>>(rstd), rows, n);
  });
}

void rms_norm_backward_cuda(const Tensor& x, const Tensor& weight, const Tensor& rstd,
                            ops::NormOf of, const Tensor& gy, Tensor& gx, Tensor& gw) {
  const char* name = "rms_norm_backward";
  const int64_t rows = x.shape()[0], n = x.shape()[1];
  const int dev = gx.device().index;
  dispatch_float(name, x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using A = Acc<T>;
    check_stats_dtype<T>(name, rstd);
    if (rows > 0)
      launch(name, dev, grid_for(rows, 1), row_threads(n), &rms_norm_backward_kernel<T>, cptr<T>(x),
             weight.defined() ? cptr<T>(weight) : nullptr, cptr<A>(rstd), divisor<A>(of, n),
             cptr<T>(gy), mptr<T>(gx), rows, n);
    if (!gw.defined() || n == 0) return;
    // Enough row chunks for ~1024 blocks in the first pass, at least 64 rows each.
    const int64_t col_tiles = (n + kCols - 1) / kCols;
    int64_t chunks = std::clamp<int64_t>((1024 + col_tiles - 1) / col_tiles, 1, 65535);
    chunks = std::max<int64_t>(1, std::min(chunks, (rows + 63) / 64));
    const int64_t per_chunk = std::max<int64_t>(1, (rows + chunks - 1) / chunks);
    Tensor partial = Tensor::empty({chunks, n}, std::is_same_v<A, double> ? DType::F64 : DType::F32,
                                   gw.device());
    if (rows > 0)
      launch(name, dev, dim3(static_cast<unsigned>(col_tiles), static_cast<unsigned>(chunks)),
             dim3(kCols, kSplit), &rms_norm_gw_partial_kernel<T>, cptr<T>(x), cptr<A>(rstd),
             cptr<T>(gy), mptr<A>(partial), rows, n, per_chunk);
    else
      partial.fill_(0.0);
    launch(name, dev, grid_for(n), kThreads, &rms_norm_gw_final_kernel<T>, cptr<A>(partial),
           mptr<T>(gw), chunks, n);
  });
}

}  // namespace

MYRIAD_REGISTER_KERNEL(ops::rms_norm_kernels, ops::Backend::CUDA, &rms_norm_cuda);
MYRIAD_REGISTER_KERNEL(ops::rms_norm_backward_kernels, ops::Backend::CUDA, &rms_norm_backward_cuda);

}  // namespace myriad::gpu
