// Optimised CPU flash attention (f32 or bf16 in, f32 math). Tiles of 64 keys x 64 query rows,
// where the rows of a tile are (position, head) pairs of the query heads that share one kv head,
// so a K/V tile is loaded once for the whole group (GQA, MQA and the absorbed MLA decode).
// Products of tiles run through one register-blocked micro-kernel; the scores never leave a
// 64 x 64 scratch tile.
//  - Forward: the score tile is computed keys x rows from f32 key rows read in place (and a query
//    tile transposed once per work item), so the online softmax runs across rows in vector lanes.
//    Work items are (batch, kv head, row tile); when there are fewer items than threads (decode)
//    the keys are split and the partial results merged.
//  - Backward: P is recomputed per tile from q, k and the saved logsumexp. Work items are
//    (batch, kv head, key slice): each owns the dk/dv rows of its keys (no races) and adds into a
//    private dq partial; partials are summed in a fixed order, so results do not depend on
//    thread timing.
#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <vector>

#include "backend/cpu/amx.h"
#include "backend/cpu/cpu.h"
#include "backend/cpu/rows.h"
#include "backend/cpu/scratch.h"
#include "ops/attention.h"

namespace myriad::cpu {
namespace {
using ops::AttentionParams;

constexpr int64_t kTile = 64;
constexpr float kInf = __builtin_inff();

int64_t round16(int64_t n) {
  return (n + 15) / 16 * 16;
}
int64_t round32(int64_t n) {
  return (n + 31) / 32 * 32;
}

// ---- tile products ----

// C[MR x W·NV] (+)= A[MR x K] · B[K x W·NV] in W-lane vectors; A is addressed as
// A[r·as + k·ak], B and C by rows. Every element sums over k in order, whatever W.
template <int W, int MR, int NV>
MYRIAD_ROW_INLINE void micro(int64_t K, const float* A, int64_t as, int64_t ak, const float* B,
                             int64_t ldb, float* C, int64_t ldc, bool acc) {
  using V = typename Lanes<W>::F;
  V c[MR][NV];
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < NV; ++v) {
      c[r][v] = V{};
      if (acc) __builtin_memcpy(&c[r][v], C + r * ldc + W * v, sizeof(V));
    }
  for (int64_t k = 0; k < K; ++k) {
    V b[NV];
    for (int v = 0; v < NV; ++v) __builtin_memcpy(&b[v], B + k * ldb + W * v, sizeof(V));
    for (int r = 0; r < MR; ++r) {
      const float a = A[r * as + k * ak];
      for (int v = 0; v < NV; ++v) c[r][v] += a * b[v];
    }
  }
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < NV; ++v) __builtin_memcpy(C + r * ldc + W * v, &c[r][v], sizeof(V));
}

template <int W, int MR>
MYRIAD_ROW_INLINE void micro_nv(int nv, int64_t K, const float* A, int64_t as, int64_t ak,
                                const float* B, int64_t ldb, float* C, int64_t ldc, bool acc) {
  switch (nv) {
    case 4:
      return micro<W, MR, 4>(K, A, as, ak, B, ldb, C, ldc, acc);
    case 3:
      return micro<W, MR, 3>(K, A, as, ak, B, ldb, C, ldc, acc);
    case 2:
      return micro<W, MR, 2>(K, A, as, ak, B, ldb, C, ldc, acc);
    default:
      return micro<W, MR, 1>(K, A, as, ak, B, ldb, C, ldc, acc);
  }
}

// C[M x N] (+)= A[M x K] · B[K x N] with N a multiple of 16, in register blocks of 4 rows x
// 4 vectors (64 columns) with 16 lanes (16 of AVX-512's 32 registers), 4 rows x 2 vectors
// (16 columns) with 8 (8 of AVX2's 16).
template <int W>
MYRIAD_CPU_CLONES void tile_gemm_w(int64_t M, int64_t N, int64_t K, const float* A, int64_t as,
                                   int64_t ak, const float* B, int64_t ldb, float* C, int64_t ldc,
                                   bool acc) {
  constexpr int kMaxNv = W == 16 ? 4 : 2;
  for (int64_t j = 0; j < N; j += W * kMaxNv) {
    const int nv = static_cast<int>(std::min<int64_t>(kMaxNv, (N - j) / W));
    int64_t r = 0;
    for (; r + 4 <= M; r += 4)
      micro_nv<W, 4>(nv, K, A + r * as, as, ak, B + j, ldb, C + r * ldc + j, ldc, acc);
    const float* a = A + r * as;
    float* c = C + r * ldc + j;
    switch (M - r) {
      case 3:
        micro_nv<W, 3>(nv, K, a, as, ak, B + j, ldb, c, ldc, acc);
        break;
      case 2:
        micro_nv<W, 2>(nv, K, a, as, ak, B + j, ldb, c, ldc, acc);
        break;
      case 1:
        micro_nv<W, 1>(nv, K, a, as, ak, B + j, ldb, c, ldc, acc);
        break;
    }
  }
}
void tile_gemm(int64_t M, int64_t N, int64_t K, const float* A, int64_t as, int64_t ak,
               const float* B, int64_t ldb, float* C, int64_t ldc, bool acc) {
  with_lanes(
      [&](auto w) { tile_gemm_w<decltype(w)::value>(M, N, K, A, as, ak, B, ldb, C, ldc, acc); });
}

// ---- row helpers ----

// Key j of a tile starting at key j0 is visible to a query at position qpos when j < vis_end,
// and biased when j < bias_end.
struct RowMask {
  int64_t vis_end, bias_end;
};
RowMask row_mask(const AttentionParams& p, int64_t qpos, int64_t j0, int64_t n) {
  const int64_t vis = p.causal ? std::clamp<int64_t>(qpos - j0 + 1, 0, n) : n;
  // qpos - (j0 + j) > window  <=>  j < qpos - window - j0.
  return {vis, std::clamp<int64_t>(qpos - p.bias_window - j0, 0, n)};
}

// One key tile against a query tile, forward. st[j·64 + r] holds the score of key j0 + j for
// row r (the tile is keys x rows, so every step below runs across rows), times mul. Adds the bias
// where j < blim[r], masks keys j > vis[r], updates the running max m and sum l, sets corr to the
// factor the output rows must be rescaled by, and leaves the probabilities in st.
MYRIAD_CPU_CLONES void online_tile(float* __restrict st, int64_t n, int64_t rp,
                                   const int32_t* __restrict vis, const int32_t* __restrict blim,
                                   const float* __restrict bias, float mul, float* __restrict m,
                                   float* __restrict l, float* __restrict corr) {
  float mx[kTile], sum[kTile];
  for (int64_t r = 0; r < rp; ++r) mx[r] = -kInf, sum[r] = 0.0f;
  for (int32_t j = 0; j < n; ++j) {
    float* row = st + j * kTile;
    const float bj = bias ? bias[j] : 0.0f;
    for (int64_t r = 0; r < rp; ++r) {
      const float x = j <= vis[r] ? row[r] * mul + (j < blim[r] ? bj : 0.0f) : -kInf;
      row[r] = x;
      mx[r] = std::max(mx[r], x);
    }
  }
  for (int64_t r = 0; r < rp; ++r) {
    const float mn = std::max(m[r], mx[r]);
    // Nothing visible yet: the output row is still zero, whatever the factor.
    corr[r] = mn == -kInf ? 1.0f : fast_exp(m[r] - mn);
    m[r] = mn;
  }
  for (int64_t j = 0; j < n; ++j) {
    float* row = st + j * kTile;
    for (int64_t r = 0; r < rp; ++r) {
      const float e = row[r] == -kInf ? 0.0f : fast_exp(row[r] - m[r]);
      row[r] = e;
      sum[r] += e;
    }
  }
  for (int64_t r = 0; r < rp; ++r) l[r] = l[r] * corr[r] + sum[r];
}

// One query row against one key tile (backward): P = exp(mul s + bias − lse) on visible keys
// (into s), the score gradient dS = P (dP − delta) (into dp), and dbias += dS on biased keys.
MYRIAD_CPU_CLONES void backward_row(float* __restrict s, float* __restrict dp, RowMask mk,
                                    const float* __restrict bias, float lse, float delta, float mul,
                                    float* __restrict dbias) {
  if (mul != 1.0f)
    for (int64_t j = 0; j < kTile; ++j) s[j] *= mul;
  if (bias)
    for (int64_t j = 0; j < mk.bias_end; ++j) s[j] += bias[j];
  for (int64_t j = 0; j < kTile; ++j) {
    const float pr = j < mk.vis_end ? fast_exp(s[j] - lse) : 0.0f;
    s[j] = pr;
    dp[j] = pr * (dp[j] - delta);
  }
  if (bias)
    for (int64_t j = 0; j < mk.bias_end; ++j) dbias[j] += dp[j];
}

MYRIAD_CPU_CLONES float dot_row(const float* a, const float* b, int64_t n) {
  return row_dot(a, b, n);
}
MYRIAD_CPU_CLONES void scale_row(float* x, int64_t n, float a) {
  for (int64_t i = 0; i < n; ++i) x[i] *= a;
}
MYRIAD_CPU_CLONES void add_row(float* acc, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) acc[i] += x[i];
}

// ---- operands ----

// dst = src · mul from f32 or bf16.
MYRIAD_CPU_CLONES void load_row(const void* src, bool f32, float* dst, int64_t n, float mul) {
  if (f32) {
    const float* x = static_cast<const float*>(src);
    for (int64_t i = 0; i < n; ++i) dst[i] = x[i] * mul;
  } else {
    const uint16_t* x = static_cast<const uint16_t*>(src);
    for (int64_t i = 0; i < n; ++i) dst[i] = bf16_load(x[i]) * mul;
  }
}
MYRIAD_CPU_CLONES void copy_row(const float* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = src[i];
}

// A 4-d [B, H, T, D] view with a unit-stride last dimension, read and written as f32 rows.
struct View4 {
  explicit View4(const Tensor& t)
      : p(static_cast<char*>(t.data_ptr())),
        f32(t.dtype() == DType::F32),
        s0(t.strides()[0]),
        s1(t.strides()[1]),
        s2(t.strides()[2]),
        d(t.shape()[3]) {}
  // The keys and values of paged caches (ops::PagedKv): row (b, 0, t) is row t % bt of page
  // page[first[b] + t / bt]; d is Dk for keys, dv for values.
  View4(const ops::PagedKv& kv, bool f32_rows, int64_t width)
      : p(nullptr),
        f32(f32_rows),
        s0(0),
        s1(0),
        s2(kv.row_stride),
        d(width),
        page(kv.page.data()),
        first(kv.first.data()),
        bt(kv.block_tokens) {}
  char* p;
  bool f32;
  int64_t s0, s1, s2, d;
  const void* const* page = nullptr;
  const int64_t* first = nullptr;
  int64_t bt = 0;
  const void* row(int64_t b, int64_t h, int64_t t) const {
    if (page)
      return static_cast<const char*>(page[first[b] + t / bt]) + t % bt * s2 * (f32 ? 4 : 2);
    return p + (b * s0 + h * s1 + t * s2) * (f32 ? 4 : 2);
  }
  // The same row of a bf16 view, as the AMX packers read it.
  const uint16_t* row16(int64_t b, int64_t h, int64_t t) const {
    return static_cast<const uint16_t*>(row(b, h, t));
  }
  // dst[0, d) = row (b, h, t) · mul.
  void load(int64_t b, int64_t h, int64_t t, float* dst, float mul = 1.0f) const {
    load_row(row(b, h, t), f32, dst, d, mul);
  }
  void store(int64_t b, int64_t h, int64_t t, const float* src) const {
    void* dst = const_cast<void*>(row(b, h, t));
    if (f32)
      copy_row(src, static_cast<float*>(dst), d);
    else
      f32_row_to_bf16(src, static_cast<uint16_t*>(dst), d);
  }
  // Rows [t, t + n) of (b, h) as f32 with a row stride (into ld): in place when the rows can be
  // read as they are (f32, on one page, and a multiple of 16 wide when `padded` reads must stay
  // inside).
  const float* rows(int64_t b, int64_t h, int64_t t, int64_t n, bool padded, float* buf, int64_t ld,
                    int64_t& stride) const {
    if (f32 && (!padded || d % 16 == 0) && (!page || t % bt + n <= bt)) {  // within a page
      stride = s2;
      return static_cast<const float*>(row(b, h, t));
    }
    for (int64_t j = 0; j < n; ++j) load(b, h, t + j, buf + j * ld);
    stride = ld;
    return buf;
  }
};

// The bias of keys [j0, j0 + n) of batch b as f32 (null without a bias).
const float* load_bias(const Tensor& bias, int64_t b, int64_t j0, int64_t n, float* buf) {
  if (!bias.defined()) return nullptr;
  const int64_t o = b * bias.shape()[1] + j0;
  if (bias.dtype() == DType::F32) return bias.data<float>() + o;
  bf16_row_to_f32(bias.data<uint16_t>() + o, buf, n);
  return buf;
}

// Shapes, and the row order of a kv group: row r is query position r / G of head hk·G + r % G.
struct Geometry {
  Geometry(const Tensor& q, const Tensor& k, const Tensor& v)
      : Geometry(q, k.shape()[1], k.shape()[2], v.shape()[3]) {}
  // Tk: the most keys of any batch row (paged caches).
  Geometry(const Tensor& q, int64_t hkv, int64_t tk, int64_t dv)
      : B(q.shape()[0]),
        Hq(q.shape()[1]),
        Hkv(hkv),
        G(Hq / Hkv),
        Tq(q.shape()[2]),
        Tk(tk),
        Dk(q.shape()[3]),
        Dv(dv),
        Dkp(round16(Dk)),
        Dvp(round16(Dv)),
        rows(G * Tq),
        row_tiles((rows + kTile - 1) / kTile),
        key_tiles((Tk + kTile - 1) / kTile) {}
  int64_t B, Hq, Hkv, G, Tq, Tk, Dk, Dv, Dkp, Dvp, rows, row_tiles, key_tiles;
  int64_t head(int64_t hk, int64_t r) const { return hk * G + r % G; }
  int64_t pos(int64_t r) const { return r / G; }
};

// Loads a key tile: kt [Dk x 64] transposed (kt[d·64 + j] = key j0 + j) and, when `rows` is
// set, the same keys row by row into rows [n x ld].
void load_keys(const View4& x, int64_t b, int64_t h, int64_t j0, int64_t n, float* kt, float* rows,
               int64_t ld, float* tmp) {
  for (int64_t j = 0; j < n; ++j) {
    float* r = rows ? rows + j * ld : tmp;
    x.load(b, h, j0 + j, r);
    for (int64_t d = 0; d < x.d; ++d) kt[d * kTile + j] = r[d];
  }
}

// ---- forward ----

// Batch row b has keys [0, tk[b]) and its query i at position qoff[b] + i.
void forward(const AttentionParams& p, const Geometry& g, const View4& Q, const View4& K,
             const View4& V, const View4& O, const Tensor& bias, const std::vector<int64_t>& tk,
             const std::vector<int64_t>& qoff, Tensor& lse) {
  const float scale = static_cast<float>(p.scale);
  float* LSE = lse.data<float>();
  // Key splits when the (batch, kv head, row tile) items cannot occupy every thread.
  const int64_t items = g.B * g.Hkv * g.row_tiles;
  const int64_t threads = omp_get_max_threads();
  const int64_t splits = items >= threads ? 1
                                          : std::clamp<int64_t>((threads + items - 1) / items, 1,
                                                                std::max<int64_t>(g.key_tiles, 1));
  // Split partials: unnormalised output rows, running max and sum.
  std::vector<float> part_o(splits > 1 ? items * splits * kTile * g.Dvp : 0);
  std::vector<float> part_ml(splits > 1 ? items * splits * kTile * 2 : 0);
  // bf16 rows on a CPU with AMX: the two products of a tile on the tile unit (bf16 operands, f32
  // sums; the probabilities rounded to bf16 as they enter the second).
  const bool amx = !Q.f32 && !K.f32 && !V.f32 && amx_bf16();
  const int64_t Dk32 = round32(g.Dk);

  auto run = [&](int64_t item, int64_t split) {
    const int64_t rt = item % g.row_tiles, bh = item / g.row_tiles;
    const int64_t b = bh / g.Hkv, hk = bh % g.Hkv;
    const int64_t r0 = rt * kTile, R = std::min(kTile, g.rows - r0);
    // Keys this tile's rows can see, then this split's share of their tiles.
    const int64_t last_pos = qoff[b] + g.pos(r0 + R - 1);
    const int64_t key_end = p.causal ? std::clamp<int64_t>(last_pos + 1, 0, tk[b]) : tk[b];
    const int64_t nkt = (key_end + kTile - 1) / kTile;
    const int64_t kt0 = nkt * split / splits, kt1 = nkt * (split + 1) / splits;
    const int64_t Rp = round16(R);
    int slot = 0;  // tiles on different lines modulo 4 KiB (scratch.h)
    Scratch<float> qt(amx ? 0 : g.Dk * kTile, slot), kb(amx ? 0 : kTile * g.Dk, slot),
        vb(amx ? 0 : kTile * g.Dvp, slot), st(kTile * kTile, slot), o(kTile * g.Dvp, slot),
        m(kTile, slot, -kInf), l(kTile, slot), corr(kTile, slot), tmp(g.Dk, slot), bb(kTile, slot);
    // AMX operands: the query tile transposed (pairs), a key tile's rows, P transposed, V (pairs).
    Scratch<uint16_t> bq(amx ? Dk32 * Rp : 0, slot), ka(amx ? kTile * Dk32 : 0, slot),
        pa(amx ? kTile * kTile : 0, slot), bv(amx ? kTile * g.Dvp : 0, slot);
    std::vector<const uint16_t*> rows(amx ? kTile : 0);
    // The query tile transposed and scaled: qt[d·64 + r] (AMX: unscaled, as pairs, the scale
    // applied to the f32 scores). Padding rows see no key.
    std::vector<int64_t> qpos(kTile, std::numeric_limits<int32_t>::min());
    for (int64_t r = 0; r < R; ++r) {
      qpos[r] = qoff[b] + g.pos(r0 + r);
      if (amx) {
        rows[r] = Q.row16(b, g.head(hk, r0 + r), g.pos(r0 + r));
        continue;
      }
      Q.load(b, g.head(hk, r0 + r), g.pos(r0 + r), tmp.data(), scale);
      for (int64_t d = 0; d < g.Dk; ++d) qt[d * kTile + r] = tmp[d];
    }
    std::optional<AmxTiles> tiles;
    if (amx) {
      pack_pairs_t(rows.data(), g.Dk, R, bq.data(), Dk32, Rp);
      tiles.emplace();
    }
    std::vector<int32_t> vis(kTile), blim(kTile);
    for (int64_t t = kt0; t < kt1; ++t) {
      const int64_t j0 = t * kTile, n = std::min(kTile, key_end - j0);
      for (int64_t r = 0; r < Rp;
           ++r) {  // key j is visible when j <= vis[r], biased when j < blim[r]
        vis[r] = p.causal && r < R ? std::clamp<int64_t>(qpos[r] - j0, -1, kTile) : kTile;
        blim[r] = r < R ? std::clamp<int64_t>(qpos[r] - p.bias_window - j0, 0, kTile) : 0;
      }
      const float* bias_t = load_bias(bias, b, j0, n, bb.data());
      if (amx) {
        const int64_t n16 = round16(n), n32 = round32(n);
        for (int64_t j = 0; j < n; ++j) rows[j] = K.row16(b, hk, j0 + j);
        pack_rows(rows.data(), n, g.Dk, ka.data(), Dk32, n16, Dk32);
        amx_gemm(n16, Rp, Dk32, ka.data(), Dk32, bq.data(), 2 * Rp, st.data(), kTile, false);
        online_tile(st.data(), n, Rp, vis.data(), blim.data(), bias_t, scale, m.data(), l.data(),
                    corr.data());
        for (int64_t r = 0; r < R; ++r)
          if (corr[r] != 1.0f) scale_row(o.data() + r * g.Dvp, g.Dv, corr[r]);
        pack_rows_t(st.data(), kTile, R, n, pa.data(), kTile, Rp, n32);
        for (int64_t j = 0; j < n; ++j) rows[j] = V.row16(b, hk, j0 + j);
        pack_pairs(rows.data(), n, g.Dv, bv.data(), n32, g.Dvp);
        amx_gemm(Rp, g.Dvp, n32, pa.data(), kTile, bv.data(), 2 * g.Dvp, o.data(), g.Dvp, true);
        continue;
      }
      int64_t ldk, ldv;
      const float* kp = K.rows(b, hk, j0, n, false, kb.data(), g.Dk, ldk);
      const float* vp = V.rows(b, hk, j0, n, true, vb.data(), g.Dvp, ldv);
      tile_gemm(n, Rp, g.Dk, kp, ldk, 1, qt.data(), kTile, st.data(), kTile, false);
      online_tile(st.data(), n, Rp, vis.data(), blim.data(), bias_t, 1.0f, m.data(), l.data(),
                  corr.data());
      for (int64_t r = 0; r < R; ++r)
        if (corr[r] != 1.0f) scale_row(o.data() + r * g.Dvp, g.Dv, corr[r]);
      tile_gemm(R, g.Dvp, n, st.data(), 1, kTile, vp, ldv, o.data(), g.Dvp, true);
    }
    if (splits > 1) {  // keep the partial for the merge
      const int64_t base = (item * splits + split) * kTile;
      std::copy(o.begin(), o.end(), part_o.begin() + base * g.Dvp);
      for (int64_t r = 0; r < kTile; ++r)
        part_ml[2 * (base + r)] = m[r], part_ml[2 * (base + r) + 1] = l[r];
      return;
    }
    for (int64_t r = 0; r < R; ++r) {
      const int64_t h = g.head(hk, r0 + r), i = g.pos(r0 + r);
      float* orow = o.data() + r * g.Dvp;
      scale_row(orow, g.Dv, l[r] > 0 ? 1.0f / l[r] : 0.0f);
      O.store(b, h, i, orow);
      LSE[(b * g.Hq + h) * g.Tq + i] = l[r] > 0 ? m[r] + std::log(l[r]) : -kInf;
    }
  };
#pragma omp parallel for schedule(dynamic, 1) if (items * splits > 1)
  for (int64_t w = 0; w < items * splits; ++w) run(w / splits, w % splits);
  if (splits == 1) return;

    // Merge the splits of each row: O = Σ_s O_s e^{m_s − M} / Σ_s l_s e^{m_s − M}.
#pragma omp parallel for schedule(static)
  for (int64_t item = 0; item < items; ++item) {
    const int64_t rt = item % g.row_tiles, bh = item / g.row_tiles;
    const int64_t b = bh / g.Hkv, hk = bh % g.Hkv;
    const int64_t r0 = rt * kTile, R = std::min(kTile, g.rows - r0);
    std::vector<float> acc(g.Dvp);
    for (int64_t r = 0; r < R; ++r) {
      auto ml = [&](int64_t s) { return part_ml.data() + 2 * ((item * splits + s) * kTile + r); };
      float M = -kInf, L = 0;
      for (int64_t s = 0; s < splits; ++s) M = std::max(M, ml(s)[0]);
      std::fill(acc.begin(), acc.end(), 0.0f);
      if (M != -kInf)
        for (int64_t s = 0; s < splits; ++s) {
          if (ml(s)[0] == -kInf) continue;
          const float c = std::exp(ml(s)[0] - M);
          L += c * ml(s)[1];
          const float* po = part_o.data() + ((item * splits + s) * kTile + r) * g.Dvp;
          for (int64_t d = 0; d < g.Dv; ++d) acc[d] += c * po[d];
        }
      scale_row(acc.data(), g.Dv, L > 0 ? 1.0f / L : 0.0f);
      const int64_t h = g.head(hk, r0 + r), i = g.pos(r0 + r);
      O.store(b, h, i, acc.data());
      LSE[(b * g.Hq + h) * g.Tq + i] = L > 0 ? M + std::log(L) : -kInf;
    }
  }
}

void attention_cpu(const AttentionParams& p, const Tensor& q, const Tensor& k, const Tensor& v,
                   const Tensor& bias, Tensor& out, Tensor& lse) {
  check_row_dtype("attention", q.dtype());
  const Geometry g(q, k, v);
  forward(p, g, View4(q), View4(k), View4(v), View4(out), bias, std::vector<int64_t>(g.B, g.Tk),
          std::vector<int64_t>(g.B, p.q_offset), lse);
}

// Every sequence's pages read in place: one parallel region for the whole batch (work items are
// the (sequence, row tile) pairs; a lone sequence splits its keys over the threads).
void paged_attention_cpu(const AttentionParams& p, const Tensor& q, const ops::PagedKv& kv,
                         Tensor& out, Tensor& lse) {
  check_row_dtype("paged_attention", q.dtype());
  const bool f32 = q.dtype() == DType::F32;
  const Geometry g(q, 1, *std::max_element(kv.length.begin(), kv.length.end()), kv.dv);
  std::vector<int64_t> qoff;
  for (int64_t len : kv.length) qoff.push_back(len - g.Tq);
  forward(p, g, View4(q), View4(kv, f32, g.Dk), View4(kv, f32, g.Dv), View4(out), Tensor(),
          kv.length, qoff, lse);
}

// ---- backward ----

void attention_backward_cpu(const AttentionParams& p, const Tensor& q, const Tensor& k,
                            const Tensor& v, const Tensor& bias, const Tensor& out,
                            const Tensor& lse, const Tensor& dout, Tensor& dq, Tensor& dk,
                            Tensor& dv, Tensor& dbias) {
  check_row_dtype("attention_backward", q.dtype());
  const Geometry g(q, k, v);
  const View4 Q(q), K(k), V(v), O(out), dO(dout), dQ(dq), dK(dk), dV(dv);
  const float scale = static_cast<float>(p.scale);
  const float* LSE = lse.data<float>();
  const int64_t nrows = g.B * g.Hq * g.Tq;

  // delta = rowsum(dout ⊙ out), in lse's [B, Hq, Tq] order.
  std::vector<float> delta(nrows);
  parallel_for(nrows, row_grain(g.Dv), [&](int64_t b0, int64_t e0) {
    std::vector<float> x(g.Dv), y(g.Dv);
    for (int64_t row = b0; row < e0; ++row) {
      const int64_t i = row % g.Tq, h = row / g.Tq % g.Hq, b = row / (g.Tq * g.Hq);
      O.load(b, h, i, x.data());
      dO.load(b, h, i, y.data());
      delta[row] = dot_row(x.data(), y.data(), g.Dv);
    }
  });

  // Key slices per (batch, kv head) so every thread has work; each slice adds into its own dq
  // partial (f32, [B·Hkv·rows, Dkp]), capped at ~256 MiB in all.
  const int64_t items = g.B * g.Hkv, threads = omp_get_max_threads();
  // bf16 rows on a CPU with AMX: the five products of a tile pair on the tile unit (bf16 operands
  // and f32 sums; P and dS rounded to bf16 as they enter the products).
  const bool amx = !Q.f32 && !K.f32 && !V.f32 && !dO.f32 && amx_bf16();
  const int64_t Dk32 = round32(g.Dk), Dv32 = round32(g.Dv);
  // An item's dq partial has 15 rows to spare: the AMX products write whole 16-row tiles (and a
  // causal row tile starts at the first row that sees its keys, anywhere).
  const int64_t rows_p = g.rows + 15;
  const int64_t dq_floats = items * rows_p * g.Dkp;
  int64_t slices =
      std::clamp<int64_t>((2 * threads + items - 1) / items, 1, std::max<int64_t>(g.key_tiles, 1));
  while (slices > 1 && slices * dq_floats * 4 > (int64_t{256} << 20)) --slices;
  if (items >= threads) slices = 1;
  std::vector<float> dq_part(slices * dq_floats, 0.0f);
  std::vector<float> dbias_part(bias.defined() ? items * g.Tk : 0, 0.0f);

  auto run = [&](int64_t item, int64_t slice) {
    const int64_t b = item / g.Hkv, hk = item % g.Hkv;
    const int64_t nf = amx ? 0 : 1;  // the f32 path's buffers
    int slot = 0;                    // tiles on different lines modulo 4 KiB (scratch.h)
    Scratch<float> kt(nf * g.Dkp * kTile, slot), kr(nf * kTile * g.Dkp, slot),
        vt(nf * g.Dvp * kTile, slot), qb(nf * kTile * g.Dkp, slot), ob(nf * kTile * g.Dvp, slot),
        s(kTile * kTile, slot), dp(kTile * kTile, slot), dk_acc(kTile * g.Dkp, slot),
        dv_acc(kTile * g.Dvp, slot), tmp(g.Dvp, slot), bb(kTile, slot);
    // AMX operands: per key tile Kᵀ and Vᵀ (pairs over d), K (pairs over keys); per row tile the
    // q and dout rows, and both as pairs over rows; P, dS transposed and dS.
    const int64_t na = amx ? 1 : 0;
    Scratch<uint16_t> bkt(na * Dk32 * kTile, slot), bvt(na * Dv32 * kTile, slot),
        bk(na * kTile * g.Dkp, slot), qa(na * kTile * Dk32, slot), oa(na * kTile * Dv32, slot),
        bq(na * kTile * g.Dkp, slot), bo(na * kTile * g.Dvp, slot), pt(na * kTile * kTile, slot),
        dst(na * kTile * kTile, slot), dsa(na * kTile * kTile, slot);
    std::vector<const uint16_t*> krows(na * kTile), vrows(na * kTile), qrows(na * kTile),
        orows(na * kTile);
    std::optional<AmxTiles> tiles;
    if (amx) tiles.emplace();
    float* dq_base = dq_part.data() + (slice * items + item) * rows_p * g.Dkp;
    for (int64_t t = slice; t < g.key_tiles; t += slices) {
      const int64_t j0 = t * kTile, n = std::min(kTile, g.Tk - j0);
      const int64_t n16 = round16(n), n32 = round32(n);
      if (amx) {
        for (int64_t j = 0; j < n; ++j)
          krows[j] = K.row16(b, hk, j0 + j), vrows[j] = V.row16(b, hk, j0 + j);
        pack_pairs_t(krows.data(), g.Dk, n, bkt.data(), Dk32, kTile);
        pack_pairs_t(vrows.data(), g.Dv, n, bvt.data(), Dv32, kTile);
        pack_pairs(krows.data(), n, g.Dk, bk.data(), n32, g.Dkp);
      } else {
        load_keys(K, b, hk, j0, n, kt.data(), kr.data(), g.Dkp, nullptr);
        load_keys(V, b, hk, j0, n, vt.data(), nullptr, 0, tmp.data());
      }
      const float* bias_t = load_bias(bias, b, j0, n, bb.data());
      float* dbias_t = bias.defined() ? dbias_part.data() + item * g.Tk + j0 : nullptr;
      std::fill(dk_acc.begin(), dk_acc.end(), 0.0f);
      std::fill(dv_acc.begin(), dv_acc.end(), 0.0f);
      // Causal: rows whose position is before j0 see none of these keys.
      const int64_t r_begin =
          p.causal ? std::clamp<int64_t>((j0 - p.q_offset) * g.G, 0, g.rows) : 0;
      for (int64_t r0 = r_begin; r0 < g.rows; r0 += kTile) {
        const int64_t R = std::min(kTile, g.rows - r0), R16 = round16(R), R32 = round32(R);
        for (int64_t r = 0; r < R; ++r) {
          const int64_t h = g.head(hk, r0 + r), i = g.pos(r0 + r);
          if (amx) {
            qrows[r] = Q.row16(b, h, i), orows[r] = dO.row16(b, h, i);
            continue;
          }
          Q.load(b, h, i, qb.data() + r * g.Dkp, scale);
          dO.load(b, h, i, ob.data() + r * g.Dvp);
        }
        if (amx) {
          pack_rows(qrows.data(), R, g.Dk, qa.data(), Dk32, R16, Dk32);
          pack_rows(orows.data(), R, g.Dv, oa.data(), Dv32, R16, Dv32);
          amx_gemm(R16, kTile, Dk32, qa.data(), Dk32, bkt.data(), 2 * kTile, s.data(), kTile,
                   false);
          amx_gemm(R16, kTile, Dv32, oa.data(), Dv32, bvt.data(), 2 * kTile, dp.data(), kTile,
                   false);
        } else {
          tile_gemm(R, kTile, g.Dk, qb.data(), g.Dkp, 1, kt.data(), kTile, s.data(), kTile, false);
          tile_gemm(R, kTile, g.Dv, ob.data(), g.Dvp, 1, vt.data(), kTile, dp.data(), kTile, false);
        }
        for (int64_t r = 0; r < R; ++r) {
          const int64_t row = (b * g.Hq + g.head(hk, r0 + r)) * g.Tq + g.pos(r0 + r);
          RowMask mk = row_mask(p, p.q_offset + g.pos(r0 + r), j0, n);
          if (LSE[row] == -kInf) mk.vis_end = 0;
          backward_row(s.data() + r * kTile, dp.data() + r * kTile, mk, bias_t, LSE[row],
                       delta[row], amx ? scale : 1.0f, dbias_t);
        }
        if (amx) {  // as below, with the scale of dk applied when it is stored
          pack_rows_t(s.data(), kTile, n, R, pt.data(), kTile, n16, R32);
          pack_rows_t(dp.data(), kTile, n, R, dst.data(), kTile, n16, R32);
          pack_rows(dp.data(), kTile, R, n, dsa.data(), kTile, R16, n32);
          pack_pairs(orows.data(), R, g.Dv, bo.data(), R32, g.Dvp);
          pack_pairs(qrows.data(), R, g.Dk, bq.data(), R32, g.Dkp);
          amx_gemm(n16, g.Dvp, R32, pt.data(), kTile, bo.data(), 2 * g.Dvp, dv_acc.data(), g.Dvp,
                   true);
          amx_gemm(n16, g.Dkp, R32, dst.data(), kTile, bq.data(), 2 * g.Dkp, dk_acc.data(), g.Dkp,
                   true);
          amx_gemm(R16, g.Dkp, n32, dsa.data(), kTile, bk.data(), 2 * g.Dkp, dq_base + r0 * g.Dkp,
                   g.Dkp, true);
          continue;
        }
        // dv += Pᵀ dout, dk += dSᵀ (scale·q), dq += dS k (scaled at the end).
        tile_gemm(n, g.Dvp, R, s.data(), 1, kTile, ob.data(), g.Dvp, dv_acc.data(), g.Dvp, true);
        tile_gemm(n, g.Dkp, R, dp.data(), 1, kTile, qb.data(), g.Dkp, dk_acc.data(), g.Dkp, true);
        tile_gemm(R, g.Dkp, n, dp.data(), kTile, 1, kr.data(), g.Dkp, dq_base + r0 * g.Dkp, g.Dkp,
                  true);
      }
      for (int64_t j = 0; j < n; ++j) {
        if (amx) scale_row(dk_acc.data() + j * g.Dkp, g.Dk, scale);
        dK.store(b, hk, j0 + j, dk_acc.data() + j * g.Dkp);
        dV.store(b, hk, j0 + j, dv_acc.data() + j * g.Dvp);
      }
    }
  };
#pragma omp parallel for schedule(dynamic, 1) if (items * slices > 1)
  for (int64_t w = 0; w < items * slices; ++w) run(w / slices, w % slices);

  // dq = scale · Σ_slices partial, back in [B, Hq, Tq, Dk] order.
  parallel_for(items * g.rows, row_grain(g.Dkp * slices), [&](int64_t b0, int64_t e0) {
    for (int64_t x = b0; x < e0; ++x) {
      const int64_t item = x / g.rows, r = x % g.rows;
      float* acc = dq_part.data() + (item * rows_p + r) * g.Dkp;
      for (int64_t s = 1; s < slices; ++s) add_row(acc, acc + s * dq_floats, g.Dk);
      scale_row(acc, g.Dk, scale);
      dQ.store(item / g.Hkv, g.head(item % g.Hkv, r), g.pos(r), acc);
    }
  });
  if (!bias.defined()) return;
  std::vector<float> db(g.Tk);
  for (int64_t b = 0; b < g.B; ++b) {
    std::fill(db.begin(), db.end(), 0.0f);
    for (int64_t hk = 0; hk < g.Hkv; ++hk)
      add_row(db.data(), dbias_part.data() + (b * g.Hkv + hk) * g.Tk, g.Tk);
    if (dbias.dtype() == DType::F32)
      std::copy(db.begin(), db.end(), dbias.data<float>() + b * g.Tk);
    else
      f32_row_to_bf16(db.data(), dbias.data<uint16_t>() + b * g.Tk, g.Tk);
  }
}

}  // namespace

MYRIAD_REGISTER_KERNEL(ops::attention_kernels, ops::Backend::CPU, &attention_cpu);
MYRIAD_REGISTER_KERNEL(ops::attention_backward_kernels, ops::Backend::CPU, &attention_backward_cpu);
MYRIAD_REGISTER_KERNEL(ops::paged_attention_kernels, ops::Backend::CPU, &paged_attention_cpu);

}  // namespace myriad::cpu
