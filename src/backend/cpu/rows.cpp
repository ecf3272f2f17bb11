#include "backend/cpu/rows.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace myriad::cpu {

MYRIAD_CPU_CLONES void bf16_row_to_f32(const uint16_t* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = bf16_load(src[i]);
}

namespace {
// core/dtype.h's f32_to_bf16 (round to nearest even, NaN kept NaN) written branch-free, so each
// clone vectorises it.
MYRIAD_CPU_CLONES void f32_row_to_bf16_plain(const float* src, uint16_t* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t u = std::bit_cast<uint32_t>(src[i]);
    const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16, nan = (u >> 16) | 0x40u;
    dst[i] = static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
  }
}

#if defined(__x86_64__)
// The same rounding as one AVX512-BF16 instruction per 32 values (VCVTNE2PS2BF16: round to
// nearest even, a NaN kept NaN with its quiet bit set, as above), against about 25 instructions
// of the integer form. The instruction reads subnormal inputs as zero, where f32_to_bf16 rounds
// them to bf16 subnormals, so a block of 32 with a subnormal takes the integer form.
__attribute__((target("avx512f,avx512bw,avx512bf16"))) void f32_row_to_bf16_avx512bf16(
    const float* src, uint16_t* dst, int64_t n) {
  const __m512i magnitude = _mm512_set1_epi32(0x7fffffff), one = _mm512_set1_epi32(1),
                below_normal = _mm512_set1_epi32(0x007fffff);
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m512 lo = _mm512_loadu_ps(src + i), hi = _mm512_loadu_ps(src + i + 16);
    // Lanes with 0 < |x| < 2^-126: |x|'s bits minus 1 below 0x007fffff, unsigned.
    const __m512i mlo = _mm512_and_si512(_mm512_castps_si512(lo), magnitude),
                  mhi = _mm512_and_si512(_mm512_castps_si512(hi), magnitude);
    if (_mm512_cmplt_epu32_mask(_mm512_sub_epi32(mlo, one), below_normal) |
        _mm512_cmplt_epu32_mask(_mm512_sub_epi32(mhi, one), below_normal)) {
      f32_row_to_bf16_plain(src + i, dst + i, 32);
      continue;
    }
    _mm512_storeu_si512(dst + i, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi, lo)));
  }
  if (i < n) f32_row_to_bf16_plain(src + i, dst + i, n - i);
}

#endif
}  // namespace

bool avx512_bf16() {
#if defined(__x86_64__)
  static const bool has = __builtin_cpu_supports("avx512bf16");
  return has;
#else
  return false;
#endif
}

void f32_row_to_bf16(const float* src, uint16_t* dst, int64_t n) {
#if defined(__x86_64__)
  if (avx512_bf16()) return f32_row_to_bf16_avx512bf16(src, dst, n);
#endif
  f32_row_to_bf16_plain(src, dst, n);
}

namespace {
template <int W, int B>
MYRIAD_ROW_INLINE void swap_blocks(typename Lanes<W>::F* r) {
  if constexpr (B >= 1) {
    typename Lanes<W>::U lo, hi;  // constants once unrolled
    for (int j = 0; j < W; ++j) {
      lo[j] = (j & B) == 0 ? j : W + j - B;
      hi[j] = (j & B) == 0 ? j + B : W + j;
    }
    for (int i = 0; i < W; ++i)
      if ((i & B) == 0) {
        const auto a = r[i], b = r[i + B];
        r[i] = __builtin_shuffle(a, b, lo);
        r[i + B] = __builtin_shuffle(a, b, hi);
      }
    swap_blocks<W, B / 2>(r);
  }
}
template <int W>
MYRIAD_CPU_CLONES void transpose_w(const float* __restrict src, int64_t rows, int64_t cols,
                                   int64_t lds, float* __restrict dst, int64_t ldd) {
  using V = typename Lanes<W>::F;
  for (int64_t i0 = 0; i0 < rows; i0 += W)
    for (int64_t j0 = 0; j0 < cols; j0 += W) {
      V r[W];
      for (int i = 0; i < W; ++i) std::memcpy(&r[i], src + (i0 + i) * lds + j0, sizeof(V));
      swap_blocks<W, W / 2>(r);
      for (int j = 0; j < W; ++j) std::memcpy(dst + (j0 + j) * ldd + i0, &r[j], sizeof(V));
    }
}
}  // namespace
void transpose(const float* src, int64_t rows, int64_t cols, int64_t lds, float* dst, int64_t ldd) {
  with_lanes([&](auto w) { transpose_w<decltype(w)::value>(src, rows, cols, lds, dst, ldd); });
}

}  // namespace myriad::cpu
