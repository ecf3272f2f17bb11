// Optimised CPU softmax / log-softmax over rows of [rows, n]: f32 or bf16 in, f32 math, two passes
// (max, then exp-sum with fast_exp), vectorised through runtime-dispatched clones and threaded
// over rows.
#include <cmath>
#include <limits>
#include <vector>

#include "backend/cpu/cpu.h"
#include "backend/cpu/rows.h"
#include "ops/softmax.h"

namespace myriad::cpu {
namespace {

// y = softmax(x) or log_softmax(x) for one row; y may alias x.
MYRIAD_CPU_CLONES void softmax_row(const float* x, float* y, int64_t n, bool log) {
  const float m = row_max(x, n);
  if (log) {
    const float lse = m + std::log(row_sum_exp(x, m, n));
    for (int64_t i = 0; i < n; ++i) y[i] = x[i] - lse;
    return;
  }
  for (int64_t i = 0; i < n; ++i) y[i] = fast_exp(x[i] - m);
  const float inv = 1.0f / row_sum(y, n);
  for (int64_t i = 0; i < n; ++i) y[i] *= inv;
}

// gx = y * (gy - sum(gy * y)), or gy - exp(y) * sum(gy) for log-softmax; gx may alias gy.
MYRIAD_CPU_CLONES void softmax_backward_row(const float* y, const float* gy, float* gx, int64_t n,
                                            bool log) {
  if (log) {
    const float s = row_sum(gy, n);
    for (int64_t i = 0; i < n; ++i) gx[i] = gy[i] - fast_exp(y[i]) * s;
    return;
  }
  const float s = row_dot(gy, y, n);
  for (int64_t i = 0; i < n; ++i) gx[i] = y[i] * (gy[i] - s);
}

void softmax_cpu(const Tensor& x, Tensor& y, bool log) {
  check_row_dtype("softmax", x.dtype());
  const int64_t n = x.shape().empty() ? 1 : x.shape().back();
  const int64_t rows = x.numel() / n;
  RowIO in(x), out(y);
  parallel_for(rows, row_grain(n), [&](int64_t b, int64_t e) {
    std::vector<float> buf(in.f32 ? 0 : n);
    for (int64_t r = b; r < e; ++r) {
      float* dst = out.f32 ? out.row_f32(r, n) : buf.data();
      softmax_row(in.load(r, n, buf.data()), dst, n, log);
      out.store(r, n, dst);
    }
  });
}

void softmax_backward_cpu(const Tensor& y, const Tensor& gy, Tensor& gx, bool log) {
  check_row_dtype("softmax_backward", y.dtype());
  const int64_t n = y.shape().empty() ? 1 : y.shape().back();
  const int64_t rows = y.numel() / n;
  RowIO iy(y), ig(gy), og(gx);
  parallel_for(rows, row_grain(n), [&](int64_t b, int64_t e) {
    std::vector<float> by(iy.f32 ? 0 : n), bg(iy.f32 ? 0 : n);
    for (int64_t r = b; r < e; ++r) {
      float* dst = og.f32 ? og.row_f32(r, n) : bg.data();
      softmax_backward_row(iy.load(r, n, by.data()), ig.load(r, n, bg.data()), dst, n, log);
      og.store(r, n, dst);
    }
  });
}

}  // namespace

MYRIAD_REGISTER_KERNEL(ops::softmax_kernels, ops::Backend::CPU, &softmax_cpu);
MYRIAD_REGISTER_KERNEL(ops::softmax_backward_kernels, ops::Backend::CPU, &softmax_backward_cpu);

}  // namespace myriad::cpu
