// Matrix products on the GEMM backend (oneDNN on the CPU, cuBLASLt on CUDA). f32 and bf16
// (bf16 inputs, f32 accumulation, bf16 output); f64 through the reference.
#pragma once
#include "core/tensor.h"
#include "ops/dispatch.h"

namespace myriad::ops {

// Rows of A up to which a GEMM is a stream of B (decode: a token per running sequence).
constexpr int64_t kFewRows = 16;

// [M, K] x [K, N] -> [M, N]; with batch dims, [..., M, K] x [..., K, N] (batch dims broadcast;
// a 2-d operand is shared by every batch).
Tensor matmul(const Tensor& a, const Tensor& b);
// [B, M, K] x [B, K, N] -> [B, M, N].
Tensor bmm(const Tensor& a, const Tensor& b);
// x [..., in] . W[out, in]^T + bias[out] -> [..., out]  (PyTorch's nn.Linear).
Tensor linear(const Tensor& x, const Tensor& w, const Tensor& bias = {});
// One linear per group of rows (the experts of a MoE, tokens in expert order): rows
// [offsets[g], offsets[g + 1]) of x [M, in] times w[g] [out, in]^T, -> [M, out]. offsets has
// w.size() + 1 entries from 0 to M, non-decreasing (empty groups allowed). All groups run as one
// grouped GEMM, forward and backward.
Tensor grouped_linear(const Tensor& x, const std::vector<int64_t>& offsets,
                      const std::vector<Tensor>& w);
// Several grouped linears of one input side by side (the gate and up projections of every
// expert): w[s][g] [out_s, in] for set s and group g -> [M, sum of out_s], the columns of set 0
// first: concat(grouped_linear(x, offsets, w[s]), -1) without the copy. The backward accumulates
// dx set by set inside the GEMMs (no separate sum of per-set dx).
Tensor grouped_linear_cat(const Tensor& x, const std::vector<int64_t>& offsets,
                          const std::vector<std::vector<Tensor>>& w);
// Several linears of one input side by side: x [..., in] and w[i] [out_i, in] -> [..., sum of
// out_i], the columns of w[0] first: concat(linear(x, w[i]), -1) without the copy. Up to
// kFewRows rows (decode) run every product as one grouped GEMM (one parallel region on the CPU)
// with the bits linear gives; more rows run a GEMM per product into its columns.
Tensor linear_cat(const Tensor& x, const std::vector<Tensor>& w);

// ---- kernel ----
// C[b] = alpha * op(A[b]) op(B[b]) + beta * C[b] for b < batch, row-major, with op = transpose
// when trans_*; lda/ldb/ldc are row strides, stride_* the batch strides (0 broadcasts). A, B,
// C share a dtype; accumulation is f32 or wider.
struct GemmArgs {
  int64_t batch = 1, m = 0, n = 0, k = 0;
  bool trans_a = false, trans_b = false;
  const void* a = nullptr;
  const void* b = nullptr;
  void* c = nullptr;
  int64_t lda = 0, ldb = 0, ldc = 0;
  int64_t stride_a = 0, stride_b = 0, stride_c = 0;
  float alpha = 1.0f, beta = 0.0f;
  DType dtype = DType::F32;
  // Quantized B (ops/quant.h, quant_gemm_kernels only): one f32 scale per 32 elements of a row of
  // B, codes of b_bits bits (8 or 4). a_bits 8: the kernel quantizes A's rows to int8 per 32
  // elements and multiplies codes by codes (QuantWeight::act_bits); 0: A is multiplied as f32.
  const float* b_scale = nullptr;
  int b_bits = 8;
  int a_bits = 0;
  Device device;
};
using GemmKernel = void (*)(const GemmArgs& args);
KernelTable<GemmKernel>& gemm_kernels();
// Runs the GEMM kernel for args.device / args.dtype (used by matmul and by fused ops).
void gemm(const GemmArgs& args);
// Independent GEMMs (one device and dtype) as one unit of work: a backend's grouped kernel
// schedules them together (the CPU's runs all the few-row products in one parallel region);
// without one, each goes to the GEMM kernel in turn. Results equal running them one by one.
using GroupedGemmKernel = void (*)(const std::vector<GemmArgs>& groups);
KernelTable<GroupedGemmKernel>& grouped_gemm_kernels();
void grouped_gemm(const std::vector<GemmArgs>& groups);

}  // namespace myriad::ops
