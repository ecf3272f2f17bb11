// Kernel dispatch. Every op owns one KernelTable per kernel signature; backends fill the slots
// at static-initialisation time with MYRIAD_REGISTER_KERNEL. Three backends:
//   Reference: the op's plain loops (in ops/), exact in f64, the yardstick for the others;
//   CPU: optimised kernels in backend/cpu; CUDA: kernels in backend/cuda.
// A CPU tensor goes to the Reference kernels when its dtype is f64 or inside a ReferenceMode
// scope, which is how tests compare the two on the same inputs.
#pragma once
#include <array>

#include "core/error.h"
#include "core/tensor.h"

namespace myriad::ops {

enum class Backend : uint8_t { Reference = 0, CPU = 1, CUDA = 2 };
constexpr int kNumBackends = 3;
const char* backend_name(Backend b);

bool reference_mode();
class ReferenceMode {
 public:
  ReferenceMode();
  ~ReferenceMode();
  ReferenceMode(const ReferenceMode&) = delete;
  ReferenceMode& operator=(const ReferenceMode&) = delete;

 private:
  bool prev_;
};

inline Backend backend_for(Device d, DType t) {
  if (d.is_cuda()) return Backend::CUDA;
  return (t == DType::F64 || reference_mode()) ? Backend::Reference : Backend::CPU;
}

template <class Fn>
class KernelTable {
 public:
  explicit KernelTable(const char* op) : op_(op) {}
  void set(Backend b, Fn f) { fns_[static_cast<int>(b)] = f; }
  bool has(Backend b) const { return fns_[static_cast<int>(b)] != nullptr; }
  Fn get(Backend b) const {
    Fn f = fns_[static_cast<int>(b)];
    MYRIAD_CHECK(f, "op '", op_, "' has no ", backend_name(b), " kernel");
    return f;
  }
  // The kernel for tensors on `d` of dtype `t`; names the op and the device when missing.
  Fn get(Device d, DType t) const {
    Backend b = backend_for(d, t);
    Fn f = fns_[static_cast<int>(b)];
    MYRIAD_CHECK(f, "op '", op_, "' has no kernel for device ", d.str(),
                 b == Backend::Reference ? " (reference)" : "");
    return f;
  }
  const char* op() const { return op_; }

 private:
  const char* op_;
  std::array<Fn, kNumBackends> fns_{};
};

}  // namespace myriad::ops

#define MYRIAD_CAT2(a, b) a##b
#define MYRIAD_CAT(a, b) MYRIAD_CAT2(a, b)
// MYRIAD_REGISTER_KERNEL(ops::binary_table, ops::Backend::CPU, &binary_cpu);
#define MYRIAD_REGISTER_KERNEL(table_fn, backend, fn) \
  static const bool MYRIAD_CAT(myriad_kernel_reg_, __LINE__) = (table_fn().set(backend, fn), true)
