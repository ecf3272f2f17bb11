// CUDA reductions over [outer, r, inner]: sum and max with the first argmax, accumulated in f32
// (f64 for f64). inner == 1 reduces each row with one block; otherwise a block of 32 x 8 threads
// takes 32 adjacent columns (coalesced loads) and splits r over its 8 thread rows.
#include <limits>

#include "backend/cuda/kernels.cuh"
#include "ops/reduce.h"

namespace myriad::gpu {
namespace {
using ops::ReduceOp;

template <class A>
struct ArgMax {
  A v;
  int64_t i;
};
// The better of two candidates: the first NaN if any, else the larger value, the smaller index
// on ties (the reference's sequential scan). Associative and commutative, so any order works.
template <class A>
__device__ ArgMax<A> pick(ArgMax<A> a, ArgMax<A> b) {
  const bool an = a.v != a.v, bn = b.v != b.v;
  const bool take_b = an ? (bn && b.i < a.i) : (bn || b.v > a.v || (b.v == a.v && b.i < a.i));
  return take_b ? b : a;
}
template <class A>
__device__ ArgMax<A> no_max() {
  return {-std::numeric_limits<A>::infinity(), std::numeric_limits<int64_t>::max()};
}
template <class A>
__device__ ArgMax<A> warp_argmax(ArgMax<A> m) {
  for (int o = 16; o > 0; o >>= 1)
    m = pick(m, {__shfl_xor_sync(0xffffffffu, m.v, o), __shfl_xor_sync(0xffffffffu, m.i, o)});
  return m;
}

template <class T>
__global__ void reduce_rows_kernel(ReduceOp op, const T* x, int64_t outer, int64_t r, T* out,
                                   int64_t* idx) {
  using A = Acc<T>;
  __shared__ A sv[32];
  __shared__ int64_t si[32];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nw = blockDim.x >> 5;
  for (int64_t row = blockIdx.x; row < outer; row += gridDim.x) {
    const T* p = x + row * r;
    if (op == ReduceOp::Sum) {
      A s = 0;
      for (int64_t k = tid; k < r; k += blockDim.x) s += ld(p[k]);
      s = block_sum(s, sv);
      if (tid == 0) out[row] = st<T>(s);
      continue;
    }
    ArgMax<A> m = no_max<A>();
    for (int64_t k = tid; k < r; k += blockDim.x) m = pick(m, {ld(p[k]), k});
    m = warp_argmax(m);
    if (lane == 0) sv[warp] = m.v, si[warp] = m.i;
    __syncthreads();
    if (tid == 0) {
      for (int w = 1; w < nw; ++w) m = pick(m, {sv[w], si[w]});
      out[row] = st<T>(m.v);
      if (idx) idx[row] = m.i;
    }
    __syncthreads();
  }
}

constexpr int kCols = 32, kSplit = 8;

template <class T>
__global__ void reduce_cols_kernel(ReduceOp op, const T* x, int64_t outer, int64_t r, int64_t inner,
                                   T* out, int64_t* idx) {
  using A = Acc<T>;
  __shared__ A sv[kSplit][kCols];
  __shared__ int64_t si[kSplit][kCols];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t col_tiles = (inner + kCols - 1) / kCols;
  for (int64_t tile = blockIdx.x; tile < outer * col_tiles; tile += gridDim.x) {
    const int64_t o = tile / col_tiles, c = (tile % col_tiles) * kCols + tx;
    const bool valid = c < inner;
    const T* p = x + o * r * inner + c;
    if (op == ReduceOp::Sum) {
      A s = 0;
      if (valid)
        for (int64_t k = ty; k < r; k += kSplit) s += ld(p[k * inner]);
      sv[ty][tx] = s;
      __syncthreads();
      if (ty == 0 && valid) {
        for (int j = 1; j < kSplit; ++j) s += sv[j][tx];
        out[o * inner + c] = st<T>(s);
      }
    } else {
      ArgMax<A> m = no_max<A>();
      if (valid)
        for (int64_t k = ty; k < r; k += kSplit) m = pick(m, {ld(p[k * inner]), k});
      sv[ty][tx] = m.v;
      si[ty][tx] = m.i;
      __syncthreads();
      if (ty == 0 && valid) {
        for (int j = 1; j < kSplit; ++j) m = pick(m, {sv[j][tx], si[j][tx]});
        out[o * inner + c] = st<T>(m.v);
        if (idx) idx[o * inner + c] = m.i;
      }
    }
    __syncthreads();
  }
}

void reduce_cuda(ReduceOp op, const Tensor& x, int64_t outer, int64_t r, int64_t inner, Tensor& out,
                 Tensor* idx) {
  const char* name = op == ReduceOp::Sum ? "sum" : "max";
  if (outer * inner == 0) return;
  int64_t* pidx = idx ? idx->data<int64_t>() : nullptr;
  const int dev = out.device().index;
  dispatch_float(name, x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if (inner == 1) {
      launch(name, dev, grid_for(outer, 1), row_threads(r), &reduce_rows_kernel<T>, op, cptr<T>(x),
             outer, r, mptr<T>(out), pidx);
    } else {
      const int64_t tiles = outer * ((inner + kCols - 1) / kCols);
      launch(name, dev, grid_for(tiles, 1), dim3(kCols, kSplit), &reduce_cols_kernel<T>, op,
             cptr<T>(x), outer, r, inner, mptr<T>(out), pidx);
    }
  });
}

}  // namespace

MYRIAD_REGISTER_KERNEL(ops::reduce_kernels, ops::Backend::CUDA, &reduce_cuda);

}  // namespace myriad::gpu
