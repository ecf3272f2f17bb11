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

}  // namespace myriad::cpu
