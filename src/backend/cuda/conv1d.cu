// CUDA depthwise causal conv1d over time with a carried state (KDA's short convolution), f32 math
// for f32/bf16 storage (f64 for f64). Forward and input gradients: one thread per (row, channel)
// output, a 2-d grid of channel tiles x time rows, the K taps summed in order j = 0..K-1 (so a
// sequence run in segments with the carried state gives the one-pass bits). The weight gradient
// sums over batch and time in two deterministic passes: per-chunk partials over row chunks, then
// their total in chunk order.
#include <algorithm>
#include <type_traits>

#include "backend/cuda/kernels.cuh"
#include "ops/conv1d.h"

namespace myriad::gpu {
namespace {

// Sizes of one call: x [B, T, C], w [C, K], state [B, C, P] with P = K - 1.
struct Dims {
  int64_t B, T, C, K, P;
};

// xpad[b, q + P, c]: x[b, q, c] for q >= 0, else state[b, c, q + P] (zero without a state).
template <class T>
__device__ inline Acc<T> xpad(const T* x, const T* state, const Dims& d, int64_t b, int64_t q,
                              int64_t c) {
  if (q >= 0) return ld(x[(b * d.T + q) * d.C + c]);
  return state ? ld(state[(b * d.C + c) * d.P + q + d.P]) : Acc<T>(0);
}

// y[b, t, c] = sum_j w[c, j] xpad[b, t + j, c]; rows are (b, t).
template <class T>
__global__ void conv1d_kernel(const T* x, const T* w, const T* state, T* y, Dims d) {
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t cs = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t r = blockIdx.y; r < d.B * d.T; r += gridDim.y) {
    const int64_t b = r / d.T, t = r - b * d.T;
    for (int64_t c = c0; c < d.C; c += cs) {
      Acc<T> acc = 0;
      for (int64_t j = 0; j < d.K; ++j)
        acc += ld(w[c * d.K + j]) * xpad(x, state, d, b, t - d.P + j, c);
      y[r * d.C + c] = st<T>(acc);
    }
  }
}

// gxpad[b, p, c] = sum_j w[c, j] gy[b, p - j, c] over 0 <= p - j < T, for rows (b, p) with p in
// [0, T + P): p >= P is gx[b, p - P, c], p < P is gstate[b, c, p] (skipped without a state).
template <class T>
__global__ void conv1d_input_grad_kernel(const T* w, const T* gy, T* gx, T* gstate, Dims d) {
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t cs = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t len = d.T + d.P;
  for (int64_t r = blockIdx.y; r < d.B * len; r += gridDim.y) {
    const int64_t b = r / len, p = r - b * len;
    if (p < d.P && !gstate) continue;
    const int64_t j0 = p >= d.T ? p - d.T + 1 : 0, j1 = p < d.K ? p + 1 : d.K;  // 0 <= p - j < T
    for (int64_t c = c0; c < d.C; c += cs) {
      Acc<T> acc = 0;
      for (int64_t j = j0; j < j1; ++j)
        acc += ld(w[c * d.K + j]) * ld(gy[(b * d.T + p - j) * d.C + c]);
      if (p >= d.P)
        gx[(b * d.T + p - d.P) * d.C + c] = st<T>(acc);
      else
        gstate[(b * d.C + c) * d.P + p] = st<T>(acc);
    }
  }
}

constexpr int kCols = 32, kSplit = 8;

// partial[chunk, j, c] = sum over the chunk's rows (b, t) of gy[b, t, c] xpad[b, t + j, c];
// blocks of 32 channels x 8 row lanes, one tap j per blockIdx.z.
template <class T>
__global__ void conv1d_gw_partial_kernel(const T* x, const T* state, const T* gy, Acc<T>* partial,
                                         Dims d, int64_t rows_per_chunk) {
  using A = Acc<T>;
  __shared__ A sv[kSplit][kCols];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kCols + tx, chunk = blockIdx.y;
  const int64_t j = blockIdx.z, rows = d.B * d.T;
  const int64_t r0 = chunk * rows_per_chunk, r1 = min(rows, r0 + rows_per_chunk);
  A s = 0;
  if (c < d.C)
    for (int64_t r = r0 + ty; r < r1; r += kSplit) {
      const int64_t b = r / d.T, t = r - b * d.T;
      s += ld(gy[r * d.C + c]) * xpad(x, state, d, b, t - d.P + j, c);
    }
  sv[ty][tx] = s;
  __syncthreads();
  if (ty == 0 && c < d.C) {
    for (int k = 1; k < kSplit; ++k) s += sv[k][tx];
    partial[(chunk * d.K + j) * d.C + c] = s;
  }
}

// gw[c, j] = sum over chunks of partial[chunk, j, c], in chunk order.
template <class T>
__global__ void conv1d_gw_final_kernel(const Acc<T>* partial, T* gw, int64_t chunks, Dims d) {
  for (int64_t i = global_thread(); i < d.C * d.K; i += global_threads()) {
    const int64_t c = i / d.K, j = i - c * d.K;
    Acc<T> s = 0;
    for (int64_t k = 0; k < chunks; ++k) s += partial[(k * d.K + j) * d.C + c];
    gw[i] = st<T>(s);
  }
}

Dims dims_of(const Tensor& x, const Tensor& w) {
  const int64_t K = w.shape()[1];
  return {x.shape()[0], x.shape()[1], x.shape()[2], K, K - 1};
}

// Threads per block (whole warps, up to 256) and a 2-d grid: x over channel tiles (at most 64),
// y over rows, ~4096 blocks in all when there is that much work.
int conv_threads(int64_t C) {
  return static_cast<int>(std::clamp<int64_t>((C + 31) / 32 * 32, 32, kThreads));
}
dim3 conv_grid(int64_t rows, int64_t C, int threads) {
  const int64_t gx = std::clamp<int64_t>((C + threads - 1) / threads, 1, 64);
  const int64_t gy = std::clamp<int64_t>((4096 + gx - 1) / gx, 1, std::min<int64_t>(rows, 65535));
  return dim3(static_cast<unsigned>(gx), static_cast<unsigned>(gy));
}

// The state's data, or null when it is undefined or empty (K = 1).
template <class T>
const T* state_ptr(const Tensor& s) {
  return s.defined() && s.numel() > 0 ? cptr<T>(s) : nullptr;
}

void conv1d_cuda(const Tensor& x, const Tensor& w, const Tensor& state, Tensor& y) {
  const char* name = "conv1d_causal";
  const Dims d = dims_of(x, w);
  if (d.B * d.T == 0 || d.C == 0) return;
  dispatch_float(name, x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const int threads = conv_threads(d.C);
    launch(name, y.device().index, conv_grid(d.B * d.T, d.C, threads), threads, &conv1d_kernel<T>,
           cptr<T>(x), cptr<T>(w), state_ptr<T>(state), mptr<T>(y), d);
  });
}

void conv1d_backward_cuda(const Tensor& x, const Tensor& w, const Tensor& state, const Tensor& gy,
                          Tensor& gx, Tensor& gw, Tensor& gstate) {
  const char* name = "conv1d_causal_backward";
  const Dims d = dims_of(x, w);
  if (d.C == 0) return;  // every gradient is empty
  MYRIAD_CHECK(d.K <= 65535, name, ": the cuda kernel takes at most 65535 taps, got ", d.K);
  const int dev = gx.device().index;
  dispatch_float(name, x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using A = Acc<T>;
    // Input side: gx, and gstate when there is one (rows p < P of the padded gradient).
    T* gs = gstate.defined() && gstate.numel() > 0 ? mptr<T>(gstate) : nullptr;
    const int64_t in_rows = d.B * (d.T + (gs ? d.P : 0));
    if (in_rows > 0) {
      // Without a state the rows p < P are skipped; index them anyway (cheap) so one kernel serves.
      const int64_t all_rows = d.B * (d.T + d.P);
      const int threads = conv_threads(d.C);
      launch(name, dev, conv_grid(all_rows, d.C, threads), threads, &conv1d_input_grad_kernel<T>,
             cptr<T>(w), cptr<T>(gy), d.T > 0 ? mptr<T>(gx) : nullptr, gs, d);
    }
    // Weight side: enough row chunks for ~1024 blocks in the first pass, at least 64 rows each.
    const int64_t rows = d.B * d.T;
    const int64_t col_tiles = (d.C + kCols - 1) / kCols;
    int64_t chunks =
        std::clamp<int64_t>((1024 + col_tiles * d.K - 1) / (col_tiles * d.K), 1, 65535);
    chunks = std::max<int64_t>(1, std::min(chunks, (rows + 63) / 64));
    const int64_t per_chunk = std::max<int64_t>(1, (rows + chunks - 1) / chunks);
    chunks = std::max<int64_t>(1, (rows + per_chunk - 1) / per_chunk);
    Tensor partial = Tensor::empty(
        {chunks, d.K, d.C}, std::is_same_v<A, double> ? DType::F64 : DType::F32, gw.device());
    launch(name, dev,
           dim3(static_cast<unsigned>(col_tiles), static_cast<unsigned>(chunks),
                static_cast<unsigned>(d.K)),
           dim3(kCols, kSplit), &conv1d_gw_partial_kernel<T>, cptr<T>(x), state_ptr<T>(state),
           cptr<T>(gy), mptr<A>(partial), d, per_chunk);
    launch(name, dev, grid_for(d.C * d.K), kThreads, &conv1d_gw_final_kernel<T>, cptr<A>(partial),
           mptr<T>(gw), chunks, d);
  });
}

}  // namespace

MYRIAD_REGISTER_KERNEL(ops::conv1d_kernels, ops::Backend::CUDA, &conv1d_cuda);
MYRIAD_REGISTER_KERNEL(ops::conv1d_backward_kernels, ops::Backend::CUDA, &conv1d_backward_cuda);

}  // namespace myriad::gpu
