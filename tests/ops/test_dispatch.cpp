#include "ops/adamw.h"
#include "ops/gelu.h"
#include "ops/quant.h"
#include "tests/ops/op_test.h"

namespace myriad::testing {
namespace {

using Fn = void (*)(const Tensor&);

TEST(Dispatch, MissingKernelNamesOpAndDevice) {
  ops::KernelTable<Fn> table("fancy_op");
  expect_error([&] { table.get(kCPU, DType::F32); }, {"fancy_op", "cpu"});
  expect_error([&] { table.get(cuda(1), DType::BF16); }, {"fancy_op", "cuda:1"});
  table.set(ops::Backend::CPU, [](const Tensor&) {});
  EXPECT_NE(table.get(kCPU, DType::F32), nullptr);
  // f64 always goes to the reference, which this table lacks.
  expect_error([&] { table.get(kCPU, DType::F64); }, {"fancy_op", "reference"});
}

TEST(Dispatch, ReferenceModeRoutesCpuTensors) {
  EXPECT_EQ(ops::backend_for(kCPU, DType::F32), ops::Backend::CPU);
  {
    ops::ReferenceMode ref;
    EXPECT_EQ(ops::backend_for(kCPU, DType::F32), ops::Backend::Reference);
    EXPECT_EQ(ops::backend_for(cuda(0), DType::F32), ops::Backend::CUDA);
  }
  EXPECT_EQ(ops::backend_for(kCPU, DType::F32), ops::Backend::CPU);
  EXPECT_EQ(ops::backend_for(kCPU, DType::F64), ops::Backend::Reference);
}

// Calls f on every op's kernel table but the two without a reference kernel (grouped_gemm: without
// a grouped kernel each group runs the GEMM kernel; paged_attention: without a paged kernel the op
// gathers each sequence's pages for attention).
template <class F>
void for_each_table(F&& f) {
  f(ops::binary_kernels());
  f(ops::scalar_kernels());
  f(ops::pow_kernels());
  f(ops::unary_kernels());
  f(ops::unary_backward_kernels());
  f(ops::axpy_kernels());
  f(ops::reduce_kernels());
  f(ops::gemm_kernels());
  f(ops::softmax_kernels());
  f(ops::softmax_backward_kernels());
  f(ops::rms_norm_kernels());
  f(ops::rms_norm_backward_kernels());
  f(ops::cross_entropy_rows_kernels());
  f(ops::gather_kernels());
  f(ops::scatter_add_kernels());
  f(ops::embedding_kernels());
  f(ops::embedding_backward_kernels());
  f(ops::topk_kernels());
  f(ops::cumsum_kernels());
  f(ops::conv1d_kernels());
  f(ops::conv1d_backward_kernels());
  f(ops::attention_kernels());
  f(ops::attention_backward_kernels());
  f(ops::attn_res_kernels());
  f(ops::attn_res_backward_kernels());
  f(ops::weighted_index_add_kernels());
  f(ops::weighted_index_add_backward_kernels());
  f(ops::kda_kernels());
  f(ops::kda_backward_kernels());
  f(ops::kda_step_kernels());
  f(ops::kda_gate_kernels());
  f(ops::kda_gate_backward_kernels());
  f(ops::glu_kernels());
  f(ops::glu_backward_kernels());
  f(ops::gelu_kernels());
  f(ops::gelu_backward_kernels());
  f(ops::adamw_kernels());
  f(ops::dequantize_kernels());
  f(ops::quant_gemm_kernels());
}

TEST(Dispatch, EveryOpHasReferenceAndCpuKernels) {
  for_each_table([](const auto& t) {
    EXPECT_TRUE(t.has(ops::Backend::Reference)) << t.op();
    EXPECT_TRUE(t.has(ops::Backend::CPU)) << t.op();
  });
  EXPECT_TRUE(ops::grouped_gemm_kernels().has(ops::Backend::CPU));
  EXPECT_TRUE(ops::paged_attention_kernels().has(ops::Backend::CPU));
}

// A build with the CUDA backend registers a CUDA kernel for every op (checked without a GPU: the
// registration is static), so no model op fails on a CUDA tensor for want of one.
TEST(Dispatch, EveryOpHasACudaKernelInCudaBuilds) {
#ifdef MYRIAD_HAVE_CUDA
  for_each_table([](const auto& t) { EXPECT_TRUE(t.has(ops::Backend::CUDA)) << t.op(); });
  EXPECT_TRUE(ops::grouped_gemm_kernels().has(ops::Backend::CUDA));
  EXPECT_TRUE(ops::paged_attention_kernels().has(ops::Backend::CUDA));
#else
  GTEST_SKIP() << "built without the CUDA backend";
#endif
}

}  // namespace
}  // namespace myriad::testing
