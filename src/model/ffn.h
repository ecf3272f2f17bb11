// Gated-linear-unit FFNs (MODEL.md §6, §8): the dense layer-0 MLP, also used for the fused
// shared experts and each routed expert: y = W_down act(W_gate x, W_up x), with act SwiGLU
// (hidden_act "silu") or SiTU-GLU (hidden_act "situ").
#pragma once
#include <string>
#include <vector>

#include "model/config.h"
#include "model/weights.h"

namespace myriad::model {

struct GluAct {
  bool situ = false;
  double beta1 = 4.0, beta2 = 25.0;
  static GluAct from(const ModelConfig& c);
};
// act(gate, up), element-wise.
Tensor glu(const GluAct& a, const Tensor& gate, const Tensor& up);
// The same on one [..., 2I] tensor whose first half is the gate.
Tensor glu_fused(const GluAct& a, const Tensor& gate_up);
// W_down act(W_gate x, W_up x) for x [..., d].
// prefix + {gate,up,down}_proj.weight through project() (int8 where the weights have copies).
Tensor glu_mlp(const GluAct& a, const Tensor& x, const Weights& w, const std::string& prefix);

// The dense FFN of a non-MoE layer: `model.layers.{i}.mlp.{gate,up,down}_proj.weight`
// (kimi checkpoints saved by transformers 5.24 spell it block_sparse_moe.*; both load).
class DenseFfn {
 public:
  DenseFfn(const ModelConfig& c, const Weights* w, int64_t layer);
  static void add_specs(const ModelConfig& c, int64_t layer, std::vector<ParamSpec>& out);
  Tensor forward(const Tensor& x_BTD) const;

 private:
  const Weights* w_;
  std::string prefix_;
  GluAct act_;
};

}  // namespace myriad::model
