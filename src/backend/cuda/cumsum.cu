// CUDA inclusive prefix sum over a contiguous [outer, n, inner] tensor (ops/cumsum.h), reverse
// scanning from the end, accumulated in f32 (f64 for f64) with each output rounded from the
// running sum, as the CPU kernel does. The order of additions differs from the CPU's sequential
// one (within tolerance; sums of small integers stay exact), but is fixed for a shape, so results
// are deterministic.
//   - inner == 1 (rows): blocks scan chunks of a row in tiles (a warp-shuffle scan inside each
//     tile, a running carry across tiles). Long rows with few of them split into chunks over
//     several blocks: pass 1 sums each chunk, pass 2 turns the sums into exclusive offsets, pass
//     3 scans each chunk from its offset.
//   - inner > 1 (columns): one thread per (outer, inner) column walks its steps sequentially
//     (coalesced across the column). With few columns the steps split into ~sqrt(n) chunks with
//     the same three passes.
#include <algorithm>
#include <cmath>

#include "backend/cuda/kernels.cuh"
#include "ops/cumsum.h"

namespace myriad::gpu {
namespace {

// Element offset of step s along a line of n, forwards or from the end.
__device__ inline int64_t step_pos(int64_t s, int64_t n, bool reverse) {
  return reverse ? n - 1 - s : s;
}

// ---- columns (inner > 1) ----

// Block (x over columns, y over chunks). Mode sums: sums[chunk * cols + c] = the sum of the
// chunk's steps of column c. Otherwise scans the chunk's steps of column c from
// offsets[chunk * cols + c] (0 without offsets) into out.
template <class T>
__global__ void cumsum_columns_kernel(const T* __restrict__ x, T* __restrict__ out,
                                      const Acc<T>* __restrict__ offsets, Acc<T>* __restrict__ sums,
                                      int64_t outer, int64_t n, int64_t inner, int64_t len,
                                      int64_t chunks, bool reverse) {
  using A = Acc<T>;
  const int64_t cols = outer * inner;
  for (int64_t chunk = blockIdx.y; chunk < chunks; chunk += gridDim.y) {
    const int64_t s0 = chunk * len, s1 = min(n, s0 + len);
    for (int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < cols;
         c += static_cast<int64_t>(gridDim.x) * blockDim.x) {
      const int64_t o = c / inner, base = o * n * inner + (c - o * inner);
      A acc = offsets ? offsets[chunk * cols + c] : A(0);
      if (sums) {
        for (int64_t s = s0; s < s1; ++s) acc += ld(x[base + step_pos(s, n, reverse) * inner]);
        sums[chunk * cols + c] = acc;
        continue;
      }
      for (int64_t s = s0; s < s1; ++s) {
        const int64_t e = base + step_pos(s, n, reverse) * inner;
        acc += ld(x[e]);
        out[e] = st<T>(acc);
      }
    }
  }
}

// sums [chunks, lines] -> the exclusive prefix over chunks of each line, in place.
template <class A>
__global__ void exclusive_offsets_kernel(A* sums, int64_t lines, int64_t chunks) {
  for (int64_t c = global_thread(); c < lines; c += global_threads()) {
    A run = 0;
    for (int64_t j = 0; j < chunks; ++j) {
      const A t = sums[j * lines + c];
      sums[j * lines + c] = run;
      run += t;
    }
  }
}

// ---- rows (inner == 1) ----

// Inclusive scan of v over the block (blockDim.x a multiple of 32); *total gets the block's sum.
// `scratch` holds 32 values; the call ends with a barrier, so it may be reused right after.
template <class A>
__device__ A block_inclusive_scan(A v, A* scratch, A* total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  for (int o = 1; o < 32; o <<= 1) {
    const A w = __shfl_up_sync(0xffffffffu, v, o);
    if (lane >= o) v += w;
  }
  if (lane == 31) scratch[warp] = v;
  __syncthreads();
  if (warp == 0) {
    A w = lane < nw ? scratch[lane] : A(0);
    for (int o = 1; o < 32; o <<= 1) {
      const A u = __shfl_up_sync(0xffffffffu, w, o);
      if (lane >= o) w += u;
    }
    scratch[lane] = w;
  }
  __syncthreads();
  if (warp > 0) v += scratch[warp - 1];
  *total = scratch[nw - 1];
  __syncthreads();
  return v;
}

// One block per (row, chunk) unit, unit = row * chunks + chunk. Mode sums: sums[chunk * rows +
// row] = the chunk's sum. Otherwise scans the chunk from offsets[chunk * rows + row] (0 without
// offsets) in tiles of blockDim.x elements.
template <class T>
__global__ void cumsum_rows_kernel(const T* __restrict__ x, T* __restrict__ out,
                                   const Acc<T>* __restrict__ offsets, Acc<T>* __restrict__ sums,
                                   int64_t rows, int64_t n, int64_t len, int64_t chunks,
                                   bool reverse) {
  using A = Acc<T>;
  __shared__ A scratch[32];
  for (int64_t u = blockIdx.x; u < rows * chunks; u += gridDim.x) {
    const int64_t row = u / chunks, chunk = u - row * chunks;
    const int64_t s0 = chunk * len, s1 = min(n, s0 + len);
    const T* px = x + row * n;
    if (sums) {
      A s = 0;
      for (int64_t t = s0 + threadIdx.x; t < s1; t += blockDim.x)
        s += ld(px[step_pos(t, n, reverse)]);
      s = block_sum(s, scratch);
      if (threadIdx.x == 0) sums[chunk * rows + row] = s;
      continue;
    }
    T* po = out + row * n;
    A carry = offsets ? offsets[chunk * rows + row] : A(0);
    for (int64_t t0 = s0; t0 < s1; t0 += blockDim.x) {
      const int64_t t = t0 + threadIdx.x;
      const int64_t e = t < s1 ? step_pos(t, n, reverse) : 0;
      A total;
      const A v = block_inclusive_scan(t < s1 ? ld(px[e]) : A(0), scratch, &total);
      if (t < s1) po[e] = st<T>(carry + v);
      carry += total;
    }
  }
}

template <class T>
void scan_rows(int dev, const Tensor& x, int64_t rows, int64_t n, bool reverse, Tensor& out) {
  using A = Acc<T>;
  const char* op = "cumsum";
  // Split long rows only when there are too few rows to fill the GPU.
  int64_t chunks = 1;
  if (rows < 256 && n > 8192)
    chunks = std::min<int64_t>((n + 2047) / 2048, (512 + rows - 1) / rows);
  const int64_t len = (n + chunks - 1) / chunks;
  chunks = (n + len - 1) / len;
  const int threads = row_threads(len);
  const unsigned grid = grid_for(rows * chunks, 1);
  if (chunks == 1) {
    launch(op, dev, grid, threads, &cumsum_rows_kernel<T>, cptr<T>(x), mptr<T>(out),
           static_cast<const A*>(nullptr), static_cast<A*>(nullptr), rows, n, len, chunks, reverse);
    return;
  }
  Tensor sums = Tensor::empty({chunks, rows}, std::is_same_v<A, double> ? DType::F64 : DType::F32,
                              out.device());
  launch(op, dev, grid, threads, &cumsum_rows_kernel<T>, cptr<T>(x), mptr<T>(out),
         static_cast<const A*>(nullptr), mptr<A>(sums), rows, n, len, chunks, reverse);
  launch(op, dev, grid_for(rows), kThreads, &exclusive_offsets_kernel<A>, mptr<A>(sums), rows,
         chunks);
  launch(op, dev, grid, threads, &cumsum_rows_kernel<T>, cptr<T>(x), mptr<T>(out), cptr<A>(sums),
         static_cast<A*>(nullptr), rows, n, len, chunks, reverse);
}

template <class T>
void scan_columns(int dev, const Tensor& x, int64_t outer, int64_t n, int64_t inner, bool reverse,
                  Tensor& out) {
  using A = Acc<T>;
  const char* op = "cumsum";
  const int64_t cols = outer * inner;
  // Enough (chunk, column) threads to fill the GPU, with chunks ~ sqrt(n) so the sequential
  // steps of the passes stay short.
  int64_t chunks = 1;
  if (cols < 65536 && n > 64)
    chunks = std::min<int64_t>(static_cast<int64_t>(std::ceil(std::sqrt(static_cast<double>(n)))),
                               (131072 + cols - 1) / cols);
  chunks = std::clamp<int64_t>(chunks, 1, 65535);
  const int64_t len = (n + chunks - 1) / chunks;
  chunks = (n + len - 1) / len;
  const int64_t threads = std::min<int64_t>(kThreads, (cols + 31) / 32 * 32);
  const dim3 grid(std::min<unsigned>(grid_for(cols, static_cast<int>(threads)), 65535u),
                  static_cast<unsigned>(chunks));
  if (chunks == 1) {
    launch(op, dev, grid, static_cast<unsigned>(threads), &cumsum_columns_kernel<T>, cptr<T>(x),
           mptr<T>(out), static_cast<const A*>(nullptr), static_cast<A*>(nullptr), outer, n, inner,
           len, chunks, reverse);
    return;
  }
  Tensor sums = Tensor::empty({chunks, cols}, std::is_same_v<A, double> ? DType::F64 : DType::F32,
                              out.device());
  launch(op, dev, grid, static_cast<unsigned>(threads), &cumsum_columns_kernel<T>, cptr<T>(x),
         mptr<T>(out), static_cast<const A*>(nullptr), mptr<A>(sums), outer, n, inner, len, chunks,
         reverse);
  launch(op, dev, grid_for(cols), kThreads, &exclusive_offsets_kernel<A>, mptr<A>(sums), cols,
         chunks);
  launch(op, dev, grid, static_cast<unsigned>(threads), &cumsum_columns_kernel<T>, cptr<T>(x),
         mptr<T>(out), cptr<A>(sums), static_cast<A*>(nullptr), outer, n, inner, len, chunks,
         reverse);
}

void cumsum_cuda(const Tensor& x, int64_t outer, int64_t n, int64_t inner, bool reverse,
                 Tensor& out) {
  if (outer == 0 || n == 0 || inner == 0) return;
  const int dev = out.device().index;
  dispatch_float("cumsum", x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if (inner == 1)
      scan_rows<T>(dev, x, outer, n, reverse, out);
    else
      scan_columns<T>(dev, x, outer, n, inner, reverse, out);
  });
}

}  // namespace
MYRIAD_REGISTER_KERNEL(ops::cumsum_kernels, ops::Backend::CUDA, &cumsum_cuda);
}  // namespace myriad::gpu
