#include "train/mixed_precision.h"

#include "core/autograd.h"
#include "ops/elementwise.h"

namespace myriad::train {

Bf16Copy::Bf16Copy(const model::Decoder& master)
    : master_(master), copy_(master.config(), master.weights().to(DType::BF16)) {
  copy_.weights().requires_grad_(true);
  for (const auto& [name, t] : master_.weights().tensors())
    if (t.requires_grad()) params_.emplace_back(t, copy_.weights().get(name));
}

void Bf16Copy::accumulate_grads() {
  NoGradGuard ng;
  for (auto& [m, c] : params_) {
    const Tensor g = c.grad();
    if (!g.defined()) continue;
    const Tensor g32 = g.to(DType::F32);
    Tensor mg = m.grad();
    if (mg.defined())
      ops::add_(mg, g32);
    else
      m.set_grad(g32);
    c.zero_grad();
  }
}

void Bf16Copy::refresh() {
  NoGradGuard ng;
  for (const auto& [name, t] : master_.weights().tensors()) {
    Tensor c = copy_.weights().get(name);
    c.copy_(t);
  }
}

}  // namespace myriad::train
