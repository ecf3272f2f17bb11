// CUDA KDA (MODEL.md §4): the gated delta rule with a per-channel decay, in its recurrent form
// (§4.3), state and arithmetic in f32 (f64 for f64 inputs). Per (b, h), with state S [K, V]:
//   S = Diag(exp(g_t)) S;  e = v_t - S^T k_t;  S += beta_t k_t e^T;  o_t = S^T (scale q_t).
// Every value column S[:, j] evolves on its own (the decay is per key row and the delta correction
// uses (S^T k)_j of the same column), so the forward and the decode step run one block per
// (b, h, tile of 16 value columns): 8 lanes share a column, each holding R = ceil(K / 8) rows of
// it in registers (rows d = lane + 8 r, R a power of two, K <= 256), and the sums over the key
// rows are 3 shuffles within the 8 lanes. Tokens run in order; scale q, k, exp(g), beta and the
// tile's v of a few tokens at a time are staged in shared memory. The forward stores the state
// entering each chunk into `saved`.
//
// This is the recurrent form, not the chunkwise WY/UT tensor-core form of §4.4 (a later step).
//
// Backward: the reverse adjoint of the Reference kernel (ops/kda.cpp), token by token. With Sp
// the state before token t, alpha = exp(g_t), Sa = Diag(alpha) Sp, e = v - Sa^T k,
// St = Sa + beta k e^T, o = St^T qs (qs = scale q), and dS the gradient of the state after t:
//   dSt = dS + qs do^T                 (o reads St)
//   dq = scale St do                   (a sum over the value columns)
//   de = beta dSt^T k;  dv = de        (St = Sa + beta k e^T)
//   dSe = dSt e;  dbeta = k . dSe;  dk = beta dSe - Sa de
//   dSa = dSt - k de^T                 (Sa reaches St directly and through e = v - Sa^T k)
//   dg = rowsum(Sa * dSa)              (dSa/dg = Sa, row by row)
//   dS (before t) = Diag(alpha) dSa
// The dS recurrence needs no state and is column-independent like the forward, while dq, dk, dg
// and dbeta are per-token sums over all value columns. The backward runs in units of at most one
// chunk (chunks in reverse, the state entering each read from `saved`), each as two kernels:
//  1. kda_backward_chunk (the forward's layout): recomputes the states before each of the unit's
//     tokens from the entering state into a global scratch (and e), then runs the dS recurrence in
//     reverse (dS carried between units in dh0; the first unit reads dht), writing dv and, per
//     token, the sums over the block's 16 columns of St do, dSt e, Sa de and Sa dSa (a transpose
//     through shared memory, each summed in a fixed order) as per-tile partials;
//  2. kda_backward_sum: per token and key row, the partials summed over the tiles in order, giving
//     dq, dk, dg, and dbeta as a block sum over the rows. Deterministic, no atomics.
// (b, h) pairs are processed in groups so the scratch stays under kScratchBytes; a chunk too long
// for it is split into sub-chunks whose entering states a forward pass over the chunk stores.
#include <algorithm>
#include <climits>
#include <cmath>
#include <type_traits>
#include <utility>

#include "backend/cuda/kernels.cuh"
#include "ops/kda.h"

namespace myriad::gpu {
namespace {

constexpr int kLanes = 8;                       // lanes per value column
constexpr int kCols = 16;                       // value columns per block
constexpr int kRecThreads = kLanes * kCols;     // threads of the recurrent kernels
constexpr int kMaxRows = 32;                    // rows per lane: K <= 256
constexpr int kSumThreads = kLanes * kMaxRows;  // threads of kda_backward_sum (one per key row)
constexpr int64_t kScratchBytes = 512ll << 20;  // backward scratch budget

// The sequence: q, k, v [B, T, H, K|V] in X; g [B, T, H, K], beta [B, T, H] in A.
template <class X>
struct Seq {
  const X* q;
  const X* k;
  const X* v;
  const Acc<X>* g;
  const Acc<X>* beta;
  int64_t len, H, K, V;  // len = T
  Acc<X> scale;
};

// Tokens per stage: a power of two in [2, 16] keeping a stage near 16 KB.
constexpr int stage_tokens_for(int kp, int bytes) {
  int tt = 16;
  while (tt > 2 && tt * (3 * kp + 2 * kCols + 1) * bytes > 16384) tt /= 2;
  return tt;
}

// Up to TT tokens staged in shared memory: per key row scale q, k, exp(g) (padded rows: 0, 0,
// 1), beta, and two per-column vectors x, y of the block's value columns (0 outside).
template <class X, int R>
struct Stage {
  using A = Acc<X>;
  static constexpr int KP = kLanes * R;
  static constexpr int TT = stage_tokens_for(KP, sizeof(A));
  A q[TT][KP], k[TT][KP], a[TT][KP], b[TT], x[TT][kCols], y[TT][kCols];
};

// Stages the row quantities of tokens t_first .. t_first + cnt - 1 of (b, h) (no barrier).
template <class X, int R>
__device__ void stage_rows(Stage<X, R>& sh, const Seq<X>& s, int64_t b, int64_t h, int64_t t_first,
                           int cnt, bool want_q) {
  using A = Acc<X>;
  using St = Stage<X, R>;
  for (int idx = threadIdx.x; idx < St::TT * St::KP; idx += blockDim.x) {
    const int tt = idx / St::KP, d = idx - tt * St::KP;
    A qv = 0, kv = 0, av = 1;
    if (tt < cnt && d < s.K) {
      const int64_t off = ((b * s.len + t_first + tt) * s.H + h) * s.K + d;
      kv = ld(s.k[off]);
      av = std::exp(s.g[off]);
      if (want_q) qv = s.scale * ld(s.q[off]);
    }
    sh.q[tt][d] = qv;
    sh.k[tt][d] = kv;
    sh.a[tt][d] = av;
  }
  for (int tt = threadIdx.x; tt < St::TT; tt += blockDim.x)
    sh.b[tt] = tt < cnt ? s.beta[(b * s.len + t_first + tt) * s.H + h] : A(0);
}

// dst[tt][c] = src[tt * row + c] for the block's columns j0 + c < V and tt < cnt, else 0.
template <class T, int TT, class A>
__device__ void stage_cols(A (&dst)[TT][kCols], const T* src, int64_t row, int cnt, int64_t j0,
                           int64_t V) {
  for (int idx = threadIdx.x; idx < TT * kCols; idx += blockDim.x) {
    const int tt = idx / kCols, c = idx - tt * kCols;
    dst[tt][c] = (tt < cnt && j0 + c < V) ? A(ld(src[tt * row + j0 + c])) : A(0);
  }
}

// Sum over the kLanes lanes of a column (all lanes get it; every lane of the warp must call).
template <class A>
__device__ inline A column_sum(A v) {
  for (int o = 1; o < kLanes; o <<= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// The recurrence over tokens t0 .. t0 + n - 1 of the (b, h) pairs bh0 + blockIdx.x / tiles,
// starting from S0[lb * s0_stride] (lb = the pair's index from bh0; null: zeros). Writes o
// ([B, T, H, V], may be null), the final state to hout[lb * hout_stride] (may be null) and,
// when bnd is not null, the state entering each run of `chunk` tokens to
// bnd[lb * bnd_stride + c * K * V].
template <class X, int R>
__global__ void __launch_bounds__(kRecThreads)
    kda_forward_kernel(Seq<X> s, int64_t bh0, int64_t tiles, int64_t t0, int64_t n,
                       const Acc<X>* S0, int64_t s0_stride, Acc<X>* o, Acc<X>* hout,
                       int64_t hout_stride, Acc<X>* bnd, int64_t bnd_stride, int64_t chunk) {
  using A = Acc<X>;
  using St = Stage<X, R>;
  __shared__ St sh;
  const int64_t lb = blockIdx.x / tiles, tile = blockIdx.x - lb * tiles;
  const int64_t bh = bh0 + lb, b = bh / s.H, h = bh - b * s.H;
  const int sl = threadIdx.x % kLanes, cl = threadIdx.x / kLanes;
  const int64_t j = tile * kCols + cl;
  const bool col = j < s.V;
  const int64_t KV = s.K * s.V, vrow = s.H * s.V;
  A S[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int d = sl + kLanes * r;
    S[r] = (S0 && col && d < s.K) ? S0[lb * s0_stride + d * s.V + j] : A(0);
  }
  int64_t since = 0, c = 0;  // tokens since the last boundary, boundaries written
  for (int64_t i0 = 0; i0 < n; i0 += St::TT) {
    const int cnt = static_cast<int>(min(static_cast<int64_t>(St::TT), n - i0));
    const int64_t vbase = ((b * s.len + t0 + i0) * s.H + h) * s.V;
    stage_rows(sh, s, b, h, t0 + i0, cnt, o != nullptr);
    stage_cols(sh.x, s.v + vbase, vrow, cnt, tile * kCols, s.V);
    __syncthreads();
    for (int tt = 0; tt < cnt; ++tt) {
      if (bnd && since == 0) {
        if (col) {
          A* p = bnd + lb * bnd_stride + c * KV + j;
#pragma unroll
          for (int r = 0; r < R; ++r) {
            const int d = sl + kLanes * r;
            if (d < s.K) p[d * s.V] = S[r];
          }
        }
        ++c;
      }
      if (++since == chunk) since = 0;
      A p0 = 0, p1 = 0;
#pragma unroll
      for (int r = 0; r < R; ++r) {
        S[r] *= sh.a[tt][sl + kLanes * r];
        (r & 1 ? p1 : p0) += S[r] * sh.k[tt][sl + kLanes * r];
      }
      const A be = sh.b[tt] * (sh.x[tt][cl] - column_sum(p0 + p1));
      A a0 = 0, a1 = 0;
#pragma unroll
      for (int r = 0; r < R; ++r) {
        S[r] += sh.k[tt][sl + kLanes * r] * be;
        (r & 1 ? a1 : a0) += S[r] * sh.q[tt][sl + kLanes * r];
      }
      if (o) {
        const A acc = column_sum(a0 + a1);
        if (col && sl == 0) o[vbase + tt * vrow + j] = acc;
      }
    }
    __syncthreads();  // before the next tokens overwrite the stage
  }
  if (hout && col) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int d = sl + kLanes * r;
      if (d < s.K) hout[lb * hout_stride + d * s.V + j] = S[r];
    }
  }
}

// Backward over tokens t0 .. t0 + n - 1 (n <= cap) of the pairs bh0 + lb, in the forward's
// layout. Scratch per pair lb: Sbuf [tiles, cap, R, threads] (the state before each token, as
// each thread holds it: every access is a whole coalesced row; only this thread reads it back) and
// ebuf [cap, V]; part [cap, tiles, 4, K] receives, per token and tile, the sums over the tile's
// columns of St do, dSt e, Sa de and Sa dSa (for dq, dk, dbeta, dg). dS is read from dS_src and
// written to dS_dst (both [B*H, K, V], may alias: each element is read and written by the same
// thread). Dynamic shared memory: red [4][KP][kCols + 1].
template <class X, int R>
__global__ void __launch_bounds__(kRecThreads)
    kda_backward_chunk_kernel(Seq<X> s, int64_t bh0, int64_t tiles, int64_t t0, int64_t n,
                              const Acc<X>* S0, int64_t s0_stride, int64_t cap, Acc<X>* Sbuf,
                              Acc<X>* ebuf, Acc<X>* part, const Acc<X>* d_o, const Acc<X>* dS_src,
                              Acc<X>* dS_dst, X* dv) {
  using A = Acc<X>;
  using St = Stage<X, R>;
  constexpr int KP = St::KP, RS = kCols + 1;
  __shared__ St sh;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  A* red = reinterpret_cast<A*>(smem_raw);
  const int64_t lb = blockIdx.x / tiles, tile = blockIdx.x - lb * tiles;
  const int64_t bh = bh0 + lb, b = bh / s.H, h = bh - b * s.H;
  const int sl = threadIdx.x % kLanes, cl = threadIdx.x / kLanes;
  const int64_t j = tile * kCols + cl;
  const bool col = j < s.V;
  const int64_t KV = s.K * s.V, vrow = s.H * s.V;
  A* Sb = Sbuf + (lb * tiles + tile) * cap * R * kRecThreads + threadIdx.x;
  A* eb = ebuf + lb * cap * s.V;

  // States, forward: Sbuf and e.
  A S[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int d = sl + kLanes * r;
    S[r] = (col && d < s.K) ? S0[lb * s0_stride + d * s.V + j] : A(0);
  }
  for (int64_t i0 = 0; i0 < n; i0 += St::TT) {
    const int cnt = static_cast<int>(min(static_cast<int64_t>(St::TT), n - i0));
    stage_rows(sh, s, b, h, t0 + i0, cnt, false);
    stage_cols(sh.x, s.v + ((b * s.len + t0 + i0) * s.H + h) * s.V, vrow, cnt, tile * kCols, s.V);
    __syncthreads();
    for (int tt = 0; tt < cnt; ++tt) {
      const int64_t i = i0 + tt;
#pragma unroll
      for (int r = 0; r < R; ++r) Sb[(i * R + r) * kRecThreads] = S[r];
      A p0 = 0, p1 = 0;
#pragma unroll
      for (int r = 0; r < R; ++r) {
        S[r] *= sh.a[tt][sl + kLanes * r];
        (r & 1 ? p1 : p0) += S[r] * sh.k[tt][sl + kLanes * r];
      }
      const A e = sh.x[tt][cl] - column_sum(p0 + p1);
      if (col && sl == 0) eb[i * s.V + j] = e;
      const A be = sh.b[tt] * e;
#pragma unroll
      for (int r = 0; r < R; ++r) S[r] += sh.k[tt][sl + kLanes * r] * be;
    }
    __syncthreads();  // also makes ebuf visible to the whole block
  }

  // The state gradient in reverse (S now holds dS), with the per-token column sums.
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int d = sl + kLanes * r;
    S[r] = (col && d < s.K) ? dS_src[bh * KV + d * s.V + j] : A(0);
  }
  // Sbuf[i] is loaded one token ahead where the registers allow it.
  constexpr bool kAhead = R * sizeof(A) <= 128;
  A Sn[kAhead ? R : 1];
  if constexpr (kAhead) {
#pragma unroll
    for (int r = 0; r < R; ++r) Sn[r] = Sb[((n - 1) * R + r) * kRecThreads];
  }
  for (int64_t i1 = n; i1 > 0;) {
    const int64_t ib = max(int64_t(0), i1 - St::TT);
    const int cnt = static_cast<int>(i1 - ib);
    const int64_t vbase = ((b * s.len + t0 + ib) * s.H + h) * s.V;
    stage_rows(sh, s, b, h, t0 + ib, cnt, true);
    stage_cols(sh.x, d_o + vbase, vrow, cnt, tile * kCols, s.V);
    stage_cols(sh.y, eb + ib * s.V, s.V, cnt, tile * kCols, s.V);
    __syncthreads();
    for (int tt = cnt - 1; tt >= 0; --tt) {
      const int64_t i = ib + tt;
      A Sp[R];
#pragma unroll
      for (int r = 0; r < R; ++r) {
        if constexpr (kAhead) {
          Sp[r] = Sn[r];
          Sn[r] = i > 0 ? Sb[((i - 1) * R + r) * kRecThreads] : A(0);
        } else {
          Sp[r] = Sb[(i * R + r) * kRecThreads];
        }
      }
      const A dov = sh.x[tt][cl], e = sh.y[tt][cl], be = sh.b[tt] * e;
      A p0 = 0, p1 = 0;
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const int d = sl + kLanes * r;
        const A kd = sh.k[tt][d];
        Sp[r] *= sh.a[tt][d];                                   // Sa
        S[r] += sh.q[tt][d] * dov;                              // dSt
        red[(0 * KP + d) * RS + cl] = (Sp[r] + kd * be) * dov;  // St do
        red[(1 * KP + d) * RS + cl] = S[r] * e;
        (r & 1 ? p1 : p0) += S[r] * kd;
      }
      const A de = sh.b[tt] * column_sum(p0 + p1);
      if (col && sl == 0) dv[vbase + tt * vrow + j] = st<X>(de);
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const int d = sl + kLanes * r;
        const A dSa = S[r] - sh.k[tt][d] * de;
        red[(2 * KP + d) * RS + cl] = Sp[r] * de;
        red[(3 * KP + d) * RS + cl] = Sp[r] * dSa;
        S[r] = dSa * sh.a[tt][d];
      }
      __syncthreads();
      A* out = part + ((lb * cap + i) * tiles + tile) * 4 * s.K;
      for (int idx = threadIdx.x; idx < 4 * KP; idx += blockDim.x) {
        const int qn = idx / KP, d = idx - qn * KP;
        if (d >= s.K) continue;
        const A* rw = red + idx * RS;
        A acc = 0;
#pragma unroll
        for (int c = 0; c < kCols; ++c) acc += rw[c];
        out[qn * s.K + d] = acc;
      }
      __syncthreads();
    }
    i1 = ib;
  }
  if (col) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int d = sl + kLanes * r;
      if (d < s.K) dS_dst[bh * KV + d * s.V + j] = S[r];
    }
  }
}

// Backward, the sums over tiles: block lb * n + i handles token t0 + i of pair bh0 + lb, thread
// d the key row d: dq = scale sum St do, dk = beta sum dSt e - sum Sa de, dg = sum Sa dSa,
// dbeta = sum_d k_d (sum dSt e)_d.
template <class X>
__global__ void __launch_bounds__(kSumThreads)
    kda_backward_sum_kernel(Seq<X> s, int64_t bh0, int64_t tiles, int64_t t0, int64_t n,
                            int64_t cap, const Acc<X>* part, X* dq, X* dk, Acc<X>* dg,
                            Acc<X>* dbeta) {
  using A = Acc<X>;
  __shared__ A scratch[32];
  const int64_t lb = blockIdx.x / n, i = blockIdx.x - lb * n;
  const int64_t bh = bh0 + lb, b = bh / s.H, h = bh - b * s.H, t = t0 + i;
  const int d = threadIdx.x;
  const A* P = part + (lb * cap + i) * tiles * 4 * s.K;
  A kd = 0, ae = 0;
  if (d < s.K) {
    A aq = 0, ak = 0, ag = 0;
    for (int64_t tl = 0; tl < tiles; ++tl) {
      const A* p = P + tl * 4 * s.K + d;
      aq += p[0];
      ae += p[s.K];
      ak += p[2 * s.K];
      ag += p[3 * s.K];
    }
    const int64_t off = ((b * s.len + t) * s.H + h) * s.K + d;
    kd = ld(s.k[off]);
    const A beta = s.beta[(b * s.len + t) * s.H + h];
    dq[off] = st<X>(s.scale * aq);
    dk[off] = st<X>(beta * ae - ak);
    dg[off] = ag;
  }
  const A tot = block_sum(kd * ae, scratch);
  if (threadIdx.x == 0) dbeta[(b * s.len + t) * s.H + h] = tot;
}

// ---- host side ----

template <class X>
Seq<X> make_seq(const ops::KdaArgs& a) {
  return {
      cptr<X>(a.q), cptr<X>(a.k), cptr<X>(a.v), cptr<Acc<X>>(a.g), cptr<Acc<X>>(a.beta),
      a.q.size(1),  a.q.size(2),  a.q.size(3),  a.v.size(3),       static_cast<Acc<X>>(a.scale)};
}

// Rows per lane for K: the power of two >= K / kLanes.
int rows_for(int64_t K) {
  int r = 1;
  while (r * kLanes < K) r *= 2;
  return r;
}

// Calls f(std::integral_constant<int, R>) with R = rows per lane for K (a power of two).
template <class F>
void with_rows(const char* op, int64_t K, F&& f) {
  MYRIAD_CHECK(K <= kLanes * kMaxRows, op, ": the cuda kernel supports K <= ", kLanes * kMaxRows,
               " (the key head size), got ", K);
  const int r = rows_for(K);
  if (r <= 1) return f(std::integral_constant<int, 1>{});
  if (r <= 2) return f(std::integral_constant<int, 2>{});
  if (r <= 4) return f(std::integral_constant<int, 4>{});
  if (r <= 8) return f(std::integral_constant<int, 8>{});
  if (r <= 16) return f(std::integral_constant<int, 16>{});
  return f(std::integral_constant<int, 32>{});
}

template <class X>
void check_args(const char* op, const ops::KdaArgs& a) {
  constexpr DType acc = std::is_same_v<Acc<X>, double> ? DType::F64 : DType::F32;
  for (const Tensor* t : {&a.g, &a.beta, &a.h0})
    if (t->defined())
      MYRIAD_CHECK(t->dtype() == acc, op, ": the cuda kernel expects g, beta and the state in ",
                   dtype_name(acc), " for ", dtype_name(a.q.dtype()), " inputs, got ", t->desc());
  MYRIAD_CHECK(a.k.dtype() == a.q.dtype() && a.v.dtype() == a.q.dtype(), op,
               ": q, k and v must share a dtype, got ", a.q.desc(), ", ", a.k.desc(), " and ",
               a.v.desc());
}

template <class... P, class... Args>
void launch_smem(const char* name, int device, int64_t blocks, int threads, size_t smem,
                 void (*kernel)(P...), Args&&... args) {
  MYRIAD_CHECK(blocks <= INT_MAX, name, ": too many blocks for one launch (", blocks, ")");
  DeviceGuard g(device);
  kernel<<<static_cast<unsigned>(blocks), threads, smem, current_stream(device)>>>(
      std::forward<Args>(args)...);
  CUDA_CHECK_LAUNCH(name);
}

// The forward recurrence (see kda_forward_kernel) for pairs bh0 .. bh0 + nbh - 1.
template <class X>
void run_forward(const char* name, int dev, const Seq<X>& s, int64_t bh0, int64_t nbh, int64_t t0,
                 int64_t n, const Acc<X>* S0, int64_t s0_stride, Acc<X>* o, Acc<X>* hout,
                 int64_t hout_stride, Acc<X>* bnd, int64_t bnd_stride, int64_t chunk) {
  const int64_t tiles = (s.V + kCols - 1) / kCols;
  if (nbh == 0 || tiles == 0) return;
  with_rows(name, s.K, [&](auto rows) {
    constexpr int R = decltype(rows)::value;
    launch_smem(name, dev, nbh * tiles, kRecThreads, 0, &kda_forward_kernel<X, R>, s, bh0, tiles,
                t0, n, S0, s0_stride, o, hout, hout_stride, bnd, bnd_stride, chunk);
  });
}

void kda_cuda(const ops::KdaArgs& a, Tensor& o, Tensor& ht, ops::KdaSaved& kept) {
  Tensor& saved = kept.states;  // (U is not kept: the backward repeats the solve)
  const char* name = "kda";
  dispatch_float(name, a.q.dtype(), [&](auto tag) {
    using X = decltype(tag);
    using A = Acc<X>;
    check_args<X>(name, a);
    const Seq<X> s = make_seq<X>(a);
    const int64_t BH = a.q.size(0) * s.H, KV = s.K * s.V, NC = (s.len + a.chunk - 1) / a.chunk;
    run_forward<X>(name, ht.device().index, s, 0, BH, 0, s.len,
                   a.h0.defined() ? cptr<A>(a.h0) : nullptr, KV, s.len > 0 ? mptr<A>(o) : nullptr,
                   mptr<A>(ht), KV, saved.defined() && NC > 0 ? mptr<A>(saved) : nullptr, NC * KV,
                   a.chunk);
  });
}

void kda_step_cuda(const ops::KdaArgs& a, Tensor& o, Tensor& new_state) {
  const char* name = "kda_step";
  MYRIAD_CHECK(a.q.size(1) == 1, name, ": expects one token, got q ", a.q.desc());
  dispatch_float(name, a.q.dtype(), [&](auto tag) {
    using X = decltype(tag);
    using A = Acc<X>;
    check_args<X>(name, a);
    const Seq<X> s = make_seq<X>(a);
    const int64_t BH = a.q.size(0) * s.H, KV = s.K * s.V;
    run_forward<X>(name, new_state.device().index, s, 0, BH, 0, 1,
                   a.h0.defined() ? cptr<A>(a.h0) : nullptr, KV, mptr<A>(o), mptr<A>(new_state), KV,
                   nullptr, 0, 1);
  });
}

// Scratch elements per (b, h) pair for units of `cap` tokens: Sbuf, ebuf, part.
int64_t scratch_per_pair(int64_t cap, int64_t K, int64_t V) {
  const int64_t tiles = (V + kCols - 1) / kCols;
  return cap * (tiles * rows_for(K) * kRecThreads + V + 4 * K * tiles);
}

template <class X>
void backward_impl(const char* name, const ops::KdaArgs& a, const Tensor& saved, const Tensor& d_o,
                   const Tensor& dht, ops::KdaGrads& gr, int64_t budget_bytes) {
  using A = Acc<X>;
  check_args<X>(name, a);
  const Seq<X> s = make_seq<X>(a);
  const int64_t B = a.q.size(0), BH = B * s.H, K = s.K, V = s.V, KV = K * V, T = s.len;
  const int64_t C = a.chunk, NC = (T + C - 1) / C;
  const int dev = gr.dh0.device().index;
  const DType acc = std::is_same_v<A, double> ? DType::F64 : DType::F32;
  for (const Tensor* t : {&saved, &d_o, &dht})
    MYRIAD_CHECK(t->defined() && t->dtype() == acc, name, ": expects the saved states, d_o and dht",
                 " in ", dtype_name(acc));
  MYRIAD_CHECK(saved.numel() == BH * NC * KV, name,
               ": saved must be [B, H, NC, K, V] = ", shape_str({B, s.H, NC, K, V}), ", got ",
               saved.desc());
  with_rows(name, K, [](auto) {});  // checks K
  if (BH == 0) return;
  if (T == 0) {  // the state passes through
    if (KV > 0) {
      DeviceGuard g(dev);
      CUDA_CHECK(cudaMemcpyAsync(mptr<A>(gr.dh0), cptr<A>(dht), KV * BH * sizeof(A),
                                 cudaMemcpyDeviceToDevice, current_stream(dev)));
    }
    return;
  }
  const int64_t tiles = (V + kCols - 1) / kCols;
  // Units of `cap` tokens (a whole chunk when the scratch allows) and groups of `G` pairs.
  const int64_t budget = std::max<int64_t>(1, budget_bytes / static_cast<int64_t>(sizeof(A)));
  int64_t cap = std::min(C, T);
  const int64_t per_token = std::max<int64_t>(1, scratch_per_pair(1, K, V));
  if (cap * per_token > budget) cap = std::clamp<int64_t>(budget / per_token, 1, cap);
  int64_t G = std::clamp<int64_t>(budget / (cap * per_token), 1, BH);
  G = std::max<int64_t>(1, std::min(G, INT_MAX / (cap * std::max<int64_t>(1, tiles))));
  const int64_t groups = (BH + G - 1) / G;  // as even as possible
  G = (BH + groups - 1) / groups;
  const int64_t nsub_max = (std::min(C, T) + cap - 1) / cap;
  const Device d = gr.dh0.device();
  Tensor Sbuf = Tensor::empty({G * tiles * cap * rows_for(K) * kRecThreads}, acc, d);
  Tensor ebuf = Tensor::empty({G * cap * V}, acc, d);
  Tensor part = Tensor::empty({G * cap * tiles * 4 * K}, acc, d);
  Tensor subbuf = nsub_max > 1 ? Tensor::empty({G * nsub_max * KV}, acc, d) : Tensor();
  A* dh0 = mptr<A>(gr.dh0);
  for (int64_t g0 = 0; g0 < BH; g0 += G) {
    const int64_t nb = std::min(G, BH - g0);
    bool first = true;
    // One unit: tokens t0 .. t0 + n - 1 from the entering states S0[lb * s0_stride].
    auto unit = [&](int64_t t0, int64_t n, const A* S0, int64_t s0_stride) {
      const A* src = first ? cptr<A>(dht) : dh0;
      first = false;
      if (tiles > 0)
        with_rows(name, K, [&](auto rows) {
          constexpr int R = decltype(rows)::value;
          auto* kernel = &kda_backward_chunk_kernel<X, R>;
          const size_t red = 4 * static_cast<size_t>(kLanes * R) * (kCols + 1) * sizeof(A);
          if (red + sizeof(Stage<X, R>) > 48 * 1024) {  // static + dynamic over the default
            DeviceGuard g(dev);
            CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            static_cast<int>(red)));
          }
          launch_smem(name, dev, nb * tiles, kRecThreads, red, kernel, s, g0, tiles, t0, n, S0,
                      s0_stride, cap, mptr<A>(Sbuf), mptr<A>(ebuf), mptr<A>(part), cptr<A>(d_o),
                      src, dh0, mptr<X>(gr.dv));
        });
      launch_smem(name, dev, nb * n, kSumThreads, 0, &kda_backward_sum_kernel<X>, s, g0, tiles, t0,
                  n, cap, cptr<A>(part), mptr<X>(gr.dq), mptr<X>(gr.dk), mptr<A>(gr.dg),
                  mptr<A>(gr.dbeta));
    };
    for (int64_t c = NC - 1; c >= 0; --c) {
      const int64_t tc = c * C, nc = std::min(C, T - tc);
      const A* entering = cptr<A>(saved) + (g0 * NC + c) * KV;
      if (nc <= cap) {
        unit(tc, nc, entering, NC * KV);
        continue;
      }
      // The chunk in sub-chunks of cap tokens: their entering states from a forward pass.
      const int64_t nsub = (nc + cap - 1) / cap;
      run_forward<X>(name, dev, s, g0, nb, tc, nc, entering, NC * KV, nullptr, nullptr, 0,
                     mptr<A>(subbuf), nsub_max * KV, cap);
      for (int64_t u = nsub - 1; u >= 0; --u)
        unit(tc + u * cap, std::min(cap, nc - u * cap), cptr<A>(subbuf) + u * KV, nsub_max * KV);
    }
  }
}

void kda_backward_cuda(const ops::KdaArgs& a, const ops::KdaSaved& saved, const Tensor& d_o,
                       const Tensor& dht, ops::KdaGrads& gr) {
  dispatch_float("kda_backward", a.q.dtype(), [&](auto tag) {
    backward_impl<decltype(tag)>("kda_backward", a, saved.states, d_o, dht, gr, kScratchBytes);
  });
}

// ---- the gates (ops::KdaGateKind), element by element on x = z + bias: the forward one thread
// per element; the backward writes dz the same way and sums dbias and da in two deterministic
// passes (per row chunk and column, then over the chunks in order, as rms_norm's gw) ----
template <class A>
__device__ A gate_softplus(A x) {
  return x > A(20) ? x : log1p(exp(x));
}

template <class T>
__global__ void kda_gate_kernel(const T* z, const Acc<T>* bias, const Acc<T>* a, bool softplus,
                                Acc<T> g_min, Acc<T>* g, int64_t n, int64_t P, int64_t per_head) {
  using A = Acc<T>;
  for (int64_t i = global_thread(); i < n; i += global_threads()) {
    const int64_t p = i % P;
    const A x = ld(z[i]) + (bias ? bias[p] : A(0)), f = a[p / per_head];
    g[i] = softplus ? -(f * gate_softplus(x)) : g_min / (A(1) + exp(-(f * x)));
  }
}

constexpr int kGateCols = 32, kGateSplit = 8;

// dz per element; per (row chunk, column): the sums of dx (for dbias) and of dg * dg/da.
template <class T>
__global__ void kda_gate_backward_kernel(const T* z, const Acc<T>* bias, const Acc<T>* a,
                                         bool softplus, Acc<T> g_min, const Acc<T>* dg, T* dz,
                                         Acc<T>* part_db, Acc<T>* part_da, int64_t rows, int64_t P,
                                         int64_t per_head, int64_t rows_per_chunk) {
  using A = Acc<T>;
  __shared__ A sdb[kGateSplit][kGateCols], sda[kGateSplit][kGateCols];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kGateCols + tx, chunk = blockIdx.y;
  const int64_t r0 = chunk * rows_per_chunk, r1 = min(rows, r0 + rows_per_chunk);
  A db = 0, da = 0;
  if (c < P) {
    const A f = a[c / per_head], b = bias ? bias[c] : A(0);
    for (int64_t r = r0 + ty; r < r1; r += kGateSplit) {
      const int64_t i = r * P + c;
      const A x = ld(z[i]) + b, d = dg[i];
      A dx;
      if (softplus) {
        dx = -d * f * (x > A(20) ? A(1) : A(1) / (A(1) + exp(-x)));
        da -= d * gate_softplus(x);
      } else {
        const A s = A(1) / (A(1) + exp(-(f * x))), t = g_min * s * (A(1) - s) * d;
        dx = f * t;
        da += x * t;
      }
      dz[i] = st<T>(dx);
      db += dx;
    }
  }
  sdb[ty][tx] = db, sda[ty][tx] = da;
  __syncthreads();
  if (ty == 0 && c < P) {
    for (int j = 1; j < kGateSplit; ++j) db += sdb[j][tx], da += sda[j][tx];
    part_db[chunk * P + c] = db;
    part_da[chunk * P + c] = da;
  }
}

// dbias[c] = the chunks' sums in order; da[h] = its columns' sums in order, chunk by chunk.
template <class A>
__global__ void kda_gate_final_kernel(const A* part_db, const A* part_da, A* dbias, A* da,
                                      int64_t chunks, int64_t P, int64_t H) {
  const int64_t per_head = P / H;
  for (int64_t t = global_thread(); t < P + H; t += global_threads()) {
    A s = 0;
    if (t < P) {
      if (!dbias) continue;
      for (int64_t j = 0; j < chunks; ++j) s += part_db[j * P + t];
      dbias[t] = s;
    } else {
      const int64_t h = t - P;
      for (int64_t j = 0; j < chunks; ++j)
        for (int64_t c = h * per_head; c < (h + 1) * per_head; ++c) s += part_da[j * P + c];
      da[h] = s;
    }
  }
}

void kda_gate_cuda(const ops::KdaGateArgs& args, Tensor& g) {
  const int64_t rows = args.z.size(0), P = args.z.size(1), H = args.a.numel();
  dispatch_float("kda_gate", args.z.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using A = Acc<T>;
    const int64_t n = rows * P;
    launch("kda_gate", g.device().index, grid_for(n), kThreads, &kda_gate_kernel<T>,
           cptr<T>(args.z), args.bias.defined() ? cptr<A>(args.bias) : nullptr, cptr<A>(args.a),
           args.kind == ops::KdaGateKind::Softplus, static_cast<A>(args.g_min), mptr<A>(g), n, P,
           P / H);
  });
}

void kda_gate_backward_cuda(const ops::KdaGateArgs& args, const Tensor& dg, Tensor& dz,
                            Tensor& dbias, Tensor& da) {
  const char* name = "kda_gate_backward";
  const int64_t rows = args.z.size(0), P = args.z.size(1), H = args.a.numel();
  const int dev = dz.device().index;
  dispatch_float(name, args.z.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using A = Acc<T>;
    const int64_t col_tiles = (P + kGateCols - 1) / kGateCols;
    int64_t chunks = std::clamp<int64_t>((1024 + col_tiles - 1) / col_tiles, 1, 65535);
    chunks = std::max<int64_t>(1, std::min(chunks, (rows + 63) / 64));
    const int64_t per_chunk = std::max<int64_t>(1, (rows + chunks - 1) / chunks);
    const DType at = std::is_same_v<A, double> ? DType::F64 : DType::F32;
    Tensor part_db = Tensor::empty({chunks, P}, at, dz.device());
    Tensor part_da = Tensor::empty({chunks, P}, at, dz.device());
    launch(name, dev, dim3(static_cast<unsigned>(col_tiles), static_cast<unsigned>(chunks)),
           dim3(kGateCols, kGateSplit), &kda_gate_backward_kernel<T>, cptr<T>(args.z),
           args.bias.defined() ? cptr<A>(args.bias) : nullptr, cptr<A>(args.a),
           args.kind == ops::KdaGateKind::Softplus, static_cast<A>(args.g_min), cptr<A>(dg),
           mptr<T>(dz), mptr<A>(part_db), mptr<A>(part_da), rows, P, P / H, per_chunk);
    launch(name, dev, grid_for(P + H), kThreads, &kda_gate_final_kernel<A>, cptr<A>(part_db),
           cptr<A>(part_da), dbias.defined() ? mptr<A>(dbias) : nullptr, mptr<A>(da), chunks, P, H);
  });
}

}  // namespace

MYRIAD_REGISTER_KERNEL(ops::kda_gate_kernels, ops::Backend::CUDA, &kda_gate_cuda);
MYRIAD_REGISTER_KERNEL(ops::kda_gate_backward_kernels, ops::Backend::CUDA, &kda_gate_backward_cuda);
MYRIAD_REGISTER_KERNEL(ops::kda_kernels, ops::Backend::CUDA, &kda_cuda);
MYRIAD_REGISTER_KERNEL(ops::kda_backward_kernels, ops::Backend::CUDA, &kda_backward_cuda);
MYRIAD_REGISTER_KERNEL(ops::kda_step_kernels, ops::Backend::CUDA, &kda_step_cuda);

}  // namespace myriad::gpu
