// Weight-only int8 (docs/PERFORMANCE.md "int8 decode"): a weight [out, in] is held as int8 codes
// with one f32 scale per 32 consecutive elements of a row (llama.cpp's q8_0 block, with an f32
// scale), and decode's few-row products read the codes (a quarter of the f32 bytes) instead of
// the f32 rows. Activations stay f32: only the weights are quantized.
//
//   scale[i, g] = max_{j in group g} |w[i, j]| / 127   (0 for an all-zero group)
//   q[i, j]     = round_half_even(w[i, j] / scale[i, j / 32]), in [-127, 127]
//   w'[i, j]    = float(q[i, j]) * scale[i, j / 32]      (dequantize_int8, one f32 rounding)
//
// linear_int8(x, w) is linear(x, dequantize_int8(w)): bit for bit on the CPU, where up to
// kInt8StreamRows rows of x stream the codes through the few-row GEMM (dequantizing each group in
// registers with the f32 kernel's sum order) and more rows (prefill) dequantize the weight once
// and run the f32 GEMM. No gradient: int8 weights are for inference.
#pragma once
#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "ops/dispatch.h"
#include "ops/matmul.h"

namespace myriad::ops {

constexpr int64_t kInt8Group = 32;             // elements of a row per scale
constexpr int64_t kInt8StreamRows = kFewRows;  // rows of x up to which the codes are streamed

struct Int8Weight {
  Tensor q;      // U8 [out, in]: the int8 codes' bytes (two's complement)
  Tensor scale;  // F32 [out, in / 32]
  int64_t out() const { return q.size(0); }
  int64_t in() const { return q.size(1); }
  int64_t bytes() const;  // codes + scales
};

// w: f32 or bf16 [out, in] with in a multiple of 32.
Int8Weight quantize_int8(const Tensor& w);
Tensor dequantize_int8(const Int8Weight& w);  // f32 [out, in]
// x [..., in] (f32 or bf16) -> [..., out] in x's dtype; x must not require a gradient.
Tensor linear_int8(const Tensor& x, const Int8Weight& w);
// grouped_linear with int8 weights: rows [offsets[g], offsets[g + 1]) of x [M, in] times w[g].
Tensor grouped_linear_int8(const Tensor& x, const std::vector<int64_t>& offsets,
                           const std::vector<const Int8Weight*>& w);
// linear_cat with int8 weights: up to kInt8StreamRows rows stream every weight's codes in one unit
// of work, concat(linear_int8(x, *w[i]), -1) bit for bit; more rows (prefill) run linear_cat on
// the dequantized weights.
Tensor linear_int8_cat(const Tensor& x, const std::vector<const Int8Weight*>& w);

// ---- kernel ----
// Few-row products with int8 B: every GemmArgs has trans_b, m <= kInt8StreamRows, dtype F32 (A
// and C), b pointing at int8 codes [n, k] with k a multiple of 32, and b_scale at their scales
// [n, k / 32] (row stride k / 32). All run as one unit of work.
using Int8GemmKernel = void (*)(const std::vector<GemmArgs>& groups);
KernelTable<Int8GemmKernel>& int8_gemm_kernels();

}  // namespace myriad::ops
