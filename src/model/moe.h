// The routed-expert FFN (MODEL.md §6; REFERENCE_NOTES §7): sigmoid router whose selection uses
// the score plus the correction bias (selection only), DeepSeek group-limited selection when
// num_expert_group > 1, top-k, weights from the unbiased scores renormalised (+1e-20) and times
// routed_scaling_factor; experts run on their tokens (index_select), combined with index_add
// weighted by p (differentiable in p and the experts). Router mode latent_similarity (MODEL.md
// §12.2): s_j = σ(<W_rd x, e_j> / √d_r), a rank-d_r factorisation of the full router; selection,
// bias, renormalisation and scaling are unchanged. Optional K3 latent path: experts work in
// a latent width ℓ between routed_expert_down_proj and an RMSNorm + routed_expert_up_proj.
// Shared experts are one fused GLU MLP added unscaled.
#pragma once
#include <string>
#include <vector>

#include "model/config.h"
#include "model/ffn.h"
#include "model/weights.h"

namespace myriad::model {

struct Routing {
  Tensor idx_NK;  // i64 [N, k], the chosen experts
  Tensor p_NK;    // [N, k] mixture weights (differentiable)
};

// What the last route() saw, for balancers and monitors (TRAINING.md §3-4): detached, except
// scores_graph, the same scores in the model's dtype with their autograd history (defined only when
// they require grad), for auxiliary losses on the router (MODEL.md §12.3 aux_loss).
struct RouteStats {
  Tensor scores_Nn;    // f32 [N, n] unbiased sigmoid scores
  Tensor selected_Nk;  // i64 [N, k] chosen experts
  Tensor scores_graph;
};

class Moe {
 public:
  Moe(const ModelConfig& c, const Weights* w, int64_t layer);
  static void add_specs(const ModelConfig& c, int64_t layer, std::vector<ParamSpec>& out);
  // The checkpoint prefix of layer i's MoE ("...block_sparse_moe." or deepseek's "...mlp.").
  static std::string prefix(const ModelConfig& c, int64_t layer);
  Routing route(const Tensor& x_ND) const;
  Tensor forward(const Tensor& x_BTD) const;
  const RouteStats& last_route() const { return last_; }

 private:
  const Tensor& w(const std::string& name) const { return w_->get(prefix_ + name); }
  std::string expert(int64_t j, int which) const;  // which: 0 gate, 1 up, 2 down
  const Weights* w_;
  std::string prefix_;
  bool deepseek_names_;
  GluAct act_;
  int64_t n_, k_, groups_, topk_group_, shared_;
  bool renorm_, latent_, latent_norm_, latent_router_;
  double scale_, eps_, router_scale_;  // router_scale_ = 1/√d_r
  mutable RouteStats last_;            // overwritten by every route()
};

}  // namespace myriad::model
