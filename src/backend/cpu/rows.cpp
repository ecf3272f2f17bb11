#include "backend/cpu/rows.h"

namespace myriad::cpu {

MYRIAD_CPU_CLONES void bf16_row_to_f32(const uint16_t* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = bf16_load(src[i]);
}
MYRIAD_CPU_CLONES void f32_row_to_bf16(const float* src, uint16_t* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = bf16_store(src[i]);
}

}  // namespace myriad::cpu
