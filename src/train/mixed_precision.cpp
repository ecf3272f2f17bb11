#include "train/mixed_precision.h"

#include <set>

#include "core/autograd.h"
#include "ops/elementwise.h"

namespace myriad::train {

Bf16Copy::Bf16Copy(const model::Decoder& master)
    : master_(master), copy_(master.config(), master.weights().to(DType::BF16)) {
  copy_.weights().requires_grad_(true);
  for (const auto& [name, t] : master_.weights().tensors()) {
    if (t.requires_grad()) params_.emplace_back(t, copy_.weights().get(name));
    unmirrored_.emplace_back(t, copy_.weights().get(name));  // until attach()
  }
}

void Bf16Copy::accumulate_grads() {
  NoGradGuard ng;
  for (auto& [m, c] : params_) {
    const Tensor g = c.grad();
    if (!g.defined()) continue;
    Tensor mg = m.grad();
    if (!mg.defined()) {
      m.set_grad(g);  // as it is: one conversion pass less (the copy then drops its reference)
    } else {
      if (mg.dtype() != DType::F32) m.set_grad(mg = mg.to(DType::F32));
      ops::add_(mg, g.to(DType::F32));
    }
    c.zero_grad();
  }
}

void Bf16Copy::attach(Optimizer& opt) {
  NamedParams low;
  for (const auto& [name, t] : master_.weights().tensors())
    low.emplace_back(name, copy_.weights().get(name));
  const std::vector<std::string> taken = opt.mirror_into(low);
  const std::set<std::string> mirrored(taken.begin(), taken.end());
  unmirrored_.clear();
  for (const auto& [name, t] : master_.weights().tensors())
    if (!mirrored.contains(name)) unmirrored_.emplace_back(t, copy_.weights().get(name));
}

void Bf16Copy::refresh_buffers() {
  NoGradGuard ng;
  for (auto& [m, c] : unmirrored_) c.copy_(m);
}

void Bf16Copy::refresh() {
  NoGradGuard ng;
  for (const auto& [name, t] : master_.weights().tensors()) {
    Tensor c = copy_.weights().get(name);
    c.copy_(t);
  }
}

}  // namespace myriad::train
