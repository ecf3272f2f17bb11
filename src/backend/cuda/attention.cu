// CUDA scaled dot-product attention (ops/attention.h), flash style: scores never exist beyond one
// tile of keys; softmax statistics in f32 (f64 for f64); f32, bf16 and f64 storage.
//  - Forward: a block takes (batch, kv head, tile of query rows, key split). The rows of a tile
//    are (position, head) pairs of the G query heads that share the kv head, R per warp, so a
//    tile of KT keys and values staged in shared memory serves all of them (GQA, MQA, absorbed
//    MLA). Lane j dots key j with each of its warp's query rows (held in shared memory), the
//    online softmax runs per row with warp reductions, and the output rows accumulate in
//    registers with the lanes over the head dims (a template bucket bounds their number). Few
//    work items (decode) split the keys; the splits are merged by their log-sum-exp.
//  - Backward: delta = rowsum(dout * out); dq per query row in the forward's layout (P recomputed
//    from the saved lse; keys split as in the forward, partials summed in a fixed order); dk and
//    dv per key, a block taking a tile of keys and its lanes running over the query rows that see
//    them; dbias partials per (batch, kv head, key) in that pass, summed over kv heads after.
//    No atomics: the results do not depend on scheduling.
// Plain FMA loops on the CUDA cores; tensor-core (mma) tiles are a later step.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

#include "backend/cuda/kernels.cuh"
#include "ops/attention.h"

namespace myriad::gpu {
namespace {
using ops::AttentionParams;

constexpr unsigned kFull = 0xffffffffu;

// Shapes, strides (elements, dimensions 0-2; the last is unit-stride) and parameters.
struct Geo {
  int64_t B, Hq, Hkv, G, Tq, Tk, Dk, Dv;
  int64_t rows;                        // G * Tq query rows per (batch, kv head)
  int64_t nrows;                       // B * Hq * Tq output rows
  int64_t qs[3], ks[3], vs[3], os[3];  // q, k, v, dout
  double scale;
  int64_t q_offset, bias_window;
  bool causal;
};

Geo make_geo(const AttentionParams& p, const Tensor& q, const Tensor& k, const Tensor& v,
             const Tensor* dout) {
  Geo g{};
  g.B = q.shape()[0];
  g.Hq = q.shape()[1];
  g.Hkv = k.shape()[1];
  g.G = g.Hq / g.Hkv;
  g.Tq = q.shape()[2];
  g.Tk = k.shape()[2];
  g.Dk = q.shape()[3];
  g.Dv = v.shape()[3];
  g.rows = g.G * g.Tq;
  g.nrows = g.B * g.Hq * g.Tq;
  for (int d = 0; d < 3; ++d) {
    g.qs[d] = q.strides()[d];
    g.ks[d] = k.strides()[d];
    g.vs[d] = v.strides()[d];
    g.os[d] = dout ? dout->strides()[d] : 0;
  }
  g.scale = p.scale;
  g.q_offset = p.q_offset;
  g.bias_window = p.bias_window;
  g.causal = p.causal;
  return g;
}

template <class A>
__device__ inline A neg_inf() {
  return -std::numeric_limits<A>::infinity();
}

__host__ __device__ inline int64_t clamp64(int64_t x, int64_t lo, int64_t hi) {
  return x < lo ? lo : (x > hi ? hi : x);
}

// Row r of a kv group's G * Tq rows is position r / G of query head hk * G + r % G.
struct RowId {
  int64_t h, i;
};
__device__ inline RowId row_id(const Geo& g, int64_t hk, int64_t r) {
  const int64_t i = r / g.G;
  return {hk * g.G + (r - i * g.G), i};
}

// Element x of the [B, Tk] bias, stored as f32 or as T.
template <class T>
__device__ inline Acc<T> bias_at(const void* bias, bool f32, int64_t x) {
  if (f32) return static_cast<Acc<T>>(static_cast<const float*>(bias)[x]);
  return ld(static_cast<const T*>(bias)[x]);
}

// dst[j * lds + d] = src[off(j) + d] for the rows j < n of a tile of `cap` rows (zeros for
// j >= n) and d < D; the whole block cooperates, consecutive threads on consecutive d.
template <class T, class Off>
__device__ void load_tile(Acc<T>* dst, int lds, const T* src, int cap, int n, int D, Off off) {
  for (int x = threadIdx.x; x < cap * D; x += blockDim.x) {
    const int j = x / D, d = x - j * D;
    dst[j * lds + d] = j < n ? ld(src[off(j) + d]) : Acc<T>(0);
  }
}

// The same with row j read from row(j), a pointer.
template <class T, class Row>
__device__ void load_rows(Acc<T>* dst, int lds, int cap, int n, int D, Row row) {
  for (int x = threadIdx.x; x < cap * D; x += blockDim.x) {
    const int j = x / D, d = x - j * D;
    dst[j * lds + d] = j < n ? ld(row(j)[d]) : Acc<T>(0);
  }
}

// The lanes of a warp are (item, part) = (lane % (32 / P), lane / (32 / P)). Each dots its own
// row x with the R broadcast rows y + r * ys over the d ≡ part (mod P), then the P parts are
// summed with shuffles: every lane of an item ends with the same sums.
template <class A, int R>
__device__ inline void lane_dots(const A* x, const A* y, int ys, int n, int part, int P,
                                 A (&out)[R]) {
#pragma unroll
  for (int r = 0; r < R; ++r) out[r] = A(0);
  for (int d = part; d < n; d += P) {
    const A xv = x[d];
#pragma unroll
    for (int r = 0; r < R; ++r) out[r] += xv * y[r * ys + d];
  }
  for (int o = 32 / P; o < 32; o <<= 1)
#pragma unroll
    for (int r = 0; r < R; ++r) out[r] += __shfl_xor_sync(kFull, out[r], o);
}

// ---- forward ----

// Where the keys and values of (batch b, kv head hk) live, and how many there are. Key j's row
// starts at key(b, hk, j), value j's at value(b, hk, j) (unit-stride channels).
//  - Strided tensors k and v (ops::attention): Tk keys, queries from g.q_offset.
template <class T>
struct DenseKv {
  const T* k;
  const T* v;
  __device__ const T* key(const Geo& g, int64_t b, int64_t hk, int64_t j) const {
    return k + b * g.ks[0] + hk * g.ks[1] + j * g.ks[2];
  }
  __device__ const T* value(const Geo& g, int64_t b, int64_t hk, int64_t j) const {
    return v + b * g.vs[0] + hk * g.vs[1] + j * g.vs[2];
  }
  __device__ int64_t length(const Geo& g, int64_t) const { return g.Tk; }
  __device__ int64_t q_offset(const Geo& g, int64_t) const { return g.q_offset; }
};
//  - A paged latent cache (ops::paged_attention, one kv head): key j of sequence b is row
//    j % bt of page[first[b] + j / bt], its value the same row's first Dv channels; sequence b
//    holds length[b] keys and its Tq queries are its last positions. The tables are on the device.
template <class T>
struct PagedKvRows {
  const T* const* page;
  const int64_t* first;
  const int64_t* length_of;
  int64_t bt, row_stride;
  __device__ const T* key(const Geo&, int64_t b, int64_t, int64_t j) const {
    const int64_t k = j / bt;
    return page[first[b] + k] + (j - k * bt) * row_stride;
  }
  __device__ const T* value(const Geo& g, int64_t b, int64_t hk, int64_t j) const {
    return key(g, b, hk, j);
  }
  __device__ int64_t length(const Geo&, int64_t b) const { return length_of[b]; }
  __device__ int64_t q_offset(const Geo& g, int64_t b) const { return length_of[b] - g.Tq; }
};

// Shared memory: q rows [RT][Dk], keys [KT][Dk | 1] (odd stride: lane j reads row j without
// bank conflicts), values [KT][Dv]. Without splits writes out and lse; with them, the split's
// unnormalised output rows into part_o [splits, nrows, Dv] and (max, sum) into part_ml.
template <class T, int NV, int R, class Kv>
__global__ void __launch_bounds__(128)
    attention_fwd_kernel(Geo g, const T* q, Kv kv, const void* bias, bool bias_f32, T* out,
                         Acc<T>* lse, Acc<T>* part_o, Acc<T>* part_ml, int64_t row_tiles,
                         int splits, int KT) {
  using A = Acc<T>;
  extern __shared__ __align__(16) unsigned char smem[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int RT = static_cast<int>(blockDim.x >> 5) * R;
  const int Dk = static_cast<int>(g.Dk), Dv = static_cast<int>(g.Dv), Dkp = Dk | 1;
  A* qs = reinterpret_cast<A*>(smem);
  A* ks = qs + RT * Dk;
  A* vs = ks + KT * Dkp;

  const int split = static_cast<int>(blockIdx.x % static_cast<unsigned>(splits));
  const int64_t item = blockIdx.x / static_cast<unsigned>(splits);
  // The last row tiles (the most keys when causal) first.
  const int64_t rt = row_tiles - 1 - item % row_tiles, bh = item / row_tiles;
  const int64_t b = bh / g.Hkv, hk = bh % g.Hkv;
  const int64_t r0 = rt * RT;
  const int nr = static_cast<int>(std::min<int64_t>(RT, g.rows - r0));

  load_tile<T>(qs, Dk, q, RT, nr, Dk, [&](int j) {
    const RowId id = row_id(g, hk, r0 + j);
    return b * g.qs[0] + id.h * g.qs[1] + id.i * g.qs[2];
  });

  // This warp's rows.
  const int64_t q_offset = kv.q_offset(g, b), Tk = kv.length(g, b);
  const int w0 = warp * R;
  const bool active = w0 < nr;
  bool valid[R];
  int64_t qpos[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    valid[r] = w0 + r < nr;
    qpos[r] = q_offset + (r0 + w0 + r) / g.G;
  }
  const int64_t warp_last = q_offset + (r0 + std::min(w0 + R, nr) - 1) / g.G;
  // Keys visible to the tile's rows, and this split's share of their tiles.
  const int64_t tile_last = q_offset + (r0 + nr - 1) / g.G;
  const int64_t key_end = g.causal ? clamp64(tile_last + 1, 0, Tk) : Tk;
  const int64_t nkt = (key_end + KT - 1) / KT;
  const int64_t kt0 = nkt * split / splits, kt1 = nkt * (split + 1) / splits;

  const int P = 32 / KT, jl = lane % KT, part = lane / KT;
  const A scale = static_cast<A>(g.scale);
  A m[R], l[R], acc[R][NV];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    m[r] = neg_inf<A>();
    l[r] = A(0);
#pragma unroll
    for (int c = 0; c < NV; ++c) acc[r][c] = A(0);
  }

  for (int64_t t = kt0; t < kt1; ++t) {
    const int64_t j0 = t * KT;
    const int n = static_cast<int>(std::min<int64_t>(KT, key_end - j0));
    __syncthreads();  // the previous tile is consumed
    load_rows<T>(ks, Dkp, KT, n, Dk, [&](int j) { return kv.key(g, b, hk, j0 + j); });
    load_rows<T>(vs, Dv, KT, n, Dv, [&](int j) { return kv.value(g, b, hk, j0 + j); });
    __syncthreads();
    if (!active || (g.causal && j0 > warp_last)) continue;  // warp-uniform

    A s[R];
    lane_dots<A, R>(ks + jl * Dkp, qs + w0 * Dk, Dk, Dk, part, P, s);
    const int64_t j = j0 + jl;
    const bool in = jl < n;
    const A bj = bias != nullptr && in ? bias_at<T>(bias, bias_f32, b * g.Tk + j) : A(0);
    A pr[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const bool vis = valid[r] && in && (!g.causal || j <= qpos[r]);
      const A x = vis ? s[r] * scale + (qpos[r] - j > g.bias_window ? bj : A(0)) : neg_inf<A>();
      const A mx = warp_max(x);
      const A mn = mx > m[r] ? mx : m[r];
      // Nothing visible yet: the accumulators are still zero, whatever the factor.
      const A corr = mn == neg_inf<A>() ? A(1) : std::exp(m[r] - mn);
      pr[r] = x == neg_inf<A>() ? A(0) : std::exp(x - mn);
      l[r] = l[r] * corr + warp_sum(part == 0 ? pr[r] : A(0));
      m[r] = mn;
#pragma unroll
      for (int c = 0; c < NV; ++c) acc[r][c] *= corr;
    }
    for (int jj = 0; jj < n; ++jj) {
      A pj[R];
#pragma unroll
      for (int r = 0; r < R; ++r) pj[r] = __shfl_sync(kFull, pr[r], jj);
#pragma unroll
      for (int c = 0; c < NV; ++c) {
        const int d = lane + 32 * c;
        if (d < Dv) {
          const A x = vs[jj * Dv + d];
#pragma unroll
          for (int r = 0; r < R; ++r) acc[r][c] += pj[r] * x;
        }
      }
    }
  }

#pragma unroll
  for (int r = 0; r < R; ++r) {
    if (!valid[r]) continue;
    const RowId id = row_id(g, hk, r0 + w0 + r);
    const int64_t orow = (b * g.Hq + id.h) * g.Tq + id.i;
    if (splits == 1) {
#pragma unroll
      for (int c = 0; c < NV; ++c) {
        const int d = lane + 32 * c;
        if (d < Dv) out[orow * Dv + d] = st<T>(l[r] > A(0) ? acc[r][c] / l[r] : A(0));
      }
      if (lane == 0) lse[orow] = l[r] > A(0) ? m[r] + std::log(l[r]) : neg_inf<A>();
    } else {
      const int64_t x = split * g.nrows + orow;
#pragma unroll
      for (int c = 0; c < NV; ++c) {
        const int d = lane + 32 * c;
        if (d < Dv) part_o[x * Dv + d] = acc[r][c];
      }
      if (lane == 0) {
        part_ml[2 * x] = m[r];
        part_ml[2 * x + 1] = l[r];
      }
    }
  }
}

// out = Σ_s e^{m_s − M} O_s / Σ_s e^{m_s − M} l_s with M = max_s m_s; one warp per row.
template <class T>
__global__ void attention_merge_kernel(const Acc<T>* part_o, const Acc<T>* part_ml, T* out,
                                       Acc<T>* lse, int64_t nrows, int64_t Dv, int splits) {
  using A = Acc<T>;
  const int lane = threadIdx.x & 31, wpb = blockDim.x >> 5;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * wpb + (threadIdx.x >> 5); row < nrows;
       row += static_cast<int64_t>(gridDim.x) * wpb) {
    A M = neg_inf<A>(), L = A(0);
    for (int s = 0; s < splits; ++s) {
      const A ms = part_ml[2 * (s * nrows + row)];
      M = ms > M ? ms : M;
    }
    if (M != neg_inf<A>())
      for (int s = 0; s < splits; ++s) {
        const A* ml = part_ml + 2 * (s * nrows + row);
        if (ml[0] != neg_inf<A>()) L += std::exp(ml[0] - M) * ml[1];
      }
    for (int64_t d = lane; d < Dv; d += 32) {
      A o = A(0);
      if (L > A(0))
        for (int s = 0; s < splits; ++s) {
          const A ms = part_ml[2 * (s * nrows + row)];
          if (ms != neg_inf<A>()) o += std::exp(ms - M) * part_o[(s * nrows + row) * Dv + d];
        }
      out[row * Dv + d] = st<T>(L > A(0) ? o / L : A(0));
    }
    if (lane == 0) lse[row] = L > A(0) ? M + std::log(L) : neg_inf<A>();
  }
}

// ---- backward ----

// delta[row] = Σ_d dout[row, d] · out[row, d]; one warp per row.
template <class T>
__global__ void attention_delta_kernel(Geo g, const T* out, const T* dout, Acc<T>* delta) {
  using A = Acc<T>;
  const int lane = threadIdx.x & 31, wpb = blockDim.x >> 5;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * wpb + (threadIdx.x >> 5); row < g.nrows;
       row += static_cast<int64_t>(gridDim.x) * wpb) {
    const int64_t i = row % g.Tq, h = row / g.Tq % g.Hq, b = row / (g.Tq * g.Hq);
    const T* o = out + row * g.Dv;
    const T* go = dout + b * g.os[0] + h * g.os[1] + i * g.os[2];
    A s = A(0);
    for (int64_t d = lane; d < g.Dv; d += 32) s += ld(o[d]) * ld(go[d]);
    s = warp_sum(s);
    if (lane == 0) delta[row] = s;
  }
}

// dq of a tile of query rows (the forward's layout): with P = exp(s − lse) and
// dS = P (dout·v − delta), dq = scale Σ_j dS_j k_j. Shared memory: q rows [RT][Dk], dout rows
// [RT][Dv], keys [KT][Dk | 1], values [KT][Dv | 1]. With splits, the split's unscaled sums go to
// part [splits, nrows, Dk].
template <class T, int NK, int R>
__global__ void __launch_bounds__(128)
    attention_dq_kernel(Geo g, const T* q, const T* k, const T* v, const T* dout, const void* bias,
                        bool bias_f32, const Acc<T>* lse, const Acc<T>* delta, T* dq, Acc<T>* part,
                        int64_t row_tiles, int splits, int KT) {
  using A = Acc<T>;
  extern __shared__ __align__(16) unsigned char smem[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int RT = static_cast<int>(blockDim.x >> 5) * R;
  const int Dk = static_cast<int>(g.Dk), Dv = static_cast<int>(g.Dv);
  const int Dkp = Dk | 1, Dvp = Dv | 1;
  A* qs = reinterpret_cast<A*>(smem);
  A* os = qs + RT * Dk;
  A* ks = os + RT * Dv;
  A* vs = ks + KT * Dkp;

  const int split = static_cast<int>(blockIdx.x % static_cast<unsigned>(splits));
  const int64_t item = blockIdx.x / static_cast<unsigned>(splits);
  const int64_t rt = row_tiles - 1 - item % row_tiles, bh = item / row_tiles;
  const int64_t b = bh / g.Hkv, hk = bh % g.Hkv;
  const int64_t r0 = rt * RT;
  const int nr = static_cast<int>(std::min<int64_t>(RT, g.rows - r0));

  load_tile<T>(qs, Dk, q, RT, nr, Dk, [&](int j) {
    const RowId id = row_id(g, hk, r0 + j);
    return b * g.qs[0] + id.h * g.qs[1] + id.i * g.qs[2];
  });
  load_tile<T>(os, Dv, dout, RT, nr, Dv, [&](int j) {
    const RowId id = row_id(g, hk, r0 + j);
    return b * g.os[0] + id.h * g.os[1] + id.i * g.os[2];
  });

  const int w0 = warp * R;
  const bool active = w0 < nr;
  bool valid[R];
  int64_t qpos[R];
  A lse_r[R], del_r[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    valid[r] = w0 + r < nr;
    qpos[r] = g.q_offset + (r0 + w0 + r) / g.G;
    lse_r[r] = neg_inf<A>();
    del_r[r] = A(0);
    if (valid[r]) {
      const RowId id = row_id(g, hk, r0 + w0 + r);
      const int64_t orow = (b * g.Hq + id.h) * g.Tq + id.i;
      lse_r[r] = lse[orow];
      del_r[r] = delta[orow];
    }
  }
  const int64_t warp_last = g.q_offset + (r0 + std::min(w0 + R, nr) - 1) / g.G;
  const int64_t tile_last = g.q_offset + (r0 + nr - 1) / g.G;
  const int64_t key_end = g.causal ? clamp64(tile_last + 1, 0, g.Tk) : g.Tk;
  const int64_t nkt = (key_end + KT - 1) / KT;
  const int64_t kt0 = nkt * split / splits, kt1 = nkt * (split + 1) / splits;

  const int P = 32 / KT, jl = lane % KT, part_id = lane / KT;
  const A scale = static_cast<A>(g.scale);
  const T* kbase = k + b * g.ks[0] + hk * g.ks[1];
  const T* vbase = v + b * g.vs[0] + hk * g.vs[1];
  A acc[R][NK];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int c = 0; c < NK; ++c) acc[r][c] = A(0);

  for (int64_t t = kt0; t < kt1; ++t) {
    const int64_t j0 = t * KT;
    const int n = static_cast<int>(std::min<int64_t>(KT, key_end - j0));
    __syncthreads();
    load_tile<T>(ks, Dkp, kbase + j0 * g.ks[2], KT, n, Dk, [&](int j) { return j * g.ks[2]; });
    load_tile<T>(vs, Dvp, vbase + j0 * g.vs[2], KT, n, Dv, [&](int j) { return j * g.vs[2]; });
    __syncthreads();
    if (!active || (g.causal && j0 > warp_last)) continue;  // warp-uniform

    A s[R], dp[R];
    lane_dots<A, R>(ks + jl * Dkp, qs + w0 * Dk, Dk, Dk, part_id, P, s);
    lane_dots<A, R>(vs + jl * Dvp, os + w0 * Dv, Dv, Dv, part_id, P, dp);
    const int64_t j = j0 + jl;
    const bool in = jl < n;
    const A bj = bias != nullptr && in ? bias_at<T>(bias, bias_f32, b * g.Tk + j) : A(0);
    A ds[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const bool vis = valid[r] && in && (!g.causal || j <= qpos[r]) && lse_r[r] != neg_inf<A>();
      const A x = s[r] * scale + (qpos[r] - j > g.bias_window ? bj : A(0));
      const A p = vis ? std::exp(x - lse_r[r]) : A(0);
      ds[r] = vis ? p * (dp[r] - del_r[r]) : A(0);
    }
    for (int jj = 0; jj < n; ++jj) {
      A dj[R];
#pragma unroll
      for (int r = 0; r < R; ++r) dj[r] = __shfl_sync(kFull, ds[r], jj);
#pragma unroll
      for (int c = 0; c < NK; ++c) {
        const int d = lane + 32 * c;
        if (d < Dk) {
          const A x = ks[jj * Dkp + d];
#pragma unroll
          for (int r = 0; r < R; ++r) acc[r][c] += dj[r] * x;
        }
      }
    }
  }

#pragma unroll
  for (int r = 0; r < R; ++r) {
    if (!valid[r]) continue;
    const RowId id = row_id(g, hk, r0 + w0 + r);
    const int64_t orow = (b * g.Hq + id.h) * g.Tq + id.i;
#pragma unroll
    for (int c = 0; c < NK; ++c) {
      const int d = lane + 32 * c;
      if (d >= Dk) continue;
      if (splits == 1)
        dq[orow * Dk + d] = st<T>(scale * acc[r][c]);
      else
        part[(split * g.nrows + orow) * Dk + d] = acc[r][c];
    }
  }
}

// dq = scale · Σ_s part[s] (splits summed in order).
template <class T>
__global__ void attention_dq_sum_kernel(const Acc<T>* part, T* dq, int64_t n, int splits,
                                        Acc<T> scale) {
  for (int64_t x = global_thread(); x < n; x += global_threads()) {
    Acc<T> s = Acc<T>(0);
    for (int sp = 0; sp < splits; ++sp) s += part[sp * n + x];
    dq[x] = st<T>(scale * s);
  }
}

// dk and dv of a tile of KB = W·R keys (R per warp): dv_j = Σ P_ij dout_i, dk_j = scale Σ dS_ij q_i
// over the G·Tq rows i of the kv group, in tiles of QT rows with the lanes over the rows.
// Shared memory: per row of the tile its q and dout offsets and position (int64), then lse and
// delta, keys [KB][Dk], values [KB][Dv] (read as broadcasts), q rows [QT][Dk | 1], dout rows
// [QT][Dv | 1]. dbias_part [B, Hkv, Tk] (when given) gets Σ_i dS_ij over the biased (i, j).
template <class T, int ND, int R>
__global__ void __launch_bounds__(256)
    attention_dkdv_kernel(Geo g, const T* q, const T* k, const T* v, const T* dout,
                          const void* bias, bool bias_f32, const Acc<T>* lse, const Acc<T>* delta,
                          T* dk, T* dv, Acc<T>* dbias_part, int64_t key_tiles, int QT) {
  using A = Acc<T>;
  extern __shared__ __align__(16) unsigned char smem[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int KB = static_cast<int>(blockDim.x >> 5) * R;
  const int Dk = static_cast<int>(g.Dk), Dv = static_cast<int>(g.Dv);
  const int Dkp = Dk | 1, Dvp = Dv | 1;
  int64_t* qoff = reinterpret_cast<int64_t*>(smem);
  int64_t* ooff = qoff + QT;
  int64_t* qposs = ooff + QT;
  A* lses = reinterpret_cast<A*>(qposs + QT);
  A* dels = lses + QT;
  A* kS = dels + QT;
  A* vS = kS + KB * Dk;
  A* qS = vS + KB * Dv;
  A* oS = qS + QT * Dkp;

  const int64_t kt = blockIdx.x % key_tiles, bh = blockIdx.x / key_tiles;
  const int64_t b = bh / g.Hkv, hk = bh % g.Hkv;
  const int64_t j0 = kt * KB;
  const int nk = static_cast<int>(std::min<int64_t>(KB, g.Tk - j0));
  load_tile<T>(kS, Dk, k + b * g.ks[0] + hk * g.ks[1] + j0 * g.ks[2], KB, nk, Dk,
               [&](int j) { return j * g.ks[2]; });
  load_tile<T>(vS, Dv, v + b * g.vs[0] + hk * g.vs[1] + j0 * g.vs[2], KB, nk, Dv,
               [&](int j) { return j * g.vs[2]; });

  // This warp's keys.
  const int w0 = warp * R;
  const bool active = w0 < nk;
  bool kvalid[R];
  int64_t kj[R];
  A bj[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    kvalid[r] = w0 + r < nk;
    kj[r] = j0 + w0 + r;
    bj[r] = bias != nullptr && kvalid[r] ? bias_at<T>(bias, bias_f32, b * g.Tk + kj[r]) : A(0);
  }
  const int P = 32 / QT, il = lane % QT, part = lane / QT;
  const A scale = static_cast<A>(g.scale);
  A dkacc[R][ND], dvacc[R][ND], dbacc[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    dbacc[r] = A(0);
#pragma unroll
    for (int c = 0; c < ND; ++c) dkacc[r][c] = dvacc[r][c] = A(0);
  }

  // Causal: rows before position j0 - q_offset see none of these keys.
  const int64_t r_begin = g.causal ? clamp64((j0 - g.q_offset) * g.G, 0, g.rows) : 0;
  for (int64_t rt0 = r_begin; rt0 < g.rows; rt0 += QT) {
    const int nq = static_cast<int>(std::min<int64_t>(QT, g.rows - rt0));
    __syncthreads();  // the previous row tile is consumed
    if (static_cast<int>(threadIdx.x) < QT) {
      const int x = threadIdx.x;
      if (x < nq) {
        const RowId id = row_id(g, hk, rt0 + x);
        const int64_t orow = (b * g.Hq + id.h) * g.Tq + id.i;
        qoff[x] = b * g.qs[0] + id.h * g.qs[1] + id.i * g.qs[2];
        ooff[x] = b * g.os[0] + id.h * g.os[1] + id.i * g.os[2];
        qposs[x] = g.q_offset + id.i;
        lses[x] = lse[orow];
        dels[x] = delta[orow];
      } else {
        qoff[x] = ooff[x] = qposs[x] = 0;
        lses[x] = neg_inf<A>();
        dels[x] = A(0);
      }
    }
    __syncthreads();
    load_tile<T>(qS, Dkp, q, QT, nq, Dk, [&](int j) { return qoff[j]; });
    load_tile<T>(oS, Dvp, dout, QT, nq, Dv, [&](int j) { return ooff[j]; });
    __syncthreads();
    const int64_t tile_last = g.q_offset + (rt0 + nq - 1) / g.G;
    if (!active || (g.causal && j0 + w0 > tile_last)) continue;  // warp-uniform

    A s[R], dp[R];
    lane_dots<A, R>(qS + il * Dkp, kS + w0 * Dk, Dk, Dk, part, P, s);
    lane_dots<A, R>(oS + il * Dvp, vS + w0 * Dv, Dv, Dv, part, P, dp);
    const A lse_i = lses[il], del_i = dels[il];
    const int64_t qp = qposs[il];
    const bool rvalid = il < nq && lse_i != neg_inf<A>();
    A pr[R], ds[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const bool vis = kvalid[r] && rvalid && (!g.causal || kj[r] <= qp);
      const bool biased = qp - kj[r] > g.bias_window;
      const A x = s[r] * scale + (biased ? bj[r] : A(0));
      pr[r] = vis ? std::exp(x - lse_i) : A(0);
      ds[r] = vis ? pr[r] * (dp[r] - del_i) : A(0);
      if (vis && biased && part == 0) dbacc[r] += ds[r];
    }
    for (int rr = 0; rr < nq; ++rr) {
      A pj[R], dj[R];
#pragma unroll
      for (int r = 0; r < R; ++r) {
        pj[r] = __shfl_sync(kFull, pr[r], rr);
        dj[r] = __shfl_sync(kFull, ds[r], rr);
      }
#pragma unroll
      for (int c = 0; c < ND; ++c) {
        const int d = lane + 32 * c;
        if (d < Dv) {
          const A o = oS[rr * Dvp + d];
#pragma unroll
          for (int r = 0; r < R; ++r) dvacc[r][c] += pj[r] * o;
        }
        if (d < Dk) {
          const A x = qS[rr * Dkp + d];
#pragma unroll
          for (int r = 0; r < R; ++r) dkacc[r][c] += dj[r] * x;
        }
      }
    }
  }

#pragma unroll
  for (int r = 0; r < R; ++r) {
    if (!kvalid[r]) continue;
    const int64_t key = (b * g.Hkv + hk) * g.Tk + kj[r];
#pragma unroll
    for (int c = 0; c < ND; ++c) {
      const int d = lane + 32 * c;
      if (d < Dk) dk[key * Dk + d] = st<T>(scale * dkacc[r][c]);
      if (d < Dv) dv[key * Dv + d] = st<T>(dvacc[r][c]);
    }
  }
  if (dbias_part != nullptr)
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const A tot = warp_sum(dbacc[r]);
      if (lane == 0 && kvalid[r]) dbias_part[(b * g.Hkv + hk) * g.Tk + kj[r]] = tot;
    }
}

// dbias[b, j] = Σ_hk part[b, hk, j] (kv heads in order), stored as f32 or as T.
template <class T>
__global__ void attention_dbias_kernel(const Acc<T>* part, void* dbias, bool f32, int64_t B,
                                       int64_t Hkv, int64_t Tk) {
  for (int64_t x = global_thread(); x < B * Tk; x += global_threads()) {
    const int64_t b = x / Tk, j = x - b * Tk;
    Acc<T> s = Acc<T>(0);
    for (int64_t h = 0; h < Hkv; ++h) s += part[(b * Hkv + h) * Tk + j];
    if (f32)
      static_cast<float*>(dbias)[x] = static_cast<float>(s);
    else
      static_cast<T*>(dbias)[x] = st<T>(s);
  }
}

// ---- host side ----

template <class T>
DType acc_dtype() {
  return std::is_same_v<Acc<T>, double> ? DType::F64 : DType::F32;
}

template <class T>
void check_dtypes(const char* op, const Tensor& q, const Tensor& bias, const Tensor& lse) {
  MYRIAD_CHECK(lse.dtype() == acc_dtype<T>(), op, ": lse must be ", dtype_name(acc_dtype<T>()),
               ", got ", lse.desc());
  if (bias.defined())
    MYRIAD_CHECK(bias.dtype() == q.dtype() || bias.dtype() == DType::F32, op,
                 ": key_bias must be f32 or q's dtype, got ", bias.desc());
}

int device_attr(cudaDeviceAttr a, int device) {
  int v = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&v, a, device));
  return v;
}

// Calls f(std::integral_constant<int, N>) with N >= ceil(D / 32) lanes' worth of accumulators.
template <class F>
void with_dim_bucket(const char* op, int64_t D, F&& f) {
  const int64_t c = (D + 31) / 32;
  if (c <= 2) return f(std::integral_constant<int, 2>{});
  if (c <= 4) return f(std::integral_constant<int, 4>{});
  if (c <= 8) return f(std::integral_constant<int, 8>{});
  if (c <= 18) return f(std::integral_constant<int, 18>{});  // MLA's 576
  if (c <= 32) return f(std::integral_constant<int, 32>{});
  throw Error(cat(op, ": the cuda kernel supports head dims up to 1024, got ", D));
}

// The largest tile (32, 16 or 8 rows) whose shared memory bytes(tile) leaves room for two blocks
// per SM (227 KB each on an H100/H200), else the smallest within the device's limit.
template <class F>
int pick_tile(const char* op, int device, F bytes) {
  for (int t : {32, 16, 8})
    if (bytes(t) <= size_t{112} << 10) return t;
  const size_t limit = device_attr(cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  MYRIAD_CHECK(bytes(8) <= limit, op, ": head dims too large for the cuda kernel's shared memory (",
               bytes(8), " bytes needed, ", limit, " available)");
  return 8;
}

// Key splits when `items` blocks cannot fill the GPU: about two blocks per SM, at least two key
// tiles per split.
int choose_splits(int64_t items, int64_t Tk, int KT, int device) {
  const int64_t target =
      2 * static_cast<int64_t>(device_attr(cudaDevAttrMultiProcessorCount, device));
  if (items * 2 >= target) return 1;
  const int64_t tiles = (Tk + KT - 1) / KT;
  return static_cast<int>(
      std::clamp<int64_t>((target + items - 1) / items, 1, std::clamp<int64_t>(tiles / 2, 1, 256)));
}

// launch() with dynamic shared memory (opted in above 48 KB) and a 1-d grid.
template <class... P, class... Args>
void launch_smem(const char* name, int device, int64_t blocks, int threads, size_t smem,
                 void (*kernel)(P...), Args&&... args) {
  MYRIAD_CHECK(blocks <= std::numeric_limits<int32_t>::max(), name, ": ", blocks,
               " blocks exceed the cuda kernel's grid");
  DeviceGuard guard(device);
  if (smem > (size_t{48} << 10))
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    static_cast<int>(smem)));
  kernel<<<dim3(static_cast<unsigned>(blocks)), dim3(threads), smem, current_stream(device)>>>(
      std::forward<Args>(args)...);
  CUDA_CHECK_LAUNCH(name);
}

// Rows (forward, dq) or keys (dk/dv) per warp: keeps the register accumulators near 64 floats.
constexpr int rows_per_warp(int n) {
  return n <= 8 ? 4 : n <= 18 ? 2 : 1;
}
constexpr int keys_per_warp(int n) {
  return n <= 4 ? 4 : n <= 8 ? 2 : 1;
}
constexpr int kRowWarps = 4;      // warps per block, forward and dq
constexpr int kKeyWarps = 8;      // warps per block, dk/dv
constexpr int kRowsPerBlock = 8;  // one warp per row in the small kernels (256 threads)

// The forward kernel over keys and values from kv (DenseKv, PagedKvRows), then the merge of its
// key splits when there are several.
template <class T, class Kv>
void run_forward(const char* name, const Geo& g, const Tensor& q, const Kv& kv, const void* bias,
                 bool bias_f32, Tensor& out, Tensor& lse) {
  using A = Acc<T>;
  const int dev = out.device().index;
  with_dim_bucket(name, g.Dv, [&](auto nv) {
    constexpr int NV = decltype(nv)::value, R = rows_per_warp(NV);
    const int W = static_cast<int>(std::clamp<int64_t>((g.rows + R - 1) / R, 1, kRowWarps));
    const int64_t RT = W * R, row_tiles = (g.rows + RT - 1) / RT;
    auto bytes = [&](int64_t t) {
      return static_cast<size_t>(RT * g.Dk + t * ((g.Dk | 1) + g.Dv)) * sizeof(A);
    };
    const int KT = pick_tile(name, dev, bytes);
    const int64_t items = g.B * g.Hkv * row_tiles;
    const int splits = choose_splits(items, g.Tk, KT, dev);
    Tensor part_o, part_ml;
    if (splits > 1) {
      part_o = Tensor::empty({splits * g.nrows * g.Dv}, acc_dtype<T>(), out.device());
      part_ml = Tensor::empty({splits * g.nrows * 2}, acc_dtype<T>(), out.device());
    }
    A* po = splits > 1 ? mptr<A>(part_o) : nullptr;
    A* pml = splits > 1 ? mptr<A>(part_ml) : nullptr;
    launch_smem(name, dev, items * splits, 32 * W, bytes(KT), &attention_fwd_kernel<T, NV, R, Kv>,
                g, cptr<T>(q), kv, bias, bias_f32, mptr<T>(out), mptr<A>(lse), po, pml, row_tiles,
                splits, KT);
    if (splits > 1)
      launch(name, dev, grid_for(g.nrows, kRowsPerBlock), 32 * kRowsPerBlock,
             &attention_merge_kernel<T>, static_cast<const A*>(po), static_cast<const A*>(pml),
             mptr<T>(out), mptr<A>(lse), g.nrows, g.Dv, splits);
  });
}

void attention_cuda(const AttentionParams& p, const Tensor& q, const Tensor& k, const Tensor& v,
                    const Tensor& bias, Tensor& out, Tensor& lse) {
  const char* name = "attention";
  const Geo g = make_geo(p, q, k, v, nullptr);
  if (g.nrows == 0) return;
  dispatch_float(name, q.dtype(), [&](auto tag) {
    using T = decltype(tag);
    check_dtypes<T>(name, q, bias, lse);
    const void* bias_p = bias.defined() ? bias.data_ptr() : nullptr;
    const bool bias_f32 = bias.defined() && bias.dtype() == DType::F32;
    run_forward<T>(name, g, q, DenseKv<T>{cptr<T>(k), cptr<T>(v)}, bias_p, bias_f32, out, lse);
  });
}

// Paged caches: the forward kernel with the keys read through the block tables, which go to
// the device as one I64 tensor [page pointers | first | length] in a copy queued on the stream.
// One kv head (G = Hq); the splits are chosen for the longest sequence.
void paged_attention_cuda(const AttentionParams& p, const Tensor& q, const ops::PagedKv& kv,
                          Tensor& out, Tensor& lse) {
  const char* name = "paged_attention";
  Geo g{};
  g.B = q.size(0), g.Hq = q.size(1), g.Hkv = 1, g.G = g.Hq, g.Tq = q.size(2);
  g.Dk = q.size(3), g.Dv = kv.dv;
  g.rows = g.G * g.Tq, g.nrows = g.B * g.Hq * g.Tq;
  for (int d = 0; d < 3; ++d) g.qs[d] = q.strides()[d];
  g.scale = p.scale, g.causal = true;
  for (int64_t len : kv.length) g.Tk = std::max(g.Tk, len);
  if (g.nrows == 0) return;
  const int dev = out.device().index;
  const int64_t np = static_cast<int64_t>(kv.page.size());
  std::vector<int64_t> table;
  table.reserve(np + 2 * g.B);
  for (const void* pg : kv.page)
    table.push_back(static_cast<int64_t>(reinterpret_cast<uintptr_t>(pg)));
  table.insert(table.end(), kv.first.begin(), kv.first.begin() + g.B);
  table.insert(table.end(), kv.length.begin(), kv.length.end());
  const Tensor dtable =
      Tensor::empty({static_cast<int64_t>(table.size())}, DType::I64, out.device());
  copy_to_device_async(dtable.data_ptr(), table.data(), table.size() * sizeof(int64_t), dev);
  const int64_t* tp = cptr<int64_t>(dtable);
  dispatch_float(name, q.dtype(), [&](auto tag) {
    using T = decltype(tag);
    check_dtypes<T>(name, q, Tensor{}, lse);
    const PagedKvRows<T> rows{reinterpret_cast<const T* const*>(tp), tp + np, tp + np + g.B,
                              kv.block_tokens, kv.row_stride};
    run_forward<T>(name, g, q, rows, nullptr, false, out, lse);
  });
}

void attention_backward_cuda(const AttentionParams& p, const Tensor& q, const Tensor& k,
                             const Tensor& v, const Tensor& bias, const Tensor& out,
                             const Tensor& lse, const Tensor& dout, Tensor& dq, Tensor& dk,
                             Tensor& dv, Tensor& dbias) {
  const char* name = "attention_backward";
  const Geo g = make_geo(p, q, k, v, &dout);
  const int dev = dq.device().index;
  const bool has_db = dbias.defined() && dbias.numel() > 0;
  if (g.nrows == 0 || g.Tk == 0) {  // no query sees a key: every gradient is zero
    for (Tensor* t : {&dq, &dk, &dv, &dbias})
      if (t->defined() && t->numel() > 0) t->fill_(0.0);
    return;
  }
  dispatch_float(name, q.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using A = Acc<T>;
    check_dtypes<T>(name, q, bias, lse);
    if (has_db)
      MYRIAD_CHECK(bias.defined() && dbias.dtype() == bias.dtype(), name,
                   ": dbias must match the bias, got ", dbias.desc());
    const void* bias_p = bias.defined() ? bias.data_ptr() : nullptr;
    const bool bias_f32 = bias.defined() && bias.dtype() == DType::F32;

    Tensor delta = Tensor::empty({g.nrows}, acc_dtype<T>(), dq.device());
    launch(name, dev, grid_for(g.nrows, kRowsPerBlock), 32 * kRowsPerBlock,
           &attention_delta_kernel<T>, g, cptr<T>(out), cptr<T>(dout), mptr<A>(delta));

    // dq.
    if (g.Dk > 0)
      with_dim_bucket(name, g.Dk, [&](auto nk) {
        constexpr int NK = decltype(nk)::value, R = rows_per_warp(NK);
        const int W = static_cast<int>(std::clamp<int64_t>((g.rows + R - 1) / R, 1, kRowWarps));
        const int64_t RT = W * R, row_tiles = (g.rows + RT - 1) / RT;
        auto bytes = [&](int64_t t) {
          return static_cast<size_t>(RT * (g.Dk + g.Dv) + t * ((g.Dk | 1) + (g.Dv | 1))) *
                 sizeof(A);
        };
        const int KT = pick_tile(name, dev, bytes);
        const int64_t items = g.B * g.Hkv * row_tiles;
        const int splits = choose_splits(items, g.Tk, KT, dev);
        Tensor part;
        if (splits > 1)
          part = Tensor::empty({splits * g.nrows * g.Dk}, acc_dtype<T>(), dq.device());
        A* pp = splits > 1 ? mptr<A>(part) : nullptr;
        launch_smem(name, dev, items * splits, 32 * W, bytes(KT), &attention_dq_kernel<T, NK, R>, g,
                    cptr<T>(q), cptr<T>(k), cptr<T>(v), cptr<T>(dout), bias_p, bias_f32,
                    cptr<A>(lse), static_cast<const A*>(mptr<A>(delta)), mptr<T>(dq), pp, row_tiles,
                    splits, KT);
        if (splits > 1)
          launch(name, dev, grid_for(g.nrows * g.Dk), kThreads, &attention_dq_sum_kernel<T>,
                 static_cast<const A*>(pp), mptr<T>(dq), g.nrows * g.Dk, splits,
                 static_cast<A>(g.scale));
      });

    // dk, dv and the dbias partials.
    with_dim_bucket(name, std::max(g.Dk, g.Dv), [&](auto nd) {
      constexpr int ND = decltype(nd)::value, R = keys_per_warp(ND);
      const int W = static_cast<int>(std::clamp<int64_t>((g.Tk + R - 1) / R, 1, kKeyWarps));
      const int64_t KB = W * R, key_tiles = (g.Tk + KB - 1) / KB;
      auto bytes = [&](int64_t t) {
        return static_cast<size_t>(3 * t) * sizeof(int64_t) +
               static_cast<size_t>(2 * t + KB * (g.Dk + g.Dv) + t * ((g.Dk | 1) + (g.Dv | 1))) *
                   sizeof(A);
      };
      const int QT = pick_tile(name, dev, bytes);
      Tensor dbp;
      if (has_db) dbp = Tensor::empty({g.B * g.Hkv * g.Tk}, acc_dtype<T>(), dq.device());
      A* dbpp = has_db ? mptr<A>(dbp) : nullptr;
      launch_smem(
          name, dev, g.B * g.Hkv * key_tiles, 32 * W, bytes(QT), &attention_dkdv_kernel<T, ND, R>,
          g, cptr<T>(q), cptr<T>(k), cptr<T>(v), cptr<T>(dout), bias_p, bias_f32, cptr<A>(lse),
          static_cast<const A*>(mptr<A>(delta)), mptr<T>(dk), mptr<T>(dv), dbpp, key_tiles, QT);
      if (has_db)
        launch(name, dev, grid_for(g.B * g.Tk), kThreads, &attention_dbias_kernel<T>,
               static_cast<const A*>(dbpp), dbias.data_ptr(), bias_f32, g.B, g.Hkv, g.Tk);
    });
  });
}

}  // namespace

MYRIAD_REGISTER_KERNEL(ops::attention_kernels, ops::Backend::CUDA, &attention_cuda);
MYRIAD_REGISTER_KERNEL(ops::attention_backward_kernels, ops::Backend::CUDA,
                       &attention_backward_cuda);
MYRIAD_REGISTER_KERNEL(ops::paged_attention_kernels, ops::Backend::CUDA, &paged_attention_cuda);

}  // namespace myriad::gpu
