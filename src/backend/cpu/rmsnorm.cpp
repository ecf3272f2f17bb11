// Optimised CPU RMSNorm (and l2norm, its sum-of-squares form) over rows of [rows, n]: f32 or bf16
// in, f32 math, vectorised through runtime-dispatched clones, threaded over rows. The backward sums
// gw in per-chunk partials that are reduced afterwards, so no two threads write the same
// accumulator.
#include <cmath>
#include <vector>

#include "backend/cpu/cpu.h"
#include "backend/cpu/rows.h"
#include "ops/rmsnorm.h"

namespace myriad::cpu {
namespace {

// bf16 rounding of v when `round` is set (x̂ is cast back to x's dtype before the weight).
MYRIAD_ROW_INLINE float maybe_bf16(float v, bool round) {
  return round ? bf16_load(bf16_store(v)) : v;
}

// y = cast(x * rstd) * w (w may be null) with rstd = 1 / sqrt(sum(x²) / div + eps) (div n for
// RMSNorm, 1 for l2norm); returns rstd.
MYRIAD_CPU_CLONES float rms_norm_row(const float* x, const float* w, float eps, float div, float* y,
                                     int64_t n, bool round) {
  const float rs = 1.0f / std::sqrt(row_dot(x, x, n) / div + eps);
  if (w)
    for (int64_t i = 0; i < n; ++i) y[i] = maybe_bf16(x[i] * rs, round) * w[i];
  else
    for (int64_t i = 0; i < n; ++i) y[i] = x[i] * rs;
  return rs;
}

// gx = rs * (g - x̂ * sum(g * x̂) / div) with g = gy * w, x̂ = x * rs; gw_acc += gy * cast(x̂).
// gx may alias gy.
MYRIAD_CPU_CLONES void rms_norm_backward_row(const float* x, const float* w, float rs, float div,
                                             const float* gy, float* gx, float* gw_acc, float* tmp,
                                             int64_t n, bool round) {
  const float* g = gy;
  if (w) {
    for (int64_t i = 0; i < n; ++i) tmp[i] = gy[i] * w[i];
    g = tmp;
  }
  if (gw_acc)
    for (int64_t i = 0; i < n; ++i) gw_acc[i] += gy[i] * maybe_bf16(x[i] * rs, round);
  const float dot = row_dot(g, x, n) * rs / div;
  for (int64_t i = 0; i < n; ++i) gx[i] = rs * (g[i] - x[i] * rs * dot);
}

MYRIAD_CPU_CLONES void add_into(float* acc, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) acc[i] += x[i];
}

// The weight as f32 (null when undefined): in place for f32, converted into buf for bf16.
const float* weight_f32(const Tensor& w, std::vector<float>& buf) {
  if (!w.defined()) return nullptr;
  RowIO io(w);
  if (!io.f32) buf.resize(w.numel());
  return io.load(0, w.numel(), buf.data());
}

// The divisor of the sum of squares: n for RMSNorm's mean, 1 for l2norm's sum.
float divisor(ops::NormOf of, int64_t n) {
  return of == ops::NormOf::MeanSquare ? static_cast<float>(n) : 1.0f;
}

void rms_norm_cpu(const Tensor& x, const Tensor& weight, double eps, ops::NormOf of, Tensor& y,
                  Tensor& rstd) {
  check_row_dtype("rms_norm", x.dtype());
  const int64_t rows = x.shape()[0], n = x.shape()[1];
  const float div = divisor(of, n);
  std::vector<float> wbuf;
  const float* w = weight_f32(weight, wbuf);
  RowIO in(x), out(y);
  const bool round = !in.f32;
  float* rs = rstd.data<float>();
  parallel_for(rows, row_grain(n), [&](int64_t b, int64_t e) {
    std::vector<float> bx(in.f32 ? 0 : n), by(in.f32 ? 0 : n);
    for (int64_t r = b; r < e; ++r) {
      float* dst = out.f32 ? out.row_f32(r, n) : by.data();
      rs[r] =
          rms_norm_row(in.load(r, n, bx.data()), w, static_cast<float>(eps), div, dst, n, round);
      out.store(r, n, dst);
    }
  });
}

void rms_norm_backward_cpu(const Tensor& x, const Tensor& weight, const Tensor& rstd,
                           ops::NormOf of, const Tensor& gy, Tensor& gx, Tensor& gw) {
  check_row_dtype("rms_norm_backward", x.dtype());
  const int64_t rows = x.shape()[0], n = x.shape()[1];
  const float div = divisor(of, n);
  std::vector<float> wbuf;
  const float* w = weight_f32(weight, wbuf);
  RowIO ix(x), ig(gy), og(gx);
  const bool round = !ix.f32;
  const float* rs = rstd.data<float>();
  // One gw partial per chunk of rows; the chunking depends only on rows and the thread count.
  const int64_t chunks =
      std::min<int64_t>(omp_get_max_threads(), (rows + row_grain(n) - 1) / row_grain(n));
  std::vector<float> partial(gw.defined() ? chunks * n : 0, 0.0f);
  parallel_for(chunks, 1, [&](int64_t cb, int64_t ce) {
    std::vector<float> bx(ix.f32 ? 0 : n), bg(ix.f32 ? 0 : n), tmp(w ? n : 0);
    for (int64_t c = cb; c < ce; ++c) {
      float* acc = gw.defined() ? partial.data() + c * n : nullptr;
      for (int64_t r = rows * c / chunks; r < rows * (c + 1) / chunks; ++r) {
        const float* xr = ix.load(r, n, bx.data());
        const float* gr = ig.load(r, n, bg.data());
        float* dst = og.f32 ? og.row_f32(r, n) : bg.data();
        rms_norm_backward_row(xr, w, rs[r], div, gr, dst, acc, tmp.data(), n, round);
        og.store(r, n, dst);
      }
    }
  });
  if (!gw.defined()) return;
  for (int64_t c = 1; c < chunks; ++c) add_into(partial.data(), partial.data() + c * n, n);
  RowIO(gw).store(0, n, partial.data());
}

}  // namespace

MYRIAD_REGISTER_KERNEL(ops::rms_norm_kernels, ops::Backend::CPU, &rms_norm_cpu);
MYRIAD_REGISTER_KERNEL(ops::rms_norm_backward_kernels, ops::Backend::CPU, &rms_norm_backward_cpu);

}  // namespace myriad::cpu
