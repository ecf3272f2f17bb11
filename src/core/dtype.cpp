#include "core/dtype.h"

#include <bit>
#include <cmath>

#include "core/error.h"

namespace myriad {

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::F32:
      return "f32";
    case DType::F64:
      return "f64";
    case DType::BF16:
      return "bf16";
    case DType::F16:
      return "f16";
    case DType::I32:
      return "i32";
    case DType::I64:
      return "i64";
    case DType::U8:
      return "u8";
  }
  return "?";
}

DType dtype_from_name(std::string_view n) {
  for (DType t :
       {DType::F32, DType::F64, DType::BF16, DType::F16, DType::I32, DType::I64, DType::U8})
    if (dtype_name(t) == n) return t;
  throw Error(cat("unknown dtype '", n, "' (expected f32, f64, bf16, f16, i32, i64 or u8)"));
}

uint16_t f32_to_f16(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t mag = x & 0x7fffffffu;
  if (mag >= 0x7f800000u)
    return static_cast<uint16_t>(sign | 0x7c00u | (mag > 0x7f800000u ? 0x200u : 0));
  if (mag >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow to inf
  if (mag < 0x38800000u) {                                               // subnormal or zero
    float a = std::bit_cast<float>(mag);
    // Scale so that the subnormal grid (2^-24) becomes integers, then round to nearest even.
    float r = std::nearbyint(a * 16777216.0f);
    return static_cast<uint16_t>(sign | static_cast<uint32_t>(r));
  }
  uint32_t e = ((mag >> 23) - 112) << 10;
  uint32_t m = mag & 0x7fffffu;
  uint32_t h = e | (m >> 13);
  uint32_t rem = m & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
  return static_cast<uint16_t>(sign | h);
}

float f16_to_f32(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t e = (h >> 10) & 0x1fu;
  uint32_t m = h & 0x3ffu;
  if (e == 0) {
    float v = static_cast<float>(m) * (1.0f / 16777216.0f);
    return sign ? -v : v;
  }
  if (e == 31) return std::bit_cast<float>(sign | 0x7f800000u | (m << 13));
  return std::bit_cast<float>(sign | ((e + 112) << 23) | (m << 13));
}

double load_as_double(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::F32:
      return static_cast<const float*>(p)[i];
    case DType::F64:
      return static_cast<const double*>(p)[i];
    case DType::BF16:
      return bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
    case DType::F16:
      return f16_to_f32(static_cast<const uint16_t*>(p)[i]);
    case DType::I32:
      return static_cast<const int32_t*>(p)[i];
    case DType::I64:
      return static_cast<double>(static_cast<const int64_t*>(p)[i]);
    case DType::U8:
      return static_cast<const uint8_t*>(p)[i];
  }
  return 0;
}

void store_from_double(void* p, DType t, int64_t i, double v) {
  switch (t) {
    case DType::F32:
      static_cast<float*>(p)[i] = static_cast<float>(v);
      return;
    case DType::F64:
      static_cast<double*>(p)[i] = v;
      return;
    case DType::BF16:
      static_cast<uint16_t*>(p)[i] = f32_to_bf16(static_cast<float>(v));
      return;
    case DType::F16:
      static_cast<uint16_t*>(p)[i] = f32_to_f16(static_cast<float>(v));
      return;
    case DType::I32:
      static_cast<int32_t*>(p)[i] = static_cast<int32_t>(v);
      return;
    case DType::I64:
      static_cast<int64_t*>(p)[i] = static_cast<int64_t>(v);
      return;
    case DType::U8:
      static_cast<uint8_t*>(p)[i] = static_cast<uint8_t>(v);
      return;
  }
}

}  // namespace myriad
