// The CUDA GEMM kernel: cuBLASLt. cuBLASLt is column-major, so the row-major product
// C = op(A) op(B) runs as C^T = op(B)^T op(A)^T, which reads the same memory with the operands
// swapped and no copies. f32 computes in plain f32 (CUBLAS_COMPUTE_32F, no TF32), bf16 takes
// bf16 operands with f32 accumulation, f64 runs in f64. The descriptors and the heuristic's
// algorithm are created once per (shape, strides, dtype, alignment) and cached. When cuBLASLt's
// heuristic offers no algorithm (operands at odd addresses, say), cuBLAS's strided-batched GEMM,
// which takes any layout, runs instead.
#include <cublas_v2.h>

#include <algorithm>
#include <array>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "backend/cuda/cuda.h"
#include "core/error.h"
#include "core/tensor.h"
#include "ops/matmul.h"

namespace myriad::gpu {
namespace {
using ops::GemmArgs;

constexpr size_t kWorkspace = size_t{32} << 20;

struct DeviceState {
  cublasLtHandle_t handle = nullptr;
  cublasHandle_t fallback = nullptr;
  void* workspace = nullptr;
};
// Created on first use and kept for the process (they are few and tied to the device).
DeviceState& device_state(int device) {
  static std::mutex mu;
  static std::map<int, DeviceState> states;
  std::lock_guard lock(mu);
  DeviceState& s = states[device];
  if (!s.handle) {
    DeviceGuard g(device);
    CUDA_CHECK(cudaMalloc(&s.workspace, kWorkspace));
    CUBLAS_CHECK(cublasLtCreate(&s.handle));
    CUBLAS_CHECK(cublasCreate(&s.fallback));
  }
  return s;
}

std::string describe(const GemmArgs& g) {
  return cat("gemm on ", g.device.str(), ": ", dtype_name(g.dtype), " batch ", g.batch, ", m ", g.m,
             ", n ", g.n, ", k ", g.k, ", trans_a ", g.trans_a, ", trans_b ", g.trans_b, ", ld ",
             g.lda, "/", g.ldb, "/", g.ldc, ", batch strides ", g.stride_a, "/", g.stride_b, "/",
             g.stride_c);
}

// The largest power of two (up to 256) dividing every address of a batch of matrices.
uint32_t alignment(const void* p, int64_t batch, int64_t stride, size_t es) {
  uint64_t bits = reinterpret_cast<uintptr_t>(p) | 256;
  if (batch > 1) bits |= static_cast<uint64_t>(stride) * es;
  return static_cast<uint32_t>(bits & (~bits + 1));
}

using Key = std::array<int64_t, 18>;
struct KeyHash {
  size_t operator()(const Key& k) const {
    uint64_t h = 1469598103934665603ull;
    for (int64_t v : k) h = (h ^ static_cast<uint64_t>(v)) * 1099511628211ull;
    return h;
  }
};

struct Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;  // cuBLASLt's A (our B), B, C
  cublasLtMatmulAlgo_t algo{};
  bool fallback = false;  // no cuBLASLt algorithm: use cublasGemmStridedBatchedEx
};

// The leading dimension of a column-major rows x cols matrix, checked.
int64_t leading_dim(int64_t rows, int64_t cols, int64_t ld, const GemmArgs& g) {
  if (cols == 1) ld = std::max(ld, rows);  // a single column: its stride is irrelevant
  MYRIAD_CHECK(ld >= std::max<int64_t>(rows, 1), describe(g), ": leading dimension ", ld,
               " is smaller than the ", rows, " rows it spans");
  return ld;
}
// Leading dimensions of cuBLAS's A (our B), B (our A) and C.
std::array<int64_t, 3> leading_dims(const GemmArgs& g) {
  return {g.trans_b ? leading_dim(g.k, g.n, g.ldb, g) : leading_dim(g.n, g.k, g.ldb, g),
          g.trans_a ? leading_dim(g.m, g.k, g.lda, g) : leading_dim(g.k, g.m, g.lda, g),
          leading_dim(g.n, g.m, g.ldc, g)};
}

// A column-major rows x cols layout with leading dimension ld and the batch stride.
cublasLtMatrixLayout_t layout(cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld,
                              int64_t batch, int64_t stride) {
  cublasLtMatrixLayout_t l = nullptr;
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&l, type, rows, cols, ld));
  if (batch > 1) {
    const int32_t count = static_cast<int32_t>(batch);
    CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count,
                                                  sizeof(count)));
    CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                  &stride, sizeof(stride)));
  }
  return l;
}

cudaDataType_t data_type(DType t) {
  return t == DType::F64 ? CUDA_R_64F : t == DType::BF16 ? CUDA_R_16BF : CUDA_R_32F;
}

Plan make_plan(const GemmArgs& g, cublasLtHandle_t handle, const std::array<uint32_t, 3>& align) {
  const bool f64 = g.dtype == DType::F64;
  const cudaDataType_t type = data_type(g.dtype);
  const auto ld = leading_dims(g);
  Plan p;
  CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.op, f64 ? CUBLAS_COMPUTE_64F : CUBLAS_COMPUTE_32F,
                                        f64 ? CUDA_R_64F : CUDA_R_32F));
  const cublasOperation_t ta = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t tb = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  // Row-major B [k, n] is column-major [n, k] (op N gives B^T); stored transposed it is [k, n].
  p.a = g.trans_b ? layout(type, g.k, g.n, ld[0], g.batch, g.stride_b)
                  : layout(type, g.n, g.k, ld[0], g.batch, g.stride_b);
  p.b = g.trans_a ? layout(type, g.m, g.k, ld[1], g.batch, g.stride_a)
                  : layout(type, g.k, g.m, ld[1], g.batch, g.stride_a);
  p.c = layout(type, g.n, g.m, ld[2], g.batch, g.stride_c);

  cublasLtMatmulPreference_t pref = nullptr;
  CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const uint64_t ws = kWorkspace;
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                    &ws, sizeof(ws)));
  const std::array<std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t>, 4> aligns = {{
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align[1]},  // cuBLASLt's A is our B
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align[0]},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align[2]},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align[2]},
  }};
  for (const auto& [attr, v] : aligns)
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attr, &v, sizeof(v)));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  cublasStatus_t st =
      cublasLtMatmulAlgoGetHeuristic(handle, p.op, p.a, p.b, p.c, p.c, pref, 1, &result, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  p.fallback = st != CUBLAS_STATUS_SUCCESS || found == 0;
  p.algo = result.algo;
  return p;
}

const Plan& plan_for(const GemmArgs& g, cublasLtHandle_t handle,
                     const std::array<uint32_t, 3>& align) {
  static std::mutex mu;
  static std::unordered_map<Key, Plan, KeyHash> cache;  // plans live for the process
  const Key key = {g.device.index,
                   static_cast<int64_t>(g.dtype),
                   g.batch,
                   g.m,
                   g.n,
                   g.k,
                   g.trans_a,
                   g.trans_b,
                   g.lda,
                   g.ldb,
                   g.ldc,
                   g.stride_a,
                   g.stride_b,
                   g.stride_c,
                   align[0],
                   align[1],
                   align[2],
                   g.beta != 0.0f};
  {
    std::lock_guard lock(mu);
    auto it = cache.find(key);
    if (it != cache.end()) return it->second;
  }
  Plan p = make_plan(g, handle, align);
  std::lock_guard lock(mu);
  return cache.emplace(key, p).first->second;  // a racing thread's plan wins; ours is dropped
}

void gemm_cuda(const GemmArgs& g) {
  MYRIAD_CHECK(g.dtype == DType::F32 || g.dtype == DType::BF16 || g.dtype == DType::F64,
               describe(g), ": the cuda kernel supports f32, bf16 and f64");
  if (g.batch == 0 || g.m == 0 || g.n == 0) return;
  const int dev = g.device.index;
  const size_t es = dtype_size(g.dtype);
  if (g.k == 0) {  // no products: C = beta * C
    scale_matrices(g.c, g.dtype, g.batch, g.m, g.n, g.ldc, g.stride_c, g.beta, dev);
    return;
  }
  if (g.batch > 1 && (g.stride_a == 0 || g.stride_b == 0)) {
    // A broadcast operand: one GEMM per batch (ops::gemm already folded the common case of a
    // shared B into one taller GEMM), since strided batches with stride 0 are not documented.
    GemmArgs one = g;
    one.batch = 1;
    one.stride_a = one.stride_b = one.stride_c = 0;
    for (int64_t b = 0; b < g.batch; ++b) {
      one.a = static_cast<const char*>(g.a) + b * g.stride_a * es;
      one.b = static_cast<const char*>(g.b) + b * g.stride_b * es;
      one.c = static_cast<char*>(g.c) + b * g.stride_c * es;
      gemm_cuda(one);
    }
    return;
  }
  DeviceState& s = device_state(dev);
  const std::array<uint32_t, 3> align = {alignment(g.a, g.batch, g.stride_a, es),
                                         alignment(g.b, g.batch, g.stride_b, es),
                                         alignment(g.c, g.batch, g.stride_c, es)};
  const Plan& p = plan_for(g, s.handle, align);
  DeviceGuard guard(dev);
  const double alpha64 = g.alpha, beta64 = g.beta;
  const void* alpha = g.dtype == DType::F64 ? static_cast<const void*>(&alpha64) : &g.alpha;
  const void* beta = g.dtype == DType::F64 ? static_cast<const void*>(&beta64) : &g.beta;
  cudaStream_t stream = current_stream(dev);
  if (!p.fallback) {
    CUBLAS_CHECK(cublasLtMatmul(s.handle, p.op, alpha, g.b, p.a, g.a, p.b, beta, g.c, p.c, g.c, p.c,
                                &p.algo, s.workspace, kWorkspace, stream));
    return;
  }
  const auto ld = leading_dims(g);
  const cudaDataType_t type = data_type(g.dtype);
  CUBLAS_CHECK(cublasSetStream(s.fallback, stream));
  cublasStatus_t st = cublasGemmStridedBatchedEx_64(
      s.fallback, g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, g.n,
      g.m, g.k, alpha, g.b, type, ld[0], g.stride_b, g.a, type, ld[1], g.stride_a, beta, g.c, type,
      ld[2], g.stride_c, g.batch, g.dtype == DType::F64 ? CUBLAS_COMPUTE_64F : CUBLAS_COMPUTE_32F,
      CUBLAS_GEMM_DEFAULT);
  MYRIAD_CHECK(st == CUBLAS_STATUS_SUCCESS, describe(g), ": cuBLASLt found no algorithm and ",
               "cublasGemmStridedBatchedEx failed (", cublasGetStatusString(st), ")");
}

// Independent GEMMs (a MoE's experts) as one cublasGemmGroupedBatchedEx call: each GEMM is a
// group of one, mapped onto column-major as gemm_cuda maps it, with the device pointer arrays
// sent in one copy queued on the stream (the host does not wait). GEMMs with k = 0 (C = beta C) and
// f64 ones run gemm_cuda; so does everything when cuBLAS declines the call
// (CUBLAS_STATUS_NOT_SUPPORTED for a dtype or layout it lacks).
void grouped_gemm_cuda(const std::vector<GemmArgs>& groups) {
  std::vector<const GemmArgs*> work;
  for (const GemmArgs& g : groups) {
    if (g.dtype == DType::F64 || g.k == 0 || groups.size() == 1)
      gemm_cuda(g);
    else
      work.push_back(&g);
  }
  if (work.empty()) return;
  MYRIAD_CHECK(work[0]->dtype == DType::F32 || work[0]->dtype == DType::BF16, describe(*work[0]),
               ": the cuda kernel supports f32, bf16 and f64");
  const int64_t n = static_cast<int64_t>(work.size());
  const int dev = work[0]->device.index;
  std::vector<cublasOperation_t> ta, tb;
  std::vector<int64_t> rows, cols, depth, lda, ldb, ldc, ptr(3 * n);
  std::vector<float> alpha, beta;
  for (int64_t i = 0; i < n; ++i) {
    const GemmArgs& g = *work[i];
    const auto ld = leading_dims(g);
    ta.push_back(g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N);
    tb.push_back(g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N);
    rows.push_back(g.n), cols.push_back(g.m), depth.push_back(g.k);
    lda.push_back(ld[0]), ldb.push_back(ld[1]), ldc.push_back(ld[2]);
    alpha.push_back(g.alpha), beta.push_back(g.beta);
    ptr[i] = static_cast<int64_t>(reinterpret_cast<uintptr_t>(g.b));  // cuBLAS's A is our B
    ptr[n + i] = static_cast<int64_t>(reinterpret_cast<uintptr_t>(g.a));
    ptr[2 * n + i] = static_cast<int64_t>(reinterpret_cast<uintptr_t>(g.c));
  }
  const std::vector<int64_t> sizes(n, 1);
  const Tensor dptr = Tensor::empty({3 * n}, DType::I64, work[0]->device);
  copy_to_device_async(dptr.data_ptr(), ptr.data(), ptr.size() * sizeof(int64_t), dev);
  const auto* p = static_cast<const void* const*>(dptr.data_ptr());
  auto* c = const_cast<void* const*>(p + 2 * n);
  const cudaDataType_t type = data_type(work[0]->dtype);
  DeviceState& s = device_state(dev);
  DeviceGuard guard(dev);
  CUBLAS_CHECK(cublasSetStream(s.fallback, current_stream(dev)));
  const cublasStatus_t st = cublasGemmGroupedBatchedEx_64(
      s.fallback, ta.data(), tb.data(), rows.data(), cols.data(), depth.data(), alpha.data(), p,
      type, lda.data(), p + n, type, ldb.data(), beta.data(), c, type, ldc.data(), n, sizes.data(),
      CUBLAS_COMPUTE_32F);
  if (st == CUBLAS_STATUS_NOT_SUPPORTED) {
    for (const GemmArgs* g : work) gemm_cuda(*g);
    return;
  }
  MYRIAD_CHECK(st == CUBLAS_STATUS_SUCCESS, "grouped gemm on ", work[0]->device.str(), ": ", n, " ",
               dtype_name(work[0]->dtype), " GEMMs, first ", describe(*work[0]),
               ": cublasGemmGroupedBatchedEx failed (", cublasGetStatusString(st), ")");
}

}  // namespace

MYRIAD_REGISTER_KERNEL(ops::gemm_kernels, ops::Backend::CUDA, &gemm_cuda);
MYRIAD_REGISTER_KERNEL(ops::grouped_gemm_kernels, ops::Backend::CUDA, &grouped_gemm_cuda);

}  // namespace myriad::gpu
