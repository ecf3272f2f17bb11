// Optimised CPU SiTU-GLU / SwiGLU: one pass over [rows, I] (f32 or bf16 in, f32 math), vectorised
// through runtime-dispatched clones, threaded over spans of rows.
#include <algorithm>

#include "backend/cpu/cpu.h"
#include "backend/cpu/rows.h"
#include "ops/situ.h"

namespace myriad::cpu {
namespace {
using ops::GluKind;
using ops::GluParams;

MYRIAD_ROW_INLINE ops::GluMath<float> math(GluKind kind, float b1, float b2, float g, float u) {
  return ops::glu_math<float>(
      kind, b1, b2, g, u, [](float x) { return 1.0f / (1.0f + fast_exp(-x)); },
      [](float x) { return 1.0f - 2.0f / (1.0f + fast_exp(2.0f * x)); });
}

template <GluKind K>
MYRIAD_CPU_CLONES void glu_span(float b1, float b2, const float* g, const float* u, float* y,
                                int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    auto m = math(K, b1, b2, g[i], u[i]);
    y[i] = m.gate * m.up;
  }
}
template <GluKind K>
MYRIAD_CPU_CLONES void glu_backward_span(float b1, float b2, const float* g, const float* u,
                                         const float* gy, float* gg, float* gu, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    auto m = math(K, b1, b2, g[i], u[i]);
    gg[i] = gy[i] * m.up * m.dgate;
    gu[i] = gy[i] * m.gate * m.dup;
  }
}

// A [rows, n] operand with a row stride, read or written as f32 spans.
struct Operand {
  explicit Operand(const Tensor& t)
      : f32(t.dtype() == DType::F32), p(static_cast<char*>(t.data_ptr())), ld(t.strides()[0]) {}
  bool f32;
  char* p;
  int64_t ld;
  const float* load(int64_t r, int64_t c, int64_t m, float* buf) const {
    if (f32) return reinterpret_cast<const float*>(p) + r * ld + c;
    bf16_row_to_f32(reinterpret_cast<const uint16_t*>(p) + r * ld + c, buf, m);
    return buf;
  }
  float* dst(int64_t r, int64_t c, float* buf) const {
    return f32 ? reinterpret_cast<float*>(p) + r * ld + c : buf;
  }
  void store(int64_t r, int64_t c, int64_t m, const float* src) const {
    if (!f32) f32_row_to_bf16(src, reinterpret_cast<uint16_t*>(p) + r * ld + c, m);
  }
};

constexpr int64_t kSpan = 1024;

// Calls f(row, col, len) over every span of at most kSpan columns, in parallel.
template <class F>
void for_spans(int64_t rows, int64_t n, F&& f) {
  const int64_t per_row = (n + kSpan - 1) / kSpan;
  parallel_for(rows * per_row, std::max<int64_t>(1, (int64_t{1} << 14) / std::min(n, kSpan)),
               [&](int64_t b, int64_t e) {
                 for (int64_t s = b; s < e; ++s) {
                   const int64_t r = s / per_row, c = (s % per_row) * kSpan;
                   f(r, c, std::min(kSpan, n - c));
                 }
               });
}

void glu_cpu(const GluParams& p, const Tensor& gate, const Tensor& up, Tensor& out) {
  check_row_dtype("glu", gate.dtype());
  auto span = p.kind == GluKind::Situ ? &glu_span<GluKind::Situ> : &glu_span<GluKind::Swiglu>;
  const float b1 = static_cast<float>(p.beta1), b2 = static_cast<float>(p.beta2);
  Operand g(gate), u(up), y(out);
  for_spans(gate.shape()[0], gate.shape()[1], [&](int64_t r, int64_t c, int64_t m) {
    float bg[kSpan], bu[kSpan], by[kSpan];
    float* dst = y.dst(r, c, by);
    span(b1, b2, g.load(r, c, m, bg), u.load(r, c, m, bu), dst, m);
    y.store(r, c, m, dst);
  });
}

void glu_backward_cpu(const GluParams& p, const Tensor& gate, const Tensor& up, const Tensor& gy,
                      Tensor& ggate, Tensor& gup) {
  check_row_dtype("glu_backward", gate.dtype());
  auto span = p.kind == GluKind::Situ ? &glu_backward_span<GluKind::Situ>
                                      : &glu_backward_span<GluKind::Swiglu>;
  const float b1 = static_cast<float>(p.beta1), b2 = static_cast<float>(p.beta2);
  Operand g(gate), u(up), dy(gy), dg(ggate), du(gup);
  for_spans(gate.shape()[0], gate.shape()[1], [&](int64_t r, int64_t c, int64_t m) {
    float bg[kSpan], bu[kSpan], bdy[kSpan], bdg[kSpan], bdu[kSpan];
    float* og = dg.dst(r, c, bdg);
    float* ou = du.dst(r, c, bdu);
    span(b1, b2, g.load(r, c, m, bg), u.load(r, c, m, bu), dy.load(r, c, m, bdy), og, ou, m);
    dg.store(r, c, m, og);
    du.store(r, c, m, ou);
  });
}

}  // namespace

MYRIAD_REGISTER_KERNEL(ops::glu_kernels, ops::Backend::CPU, &glu_cpu);
MYRIAD_REGISTER_KERNEL(ops::glu_backward_kernels, ops::Backend::CPU, &glu_backward_cpu);

}  // namespace myriad::cpu
