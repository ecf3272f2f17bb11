// The op-test harness. Every op is checked three ways:
//  1. against its plain reference implementation on every available backend (the CPU kernels,
//     and the CUDA kernels when a GPU is visible), forward and backward, in f32 and bf16;
//  2. by a finite-difference gradient check in f64 on tiny shapes (through the reference);
//  3. for bad input: a myriad::Error whose message names the op.
// Tests are parameterised by backend; the CUDA instances print as skipped without a GPU.
#pragma once
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "core/autograd.h"
#include "core/random.h"
#include "ops/ops.h"

namespace myriad::testing {

using OpFn = std::function<Tensor(const std::vector<Tensor>&)>;

struct Tolerance {
  double atol = 1e-5, rtol = 1e-4;
};
// bf16 keeps 8 bits of mantissa: ~4e-3 relative per rounding, more after accumulation.
inline Tolerance bf16_tolerance() {
  return {2e-2, 3e-2};
}

bool cuda_available();
Device device_of(ops::Backend b);

// Random f32 CPU tensors (deterministic per seed).
Tensor randn(const Shape& shape, uint64_t seed, double scale = 1.0);
Tensor randu(const Shape& shape, uint64_t seed, double lo, double hi);
Tensor randint(const Shape& shape, uint64_t seed, int64_t lo, int64_t hi);

// Expects got and want to agree element by element within tol (the absolute part scaled by
// want's largest magnitude).
void expect_close(const std::string& what, const std::vector<double>& got,
                  const std::vector<double>& want, Tolerance tol);

// Runs fn on `inputs` through the reference and through backend b (inputs cast to dtype; integer
// inputs keep theirs), seeds the backward with the same random gradient, and expects the outputs
// and the gradients of every input that requires grad to agree within tol.
void expect_matches_reference(const std::string& what, const OpFn& fn,
                              const std::vector<Tensor>& inputs, ops::Backend b,
                              DType dtype = DType::F32, Tolerance tol = {});
// f32 always, bf16 as well when `bf16` is true (with bf16_tolerance()).
void expect_matches_reference_all(const std::string& what, const OpFn& fn,
                                  const std::vector<Tensor>& inputs, ops::Backend b,
                                  bool bf16 = true);

// Finite differences (central, step 1e-6) in f64 against autograd for every input that
// requires grad, through the reference kernels.
void expect_gradcheck(const std::string& what, const OpFn& fn, const std::vector<Tensor>& inputs,
                      double tol = 1e-6);

// Expects fn() to throw a myriad::Error whose message contains every one of `parts`.
void expect_error(const std::function<void()>& fn, const std::vector<std::string>& parts);

// Fixture parameterised by backend.
class OpTest : public ::testing::TestWithParam<ops::Backend> {
 protected:
  void SetUp() override {
    if (GetParam() == ops::Backend::CUDA && !cuda_available())
      GTEST_SKIP() << "no CUDA device visible";
  }
  ops::Backend backend() const { return GetParam(); }
};

std::string backend_param_name(const ::testing::TestParamInfo<ops::Backend>& info);

}  // namespace myriad::testing

// Instantiates an OpTest-derived suite for the CPU and CUDA backends.
#define MYRIAD_OP_TEST_SUITE(Suite)                                                 \
  INSTANTIATE_TEST_SUITE_P(                                                         \
      Backends, Suite,                                                              \
      ::testing::Values(::myriad::ops::Backend::CPU, ::myriad::ops::Backend::CUDA), \
      ::myriad::testing::backend_param_name)
