#include "model/ffn.h"

#include "core/error.h"
#include "ops/matmul.h"
#include "ops/shape.h"
#include "ops/situ.h"

namespace myriad::model {

GluAct GluAct::from(const ModelConfig& c) {
  MYRIAD_CHECK(c.hidden_act == "silu" || c.hidden_act == "situ",
               "model: hidden_act must be silu or situ, got ", c.hidden_act);
  return {c.hidden_act == "situ", c.activation_situ_beta, c.activation_situ_linear_beta};
}

Tensor glu(const GluAct& a, const Tensor& gate, const Tensor& up) {
  return a.situ ? ops::situ_glu(gate, up, a.beta1, a.beta2) : ops::swiglu(gate, up);
}

Tensor glu_fused(const GluAct& a, const Tensor& gate_up) {
  return a.situ ? ops::situ_glu_fused(gate_up, a.beta1, a.beta2) : ops::swiglu_fused(gate_up);
}

Tensor glu_mlp(const GluAct& a, const Tensor& x, const Weights& w, const std::string& prefix) {
  const std::string g = prefix + "gate_proj.weight", u = prefix + "up_proj.weight";
  const auto gu = ops::split(project_cat(x, w, {g, u}), {w.get(g).size(0), w.get(u).size(0)}, -1);
  return project(glu(a, gu[0], gu[1]), w, prefix + "down_proj.weight");
}

DenseFfn::DenseFfn(const ModelConfig& c, const Weights* w, int64_t layer)
    : w_(w), prefix_(layer_prefix(layer) + "mlp."), act_(GluAct::from(c)) {}

void DenseFfn::add_specs(const ModelConfig& c, int64_t layer, std::vector<ParamSpec>& out) {
  const std::string p = layer_prefix(layer);
  const int64_t d = c.hidden_size, I = c.intermediate_size;
  auto spec = [&](const char* n, Shape s) {
    std::vector<std::string> alias;
    if (!c.is_deepseek()) alias.push_back(p + "block_sparse_moe." + n);
    out.push_back({p + "mlp." + n, std::move(s), Init::Normal, true, alias, {}});
  };
  spec("gate_proj.weight", {I, d});
  spec("up_proj.weight", {I, d});
  spec("down_proj.weight", {d, I});
}

Tensor DenseFfn::forward(const Tensor& x_BTD) const {
  return glu_mlp(act_, x_BTD, *w_, prefix_);
}

}  // namespace myriad::model
