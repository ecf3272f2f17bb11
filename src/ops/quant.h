// Weight-only quantization (docs/PERFORMANCE.md "int8 decode", "int4 decode"): a weight
// [out, in] is held as integer codes with one f32 scale per 32 consecutive elements of a row, and
// decode's few-row products read the codes (a quarter or an eighth of the f32 bytes) instead of
// the f32 rows. Activations stay f32: only the weights are quantized. Two formats, llama.cpp's
// q8_0 and q4_0 blocks with f32 scales:
//
//   int8: scale[i, g] = max_{j in g} |w[i, j]| / 127,   q[i, j] in [-127, 127]
//   int4: scale[i, g] = -w[i, j*] / 8 for j* the element of g with the largest |w| (the first
//         such), q[i, j] in [-8, 7]   (the extreme element is code -8 exactly)
//   q[i, j]  = clamp(round_half_even(w[i, j] / scale[i, j / 32]))   (0 where the scale is 0)
//   w'[i, j] = float(q[i, j]) * scale[i, j / 32]      (dequantize, one f32 rounding)
//
// int8 codes are bytes (two's complement), int4 codes q + 8 in nibbles: byte b of a group's 16
// holds element b in its low nibble and element b + 16 in its high one (q4_0's order).
//
// linear_quant(x, w) is linear(x, dequantize(w)): bit for bit on the CPU, where up to
// kQuantStreamRows rows of x stream the codes through the few-row GEMM (dequantizing each group in
// registers with the f32 kernel's sum order) and more rows (prefill) dequantize the weight once
// and run the f32 GEMM. No gradient: quantized weights are for inference.
//
// int8 activations (act_bits 8, int8 weights; "w8a8", what llama.cpp's q8_0 dot product does):
// the streamed products (up to kQuantStreamRows rows; prefill stays as above) also quantize each
// row of x per group of 32 by the int8 rule, xs[r, g] = max |x[r, g]| / 127 and
// xq = clamp(round_half_even(x / xs)), and multiply codes by codes in integers. The sum order is
// part of the definition (every backend gives its bits): lane l of 16 takes, in every block of 64
// elements b, the integer sum p of xq·q over elements 64 b + 4 l .. 64 b + 4 l + 3 and
//   acc[l] = fma(float(p), xs[r, g] · scale[j, g], acc[l])     (g = 2 b + l / 8, the group)
// from acc = 0, and y[r, j] is the 16 lanes added in order (a missing last group adds fma(0, 0,
// acc)). On a CPU with AVX512-VNNI one vpdpbusd does 64 of the multiply-adds.
#pragma once
#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "ops/dispatch.h"
#include "ops/matmul.h"

namespace myriad::ops {

constexpr int64_t kQuantGroup = 32;             // elements of a row per scale
constexpr int64_t kQuantStreamRows = kFewRows;  // rows of x up to which the codes are streamed

struct QuantWeight {
  Tensor q;          // U8 [out, in] (int8) or [out, in / 2] (int4): the codes
  Tensor scale;      // F32 [out, in / 32]
  int bits = 8;      // 8 or 4
  int act_bits = 0;  // 0: x multiplies as f32 (weight-only); 8: x as int8 codes (bits 8 only)
  int64_t out() const { return q.size(0); }
  int64_t in() const { return q.size(1) * (8 / bits); }
  int64_t bytes() const;  // codes + scales
  QuantWeight to(Device d) const { return {q.to(d), scale.to(d), bits, act_bits}; }
};

// w: f32 or bf16 [out, in] with in a multiple of 32; bits 8 or 4; act_bits 0 or (with bits 8) 8.
// The codes and scales are computed on the host and land on w's device.
QuantWeight quantize(const Tensor& w, int bits, int act_bits = 0);
inline QuantWeight quantize_int8(const Tensor& w) {
  return quantize(w, 8);
}
Tensor dequantize(const QuantWeight& w);  // f32 [out, in]
// x [..., in] (f32 or bf16) -> [..., out] in x's dtype; x must not require a gradient.
Tensor linear_quant(const Tensor& x, const QuantWeight& w);
// grouped_linear with quantized weights (all of one format): rows [offsets[g], offsets[g + 1]) of x
// [M, in] times w[g].
Tensor grouped_linear_quant(const Tensor& x, const std::vector<int64_t>& offsets,
                            const std::vector<const QuantWeight*>& w);
// linear_cat with quantized weights (all of one format): up to kQuantStreamRows rows stream every
// weight's codes in one unit of work, concat(linear_quant(x, *w[i]), -1) bit for bit; more rows
// (prefill) run linear_cat on the dequantized weights.
Tensor linear_quant_cat(const Tensor& x, const std::vector<const QuantWeight*>& w);

// ---- kernels ----
// out (f32 [out, in], contiguous, on w's device) = dequantize(w).
using DequantizeKernel = void (*)(const QuantWeight& w, Tensor& out);
KernelTable<DequantizeKernel>& dequantize_kernels();
// Few-row products with quantized B: every GemmArgs has trans_b, m <= kQuantStreamRows, dtype F32
// (A and C), b pointing at codes of b_bits bits [n, k] (ldb in bytes: k or k / 2) with k a
// multiple of 32, and b_scale at their scales [n, k / 32] (row stride k / 32), every product of
// one format (b_bits and a_bits; a_bits 8 with batch 1). All run as one unit of work. The
// reference kernel: f32 A in f64 sums (a_bits 0), the int8 definition above (a_bits 8).
using QuantGemmKernel = void (*)(const std::vector<GemmArgs>& groups);
KernelTable<QuantGemmKernel>& quant_gemm_kernels();

}  // namespace myriad::ops
