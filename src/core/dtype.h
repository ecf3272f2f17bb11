// Element types. f64 is the reference dtype: every op accepts it through its plain reference
// implementation, which is what the finite-difference gradient checks run on.
#pragma once
#include <cstdint>
#include <cstring>
#include <string_view>

namespace myriad {

enum class DType : uint8_t { F32, F64, BF16, F16, I32, I64, U8 };

constexpr size_t dtype_size(DType t) {
  switch (t) {
    case DType::F64:
    case DType::I64:
      return 8;
    case DType::F32:
    case DType::I32:
      return 4;
    case DType::BF16:
    case DType::F16:
      return 2;
    case DType::U8:
      return 1;
  }
  return 0;
}
constexpr bool is_floating(DType t) {
  return t == DType::F32 || t == DType::F64 || t == DType::BF16 || t == DType::F16;
}
std::string_view dtype_name(DType t);
DType dtype_from_name(std::string_view name);  // "f32", "bf16", ... ; throws on unknown names

// bf16: the top 16 bits of an f32, rounded to nearest even (NaN stays NaN).
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
inline float bf16_to_f32(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
// IEEE half precision, round to nearest even, with subnormals.
uint16_t f32_to_f16(float f);
float f16_to_f32(uint16_t h);

// Reads element i of a buffer of dtype t as a double / writes a double into it (reference paths).
double load_as_double(const void* p, DType t, int64_t i);
void store_from_double(void* p, DType t, int64_t i, double v);

}  // namespace myriad
