// CUDA SiTU-GLU / SwiGLU (MODEL.md §8) over [rows, I] views with unit column stride and their own
// row strides (gate and up may be the two halves of one fused tensor): one thread per element,
// f32 math for f32/bf16 storage (f64 for f64), with the formulas of ops::glu_math (situ.h's
// template is host-only, so they are repeated here). A 2-d grid: x over column tiles, y over rows,
// both grid-stride.
#include <algorithm>
#include <cmath>

#include "backend/cuda/kernels.cuh"
#include "ops/situ.h"

namespace myriad::gpu {
namespace {
using ops::GluKind;
using ops::GluParams;

template <class A>
struct GluVals {
  A gate, up, dgate, dup;  // G(g), U(u), G'(g), U'(u)
};

// ops::glu_math with σ(x) = 1 / (1 + e^-x) and tanh.
template <class A>
__device__ inline GluVals<A> glu_math(GluKind kind, A b1, A b2, A g, A u) {
  const A s = A(1) / (A(1) + std::exp(-g));
  if (kind == GluKind::Swiglu) return {g * s, u, s * (A(1) + g * (A(1) - s)), A(1)};
  const A tg = std::tanh(g / b1), tu = std::tanh(u / b2);
  return {b1 * tg * s, b2 * tu, (A(1) - tg * tg) * s + b1 * tg * s * (A(1) - s), A(1) - tu * tu};
}

// A [rows, n] operand: base pointer and row stride in elements.
template <class T>
struct View {
  T* p;
  int64_t ld;
};

template <class T>
__global__ void glu_kernel(GluKind kind, Acc<T> b1, Acc<T> b2, View<const T> g, View<const T> u,
                           View<T> y, int64_t rows, int64_t n) {
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t cs = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y)
    for (int64_t c = c0; c < n; c += cs) {
      const auto m = glu_math(kind, b1, b2, ld(g.p[r * g.ld + c]), ld(u.p[r * u.ld + c]));
      y.p[r * y.ld + c] = st<T>(m.gate * m.up);
    }
}

template <class T>
__global__ void glu_backward_kernel(GluKind kind, Acc<T> b1, Acc<T> b2, View<const T> g,
                                    View<const T> u, View<const T> gy, View<T> gg, View<T> gu,
                                    int64_t rows, int64_t n) {
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t cs = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y)
    for (int64_t c = c0; c < n; c += cs) {
      const auto m = glu_math(kind, b1, b2, ld(g.p[r * g.ld + c]), ld(u.p[r * u.ld + c]));
      const Acc<T> d = ld(gy.p[r * gy.ld + c]);
      gg.p[r * gg.ld + c] = st<T>(d * m.up * m.dgate);
      gu.p[r * gu.ld + c] = st<T>(d * m.gate * m.dup);
    }
}

template <class T>
View<const T> cview(const Tensor& t) {
  return {cptr<T>(t), t.strides()[0]};
}
template <class T>
View<T> mview(Tensor& t) {
  return {mptr<T>(t), t.strides()[0]};
}

// Column tiles of kThreads (at most 64), and enough row blocks for ~4096 blocks in all.
dim3 glu_grid(int64_t rows, int64_t n) {
  const int64_t gx = std::clamp<int64_t>((n + kThreads - 1) / kThreads, 1, 64);
  const int64_t gy = std::clamp<int64_t>((4096 + gx - 1) / gx, 1, std::min<int64_t>(rows, 65535));
  return dim3(static_cast<unsigned>(gx), static_cast<unsigned>(gy));
}

void check_views(const char* name, std::initializer_list<const Tensor*> ts) {
  for (const Tensor* t : ts)
    MYRIAD_CHECK(t->dim() == 2 && (t->shape()[1] <= 1 || t->strides()[1] == 1), name,
                 ": the cuda kernel takes [rows, I] views with unit column stride, got ",
                 t->desc());
}

void glu_cuda(const GluParams& p, const Tensor& gate, const Tensor& up, Tensor& out) {
  check_views("glu", {&gate, &up, &out});
  const int64_t rows = gate.shape()[0], n = gate.shape()[1];
  if (rows == 0 || n == 0) return;
  dispatch_float("glu", gate.dtype(), [&](auto tag) {
    using T = decltype(tag);
    launch("glu", out.device().index, glu_grid(rows, n), kThreads, &glu_kernel<T>, p.kind,
           static_cast<Acc<T>>(p.beta1), static_cast<Acc<T>>(p.beta2), cview<T>(gate), cview<T>(up),
           mview<T>(out), rows, n);
  });
}

void glu_backward_cuda(const GluParams& p, const Tensor& gate, const Tensor& up, const Tensor& gy,
                       Tensor& ggate, Tensor& gup) {
  check_views("glu_backward", {&gate, &up, &gy, &ggate, &gup});
  const int64_t rows = gate.shape()[0], n = gate.shape()[1];
  if (rows == 0 || n == 0) return;
  dispatch_float("glu_backward", gate.dtype(), [&](auto tag) {
    using T = decltype(tag);
    launch("glu_backward", ggate.device().index, glu_grid(rows, n), kThreads,
           &glu_backward_kernel<T>, p.kind, static_cast<Acc<T>>(p.beta1),
           static_cast<Acc<T>>(p.beta2), cview<T>(gate), cview<T>(up), cview<T>(gy),
           mview<T>(ggate), mview<T>(gup), rows, n);
  });
}

}  // namespace

MYRIAD_REGISTER_KERNEL(ops::glu_kernels, ops::Backend::CUDA, &glu_cuda);
MYRIAD_REGISTER_KERNEL(ops::glu_backward_kernels, ops::Backend::CUDA, &glu_backward_cuda);

}  // namespace myriad::gpu
