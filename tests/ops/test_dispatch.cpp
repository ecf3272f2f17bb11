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

TEST(Dispatch, EveryOpHasReferenceAndCpuKernels) {
  auto both = [](const auto& t) {
    EXPECT_TRUE(t.has(ops::Backend::Reference)) << t.op();
    EXPECT_TRUE(t.has(ops::Backend::CPU)) << t.op();
  };
  both(ops::binary_kernels());
  both(ops::scalar_kernels());
  both(ops::pow_kernels());
  both(ops::unary_kernels());
  both(ops::unary_backward_kernels());
  both(ops::axpy_kernels());
  both(ops::reduce_kernels());
  both(ops::gemm_kernels());
  both(ops::softmax_kernels());
  both(ops::softmax_backward_kernels());
  both(ops::rms_norm_kernels());
  both(ops::rms_norm_backward_kernels());
  both(ops::cross_entropy_rows_kernels());
  both(ops::gather_kernels());
  both(ops::scatter_add_kernels());
  both(ops::embedding_kernels());
  both(ops::embedding_backward_kernels());
  both(ops::topk_kernels());
  both(ops::cumsum_kernels());
  both(ops::conv1d_kernels());
  both(ops::conv1d_backward_kernels());
}

}  // namespace
}  // namespace myriad::testing
