// CUDA weight-only int8 / int4 (ops/quant.h): dequantize, and decode's few-row products reading
// the codes. A warp per row j of B runs every row of A against it: lane l takes elements l,
// l + 32, ... (32 consecutive codes a step, coalesced), dequantizes each as the reference does (one
// f32 rounding of code x scale), multiply-adds it into one sum per row of A, and the warp sums its
// lanes. Values, not bits: the CPU kernel's sum order is its own.
#include "backend/cuda/kernels.cuh"
#include "ops/quant.h"

namespace myriad::gpu {
namespace {

constexpr int kMaxRows = static_cast<int>(ops::kQuantStreamRows);
constexpr int64_t kGroup = ops::kQuantGroup;

// Element e of a row of codes: int8 byte e as signed, or int4 in q4_0's order (byte b of a group's
// 16 holds element b in its low nibble and element b + 16 in its high one), minus 8.
template <int Bits>
__device__ inline float code(const uint8_t* row, int64_t e) {
  if constexpr (Bits == 8) {
    return static_cast<float>(static_cast<int8_t>(row[e]));
  } else {
    const int64_t g = e / kGroup, i = e % kGroup;
    const uint8_t b = row[g * (kGroup / 2) + (i & 15)];
    return static_cast<float>((i < 16 ? (b & 15) : (b >> 4)) - 8);
  }
}

template <int Bits>
__global__ void dequantize_kernel(const uint8_t* __restrict__ q, int64_t ldq,
                                  const float* __restrict__ scale, int64_t rows, int64_t in,
                                  float* __restrict__ out) {
  for (int64_t x = global_thread(); x < rows * in; x += global_threads()) {
    const int64_t j = x / in, e = x % in;
    out[x] = __fmul_rn(code<Bits>(q + j * ldq, e), scale[j * (in / kGroup) + e / kGroup]);
  }
}

template <int Bits>
__global__ void quant_rows_kernel(const float* __restrict__ a, int64_t lda,
                                  const uint8_t* __restrict__ b, int64_t ldb,
                                  const float* __restrict__ scale, int64_t m, int64_t n, int64_t k,
                                  float* __restrict__ c, int64_t ldc) {
  const int64_t j = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x & 31);
  if (j >= n) return;  // j is the same for the whole warp
  const uint8_t* row = b + j * ldb;
  const float* sc = scale + j * (k / kGroup);
  float acc[kMaxRows];
#pragma unroll
  for (int r = 0; r < kMaxRows; ++r) acc[r] = 0.0f;
  for (int64_t e = lane; e < k; e += 32) {
    const float w = __fmul_rn(code<Bits>(row, e), sc[e / kGroup]);
#pragma unroll
    for (int r = 0; r < kMaxRows; ++r)
      if (r < m) acc[r] = __fmaf_rn(a[r * lda + e], w, acc[r]);
  }
#pragma unroll
  for (int r = 0; r < kMaxRows; ++r) {
    const float s = warp_sum(acc[r]);  // every lane takes part, used or not
    if (r < m && lane == 0) c[r * ldc + j] = s;
  }
}

void dequantize_cuda(const ops::QuantWeight& w, Tensor& out) {
  const int64_t rows = w.out(), in = w.in();
  if (rows * in == 0) return;
  const int dev = w.q.device().index;
  const auto* q = cptr<uint8_t>(w.q);
  const float* s = cptr<float>(w.scale);
  float* o = mptr<float>(out);
  if (w.bits == 8)
    launch("dequantize", dev, grid_for(rows * in), kThreads, &dequantize_kernel<8>, q, w.q.size(1),
           s, rows, in, o);
  else
    launch("dequantize", dev, grid_for(rows * in), kThreads, &dequantize_kernel<4>, q, w.q.size(1),
           s, rows, in, o);
}

void quant_gemm_cuda(const std::vector<ops::GemmArgs>& gs) {
  for (const ops::GemmArgs& g : gs) {
    MYRIAD_CHECK(g.trans_b && g.dtype == DType::F32 && g.m <= kMaxRows && g.k % kGroup == 0 &&
                     g.b_scale && (g.b_bits == 8 || g.b_bits == 4) && g.alpha == 1.0f &&
                     g.beta == 0.0f && g.batch == 1 && g.a_bits == 0,
                 "quant_gemm: the cuda kernel takes up to ", kMaxRows,
                 " f32 rows against codes [n, k] (k a multiple of ", kGroup,
                 "; int8 activations are CPU-only), got m ", g.m, ", k ", g.k, ", ", g.b_bits,
                 " bits, activation bits ", g.a_bits);
    if (g.m == 0 || g.n == 0) continue;
    const auto blocks = static_cast<unsigned>((g.n * 32 + kThreads - 1) / kThreads);
    const auto* a = static_cast<const float*>(g.a);
    const auto* b = static_cast<const uint8_t*>(g.b);
    auto* c = static_cast<float*>(g.c);
    if (g.b_bits == 8)
      launch("quant_gemm", g.device.index, blocks, kThreads, &quant_rows_kernel<8>, a, g.lda, b,
             g.ldb, g.b_scale, g.m, g.n, g.k, c, g.ldc);
    else
      launch("quant_gemm", g.device.index, blocks, kThreads, &quant_rows_kernel<4>, a, g.lda, b,
             g.ldb, g.b_scale, g.m, g.n, g.k, c, g.ldc);
  }
}

}  // namespace

MYRIAD_REGISTER_KERNEL(ops::dequantize_kernels, ops::Backend::CUDA, &dequantize_cuda);
MYRIAD_REGISTER_KERNEL(ops::quant_gemm_kernels, ops::Backend::CUDA, &quant_gemm_cuda);

}  // namespace myriad::gpu
