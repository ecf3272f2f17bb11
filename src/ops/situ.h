// Gated linear units of the FFNs (MODEL.md §8), fused forward and backward, f32 math whatever
// the storage dtype:
//   SiTU-GLU(g, u) = [β1·tanh(g/β1)·σ(g)] ⊙ [β2·tanh(u/β2)]   (K3: β1 = 4 gate, β2 = 25 up)
//   SwiGLU(g, u)   = silu(g) ⊙ u
// The *_fused forms take one [..., 2I] tensor whose first half is the gate, as checkpoints fuse
// the [gate | up] projection, and return [..., I].
#pragma once
#include "core/tensor.h"
#include "ops/dispatch.h"

namespace myriad::ops {

enum class GluKind : uint8_t { Situ, Swiglu };

Tensor situ_glu(const Tensor& gate, const Tensor& up, double beta1 = 4.0, double beta2 = 25.0);
Tensor swiglu(const Tensor& gate, const Tensor& up);
Tensor situ_glu_fused(const Tensor& gate_up, double beta1 = 4.0, double beta2 = 25.0);
Tensor swiglu_fused(const Tensor& gate_up);

// ---- kernels ----
// Every operand is a [rows, I] view with unit column stride and its own row stride (gate and up
// may be the two halves of one fused tensor); all share one dtype.
struct GluParams {
  GluKind kind = GluKind::Situ;
  double beta1 = 4.0, beta2 = 25.0;
};
using GluKernel = void (*)(const GluParams& p, const Tensor& gate, const Tensor& up, Tensor& out);
// ggate = gy · U(u) · G'(g), gup = gy · G(g) · U'(u); both overwritten.
using GluBackwardKernel = void (*)(const GluParams& p, const Tensor& gate, const Tensor& up,
                                   const Tensor& gy, Tensor& ggate, Tensor& gup);
KernelTable<GluKernel>& glu_kernels();
KernelTable<GluBackwardKernel>& glu_backward_kernels();

// The two branches and their derivatives, shared by the reference (double) and CPU (float)
// kernels. σ and tanh are passed in so the CPU kernel can use its vectorisable forms.
template <class T>
struct GluMath {
  T gate, up, dgate, dup;  // G(g), U(u), G'(g), U'(u)
};
template <class T, class Sigmoid, class Tanh>
inline GluMath<T> glu_math(GluKind kind, T b1, T b2, T g, T u, Sigmoid sigmoid, Tanh tanh_) {
  const T s = sigmoid(g);
  if (kind == GluKind::Swiglu) return {g * s, u, s * (T(1) + g * (T(1) - s)), T(1)};
  const T tg = tanh_(g / b1), tu = tanh_(u / b2);
  return {b1 * tg * s, b2 * tu, (T(1) - tg * tg) * s + b1 * tg * s * (T(1) - s), T(1) - tu * tu};
}

}  // namespace myriad::ops
