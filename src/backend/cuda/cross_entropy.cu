// CUDA cross-entropy rows kernel: one block per row of contiguous [n, V] logits (f32, or f64),
// i32/i64 targets. One read pass keeps a running (max, sum of exp) per thread, merged across the
// block in a fixed order into the row's log-sum-exp; the loss is lse - x[target] and, with grad,
// a second pass overwrites the row with softmax - onehot. Ignored rows (kIgnoreIndex) get loss 0
// and a zero gradient row.
#include <cmath>
#include <cstdint>
#include <limits>

#include "backend/cuda/kernels.cuh"
#include "ops/cross_entropy.h"

namespace myriad::gpu {
namespace {

// (m, s) <- the running max and sum of exp(x - max) of both parts.
template <class A>
__device__ inline void merge(A& m, A& s, A m2, A s2) {
  const A mx = m > m2 ? m : m2;
  if (mx == -std::numeric_limits<A>::infinity()) return;  // both parts empty (s = s2 = 0)
  s = s * std::exp(m - mx) + s2 * std::exp(m2 - mx);
  m = mx;
}

template <class A>
__device__ inline void add_one(A& m, A& s, A x) {
  if (x > m) {
    s = s * std::exp(m - x) + A(1);
    m = x;
  } else if (m != -std::numeric_limits<A>::infinity()) {
    s += std::exp(x - m);
  }
}

// The block's (max, sum of exp) pair: warps merge by shuffles, then every thread merges the warps'
// pairs from shared memory in warp order, so all get the same bits. sm and ss hold 32 values.
template <class A>
__device__ void block_merge(A& m, A& s, A* sm, A* ss) {
  for (int o = 16; o > 0; o >>= 1) {
    const A m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
    merge(m, s, m2, s2);
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  if (lane == 0) sm[warp] = m, ss[warp] = s;
  __syncthreads();
  m = sm[0], s = ss[0];
  for (int k = 1; k < nw; ++k) merge(m, s, sm[k], ss[k]);
  __syncthreads();
}

template <class A, class I>
__global__ void cross_entropy_rows_kernel(A* logits, const I* targets, A* loss, int64_t rows,
                                          int64_t v, bool grad) {
  __shared__ A sm[32], ss[32];
  constexpr A kInf = std::numeric_limits<A>::infinity();
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    A* px = logits + row * v;
    const int64_t tgt = static_cast<int64_t>(targets[row]);
    if (tgt == ops::kIgnoreIndex) {  // uniform over the block
      if (threadIdx.x == 0) loss[row] = 0;
      if (grad)
        for (int64_t k = threadIdx.x; k < v; k += blockDim.x) px[k] = 0;
      continue;
    }
    // The op layer checked the targets; a bad one still must not read outside the row.
    const bool ok = tgt >= 0 && tgt < v;
    const A xt = ok ? px[tgt] : std::numeric_limits<A>::quiet_NaN();  // read before any write
    A m = -kInf, s = 0;
    for (int64_t k = threadIdx.x; k < v; k += blockDim.x) add_one(m, s, px[k]);
    block_merge(m, s, sm, ss);  // ends with a barrier: every read of the row is done
    const A lse = m + std::log(s);
    if (threadIdx.x == 0) loss[row] = lse - xt;
    if (grad)
      for (int64_t k = threadIdx.x; k < v; k += blockDim.x)
        px[k] = ok ? std::exp(px[k] - lse) - (k == tgt ? A(1) : A(0))
                   : std::numeric_limits<A>::quiet_NaN();
  }
}

void cross_entropy_rows_cuda(Tensor& logits, const Tensor& targets, Tensor& loss, bool grad) {
  const char* name = "cross_entropy";
  MYRIAD_CHECK(logits.dtype() == loss.dtype() &&
                   (logits.dtype() == DType::F32 || logits.dtype() == DType::F64),
               name, ": the cuda rows kernel takes f32 or f64 logits and loss of one dtype, got ",
               logits.desc(), " and ", loss.desc());
  MYRIAD_CHECK(targets.dtype() == DType::I32 || targets.dtype() == DType::I64, name,
               ": targets must be i32 or i64, got ", targets.desc());
  const int64_t rows = logits.shape()[0], v = logits.shape()[1];
  if (rows == 0) return;
  const int dev = logits.device().index;
  auto run = [&](auto atag, auto itag) {
    using A = decltype(atag);
    using I = decltype(itag);
    launch(name, dev, grid_for(rows, 1), row_threads(v), &cross_entropy_rows_kernel<A, I>,
           mptr<A>(logits), cptr<I>(targets), mptr<A>(loss), rows, v, grad);
  };
  const bool i64 = targets.dtype() == DType::I64;
  if (logits.dtype() == DType::F32)
    i64 ? run(float{}, int64_t{}) : run(float{}, int32_t{});
  else
    i64 ? run(double{}, int64_t{}) : run(double{}, int32_t{});
}

}  // namespace

MYRIAD_REGISTER_KERNEL(ops::cross_entropy_rows_kernels, ops::Backend::CUDA,
                       &cross_entropy_rows_cuda);

}  // namespace myriad::gpu
