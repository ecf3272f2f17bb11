#include "backend/cpu/rows.h"

namespace myriad::cpu {

MYRIAD_CPU_CLONES void bf16_row_to_f32(const uint16_t* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = bf16_load(src[i]);
}
// core/dtype.h's f32_to_bf16 (round to nearest even, NaN kept NaN) written branch-free, so each
// clone vectorises it.
MYRIAD_CPU_CLONES void f32_row_to_bf16(const float* src, uint16_t* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t u = std::bit_cast<uint32_t>(src[i]);
    const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16, nan = (u >> 16) | 0x40u;
    dst[i] = static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
  }
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
