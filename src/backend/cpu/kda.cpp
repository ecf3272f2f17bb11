// Optimised CPU KDA (MODEL.md §4.4): the chunkwise WY/UT form in f32, threaded over (batch,
// head). Per chunk every tile lives in small buffers padded to multiples of 16 (zero outside the
// live rows and columns), so the small matrix products run as one register-blocked loop nest on
// GCC vectors, compiled for each MYRIAD_CPU_CLONES target. The in-chunk cumulative log-decay G
// is kept as an f32 pair (two-sum), so its differences stay accurate when a strongly negative
// gate makes |G| large; the decay matrices are built per 16 x 16 block, as products through a
// reference row where that is safe and from masked exponentials of differences elsewhere (see
// "pair sums" below), so nothing overflows whatever the gate. With bf16 inputs on an AMX CPU
// the larger products run on the tile unit instead (bf16 operands, f32 sums; see bmm).
//
// Backward, per chunk in reverse, from the saved state S entering it, the forward's solve rows U
// (Ṽ = Diag(β) U, saved.u) and dS' = dL/d(S after it):
//   Ṽ = (I + L)^-1 Diag(β) R with R = V - Kg S;  O = Qg S + P Ṽ;  S' = Γ_C S + Kd^T Ṽ
//   dṼ = P^T dO + Kd dS';  (I + L)^T X = dṼ;  dR = β X;  dL = -X Ṽ^T (strictly lower)
//   dβ_r = X_r·U_r (= X_r·R_r + Σ_i M_ri dL_ri);  dM = β dL;  dP = dO Ṽ^T (lower)
//   dS = Qg^T dO + Γ_C dS' - Kg^T dR
// and the pairwise terms of M and P (with E_ri = exp(G_r - G_i)) give dK, dQ and dG; dg is the
// reverse in-chunk cumsum of dG.
#include <algorithm>
#include <cstring>
#include <optional>
#include <utility>
#include <vector>

#include "backend/cpu/amx.h"
#include "backend/cpu/cpu.h"
#include "backend/cpu/rows.h"
#include "backend/cpu/scratch.h"
#if defined(__x86_64__)
#include <immintrin.h>
#endif
#include "ops/kda.h"

namespace myriad::cpu {
namespace {
using ops::KdaArgs;
using ops::KdaGrads;
using ops::KdaSaved;

int64_t pad16(int64_t n) {
  return (n + 15) / 16 * 16;
}

// c[m, n] = (acc ? c : 0) + sum_{p < kk} A(i, p) b[p, :], with A(i, p) = a[i * sai + p * sap]
// (so a row-major A or a transposed one), over columns [j0, j1). m % R == 0 and (j1 - j0) % (NV W)
// == 0. Each R x (NV W-lane vectors) tile of c stays in registers over the whole p loop. Every
// element sums over p in order, whatever the tiling.
template <int W, int R, int NV>
MYRIAD_CPU_CLONES void mm_w(int64_t m, int64_t j0, int64_t j1, int64_t kk,
                            const float* __restrict a, int64_t sai, int64_t sap,
                            const float* __restrict b, int64_t ldb, float* __restrict c,
                            int64_t ldc, bool acc) {
  using V = typename Lanes<W>::F;
  for (int64_t i0 = 0; i0 < m; i0 += R)
    for (int64_t j = j0; j < j1; j += NV * W) {
      V t[R][NV];
      for (int ii = 0; ii < R; ++ii)
        for (int v = 0; v < NV; ++v) {
          t[ii][v] = V{};
          if (acc) std::memcpy(&t[ii][v], c + (i0 + ii) * ldc + j + v * W, sizeof(V));
        }
      const float* ap = a + i0 * sai;
      for (int64_t p = 0; p < kk; ++p) {
        V bp[NV];
        for (int v = 0; v < NV; ++v) std::memcpy(&bp[v], b + p * ldb + j + v * W, sizeof(V));
        for (int ii = 0; ii < R; ++ii) {
          const float x = ap[ii * sai + p * sap];
          for (int v = 0; v < NV; ++v) t[ii][v] += x * bp[v];
        }
      }
      for (int ii = 0; ii < R; ++ii)
        for (int v = 0; v < NV; ++v)
          std::memcpy(c + (i0 + ii) * ldc + j + v * W, &t[ii][v], sizeof(V));
    }
}
// m % 8 == 0 and n % 16 == 0. AVX-512 runs 8 x 2 zmm tiles where the columns allow (16
// accumulators, 10 loads per 16 FMAs: an 8 x 1 tile's 9 loads per 8 FMAs made the loads the
// bound), then 8 x 1; AVX2 runs 4 x 2 ymm tiles (8 accumulators, 6 loads per 8 FMAs).
void mm(int64_t m, int64_t n, int64_t kk, const float* a, int64_t sai, int64_t sap, const float* b,
        int64_t ldb, float* c, int64_t ldc, bool acc) {
  if (wide_vectors()) {
    const int64_t n2 = n / 32 * 32;
    if (n2) mm_w<16, 8, 2>(m, 0, n2, kk, a, sai, sap, b, ldb, c, ldc, acc);
    if (n2 < n) mm_w<16, 8, 1>(m, n2, n, kk, a, sai, sap, b, ldb, c, ldc, acc);
  } else {
    mm_w<8, 4, 2>(m, 0, n, kk, a, sai, sap, b, ldb, c, ldc, acc);
  }
}

// ---- bf16 products on the AMX tile unit ----
// With bf16 inputs (bf16 training) on an AMX CPU, the chunk's products against the state, the
// state update, P Ṽ and the backward's products of dO, dS', Ṽ, X and nDR run as bf16 tile
// products with f32 sums, as bf16 kernels on GPUs do. Operands are rounded from the f32 tiles
// as each product needs them. The decays and factors, the 16-wide M and P blocks, the
// triangular solves and the pair gradients stay in f32: the M, P blocks and the pair gradients
// on the tile unit ran 0.93-0.96x (their operands' rounding and the tiles' set-up cost more
// than the 16-wide products).
int64_t pad32(int64_t n) {
  return (n + 31) / 32 * 32;
}
// dst[i, :kp] = bf16 of src[i lds + p] for p < kk, zero from kk to kp (a multiple of 16), for
// i < m (row-major bf16). The kernel's rows are short (16 to 64): the shared row converter's
// per-row calls were 12% of a profile, its vectorised integer rounding here 7%. AMX CPUs have
// AVX512-BF16 (its rounding reads subnormals as zero, as the kernel's FlushSubnormals does).
#if defined(__x86_64__)
#define MYRIAD_BF16_TARGET __attribute__((target("avx512f,avx512vl,avx512bw,avx512bf16")))
MYRIAD_BF16_TARGET void to_bf16_rows(const float* __restrict src, int64_t lds, int64_t m,
                                     int64_t kk, uint16_t* __restrict dst, int64_t kp) {
  for (int64_t i = 0; i < m; ++i) {
    const float* s = src + i * lds;
    uint16_t* d = dst + i * kp;
    int64_t p = 0;
    for (; p + 16 <= kk; p += 16)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + p),
                          reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(_mm512_loadu_ps(s + p))));
    if (p < kk) {
      const __mmask16 live = static_cast<__mmask16>((1u << (kk - p)) - 1);
      _mm256_storeu_si256(
          reinterpret_cast<__m256i*>(d + p),
          reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(live, s + p))));
      p += 16;
    }
    for (; p < kp; p += 16) _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + p), __m256i{});
  }
}
// dst = VNNI pairs of bf16(B) (amx.h), B[p, j] = b[p ldb + j] for p < kk, j < n (a multiple of
// 16), with zero rows from kk up to pad32(kk): [pad32(kk) / 2, 2 n].
MYRIAD_BF16_TARGET void pack_b(const float* __restrict b, int64_t ldb, int64_t kk, int64_t n,
                               uint16_t* dst) {
  for (int64_t p = 0; p < pad32(kk); p += 2) {
    uint32_t* dp = reinterpret_cast<uint32_t*>(dst) + p / 2 * n;
    for (int64_t j = 0; j < n; j += 16) {
      const __m512 lo = p < kk ? _mm512_loadu_ps(b + p * ldb + j) : _mm512_setzero_ps();
      const __m512 hi = p + 1 < kk ? _mm512_loadu_ps(b + (p + 1) * ldb + j) : _mm512_setzero_ps();
      // (the maskz forms: GCC 12 warns that the plain ones' undefined source is uninitialised)
      const __m512i l =
          _mm512_maskz_cvtepu16_epi32(0xffff, reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(lo)));
      const __m512i h =
          _mm512_maskz_cvtepu16_epi32(0xffff, reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(hi)));
      _mm512_storeu_si512(dp + j, _mm512_or_si512(l, _mm512_maskz_slli_epi32(0xffff, h, 16)));
    }
  }
}
#else  // (no AMX: never called)
void to_bf16_rows(const float*, int64_t, int64_t, int64_t, uint16_t*, int64_t) {}
void pack_b(const float*, int64_t, int64_t, int64_t, uint16_t*) {}
#endif
// The same pairs for B[p, j] = src[j lds + p] (B transposed; p < kk, j < n, n a multiple of 16):
// each source row in bf16 is a row of 32-bit pair words, and the pair rows are their transpose
// (as an f32 transpose: moves only). tmp: [n, pad32(kk) / 2] words.
void pack_bt(const float* src, int64_t lds, int64_t kk, int64_t n, uint16_t* dst, float* tmp) {
  const int64_t kp = pad32(kk);
  to_bf16_rows(src, lds, n, kk, reinterpret_cast<uint16_t*>(tmp), kp);
  transpose(tmp, n, kp / 2, kp / 2, reinterpret_cast<float*>(dst), n);
}
// c[m, n] = (acc ? c : 0) + A B with A(i, p) = a[i sai + p sap] (sai or sap is 1) rounded to bf16
// into la ([m, pad32(kk)]; a transposed A goes through the f32 scratch tmp, [m, pad16(kk)], and
// its source must be readable over pad16(kk) rows), and B given as pack_b's pairs (ldb elements
// apart: 2 n for a whole packed B).
void bmm(int64_t m, int64_t n, int64_t kk, const float* a, int64_t sai, int64_t sap,
         const uint16_t* b, int64_t ldb, float* c, int64_t ldc, bool acc, uint16_t* la,
         float* tmp) {
  const int64_t kp = pad32(kk);
  if (sap != 1) {
    transpose(a, pad16(kk), m, sap, tmp, pad16(kk));
    a = tmp, sai = pad16(kk);
  }
  to_bf16_rows(a, sai, m, kk, la, kp);
  amx_gemm(m, n, kp, la, kp, b, ldb, c, ldc, acc);
}

// Rows of n values, `stride` elements apart in a contiguous f32 or bf16 tensor (from element
// off), to / from a padded f32 buffer with leading dimension ld, times mul.
MYRIAD_CPU_CLONES void load_rows_f32(const float* src, int64_t stride, int64_t rows, int64_t n,
                                     float mul, float* __restrict dst, int64_t ld) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < n; ++i) dst[r * ld + i] = src[r * stride + i] * mul;
}
MYRIAD_CPU_CLONES void load_rows_bf16(const uint16_t* src, int64_t stride, int64_t rows, int64_t n,
                                      float mul, float* __restrict dst, int64_t ld) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < n; ++i) dst[r * ld + i] = bf16_load(src[r * stride + i]) * mul;
}
MYRIAD_CPU_CLONES void store_rows_f32(const float* src, int64_t ld, int64_t rows, int64_t n,
                                      float mul, float* __restrict dst, int64_t stride) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < n; ++i) dst[r * stride + i] = src[r * ld + i] * mul;
}
MYRIAD_CPU_CLONES void store_rows_bf16(const float* src, int64_t ld, int64_t rows, int64_t n,
                                       float mul, uint16_t* __restrict dst, int64_t stride) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < n; ++i) dst[r * stride + i] = bf16_store(src[r * ld + i] * mul);
}
void load(const Tensor& t, int64_t off, int64_t stride, int64_t rows, int64_t n, float mul,
          float* dst, int64_t ld) {
  if (t.dtype() == DType::F32)
    load_rows_f32(t.data<float>() + off, stride, rows, n, mul, dst, ld);
  else
    load_rows_bf16(t.data<uint16_t>() + off, stride, rows, n, mul, dst, ld);
}
#if defined(__x86_64__)
// The same rows with streaming stores: whole 64-byte lines written without reading them first
// (an ordinary store to a line not in the cache reads it for ownership, doubling the traffic; the
// write prefetches hid only part of that). Only for outputs of 4 MiB or more, larger than a
// core's L2, which the next op would read from L3 or memory anyway (a smaller one, from the
// prefill of a short prompt, say, stays in the cache for its reader); n a multiple of 16 and
// every row 64-byte aligned.
__attribute__((target("avx512f"))) void stream_rows_f32(const float* src, int64_t ld, int64_t rows,
                                                        int64_t n, float mul, float* dst,
                                                        int64_t stride) {
  const __m512 m = _mm512_set1_ps(mul);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < n; i += 16)
      _mm512_stream_ps(dst + r * stride + i, _mm512_mul_ps(m, _mm512_loadu_ps(src + r * ld + i)));
}
bool streamable(const Tensor& t, int64_t off, int64_t stride, int64_t n) {
  return t.dtype() == DType::F32 && t.numel() * 4 >= (int64_t{4} << 20) && wide_vectors() &&
         n % 16 == 0 && stride % 16 == 0 &&
         reinterpret_cast<uintptr_t>(t.data<float>() + off) % 64 == 0;
}
#endif
// Asks for rows of n values, `stride` elements apart (from element off), to be brought into the
// cache for writing: output rows not in the cache cost a read for ownership at the store. Rows
// that store() streams need no read, so they are not asked for.
// (Prefetching the next chunk's input rows as well ran 0.90x.)
void prefetch_rows(Tensor& t, int64_t off, int64_t stride, int64_t rows, int64_t n) {
#if defined(__x86_64__)
  if (streamable(t, off, stride, n)) return;
#endif
  const int64_t es = t.dtype() == DType::F32 ? 4 : 2;
  char* base = static_cast<char*>(t.data_ptr()) + off * es;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < n * es; i += 64) __builtin_prefetch(base + r * stride * es + i, 1, 3);
}
void store(const float* src, int64_t ld, int64_t rows, int64_t n, float mul, Tensor& t, int64_t off,
           int64_t stride) {
#if defined(__x86_64__)
  if (streamable(t, off, stride, n))
    return stream_rows_f32(src, ld, rows, n, mul, t.data<float>() + off, stride);
#endif
  if (t.dtype() == DType::F32)
    store_rows_f32(src, ld, rows, n, mul, t.data<float>() + off, stride);
  else
    store_rows_bf16(src, ld, rows, n, mul, t.data<uint16_t>() + off, stride);
}

// The in-chunk pair sums M[r, i] = sum_d K_r K_i E_ri (i < r) and P[r, i] = sum_d Q_r K_i E_ri
// (i <= r), E_ri = exp(G_r - G_i), are computed per 16 x 16 block (a, b) of (r, i). When every
// gate of the chunk is <= 0 (G non-increasing), a block is a small GEMM through a reference row
// R: E_ri = exp(G_r - R) exp(R - G_i) (Kimi Linear's secondary chunking):
//  - below the diagonal, R is the last row of block b, so both factors are <= 1;
//  - on the diagonal, R is the block's middle row, used only when G spans at most 80 over the
//    block (always so for the K3 gate, g > -5), so both factors lie in [e^-40, e^40]; the
//    non-causal entries are finite and are cleared after the product.
// Otherwise a block is "direct": the exponential of each difference, masked (i > r) before
// exponentiating, so nothing can overflow whatever the gate.
constexpr int64_t kBlk = 16;

// Direct block: rows [r0, r1) against columns [i0, i0 + 16). KT, GT, LT are K and G = GT + LT
// transposed ([k, Cp]), so the inner loop runs in W-lane vectors over i.
template <int W>
MYRIAD_CPU_CLONES void pair_sums_direct_w(int64_t r0, int64_t r1, int64_t i0, int64_t k, int64_t cp,
                                          int64_t kp, const float* __restrict Q,
                                          const float* __restrict Kc, const float* __restrict G,
                                          const float* __restrict Gl, const float* __restrict KT,
                                          const float* __restrict GT, const float* __restrict LT,
                                          float* __restrict M, float* __restrict P) {
  using V = typename Lanes<W>::F;
  constexpr int kN = static_cast<int>(kBlk / W);
  for (int64_t r = r0; r < r1; ++r) {
    V mr[kN] = {}, pr[kN] = {};  // the row's 16 sums stay in registers over d
    for (int64_t d = 0; d < k; ++d) {
      const float gr = G[r * kp + d], lr = Gl[r * kp + d];
      const float* gt = GT + d * cp + i0;
      const float* lt = LT + d * cp + i0;
      const float* kt = KT + d * cp + i0;
      float ke[kBlk];
      for (int64_t j = 0; j < kBlk; ++j) {
        const float x = i0 + j <= r ? (gr - gt[j]) + (lr - lt[j]) : -100.0f;
        ke[j] = kt[j] * fast_exp(x);
      }
      for (int v = 0; v < kN; ++v) {
        V kv;
        std::memcpy(&kv, ke + v * W, sizeof kv);
        mr[v] += Kc[r * kp + d] * kv;
        pr[v] += Q[r * kp + d] * kv;
      }
    }
    float ms[kBlk], ps[kBlk];
    std::memcpy(ms, mr, sizeof ms);
    std::memcpy(ps, pr, sizeof ps);
    for (int64_t j = 0; j < kBlk; ++j) {
      M[r * cp + i0 + j] = i0 + j < r ? ms[j] : 0.0f;
      P[r * cp + i0 + j] = i0 + j <= r ? ps[j] : 0.0f;
    }
  }
}
void pair_sums_direct(int64_t r0, int64_t r1, int64_t i0, int64_t k, int64_t cp, int64_t kp,
                      const float* Q, const float* Kc, const float* G, const float* Gl,
                      const float* KT, const float* GT, const float* LT, float* M, float* P) {
  with_lanes([&](auto w) {
    pair_sums_direct_w<decltype(w)::value>(r0, r1, i0, k, cp, kp, Q, Kc, G, Gl, KT, GT, LT, M, P);
  });
}

// The left factors of block row a against reference row (ref, refl): EL = exp(G_r - R),
// KL = K EL, QL = Q EL for the block's rows r0 + [0, rows), zero below ([16, kp] each). EL is
// only written when el is not null (the backward's pair gradients read it; the forward does not,
// and every buffer a pass writes costs it stores that miss L1).
template <bool kEL>
MYRIAD_CPU_CLONES void left_factors_w(int64_t r0, int64_t rows, int64_t kp,
                                      const float* __restrict Q, const float* __restrict Kc,
                                      const float* __restrict G, const float* __restrict Gl,
                                      const float* __restrict ref, const float* __restrict refl,
                                      float* __restrict EL, float* __restrict KL,
                                      float* __restrict QL) {
  for (int64_t r = 0; r < kBlk; ++r)
    for (int64_t d = 0; d < kp; ++d) {
      const int64_t i = (r0 + r) * kp + d, o = r * kp + d;
      const float e = r < rows ? fast_exp((G[i] - ref[d]) + (Gl[i] - refl[d])) : 0.0f;
      if constexpr (kEL) EL[o] = e;
      KL[o] = Kc[i] * e;
      QL[o] = Q[i] * e;
    }
}
void left_factors(int64_t r0, int64_t rows, int64_t kp, const float* Q, const float* Kc,
                  const float* G, const float* Gl, const float* ref, const float* refl, float* EL,
                  float* KL, float* QL) {
  if (EL)
    left_factors_w<true>(r0, rows, kp, Q, Kc, G, Gl, ref, refl, EL, KL, QL);
  else
    left_factors_w<false>(r0, rows, kp, Q, Kc, G, Gl, ref, refl, EL, KL, QL);
}

// Block (a, b < a) of a block row whose diagonal block is factorised (reference: its middle row
// m) reuses the diagonal block's left factors: exp(G_r - G_i) = EL_r c ER_i with EL_r =
// exp(G_r - G_m) (the diagonal block's), c = exp(G_m - G_R) <= 1 over k (R, the last row of b,
// comes before m) and ER_i = exp(G_R - G_i) (b's right factors). So M_ab = KL_diag (KR_b c)^T:
// one exponential per column and one scaled copy of b's transposed right factors (KRT's rows
// d < k, columns [i0, i0 + 16) times c_d, into rs [k, 16]) instead of an exponential per element.
MYRIAD_CPU_CLONES void column_factors(int64_t kp, int64_t k, int64_t cp, const float* __restrict gm,
                                      const float* __restrict lm, const float* __restrict gr,
                                      const float* __restrict lr, const float* __restrict krt,
                                      float* __restrict c, float* __restrict rs) {
  for (int64_t d = 0; d < kp; ++d) c[d] = fast_exp((gm[d] - gr[d]) + (lm[d] - lr[d]));
  using V = Lanes<kBlk>::F;  // a row of 16 as one vector (as plain loops GCC shuffled xmm lanes)
  for (int64_t d = 0; d < k; ++d) {
    V x;
    std::memcpy(&x, krt + d * cp, sizeof x);
    x *= c[d];
    std::memcpy(rs + d * kBlk, &x, sizeof x);
  }
}

// The right factors of rows [i0, i1) against reference row (ref, refl): ER = exp(R - G_i) (when
// ER is not null) and KR = K ER.
MYRIAD_CPU_CLONES void right_factors(int64_t i0, int64_t i1, int64_t kp, const float* __restrict Kc,
                                     const float* __restrict G, const float* __restrict Gl,
                                     const float* __restrict ref, const float* __restrict refl,
                                     float* __restrict ER, float* __restrict KR) {
  for (int64_t i = i0; i < i1; ++i)
    for (int64_t d = 0; d < kp; ++d) {
      const int64_t x = i * kp + d;
      const float e = fast_exp((ref[d] - G[x]) + (refl[d] - Gl[x]));
      if (ER) ER[x] = e;
      KR[x] = Kc[x] * e;
    }
}

// y[:n] += a[:n] * c[:n] * b[:n]
MYRIAD_CPU_CLONES void fma3_rows(float* __restrict y, const float* __restrict a,
                                 const float* __restrict c, const float* __restrict b, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += (a[i] * c[i]) * b[i];
}
// rs[i, :] = kr[i, :] * c for rows i < n of width kp.
MYRIAD_CPU_CLONES void scale_cols(int64_t n, int64_t kp, const float* __restrict kr,
                                  const float* __restrict c, float* __restrict rs) {
  for (int64_t i = 0; i < n; ++i)
    for (int64_t d = 0; d < kp; ++d) rs[i * kp + d] = kr[i * kp + d] * c[d];
}

// y[:n] += a[:n] * b[:n]
MYRIAD_CPU_CLONES void fma_rows(float* __restrict y, const float* __restrict a,
                                const float* __restrict b, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a[i] * b[i];
}

// The gradients through a direct block (rows [r0, r1), columns [i0, i1), pairs i <= r), with
// e = exp(G_r - G_i) as vectors over k:
//   a_r += dM_ri K_i e,  b_r += dP_ri K_i e,  c_i += e (dM_ri K_r + dP_ri Q_r).
MYRIAD_CPU_CLONES void pair_grads_direct(int64_t r0, int64_t r1, int64_t i0, int64_t i1, int64_t kp,
                                         int64_t cp, const float* __restrict Q,
                                         const float* __restrict Kc, const float* __restrict G,
                                         const float* __restrict Gl, const float* __restrict dM,
                                         const float* __restrict dP, float* __restrict A,
                                         float* __restrict Bq, float* __restrict Cc) {
  for (int64_t r = r0; r < r1; ++r) {
    const float* gr = G + r * kp;
    const float* lr = Gl + r * kp;
    const float* kr = Kc + r * kp;
    const float* qr = Q + r * kp;
    float* __restrict ar = A + r * kp;
    float* __restrict br = Bq + r * kp;
    for (int64_t i = i0; i < std::min(i1, r + 1); ++i) {
      const float dm = i < r ? dM[r * cp + i] : 0.0f, dp = dP[r * cp + i];
      const float* gi = G + i * kp;
      const float* li = Gl + i * kp;
      const float* ki = Kc + i * kp;
      float* __restrict ci = Cc + i * kp;
#pragma GCC ivdep
      for (int64_t d = 0; d < kp; ++d) {
        const float e = fast_exp((gr[d] - gi[d]) + (lr[d] - li[d]));
        const float ke = ki[d] * e;
        ar[d] += dm * ke;
        br[d] += dp * ke;
        ci[d] += e * (dm * kr[d] + dp * qr[d]);
      }
    }
  }
}

// Loads the chunk's gates (rows of k values, `stride` apart) as the in-chunk cumulative
// log-decay G + Gl, an unevaluated sum (Knuth's two-sum), so that differences G_r - G_i keep f32
// accuracy when a strongly negative gate made |G| large ([cn, kp]; the padding columns are left
// alone, zero). Returns whether no gate is > 0 (NaN counts as not), in the same vectorised pass:
// a running std::max over the gates was a scalar dependency chain, 42% of the chunk's own time
// in a forward profile, and a pass of its own cost a read of the chunk.
MYRIAD_CPU_CLONES bool load_gates(const float* __restrict g, int64_t stride, int64_t cn, int64_t k,
                                  int64_t kp, float* __restrict G, float* __restrict Gl) {
  int any = 0;
  for (int64_t d = 0; d < k; ++d) {
    G[d] = g[d];
    Gl[d] = 0.0f;
    any |= g[d] > 0.0f;
  }
  for (int64_t r = 1; r < cn; ++r)
    for (int64_t d = 0; d < k; ++d) {
      const float a = G[(r - 1) * kp + d], b = g[r * stride + d], s = a + b, bb = s - a;
      any |= b > 0.0f;
      G[r * kp + d] = s;
      Gl[r * kp + d] = Gl[(r - 1) * kp + d] + ((a - (s - bb)) + (b - bb));
    }
  return any == 0;
}

// Decays and gated copies of one chunk: Gam = exp(G), Ed = exp(G_last - G), Qg = Q Gam,
// Kg = K Gam, Kd = K Ed (rows < cn; the rest stay zero). Without `all` (the forward), Gam only
// for the last row and no Ed: the backward alone reads them.
template <bool kAll>
MYRIAD_CPU_CLONES void decays_w(int64_t cn, int64_t kp, const float* __restrict Q,
                                const float* __restrict Kc, const float* __restrict G,
                                const float* __restrict Gl, float* __restrict Gam,
                                float* __restrict Ed, float* __restrict Qg, float* __restrict Kg,
                                float* __restrict Kd) {
  const float* gl = G + (cn - 1) * kp;
  const float* ll = Gl + (cn - 1) * kp;
  for (int64_t r = 0; r < cn; ++r)
    for (int64_t d = 0; d < kp; ++d) {
      const int64_t i = r * kp + d;
      const float gam = fast_exp(G[i] + Gl[i]), ed = fast_exp((gl[d] - G[i]) + (ll[d] - Gl[i]));
      if constexpr (kAll) {
        Gam[i] = gam;
        Ed[i] = ed;
      }
      Qg[i] = Q[i] * gam;
      Kg[i] = Kc[i] * gam;
      Kd[i] = Kc[i] * ed;
    }
  if constexpr (!kAll)
    for (int64_t d = 0; d < kp; ++d) Gam[(cn - 1) * kp + d] = fast_exp(gl[d] + ll[d]);
}
void decays(int64_t cn, int64_t kp, bool all, const float* Q, const float* Kc, const float* G,
            const float* Gl, float* Gam, float* Ed, float* Qg, float* Kg, float* Kd) {
  if (all)
    decays_w<true>(cn, kp, Q, Kc, G, Gl, Gam, Ed, Qg, Kg, Kd);
  else
    decays_w<false>(cn, kp, Q, Kc, G, Gl, Gam, Ed, Qg, Kg, Kd);
}

// The two triangular solves, blocked by 16 rows: what a block row owes to the rows of other
// blocks is one register-blocked product (mm), and only the substitution inside the block runs
// row by row. Each row's block of columns (64 where vp allows, else 16; vp is a multiple of 16)
// stays in registers over that substitution. (Row by row over the whole chunk, the 4 vector
// chains of a row's sum were FMA-latency bound: 6.4% of a forward profile's samples.)
//
// Ṽ_r = β_r U_r, U_r = R_r - T_r - sum_{r0<=i<r} M_ri Ṽ_i for r in [r0, r1), with T (rows from
// r0) the earlier blocks' part: (I + Diag(β) M) Ṽ = Diag(β) R. With keep_u, U_r replaces R_r
// (read only here, before it is written).
template <int W, int N>
MYRIAD_CPU_CLONES void solve_lower_cols(int64_t r0, int64_t r1, int64_t cp, int64_t vp, int64_t j0,
                                        const float* __restrict M, const float* __restrict beta,
                                        float* __restrict R, const float* __restrict T,
                                        float* __restrict Vt, bool keep_u) {
  using V = typename Lanes<W>::F;
  for (int64_t r = r0; r < r1; ++r) {
    V acc[N], t[N];
    std::memcpy(acc, R + r * vp + j0, sizeof acc);
    std::memcpy(t, T + (r - r0) * vp + j0, sizeof t);
    for (int v = 0; v < N; ++v) acc[v] -= t[v];
    for (int64_t i = r0; i < r; ++i) {
      const float m = M[r * cp + i];
      for (int v = 0; v < N; ++v) {
        V x;
        std::memcpy(&x, Vt + i * vp + j0 + v * W, sizeof x);
        acc[v] -= m * x;
      }
    }
    if (keep_u) std::memcpy(R + r * vp + j0, acc, sizeof acc);
    for (int v = 0; v < N; ++v) acc[v] *= beta[r];
    std::memcpy(Vt + r * vp + j0, acc, sizeof acc);
  }
}

// The transposed system (I + Diag(β) M)^T X = Y by back substitution, inside rows [r0, r1)
// whose X rows already hold Y_r + sum_{i >= r1} M_ir nDR_i; also nDR_r = -β_r X_r.
template <int W, int N>
MYRIAD_CPU_CLONES void solve_upper_t_cols(int64_t r0, int64_t r1, int64_t cp, int64_t vp,
                                          int64_t j0, const float* __restrict M,
                                          const float* __restrict beta, float* __restrict X,
                                          float* __restrict nDR) {
  using V = typename Lanes<W>::F;
  for (int64_t r = r1 - 1; r >= r0; --r) {
    V acc[N];
    std::memcpy(acc, X + r * vp + j0, sizeof acc);
    for (int64_t i = r + 1; i < r1; ++i) {
      const float l = beta[i] * M[i * cp + r];
      for (int v = 0; v < N; ++v) {
        V x;
        std::memcpy(&x, X + i * vp + j0 + v * W, sizeof x);
        acc[v] -= l * x;
      }
    }
    std::memcpy(X + r * vp + j0, acc, sizeof acc);
    for (int v = 0; v < N; ++v) acc[v] *= -beta[r];
    std::memcpy(nDR + r * vp + j0, acc, sizeof acc);
  }
}

// Ṽ for rows < cn, with T a [16, vp] scratch block (and U over R's rows with keep_u).
void solve_lower(int64_t cn, int64_t cp, int64_t vp, const float* M, const float* beta, float* R,
                 float* T, float* Vt, bool keep_u) {
  for (int64_t r0 = 0; r0 < cn; r0 += kBlk) {
    const int64_t r1 = std::min(cn, r0 + kBlk);
    if (r0 > 0)
      mm(kBlk, vp, r0, &M[r0 * cp], cp, 1, Vt, vp, T, vp, false);
    else
      std::fill(T, T + kBlk * vp, 0.0f);
    with_lanes([&](auto w) {
      constexpr int W = decltype(w)::value;
      int64_t j0 = 0;
      for (; j0 + 64 <= vp; j0 += 64)
        solve_lower_cols<W, 64 / W>(r0, r1, cp, vp, j0, M, beta, R, T, Vt, keep_u);
      for (; j0 < vp; j0 += 16)
        solve_lower_cols<W, 16 / W>(r0, r1, cp, vp, j0, M, beta, R, T, Vt, keep_u);
    });
  }
}
// X and nDR = -β X for rows < cn from Y = dṼ (X's rows >= cn are left as they are).
void solve_upper_t(int64_t cn, int64_t cp, int64_t vp, const float* M, const float* beta,
                   const float* Y, float* X, float* nDR) {
  for (int64_t r0 = (cn - 1) / kBlk * kBlk; r0 >= 0; r0 -= kBlk) {
    const int64_t r1 = std::min(cn, r0 + kBlk);
    std::memcpy(X + r0 * vp, Y + r0 * vp, (r1 - r0) * vp * sizeof(float));
    if (r1 < cn)  // X_r += sum_{i >= r1} M_ir nDR_i, over the whole 16-row block
      mm(kBlk, vp, cn - r1, &M[r1 * cp + r0], 1, cp, &nDR[r1 * vp], vp, &X[r0 * vp], vp, true);
    with_lanes([&](auto w) {
      constexpr int W = decltype(w)::value;
      int64_t j0 = 0;
      for (; j0 + 64 <= vp; j0 += 64)
        solve_upper_t_cols<W, 64 / W>(r0, r1, cp, vp, j0, M, beta, X, nDR);
      for (; j0 < vp; j0 += 16) solve_upper_t_cols<W, 16 / W>(r0, r1, cp, vp, j0, M, beta, X, nDR);
    });
  }
}

// Per row of the chunk: dQ (before the scale), dK and dG from the products and pair terms
// (see the top of the file).
struct RowGrads {
  const float *Q, *Kc, *Gam, *Ed, *Qg, *Kg, *Kd, *DOS, *VDS, *NRS, *Ga, *Gb, *Gc;
};
MYRIAD_CPU_CLONES void row_grads(int64_t n, const RowGrads& a, float* __restrict dQ,
                                 float* __restrict dK, float* __restrict dG) {
  for (int64_t i = 0; i < n; ++i) {
    dQ[i] = a.Gam[i] * a.DOS[i] + a.Gb[i];
    dK[i] = a.Ed[i] * a.VDS[i] + a.Gam[i] * a.NRS[i] + a.Ga[i] + a.Gc[i];
    dG[i] = a.Qg[i] * a.DOS[i] - a.Kd[i] * a.VDS[i] + a.Kg[i] * a.NRS[i] + a.Kc[i] * a.Ga[i] +
            a.Q[i] * a.Gb[i] - a.Kc[i] * a.Gc[i];
  }
}

// The last row of dG also collects what the state hand-off owes to G_last: sum_r Kd VDS, and
// Γ_last (S·dS') per key row; then dg = the reverse in-chunk cumsum of dG.
MYRIAD_CPU_CLONES void finish_dg(int64_t cn, int64_t k, int64_t kp, int64_t vp,
                                 const float* __restrict Kd, const float* __restrict VDS,
                                 const float* __restrict gl, const float* __restrict S,
                                 const float* __restrict dS, float* __restrict dG) {
  float* last = dG + (cn - 1) * kp;
  for (int64_t r = 0; r < cn; ++r)
    for (int64_t d = 0; d < kp; ++d) last[d] += Kd[r * kp + d] * VDS[r * kp + d];
  for (int64_t d = 0; d < k; ++d) last[d] += gl[d] * row_dot(S + d * vp, dS + d * vp, vp);
  for (int64_t r = cn - 2; r >= 0; --r)
    for (int64_t d = 0; d < kp; ++d) dG[r * kp + d] += dG[(r + 1) * kp + d];
}

// For r < cn: dβ_r = X_r·U_r = X_r·R_r - sum_{i<r} M_ri XV_ri (the first form when R holds U,
// the second when it holds R) and dM_ri = -β_r XV_ri (dM is zero elsewhere).
MYRIAD_CPU_CLONES void beta_grads(int64_t cn, int64_t cp, int64_t vp, const float* __restrict beta,
                                  const float* __restrict X, const float* __restrict R, bool is_u,
                                  const float* __restrict M, const float* __restrict XV,
                                  float* __restrict dM, float* __restrict dbeta) {
  for (int64_t i = 0; i < cp * cp; ++i) dM[i] = 0.0f;
  for (int64_t r = 0; r < cn; ++r) {
    dbeta[r] = row_dot(X + r * vp, R + r * vp, vp);
    if (!is_u) dbeta[r] -= row_dot(M + r * cp, XV + r * cp, r);
    for (int64_t i = 0; i < r; ++i) dM[r * cp + i] = -beta[r] * XV[r * cp + i];
  }
}

// y[d, :] = (acc ? y[d, :] : 0) + (mul s[d]) x[d, :] for d < k (rows of vp; y may be x).
MYRIAD_CPU_CLONES void scale_rows(int64_t k, int64_t vp, const float* s, const float* x, float* y,
                                  bool acc, float mul = 1.0f) {
  for (int64_t d = 0; d < k; ++d) {
    const float sd = mul * s[d];
    for (int64_t j = 0; j < vp; ++j)
      y[d * vp + j] = (acc ? y[d * vp + j] : 0.0f) + sd * x[d * vp + j];
  }
}

// y[:n] = a[:n] - y[:n]
MYRIAD_CPU_CLONES void rsub(int64_t n, const float* __restrict a, float* __restrict y) {
  for (int64_t i = 0; i < n; ++i) y[i] = a[i] - y[i];
}

// Work buffers start on different cache lines modulo 4 KiB (scratch.h).
using Buf = Scratch<float>;

// One thread's buffers for one (batch, head) at a time.
struct Work {
  int64_t B, T, H, K, V, C, NC, Cp, Kp, Vp;
  float scale;
  // [Cp, Kp]
  Buf Q, Kc, G, Gl, Gam, Ed, Qg, Kg, Kd, ER, KR, ED, KD;
  // [Kp, Cp]
  Buf KT, GT, LT, KRT, KDT;
  // [16, Kp] each, or [pairs, 16, Kp] (per block pair (a, b <= a) of the chunk) when kept for
  // the backward's pair gradients (the forward keeps one slot: with all of them it ran 0.95x).
  // A block row uses either its diagonal block's factors alone (factorised: see column_factors)
  // or its other blocks' (a direct diagonal block), so one slot serves the forward.
  Buf EL, KL, QL;
  // Column factors c of the pairs (a, b < a) of such rows ([pairs, Kp], or [Kp] in the forward)
  // and the scaled right factors of one pair ([Kp, 16]).
  Buf Cab, RSc;
  // For the backward: keeps the left factors of every block pair, and writes the buffers only
  // the backward reads (Gam and Ed of every row, EL, ER, ED).
  bool backward;
  bool keep_u = false;  // the forward leaves U in R (for saved.u)
  // [Cp, Vp]
  Buf Vv, R, Vt, O;
  Buf Tb;  // [16, Vp]: the solve's block of products
  // [Cp, Cp]
  Buf M, P;
  Buf beta, S;      // [Cp], [Kp, Vp]
  int buffers = 0;  // Bufs made so far (the next one's slot)
  // bf16 inputs on an AMX CPU: the 64-deep products on the tile unit (see bmm), with an A
  // operand buffer, its f32 transpose scratch, and the pairs of S and Ṽ.
  bool lowp = false;
  int64_t Lk = 0, Ln = 0;  // pad32 of the largest inner size, the largest row count
  Scratch<uint16_t> LA, LS, LV;
  Buf LF;
  bool factor = false;       // every gate of the chunk is <= 0: factorised blocks
  std::vector<int64_t> mid;  // per block: the diagonal reference row, or -1 for a direct block

  Work(const KdaArgs& a, bool backward) : backward(backward) {
    const Shape& s = a.q.shape();
    B = s[0], T = s[1], H = s[2], K = s[3], V = a.v.size(3), C = a.chunk;
    NC = (T + C - 1) / C;
    Cp = pad16(std::min(C, std::max<int64_t>(T, 1))), Kp = pad16(K), Vp = pad16(V);
    scale = static_cast<float>(a.scale);
    for (Buf* b : {&Q, &Kc, &G, &Gl, &Gam, &Ed, &Qg, &Kg, &Kd, &ER, &KR, &ED, &KD})
      *b = Buf(Cp * Kp, buffers);
    for (Buf* b : {&KT, &GT, &LT, &KRT, &KDT}) *b = Buf(Kp * Cp, buffers);
    mid.assign(Cp / kBlk, -1);
    const int64_t nb = Cp / kBlk;
    for (Buf* b : {&EL, &KL, &QL})
      *b = Buf((backward ? nb * (nb + 1) / 2 : 1) * kBlk * Kp, buffers);
    Cab = Buf((backward ? nb * (nb + 1) / 2 : 1) * Kp, buffers);
    RSc = Buf(Kp * kBlk, buffers);
    for (Buf* b : {&Vv, &R, &Vt, &O}) *b = Buf(Cp * Vp, buffers);
    Tb = Buf(kBlk * Vp, buffers);
    for (Buf* b : {&M, &P}) *b = Buf(Cp * Cp, buffers);
    beta = Buf(Cp, buffers);
    S = Buf(Kp * Vp, buffers);
    lowp = a.q.dtype() == DType::BF16 && a.k.dtype() == DType::BF16 && a.v.dtype() == DType::BF16 &&
           amx_bf16() && avx512_bf16();  // (every AMX CPU so far has it)
    if (lowp) {
      Ln = std::max({Cp, Kp, Vp}), Lk = pad32(Ln);
      for (Scratch<uint16_t>* b : {&LA, &LS, &LV}) *b = Scratch<uint16_t>(Ln * Lk, buffers);
      LF = Buf(Ln * Ln, buffers);
    }
  }
  // bmm with this thread's A buffers.
  void lmm(int64_t m, int64_t n, int64_t kk, const float* a, int64_t sai, int64_t sap,
           const uint16_t* b, float* c, int64_t ldc, bool acc) {
    bmm(m, n, kk, a, sai, sap, b, 2 * n, c, ldc, acc, LA.data(), LF.data());
  }
  int64_t row_qk(int64_t b, int64_t t, int64_t h) const { return ((b * T + t) * H + h) * K; }
  int64_t row_v(int64_t b, int64_t t, int64_t h) const { return ((b * T + t) * H + h) * V; }
  int64_t state(int64_t b, int64_t h) const { return (b * H + h) * K * V; }
  int64_t saved(int64_t b, int64_t h, int64_t c) const { return ((b * H + h) * NC + c) * K * V; }

  void load_state(const Tensor& t, int64_t off) { load(t, off, V, K, V, 1.0f, S.data(), Vp); }
  void store_state(Tensor& t, int64_t off) const { store(S.data(), Vp, K, V, 1.0f, t, off, V); }

  // Block (r0, i0) as a product: the left factors of rows [r0, r1) (EL, KL, QL, [16, Kp]
  // each) and the right factors (ER, KR or ED, KD) and KR transposed, at row / column i0.
  struct Factors {
    const float *el, *kl, *ql, *er, *kr, *krt;
  };
  int64_t slot(int64_t r0, int64_t i0) const {
    if (!backward) return 0;
    const int64_t a = r0 / kBlk;
    return (a * (a + 1) / 2 + i0 / kBlk) * kBlk * Kp;
  }
  // The factors of block (r0, i0), its left ones as chunk() computed them.
  Factors factors(int64_t r0, int64_t i0) const {
    const int64_t at = slot(r0, i0);
    if (i0 == r0) return {&EL[at], &KL[at], &QL[at], &ED[i0 * Kp], &KD[i0 * Kp], &KDT[i0]};
    return {&EL[at], &KL[at], &QL[at], &ER[i0 * Kp], &KR[i0 * Kp], &KRT[i0]};
  }
  Factors left(int64_t r0, int64_t r1, int64_t i0) {
    const int64_t ref = (i0 == r0 ? mid[r0 / kBlk] : i0 + kBlk - 1) * Kp, at = slot(r0, i0);
    left_factors(r0, r1 - r0, Kp, Q.data(), Kc.data(), G.data(), Gl.data(), &G[ref], &Gl[ref],
                 backward ? &EL[at] : nullptr, &KL[at], &QL[at]);
    return factors(r0, i0);
  }
  // The column factors of pair (r0, i0 < r0) of a row whose diagonal block is factorised.
  float* cab(int64_t r0, int64_t i0) {
    if (!backward) return Cab.data();
    const int64_t a = r0 / kBlk;
    return &Cab[(a * (a + 1) / 2 + i0 / kBlk) * Kp];
  }
  // Whether block row r0's pairs derive from its diagonal block's factors (column_factors).
  bool shifts(int64_t r0) const { return factor && mid[r0 / kBlk] >= 0; }
  bool direct(int64_t r0, int64_t i0) const { return !factor || (i0 == r0 && mid[r0 / kBlk] < 0); }

  int64_t row_u(int64_t b, int64_t h, int64_t t) const { return ((b * H + h) * T + t) * V; }

  // Loads chunk [t0, t0 + cn) of (b, h) and computes everything up to Ṽ from the state S. With
  // keep_u (the forward, for a backward) U is left in R's rows; given the forward's U rows (u,
  // the backward), Ṽ = Diag(β) U from them, and R, the solve and v are skipped (R holds U).
  // A chunk of Cp rows rewrites every element these buffers use (the padding columns of the
  // loaded inputs are never written and stay zero, so the buffers derived from them get the same
  // padding every chunk); a shorter one must first clear the rows a full one left.
  void chunk(const KdaArgs& a, int64_t b, int64_t h, int64_t t0, int64_t cn,
             const Tensor* u = nullptr) {
    if (cn < Cp) {
      for (auto* v : {&Q, &Kc, &G, &Gl, &Gam, &Ed, &Qg, &Kg, &Kd, &ER, &KR, &ED, &KD, &KRT, &KDT,
                      &Vv, &M, &P})
        std::fill(v->begin(), v->end(), 0.0f);
      std::fill(beta.begin(), beta.end(), 0.0f);
    }
    load(a.q, row_qk(b, t0, h), H * K, cn, K, scale, Q.data(), Kp);
    load(a.k, row_qk(b, t0, h), H * K, cn, K, 1.0f, Kc.data(), Kp);
    if (u)
      load(*u, row_u(b, h, t0), V, cn, V, 1.0f, R.data(), Vp);
    else
      load(a.v, row_v(b, t0, h), H * V, cn, V, 1.0f, Vv.data(), Vp);
    for (int64_t r = 0; r < cn; ++r) beta[r] = a.beta.data<float>()[(b * T + t0 + r) * H + h];
    factor =
        load_gates(a.g.data<float>() + row_qk(b, t0, h), H * K, cn, K, Kp, G.data(), Gl.data());
    decays(cn, Kp, backward, Q.data(), Kc.data(), G.data(), Gl.data(), Gam.data(), Ed.data(),
           Qg.data(), Kg.data(), Kd.data());
    if (factor)
      for (int64_t i0 = 0; i0 < cn; i0 += kBlk) {
        const int64_t i1 = std::min(cn, i0 + kBlk), last = (i1 - 1) * Kp;
        right_factors(i0, i1, Kp, Kc.data(), G.data(), Gl.data(), &G[last], &Gl[last],
                      backward ? ER.data() : nullptr, KR.data());
        float span = 0.0f;
        for (int64_t d = 0; d < K; ++d) span = std::max(span, G[i0 * Kp + d] - G[last + d]);
        const int64_t m = (i0 + i1 - 1) / 2;
        mid[i0 / kBlk] = span <= 80.0f ? m : -1;
        if (span <= 80.0f)
          right_factors(i0, i1, Kp, Kc.data(), G.data(), Gl.data(), &G[m * Kp], &Gl[m * Kp],
                        backward ? ED.data() : nullptr, KD.data());
      }
    if (factor) {
      transpose(KR.data(), Cp, Kp, Kp, KRT.data(), Cp);
      transpose(KD.data(), Cp, Kp, Kp, KDT.data(), Cp);
    }
    // Direct blocks read K and G transposed (none do for a gate that keeps every diagonal block
    // within reach of its reference row, as the K3 gate does).
    const auto live_end = mid.begin() + (cn + kBlk - 1) / kBlk;
    if (!factor || std::find(mid.begin(), live_end, -1) != live_end) {
      transpose(Kc.data(), Cp, Kp, Kp, KT.data(), Cp);
      transpose(G.data(), Cp, Kp, Kp, GT.data(), Cp);
      transpose(Gl.data(), Cp, Kp, Kp, LT.data(), Cp);
    }
    for (int64_t r0 = 0; r0 < cn; r0 += kBlk) {
      const int64_t r1 = std::min(cn, r0 + kBlk);
      // With a factorised diagonal block, its left factors (taken first) serve the whole row.
      const bool shift = shifts(r0);
      if (shift) left(r0, r1, r0);
      for (int64_t i0 = 0; i0 <= r0; i0 += kBlk) {
        if (direct(r0, i0)) {
          pair_sums_direct(r0, r1, i0, K, Cp, Kp, Q.data(), Kc.data(), G.data(), Gl.data(),
                           KT.data(), GT.data(), LT.data(), M.data(), P.data());
          continue;
        }
        if (shift && i0 < r0) {
          const int64_t m = mid[r0 / kBlk] * Kp, ref = (i0 + kBlk - 1) * Kp;
          column_factors(Kp, K, Cp, &G[m], &Gl[m], &G[ref], &Gl[ref], &KRT[i0], cab(r0, i0),
                         RSc.data());
          const Factors d = factors(r0, r0);
          mm(kBlk, kBlk, K, d.kl, Kp, 1, RSc.data(), kBlk, &M[r0 * Cp + i0], Cp, false);
          mm(kBlk, kBlk, K, d.ql, Kp, 1, RSc.data(), kBlk, &P[r0 * Cp + i0], Cp, false);
          continue;
        }
        const Factors f = i0 == r0 ? factors(r0, i0) : left(r0, r1, i0);
        mm(kBlk, kBlk, K, f.kl, Kp, 1, f.krt, Cp, &M[r0 * Cp + i0], Cp, false);
        mm(kBlk, kBlk, K, f.ql, Kp, 1, f.krt, Cp, &P[r0 * Cp + i0], Cp, false);
        if (i0 == r0)  // clear the non-causal half of a diagonal block
          for (int64_t r = r0; r < r0 + kBlk; ++r)
            for (int64_t i = r; i < r0 + kBlk; ++i) {
              M[r * Cp + i] = 0.0f;
              if (i > r) P[r * Cp + i] = 0.0f;
            }
      }
    }
    if (cn < Cp) std::fill(Vt.begin(), Vt.end(), 0.0f);
    if (u) {  // (the same products as the solve's last step)
      scale_rows(cn, Vp, beta.data(), R.data(), Vt.data(), false);
      return;
    }
    // R = V - Kg S; Ṽ_r = β_r (R_r - sum_{i<r} M_ri Ṽ_i).
    if (lowp) {  // (the forward's O = Qg S reuses S's pairs)
      pack_b(S.data(), Vp, K, Vp, LS.data());
      lmm(Cp, Vp, K, Kg.data(), Kp, 1, LS.data(), R.data(), Vp, false);
    } else {
      mm(Cp, Vp, K, Kg.data(), Kp, 1, S.data(), Vp, R.data(), Vp, false);
    }
    rsub(Cp * Vp, Vv.data(), R.data());
    solve_lower(cn, Cp, Vp, M.data(), beta.data(), R.data(), Tb.data(), Vt.data(), keep_u);
  }
};

void check_dtypes(const char* op, const KdaArgs& a) {
  check_row_dtype(op, a.q.dtype());
  MYRIAD_CHECK(a.g.dtype() == DType::F32, op, ": the cpu kernel expects f32 gates, got ",
               a.g.desc());
}

// Runs f(begin, end) over the (batch, head) pairs. A pair's sequence of at least one chunk (tens
// of microseconds of work) pays a sleeping thread's wake-up, so such pairs split over the threads
// whatever the wait policy. (Through parallel_for, whose passive-wait grain is 16 items, any B H
// below 32 ran on one thread under OMP_WAIT_POLICY=passive, as scripts/main.sh sets: the training
// kernels at half their 2-thread speed.)
template <class F>
void over_heads(const KdaArgs& a, F&& f) {
  const int64_t n = a.q.size(0) * a.q.size(2);
  if (a.q.size(1) >= a.chunk)
    parallel_split(n, 1, std::forward<F>(f));
  else
    parallel_for(n, 1, std::forward<F>(f));
}

void kda_cpu(const KdaArgs& a, Tensor& o, Tensor& ht, KdaSaved& kept) {
  check_dtypes("kda", a);
  Tensor& saved = kept.states;
  if (saved.defined())
    kept.u = Tensor::empty({a.q.size(0), a.q.size(2), a.q.size(1), a.v.size(3)}, a.g.dtype());
  over_heads(a, [&](int64_t begin, int64_t end) {
    FlushSubnormals flush;  // decayed states and gates reach them (cpu.h)
    Work w(a, false);
    w.keep_u = kept.u.defined();
    std::optional<AmxTiles> tiles;
    if (w.lowp) tiles.emplace();
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / w.H, h = bh % w.H;
      std::fill(w.S.begin(), w.S.end(), 0.0f);
      if (a.h0.defined()) w.load_state(a.h0, w.state(b, h));
      for (int64_t c = 0; c < w.NC; ++c) {
        const int64_t t0 = c * w.C, cn = std::min(w.C, w.T - t0);
        if (saved.defined()) w.store_state(saved, w.saved(b, h, c));
        // The next chunk's output rows and saved state, while this one computes.
        if (c + 1 < w.NC) {
          const int64_t n1 = std::min(w.C, w.T - t0 - w.C);
          prefetch_rows(o, w.row_v(b, t0 + w.C, h), w.H * w.V, n1, w.V);
          if (saved.defined()) {
            prefetch_rows(saved, w.saved(b, h, c + 1), w.V, w.K, w.V);
            if (w.keep_u) prefetch_rows(kept.u, w.row_u(b, h, t0 + w.C), w.V, n1, w.V);
          }
        }
        w.chunk(a, b, h, t0, cn);
        if (w.keep_u) store(w.R.data(), w.Vp, cn, w.V, 1.0f, kept.u, w.row_u(b, h, t0), w.V);
        // O = Qg S + P Ṽ
        const int64_t Cp = w.Cp, Kp = w.Kp, Vp = w.Vp;
        if (w.lowp) {  // P and Ṽ whole: their rows >= cn are zero
          w.lmm(Cp, Vp, w.K, w.Qg.data(), Kp, 1, w.LS.data(), w.O.data(), Vp, false);
          pack_b(w.Vt.data(), Vp, Cp, Vp, w.LV.data());
          w.lmm(Cp, Vp, Cp, w.P.data(), Cp, 1, w.LV.data(), w.O.data(), Vp, true);
        } else {
          mm(Cp, Vp, w.K, w.Qg.data(), Kp, 1, w.S.data(), Vp, w.O.data(), Vp, false);
          for (int64_t r0 = 0; r0 < cn; r0 += kBlk)  // P is lower triangular: Ṽ rows < r0 + 16
            mm(kBlk, Vp, std::min(cn, r0 + kBlk), &w.P[r0 * Cp], Cp, 1, w.Vt.data(), Vp,
               &w.O[r0 * Vp], Vp, true);
        }
        store(w.O.data(), Vp, cn, w.V, 1.0f, o, w.row_v(b, t0, h), w.H * w.V);
        // S = Diag(Γ_C) S + Kd^T Ṽ
        const float* gl = &w.Gam[(cn - 1) * Kp];
        scale_rows(w.K, Vp, gl, w.S.data(), w.S.data(), false);
        if (w.lowp)
          w.lmm(Kp, Vp, Cp, w.Kd.data(), 1, Kp, w.LV.data(), w.S.data(), Vp, true);
        else
          mm(Kp, Vp, cn, w.Kd.data(), 1, Kp, w.Vt.data(), Vp, w.S.data(), Vp, true);
      }
      w.store_state(ht, w.state(b, h));
    }
#if defined(__x86_64__)
    _mm_sfence();  // streaming stores are weakly ordered: drain them before the region ends
#endif
  });
}

void kda_backward_cpu(const KdaArgs& a, const KdaSaved& kept, const Tensor& d_o, const Tensor& dht,
                      KdaGrads& gr) {
  check_dtypes("kda_backward", a);
  over_heads(a, [&](int64_t begin, int64_t end) {
    FlushSubnormals flush;  // decayed states and gates reach them (cpu.h)
    Work w(a, true);
    const int64_t Cp = w.Cp, Kp = w.Kp, Vp = w.Vp, K = w.K, V = w.V;
    int& n = w.buffers;
    Buf dO(Cp * Vp, n), dVt(Cp * Vp, n), X(Cp * Vp, n), nDR(Cp * Vp, n);
    // S^T, dS'^T and Ṽ^T for the f32 products (the tile products take them as pairs)
    const int64_t tsz = w.lowp ? 0 : 1;
    Buf ST(tsz * Vp * Kp, n), dST(tsz * Vp * Kp, n), VtT(tsz * Vp * Cp, n);
    Buf DOS(Cp * Kp, n), VDS(Cp * Kp, n), NRS(Cp * Kp, n), Ga(Cp * Kp, n), Gb(Cp * Kp, n),
        Gc(Cp * Kp, n), dG(Cp * Kp, n), dQ(Cp * Kp, n), dK(Cp * Kp, n), T1(kBlk * Kp, n),
        T2(kBlk * Kp, n), RS(Cp * Kp, n);
    Buf dP(Cp * Cp, n), XV(Cp * Cp, n), dM(Cp * Cp, n), dbeta(Cp, n);
    Buf dS(Kp * Vp, n), dSn(Kp * Vp, n);
    // The tile products' pairs of dO, S^T, dS'^T and Ṽ^T, and of dS' or nDR (each used right
    // after it is packed).
    const int64_t lsz = w.lowp ? w.Ln * w.Lk : 0;
    Scratch<uint16_t> Ldo(lsz, n), LST(lsz, n), LdST(lsz, n), LVtT(lsz, n), LB(lsz, n);
    std::optional<AmxTiles> tiles;
    if (w.lowp) tiles.emplace();
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / w.H, h = bh % w.H;
      std::fill(dS.begin(), dS.end(), 0.0f);
      load(dht, w.state(b, h), V, K, V, 1.0f, dS.data(), Vp);
      for (int64_t c = w.NC - 1; c >= 0; --c) {
        const int64_t t0 = c * w.C, cn = std::min(w.C, w.T - t0);
        std::fill(w.S.begin(), w.S.end(), 0.0f);
        w.load_state(kept.states, w.saved(b, h, c));
        if (c > 0) {  // the next chunk's gradient rows, while this one computes
          const int64_t p0 = t0 - w.C;
          prefetch_rows(gr.dq, w.row_qk(b, p0, h), w.H * K, w.C, K);
          prefetch_rows(gr.dk, w.row_qk(b, p0, h), w.H * K, w.C, K);
          prefetch_rows(gr.dg, w.row_qk(b, p0, h), w.H * K, w.C, K);
          prefetch_rows(gr.dv, w.row_v(b, p0, h), w.H * V, w.C, V);
        }
        w.chunk(a, b, h, t0, cn, kept.u.defined() ? &kept.u : nullptr);
        std::fill(dO.begin(), dO.end(), 0.0f);
        load(d_o, w.row_v(b, t0, h), w.H * V, cn, V, 1.0f, dO.data(), Vp);
        // dṼ = P^T dO + Kd dS'
        if (w.lowp) {  // P^T whole: dO's rows >= cn are zero
          pack_b(dO.data(), Vp, Cp, Vp, Ldo.data());
          w.lmm(Cp, Vp, Cp, w.P.data(), 1, Cp, Ldo.data(), dVt.data(), Vp, false);
          pack_b(dS.data(), Vp, K, Vp, LB.data());
          w.lmm(Cp, Vp, K, w.Kd.data(), Kp, 1, LB.data(), dVt.data(), Vp, true);
        } else {
          for (int64_t i0 = 0; i0 < Cp; i0 += kBlk)  // P^T is upper triangular: dO rows >= i0
            mm(kBlk, Vp, std::max<int64_t>(0, cn - i0), &w.P[i0 * Cp + i0], 1, Cp, &dO[i0 * Vp], Vp,
               &dVt[i0 * Vp], Vp, false);
          mm(Cp, Vp, K, w.Kd.data(), Kp, 1, dS.data(), Vp, dVt.data(), Vp, true);
        }
        // (I + L)^T X = dṼ with L_ir = β_i M_ir; nDR = -β X.
        solve_upper_t(cn, Cp, Vp, w.M.data(), w.beta.data(), dVt.data(), X.data(), nDR.data());
        // X's rows >= cn only reach XV rows nothing reads; nDR's enter products over Cp rows.
        std::fill(nDR.begin() + cn * Vp, nDR.end(), 0.0f);
        // DOS = dO S^T, VDS = Ṽ dS'^T, NRS = -dR S^T.
        if (w.lowp) {  // S^T, dS'^T and Ṽ^T as pairs
          pack_bt(w.S.data(), Vp, V, Kp, LST.data(), w.LF.data());
          pack_bt(dS.data(), Vp, V, Kp, LdST.data(), w.LF.data());
          pack_bt(w.Vt.data(), Vp, V, Cp, LVtT.data(), w.LF.data());
          w.lmm(Cp, Kp, V, dO.data(), Vp, 1, LST.data(), DOS.data(), Kp, false);
          w.lmm(Cp, Kp, V, w.Vt.data(), Vp, 1, LdST.data(), VDS.data(), Kp, false);
          w.lmm(Cp, Kp, V, nDR.data(), Vp, 1, LST.data(), NRS.data(), Kp, false);
        } else {
          transpose(w.S.data(), Kp, Vp, Vp, ST.data(), Kp);
          transpose(dS.data(), Kp, Vp, Vp, dST.data(), Kp);
          transpose(w.Vt.data(), Cp, Vp, Vp, VtT.data(), Cp);
          mm(Cp, Kp, V, dO.data(), Vp, 1, ST.data(), Kp, DOS.data(), Kp, false);
          mm(Cp, Kp, V, w.Vt.data(), Vp, 1, dST.data(), Kp, VDS.data(), Kp, false);
          mm(Cp, Kp, V, nDR.data(), Vp, 1, ST.data(), Kp, NRS.data(), Kp, false);
        }
        // dP = dO Ṽ^T; dL = -X Ṽ^T; dM = β dL; dβ.
        // Both are read below their diagonal only, so each row block stops at its diagonal block
        // (with the forward P Ṽ and the backward P^T dO, about a tenth of the chunk products'
        // FLOPs).
        if (w.lowp) {
          w.lmm(Cp, Cp, V, dO.data(), Vp, 1, LVtT.data(), dP.data(), Cp, false);
          w.lmm(Cp, Cp, V, X.data(), Vp, 1, LVtT.data(), XV.data(), Cp, false);
        } else {
          for (int64_t r0 = 0; r0 < Cp; r0 += kBlk) {
            mm(kBlk, r0 + kBlk, V, &dO[r0 * Vp], Vp, 1, VtT.data(), Cp, &dP[r0 * Cp], Cp, false);
            mm(kBlk, r0 + kBlk, V, &X[r0 * Vp], Vp, 1, VtT.data(), Cp, &XV[r0 * Cp], Cp, false);
          }
        }
        for (int64_t r = 0; r < Cp; ++r)
          for (int64_t i = r + 1; i < Cp; ++i) dP[r * Cp + i] = 0.0f;
        beta_grads(cn, Cp, Vp, w.beta.data(), X.data(), w.R.data(), kept.u.defined(), w.M.data(),
                   XV.data(), dM.data(), dbeta.data());
        std::fill(Ga.begin(), Ga.end(), 0.0f);
        std::fill(Gb.begin(), Gb.end(), 0.0f);
        std::fill(Gc.begin(), Gc.end(), 0.0f);
        for (int64_t r0 = 0; r0 < cn; r0 += kBlk) {
          const int64_t r1 = std::min(cn, r0 + kBlk);
          if (w.shifts(r0)) {  // every pair of the row through the diagonal block's factors
            // a_r += EL_r (dM [KR_b c_ab; KD])_r, b_r likewise with dP: one product over the row
            const Work::Factors d = w.factors(r0, r0);
            for (int64_t i0 = 0; i0 < r0; i0 += kBlk)
              scale_cols(kBlk, Kp, &w.KR[i0 * Kp], w.cab(r0, i0), &RS[i0 * Kp]);
            for (auto [dX, Gx] :
                 {std::pair{dM.data(), Ga.data()}, std::pair{dP.data(), Gb.data()}}) {
              if (r0 > 0)
                mm(kBlk, Kp, r0, &dX[r0 * Cp], Cp, 1, RS.data(), Kp, T1.data(), Kp, false);
              mm(kBlk, Kp, kBlk, &dX[r0 * Cp + r0], Cp, 1, d.kr, Kp, T1.data(), Kp, r0 > 0);
              for (int64_t r = 0; r < r1 - r0; ++r)
                fma_rows(&Gx[(r0 + r) * Kp], d.el + r * Kp, &T1[r * Kp], Kp);
            }
            // c_i += ER_i c_ab (dM^T KL_diag + dP^T QL_diag)_i (c = 1 and ED on the diagonal)
            for (int64_t i0 = 0; i0 <= r0; i0 += kBlk) {
              mm(kBlk, Kp, kBlk, &dM[r0 * Cp + i0], 1, Cp, d.kl, Kp, T2.data(), Kp, false);
              mm(kBlk, Kp, kBlk, &dP[r0 * Cp + i0], 1, Cp, d.ql, Kp, T2.data(), Kp, true);
              if (i0 == r0) {
                for (int64_t i = 0; i < kBlk; ++i)
                  fma_rows(&Gc[(i0 + i) * Kp], d.er + i * Kp, &T2[i * Kp], Kp);
              } else {
                const float* c = w.cab(r0, i0);
                for (int64_t i = 0; i < kBlk; ++i)
                  fma3_rows(&Gc[(i0 + i) * Kp], &w.ER[(i0 + i) * Kp], c, &T2[i * Kp], Kp);
              }
            }
            continue;
          }
          for (int64_t i0 = 0; i0 <= r0; i0 += kBlk) {
            if (w.direct(r0, i0)) {
              pair_grads_direct(r0, r1, i0, i0 + kBlk, Kp, Cp, w.Q.data(), w.Kc.data(), w.G.data(),
                                w.Gl.data(), dM.data(), dP.data(), Ga.data(), Gb.data(), Gc.data());
              continue;
            }
            // a_r += EL_r (dM KR)_r, b_r += EL_r (dP KR)_r, c_i += ER_i (dM^T KL + dP^T QL)_i
            const Work::Factors rf = w.factors(r0, i0);
            const float* dMb = &dM[r0 * Cp + i0];
            const float* dPb = &dP[r0 * Cp + i0];
            mm(kBlk, Kp, kBlk, dMb, Cp, 1, rf.kr, Kp, T1.data(), Kp, false);
            for (int64_t r = 0; r < r1 - r0; ++r)
              fma_rows(&Ga[(r0 + r) * Kp], rf.el + r * Kp, &T1[r * Kp], Kp);
            mm(kBlk, Kp, kBlk, dPb, Cp, 1, rf.kr, Kp, T1.data(), Kp, false);
            for (int64_t r = 0; r < r1 - r0; ++r)
              fma_rows(&Gb[(r0 + r) * Kp], rf.el + r * Kp, &T1[r * Kp], Kp);
            mm(kBlk, Kp, kBlk, dMb, 1, Cp, rf.kl, Kp, T2.data(), Kp, false);
            mm(kBlk, Kp, kBlk, dPb, 1, Cp, rf.ql, Kp, T2.data(), Kp, true);
            for (int64_t i = 0; i < kBlk; ++i)
              fma_rows(&Gc[(i0 + i) * Kp], rf.er + i * Kp, &T2[i * Kp], Kp);
          }
        }
        // dQ, dK, dV, dβ, dg.
        const RowGrads rg{w.Q.data(),  w.Kc.data(), w.Gam.data(), w.Ed.data(), w.Qg.data(),
                          w.Kg.data(), w.Kd.data(), DOS.data(),   VDS.data(),  NRS.data(),
                          Ga.data(),   Gb.data(),   Gc.data()};
        row_grads(cn * Kp, rg, dQ.data(), dK.data(), dG.data());
        const float* gl = &w.Gam[(cn - 1) * Kp];
        finish_dg(cn, K, Kp, Vp, w.Kd.data(), VDS.data(), gl, w.S.data(), dS.data(), dG.data());
        const int64_t qk = w.row_qk(b, t0, h), vv = w.row_v(b, t0, h);
        store(dQ.data(), Kp, cn, K, w.scale, gr.dq, qk, w.H * K);
        store(dK.data(), Kp, cn, K, 1.0f, gr.dk, qk, w.H * K);
        store(dG.data(), Kp, cn, K, 1.0f, gr.dg, qk, w.H * K);
        store(nDR.data(), Vp, cn, V, -1.0f, gr.dv, vv, w.H * V);
        for (int64_t r = 0; r < cn; ++r)
          gr.dbeta.data<float>()[(b * w.T + t0 + r) * w.H + h] = dbeta[r];
        // dS = Qg^T dO + Γ_C dS' - Kg^T dR
        if (w.lowp) {  // over Cp rows: Qg's, Kg's, dO's and nDR's rows >= cn are zero
          w.lmm(Kp, Vp, Cp, w.Qg.data(), 1, Kp, Ldo.data(), dSn.data(), Vp, false);
          pack_b(nDR.data(), Vp, Cp, Vp, LB.data());
          w.lmm(Kp, Vp, Cp, w.Kg.data(), 1, Kp, LB.data(), dSn.data(), Vp, true);
        } else {
          mm(Kp, Vp, cn, w.Qg.data(), 1, Kp, dO.data(), Vp, dSn.data(), Vp, false);
          mm(Kp, Vp, cn, w.Kg.data(), 1, Kp, nDR.data(), Vp, dSn.data(), Vp, true);
        }
        scale_rows(K, Vp, gl, dS.data(), dSn.data(), true);
        std::swap(dS, dSn);
      }
      store(dS.data(), Vp, K, V, 1.0f, gr.dh0, w.state(b, h), V);
    }
#if defined(__x86_64__)
    _mm_sfence();  // streaming stores are weakly ordered: drain them before the region ends
#endif
  });
}

// The direct recurrent update for one token.
MYRIAD_CPU_CLONES void step_head(const float* q, const float* k, const float* v, const float* g,
                                 float beta, float* S, float* e, float* o, int64_t K, int64_t V) {
  for (int64_t j = 0; j < V; ++j) e[j] = v[j];
  for (int64_t d = 0; d < K; ++d) {
    const float alpha = fast_exp(g[d]);
    float* s = S + d * V;
    for (int64_t j = 0; j < V; ++j) {
      s[j] *= alpha;
      e[j] -= k[d] * s[j];
    }
  }
  for (int64_t j = 0; j < V; ++j) o[j] = 0.0f;
  for (int64_t d = 0; d < K; ++d) {
    float* s = S + d * V;
    const float bk = beta * k[d];
    for (int64_t j = 0; j < V; ++j) {
      s[j] += bk * e[j];
      o[j] += q[d] * s[j];
    }
  }
}

void kda_step_cpu(const KdaArgs& a, Tensor& o, Tensor& new_state) {
  check_dtypes("kda_step", a);
  const int64_t B = a.q.size(0), H = a.q.size(2), K = a.q.size(3), V = a.v.size(3);
  parallel_for(B * H, 1, [&](int64_t begin, int64_t end) {
    FlushSubnormals flush;  // decayed states and gates reach them (cpu.h)
    std::vector<float> q(K), k(K), v(V), e(V), S(K * V);
    for (int64_t bh = begin; bh < end; ++bh) {
      load(a.q, bh * K, K, 1, K, static_cast<float>(a.scale), q.data(), K);
      load(a.k, bh * K, K, 1, K, 1.0f, k.data(), K);
      load(a.v, bh * V, V, 1, V, 1.0f, v.data(), V);
      if (a.h0.defined())
        load(a.h0, bh * K * V, V, K, V, 1.0f, S.data(), V);
      else
        std::fill(S.begin(), S.end(), 0.0f);
      step_head(q.data(), k.data(), v.data(), a.g.data<float>() + bh * K, a.beta.data<float>()[bh],
                S.data(), e.data(), o.data<float>() + bh * V, K, V);
      std::copy(S.begin(), S.end(), new_state.data<float>() + bh * K * V);
    }
  });
}

// ---- the gates (ops::KdaGateKind): rows of x = z + bias, f32 math, every loop over a row's
// P columns with the per-head factor a expanded per column ----
using ops::KdaGateArgs;
using ops::KdaGateKind;

// The per-column factor a[p / (P / H)], the bias (zeros when undefined), and a row of z as f32.
struct GateCols {
  std::vector<float> a, bias;
  explicit GateCols(const KdaGateArgs& args) {
    check_row_dtype("kda_gate", args.z.dtype());
    MYRIAD_CHECK(
        args.a.dtype() == DType::F32 && (!args.bias.defined() || args.bias.dtype() == DType::F32),
        "kda_gate: the cpu kernel expects an f32 factor and bias");
    const int64_t P = args.z.size(1), H = args.a.numel();
    a.resize(P), bias.assign(P, 0.0f);
    for (int64_t p = 0; p < P; ++p) a[p] = args.a.data<float>()[p / (P / H)];
    if (args.bias.defined()) std::copy_n(args.bias.data<float>(), P, bias.begin());
  }
};
const float* z_row(const Tensor& z, int64_t r, float* buf) {
  const int64_t P = z.size(1);
  if (z.dtype() == DType::F32) return z.data<float>() + r * P;
  bf16_row_to_f32(z.data<uint16_t>() + r * P, buf, P);
  return buf;
}

MYRIAD_CPU_CLONES void gate_row(bool softplus, float g_min, int64_t P, const float* __restrict z,
                                const float* __restrict bias, const float* __restrict a,
                                float* __restrict g) {
  if (softplus)
    for (int64_t p = 0; p < P; ++p) g[p] = -(a[p] * fast_softplus(z[p] + bias[p]));
  else
    for (int64_t p = 0; p < P; ++p) g[p] = g_min / (1.0f + fast_exp(-(a[p] * (z[p] + bias[p]))));
}

// dx = dg * dg/dx into dx; db += dx; dac += dg * dg/da (per column).
MYRIAD_CPU_CLONES void gate_backward_row(bool softplus, float g_min, int64_t P,
                                         const float* __restrict z, const float* __restrict bias,
                                         const float* __restrict a, const float* __restrict dg,
                                         float* __restrict dx, float* __restrict db,
                                         float* __restrict dac) {
  if (softplus)
    for (int64_t p = 0; p < P; ++p) {
      const float x = z[p] + bias[p], s = x > 20.0f ? 1.0f : 1.0f / (1.0f + fast_exp(-x));
      dx[p] = -dg[p] * a[p] * s;
      db[p] += dx[p];
      dac[p] -= dg[p] * fast_softplus(x);
    }
  else
    for (int64_t p = 0; p < P; ++p) {
      const float x = z[p] + bias[p], s = 1.0f / (1.0f + fast_exp(-(a[p] * x)));
      const float t = g_min * s * (1.0f - s) * dg[p];
      dx[p] = a[p] * t;
      db[p] += dx[p];
      dac[p] += x * t;
    }
}

void kda_gate_cpu(const KdaGateArgs& args, Tensor& g) {
  const GateCols cols(args);
  const int64_t rows = args.z.size(0), P = args.z.size(1);
  const bool softplus = args.kind == KdaGateKind::Softplus;
  const auto g_min = static_cast<float>(args.g_min);
  parallel_for(rows, std::max<int64_t>(1, 4096 / std::max<int64_t>(P, 1)),
               [&](int64_t r0, int64_t r1) {
                 std::vector<float> buf(P);
                 for (int64_t r = r0; r < r1; ++r)
                   gate_row(softplus, g_min, P, z_row(args.z, r, buf.data()), cols.bias.data(),
                            cols.a.data(), g.data<float>() + r * P);
               });
}

// The sums over rows (dbias, da) run per block of kGateBlock rows, then block by block in order:
// the same bits whatever the number of threads.
constexpr int64_t kGateBlock = 32;

void kda_gate_backward_cpu(const KdaGateArgs& args, const Tensor& dg, Tensor& dz, Tensor& dbias,
                           Tensor& da) {
  const GateCols cols(args);
  const int64_t rows = args.z.size(0), P = args.z.size(1), H = args.a.numel();
  const int64_t blocks = (rows + kGateBlock - 1) / kGateBlock;
  const bool softplus = args.kind == KdaGateKind::Softplus;
  const auto g_min = static_cast<float>(args.g_min);
  std::vector<float> db(blocks * P, 0.0f), dac(blocks * P, 0.0f);
  parallel_for(blocks, std::max<int64_t>(1, 16384 / std::max<int64_t>(P * kGateBlock, 1)),
               [&](int64_t b0, int64_t b1) {
                 std::vector<float> zb(P), dxb(P);
                 const bool f32 = dz.dtype() == DType::F32;
                 for (int64_t b = b0; b < b1; ++b)
                   for (int64_t r = b * kGateBlock; r < std::min(rows, (b + 1) * kGateBlock); ++r) {
                     float* dx = f32 ? dz.data<float>() + r * P : dxb.data();
                     gate_backward_row(softplus, g_min, P, z_row(args.z, r, zb.data()),
                                       cols.bias.data(), cols.a.data(), dg.data<float>() + r * P,
                                       dx, &db[b * P], &dac[b * P]);
                     if (!f32) f32_row_to_bf16(dx, dz.data<uint16_t>() + r * P, P);
                   }
               });
  std::vector<double> dbs(P, 0.0), das(H, 0.0);
  for (int64_t b = 0; b < blocks; ++b)
    for (int64_t p = 0; p < P; ++p) {
      dbs[p] += db[b * P + p];
      das[p / (P / H)] += dac[b * P + p];
    }
  if (dbias.defined())
    for (int64_t p = 0; p < P; ++p) dbias.data<float>()[p] = static_cast<float>(dbs[p]);
  for (int64_t h = 0; h < H; ++h) da.data<float>()[h] = static_cast<float>(das[h]);
}

}  // namespace

MYRIAD_REGISTER_KERNEL(ops::kda_gate_kernels, ops::Backend::CPU, &kda_gate_cpu);
MYRIAD_REGISTER_KERNEL(ops::kda_gate_backward_kernels, ops::Backend::CPU, &kda_gate_backward_cpu);
MYRIAD_REGISTER_KERNEL(ops::kda_kernels, ops::Backend::CPU, &kda_cpu);
MYRIAD_REGISTER_KERNEL(ops::kda_backward_kernels, ops::Backend::CPU, &kda_backward_cpu);
MYRIAD_REGISTER_KERNEL(ops::kda_step_kernels, ops::Backend::CPU, &kda_step_cpu);

}  // namespace myriad::cpu
