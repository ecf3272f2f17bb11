// Row helpers shared by the CPU row kernels (softmax, RMSNorm, cross-entropy): f32 views of f32
// or bf16 rows, and reductions with 16 independent partial results. The reductions are
// always-inline so each MYRIAD_CPU_CLONES caller vectorises them for its own target.
#pragma once
#include <algorithm>
#include <cstdint>

#include "backend/cpu/cpu.h"
#include "core/tensor.h"

namespace myriad::cpu {

#define MYRIAD_ROW_INLINE [[gnu::always_inline]] inline

MYRIAD_ROW_INLINE float row_max(const float* x, int64_t n) {
  float acc[16];
  for (int j = 0; j < 16; ++j) acc[j] = -__builtin_inff();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int j = 0; j < 16; ++j) acc[j] = x[i + j] > acc[j] ? x[i + j] : acc[j];
  float m = -__builtin_inff();
  for (; i < n; ++i) m = x[i] > m ? x[i] : m;
  for (int j = 0; j < 16; ++j) m = acc[j] > m ? acc[j] : m;
  return m;
}
MYRIAD_ROW_INLINE float row_sum(const float* x, int64_t n) {
  float acc[16] = {};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int j = 0; j < 16; ++j) acc[j] += x[i + j];
  float s = 0;
  for (; i < n; ++i) s += x[i];
  for (int j = 0; j < 16; ++j) s += acc[j];
  return s;
}
MYRIAD_ROW_INLINE float row_dot(const float* a, const float* b, int64_t n) {
  float acc[16] = {};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int j = 0; j < 16; ++j) acc[j] += a[i + j] * b[i + j];
  float s = 0;
  for (; i < n; ++i) s += a[i] * b[i];
  for (int j = 0; j < 16; ++j) s += acc[j];
  return s;
}
// sum(exp(x - m)).
MYRIAD_ROW_INLINE float row_sum_exp(const float* x, float m, int64_t n) {
  float acc[16] = {};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int j = 0; j < 16; ++j) acc[j] += fast_exp(x[i + j] - m);
  float s = 0;
  for (; i < n; ++i) s += fast_exp(x[i] - m);
  for (int j = 0; j < 16; ++j) s += acc[j];
  return s;
}

// Whether the CPU has AVX512-BF16 (its f32 -> bf16 conversion instruction; asked once).
bool avx512_bf16();

// bf16 <-> f32 rows (vectorised clones, in rows.cpp).
void bf16_row_to_f32(const uint16_t* src, float* dst, int64_t n);
void f32_row_to_bf16(const float* src, uint16_t* dst, int64_t n);

// dst[j, i] = src[i, j] for a rows x cols source (leading dimensions given), rows and cols
// multiples of 16, by W x W blocks held in registers: log2(W) rounds of two-vector shuffles swap
// the off-diagonal halves of ever smaller sub-blocks. (Element by element, KDA's transposes were
// 40% of the backward's own loops.)
void transpose(const float* src, int64_t rows, int64_t cols, int64_t lds, float* dst, int64_t ldd);

inline void check_row_dtype(const char* op, DType t) {
  MYRIAD_CHECK(t == DType::F32 || t == DType::BF16, op,
               ": the cpu kernel supports f32 and bf16, not ", dtype_name(t));
}
// Rows per parallel chunk: about 64K elements of work each.
inline int64_t row_grain(int64_t n) {
  return std::max<int64_t>(1, (int64_t{1} << 16) / std::max<int64_t>(n, 1));
}

// Row r (of length n) of a contiguous f32 or bf16 tensor, seen as f32.
struct RowIO {
  explicit RowIO(const Tensor& t)
      : f32(t.dtype() == DType::F32), p(static_cast<char*>(t.data_ptr())) {}
  bool f32;
  char* p;
  float* row_f32(int64_t r, int64_t n) const { return reinterpret_cast<float*>(p) + r * n; }
  uint16_t* row_bf16(int64_t r, int64_t n) const { return reinterpret_cast<uint16_t*>(p) + r * n; }
  // The row as f32: in place for f32, converted into buf for bf16.
  const float* load(int64_t r, int64_t n, float* buf) const {
    if (f32) return row_f32(r, n);
    bf16_row_to_f32(row_bf16(r, n), buf, n);
    return buf;
  }
  // Writes src into row r (nothing to do when src already is the f32 row).
  void store(int64_t r, int64_t n, const float* src) const {
    if (f32) {
      float* d = row_f32(r, n);
      if (d != src) std::copy(src, src + n, d);
      return;
    }
    f32_row_to_bf16(src, row_bf16(r, n), n);
  }
};

}  // namespace myriad::cpu
