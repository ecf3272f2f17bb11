#include "ops/check.h"

#include "ops/dispatch.h"

namespace myriad::ops {

namespace {
thread_local bool g_reference = false;
}
bool reference_mode() {
  return g_reference;
}
ReferenceMode::ReferenceMode() : prev_(g_reference) {
  g_reference = true;
}
ReferenceMode::~ReferenceMode() {
  g_reference = prev_;
}

const char* backend_name(Backend b) {
  switch (b) {
    case Backend::Reference:
      return "reference";
    case Backend::CPU:
      return "cpu";
    case Backend::CUDA:
      return "cuda";
  }
  return "?";
}

std::string descs(std::initializer_list<const Tensor*> ts) {
  std::string s;
  for (const Tensor* t : ts) {
    if (!s.empty()) s += ", ";
    s += t->desc();
  }
  return s;
}

Device check_inputs(const char* op, std::initializer_list<const Tensor*> ts) {
  Device dev;
  bool first = true;
  for (const Tensor* t : ts) {
    MYRIAD_CHECK(t->defined(), op, ": an input tensor is undefined");
    MYRIAD_CHECK(!t->is_released(), op, ": use of a released tensor ", t->desc());
    if (first) {
      dev = t->device();
      first = false;
    } else {
      MYRIAD_CHECK(t->device() == dev, op, ": inputs are on different devices (", descs(ts), ")");
    }
  }
  return dev;
}

void check_same_dtype(const char* op, std::initializer_list<const Tensor*> ts) {
  const Tensor* first = nullptr;
  for (const Tensor* t : ts) {
    if (!first) first = t;
    MYRIAD_CHECK(t->dtype() == first->dtype(), op, ": dtype mismatch (", descs(ts), ")");
  }
}

void check_floating(const char* op, const Tensor& t) {
  MYRIAD_CHECK(is_floating(t.dtype()), op, ": expected a floating-point tensor, got ", t.desc());
}

void check_index_dtype(const char* op, const Tensor& idx) {
  MYRIAD_CHECK(idx.dtype() == DType::I64 || idx.dtype() == DType::I32, op,
               ": indices must be i32 or i64, got ", idx.desc());
}

void check_dim(const char* op, const Tensor& t, int64_t rank) {
  MYRIAD_CHECK(t.dim() == rank, op, ": expected a ", rank, "-d tensor, got ", t.desc());
}

int64_t wrap_dim(const char* op, int64_t d, int64_t rank) {
  int64_t r = d < 0 ? d + rank : d;
  MYRIAD_CHECK(r >= 0 && r < std::max<int64_t>(rank, 1), op, ": dimension ", d,
               " out of range for rank ", rank);
  return r;
}

}  // namespace myriad::ops
