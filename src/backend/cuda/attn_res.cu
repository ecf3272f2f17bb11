// CUDA AttnRes (MODEL.md §7): per token, a softmax over up to kMaxSources depth sources scored by
// the RMS-normalised dot product with the pseudo-query c = w ⊙ gamma, then the mix of the sources;
// f32 math for f32/bf16 storage (f64 for f64). The source pointers travel by value in a
// fixed-size struct. Forward: one block per token; each source's sums are reduced per warp into
// shared memory, then finished per source, so one token costs three barriers whatever the number
// of sources. Backward: one block per fixed chunk of tokens, the same scoring plus gy·v_i, then
// the source gradients; the pseudo-query gradient is summed per chunk (each thread owns its
// columns of the chunk's partial row) and the partials are added in chunk order by a second
// kernel, so gw and ggamma are deterministic.
#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "backend/cuda/kernels.cuh"
#include "ops/attn_res.h"

namespace myriad::gpu {
namespace {

constexpr int kMaxSources = 64;

template <class P>
struct Ptrs {
  P p[kMaxSources];
};

// Launches with `smem` bytes of dynamic shared memory on `device`'s backend stream.
template <class... P, class... A>
void launch_smem(const char* name, int device, dim3 grid, dim3 block, size_t smem,
                 void (*kernel)(P...), A&&... args) {
  DeviceGuard g(device);
  kernel<<<grid, block, smem, current_stream(device)>>>(std::forward<A>(args)...);
  CUDA_CHECK_LAUNCH(name);
}

// c = w ⊙ gamma in the compute type.
template <class T>
__global__ void pseudo_query_kernel(const T* w, const T* gamma, Acc<T>* c, int64_t d) {
  for (int64_t k = global_thread(); k < d; k += global_threads()) c[k] = ld(w[k]) * ld(gamma[k]);
}

// Per-source finish of the warp partials: sums over the nw warps in warp order.
template <class A>
__device__ inline A warps_total(const A* red, int nw) {
  A s = 0;
  for (int q = 0; q < nw; ++q) s += red[q];
  return s;
}

// softmax_i(a) over m scores in shared memory, computed alike by every calling thread.
template <class A>
__device__ inline void softmax_terms(const A* sa, int m, A& amax, A& z) {
  amax = -std::numeric_limits<A>::infinity();
  for (int j = 0; j < m; ++j) amax = sa[j] > amax ? sa[j] : amax;
  z = 0;
  for (int j = 0; j < m; ++j) z += std::exp(sa[j] - amax);
}

// Dynamic shared memory: red [3][m][nw] warp partials, then six [m] per-source arrays.
template <class A>
size_t smem_bytes(int m, int threads) {
  return static_cast<size_t>(3 * m * (threads / 32) + 6 * m) * sizeof(A);
}

template <class T>
__global__ void attn_res_kernel(Ptrs<const T*> vs, int m, const Acc<T>* c, Acc<T> eps, T* out,
                                int64_t rows, int64_t d) {
  using A = Acc<T>;
  extern __shared__ __align__(16) unsigned char smem[];
  const int nw = blockDim.x >> 5, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  A* red = reinterpret_cast<A*>(smem);  // [2][m][nw]: sum v², v·c
  A* sa = red + 2 * m * nw;             // scores a_i
  A* sp = sa + m;                       // softmax p_i
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const int64_t base = row * d;
    for (int i = 0; i < m; ++i) {
      const T* v = vs.p[i] + base;
      A ss = 0, dot = 0;
      for (int64_t k = threadIdx.x; k < d; k += blockDim.x) {
        const A x = ld(v[k]);
        ss += x * x;
        dot += x * c[k];
      }
      ss = warp_sum(ss);
      dot = warp_sum(dot);
      if (lane == 0) red[i * nw + warp] = ss, red[(m + i) * nw + warp] = dot;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < m; i += blockDim.x) {
      const A r = A(1) / std::sqrt(warps_total(red + i * nw, nw) / static_cast<A>(d) + eps);
      sa[i] = r * warps_total(red + (m + i) * nw, nw);
    }
    __syncthreads();
    for (int i = threadIdx.x; i < m; i += blockDim.x) {
      A amax, z;
      softmax_terms(sa, m, amax, z);
      sp[i] = std::exp(sa[i] - amax) / z;
    }
    __syncthreads();
    // The next token's first writes (red, then sa after a barrier) touch nothing read below.
    for (int64_t k = threadIdx.x; k < d; k += blockDim.x) {
      A o = 0;
      for (int i = 0; i < m; ++i) o += sp[i] * ld(vs.p[i][base + k]);
      out[base + k] = st<T>(o);
    }
  }
}

// With dp_i = gy·v_i, da_i = p_i (dp_i − Σ_j p_j dp_j), kc_i = da_i r_i, kv_i = da_i a_i r_i² / d:
//   gv_i = p_i gy + kc_i c − kv_i v_i,   gc += Σ_i kc_i v_i   (into this chunk's partial row).
template <class T>
__global__ void attn_res_backward_kernel(Ptrs<const T*> vs, int m, const Acc<T>* c, Acc<T> eps,
                                         const T* gy, Ptrs<T*> gvs, Acc<T>* partial, int64_t rows,
                                         int64_t d, int64_t rows_per_chunk) {
  using A = Acc<T>;
  extern __shared__ __align__(16) unsigned char smem[];
  const int nw = blockDim.x >> 5, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  A* red = reinterpret_cast<A*>(smem);  // [3][m][nw]: sum v², v·c, gy·v
  A* sr = red + 3 * m * nw;             // inverse RMS r_i
  A* sa = sr + m;                       // scores a_i
  A* sdp = sa + m;                      // dp_i
  A* sp = sdp + m;                      // p_i
  A* skc = sp + m;                      // kc_i
  A* skv = skc + m;                     // kv_i
  A* gc = partial + blockIdx.x * d;
  for (int64_t k = threadIdx.x; k < d; k += blockDim.x) gc[k] = 0;  // each thread owns its k
  const int64_t r0 = blockIdx.x * rows_per_chunk, r1 = min(rows, r0 + rows_per_chunk);
  for (int64_t row = r0; row < r1; ++row) {
    const int64_t base = row * d;
    const T* g = gy + base;
    for (int i = 0; i < m; ++i) {
      const T* v = vs.p[i] + base;
      A ss = 0, dot = 0, dp = 0;
      for (int64_t k = threadIdx.x; k < d; k += blockDim.x) {
        const A x = ld(v[k]);
        ss += x * x;
        dot += x * c[k];
        dp += ld(g[k]) * x;
      }
      ss = warp_sum(ss);
      dot = warp_sum(dot);
      dp = warp_sum(dp);
      if (lane == 0)
        red[i * nw + warp] = ss, red[(m + i) * nw + warp] = dot, red[(2 * m + i) * nw + warp] = dp;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < m; i += blockDim.x) {
      const A r = A(1) / std::sqrt(warps_total(red + i * nw, nw) / static_cast<A>(d) + eps);
      sr[i] = r;
      sa[i] = r * warps_total(red + (m + i) * nw, nw);
      sdp[i] = warps_total(red + (2 * m + i) * nw, nw);
    }
    __syncthreads();
    for (int i = threadIdx.x; i < m; i += blockDim.x) {
      A amax, z;
      softmax_terms(sa, m, amax, z);
      A mean_dp = 0;
      for (int j = 0; j < m; ++j) mean_dp += std::exp(sa[j] - amax) / z * sdp[j];
      const A p = std::exp(sa[i] - amax) / z, r = sr[i];
      const A da = p * (sdp[i] - mean_dp);
      sp[i] = p;
      skc[i] = da * r;
      skv[i] = da * sa[i] * r * r / static_cast<A>(d);
    }
    __syncthreads();
    // The next token writes red, then (after a barrier) sr/sa/sdp, then (after another) sp/skc/
    // skv: nothing read below is overwritten before every thread is done with it.
    for (int64_t k = threadIdx.x; k < d; k += blockDim.x) {
      const A gk = ld(g[k]), ck = c[k];
      A acc = 0;
      for (int i = 0; i < m; ++i) {
        const A x = ld(vs.p[i][base + k]);
        gvs.p[i][base + k] = st<T>(sp[i] * gk + skc[i] * ck - skv[i] * x);
        acc += skc[i] * x;
      }
      gc[k] += acc;
    }
  }
}

// gc = sum over chunks of the partial rows, in chunk order; gw = gc ⊙ gamma, ggamma = gc ⊙ w.
template <class T>
__global__ void attn_res_gc_final_kernel(const Acc<T>* partial, const T* w, const T* gamma, T* gw,
                                         T* ggamma, int64_t chunks, int64_t d) {
  for (int64_t k = global_thread(); k < d; k += global_threads()) {
    Acc<T> s = 0;
    for (int64_t j = 0; j < chunks; ++j) s += partial[j * d + k];
    gw[k] = st<T>(s * ld(gamma[k]));
    ggamma[k] = st<T>(s * ld(w[k]));
  }
}

int check_sources(const char* name, size_t m) {
  MYRIAD_CHECK(m >= 1 && m <= static_cast<size_t>(kMaxSources), name,
               ": the cuda kernel takes 1 to ", kMaxSources, " sources, got ", m);
  return static_cast<int>(m);
}

template <class T>
DType acc_dtype() {
  return std::is_same_v<Acc<T>, double> ? DType::F64 : DType::F32;
}

// c = w ⊙ gamma as a [d] tensor of the compute dtype.
template <class T>
Tensor pseudo_query(const char* name, const Tensor& w, const Tensor& gamma, int64_t d) {
  Tensor c = Tensor::empty({d}, acc_dtype<T>(), w.device());
  if (d > 0)
    launch(name, w.device().index, grid_for(d), kThreads, &pseudo_query_kernel<T>, cptr<T>(w),
           cptr<T>(gamma), mptr<Acc<T>>(c), d);
  return c;
}

void attn_res_cuda(const std::vector<Tensor>& sources, const Tensor& w, const Tensor& gamma,
                   double eps, Tensor& out) {
  const char* name = "attn_res";
  const int m = check_sources(name, sources.size());
  const int64_t rows = out.shape()[0], d = out.shape()[1];
  if (rows == 0 || d == 0) return;
  dispatch_float(name, out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using A = Acc<T>;
    Ptrs<const T*> vs{};
    for (int i = 0; i < m; ++i) vs.p[i] = cptr<T>(sources[i]);
    const Tensor c = pseudo_query<T>(name, w, gamma, d);
    const int threads = row_threads(d);
    launch_smem(name, out.device().index, grid_for(rows, 1), threads, smem_bytes<A>(m, threads),
                &attn_res_kernel<T>, vs, m, cptr<A>(c), static_cast<A>(eps), mptr<T>(out), rows, d);
  });
}

void attn_res_backward_cuda(const std::vector<Tensor>& sources, const Tensor& w,
                            const Tensor& gamma, double eps, const Tensor& gy,
                            std::vector<Tensor>& gsources, Tensor& gw, Tensor& ggamma) {
  const char* name = "attn_res_backward";
  const int m = check_sources(name, sources.size());
  MYRIAD_CHECK(gsources.size() == sources.size(), name, ": ", gsources.size(),
               " source gradients for ", sources.size(), " sources");
  const int64_t rows = gy.shape()[0], d = gy.shape()[1];
  if (d == 0) return;  // every output is empty
  const int dev = gy.device().index;
  dispatch_float(name, gy.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using A = Acc<T>;
    Ptrs<const T*> vs{};
    Ptrs<T*> gvs{};
    for (int i = 0; i < m; ++i) vs.p[i] = cptr<T>(sources[i]), gvs.p[i] = mptr<T>(gsources[i]);
    const Tensor c = pseudo_query<T>(name, w, gamma, d);
    // A fixed number of token chunks (a function of rows alone, so the sums do not depend on the
    // device): up to 512, of equal length but the last.
    const int64_t per_chunk = std::max<int64_t>(1, (rows + 511) / 512);
    const int64_t chunks = std::max<int64_t>(1, (rows + per_chunk - 1) / per_chunk);
    Tensor partial = Tensor::empty({chunks, d}, acc_dtype<T>(), gw.device());
    const int threads = row_threads(d);
    launch_smem(name, dev, static_cast<unsigned>(chunks), threads, smem_bytes<A>(m, threads),
                &attn_res_backward_kernel<T>, vs, m, cptr<A>(c), static_cast<A>(eps), cptr<T>(gy),
                gvs, mptr<A>(partial), rows, d, per_chunk);
    launch(name, dev, grid_for(d), kThreads, &attn_res_gc_final_kernel<T>, cptr<A>(partial),
           cptr<T>(w), cptr<T>(gamma), mptr<T>(gw), mptr<T>(ggamma), chunks, d);
  });
}

}  // namespace

MYRIAD_REGISTER_KERNEL(ops::attn_res_kernels, ops::Backend::CUDA, &attn_res_cuda);
MYRIAD_REGISTER_KERNEL(ops::attn_res_backward_kernels, ops::Backend::CUDA, &attn_res_backward_cuda);

}  // namespace myriad::gpu
