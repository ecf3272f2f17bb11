// The routed-expert FFN (MODEL.md §6; REFERENCE_NOTES §7): sigmoid router whose selection uses
// the score plus the correction bias (selection only), DeepSeek group-limited selection when
// num_expert_group > 1, top-k, weights from the unbiased scores renormalised (+1e-20) and times
// routed_scaling_factor; experts run on their tokens (index_select), combined with
// weighted_index_add by p (differentiable in p and the experts). Router mode latent_similarity
// (MODEL.md §12.2): s_j = σ(<W_rd x, e_j> / √d_r), a rank-d_r factorisation of the full router;
// selection, bias, renormalisation and scaling are unchanged. Optional K3 latent path: experts work
// in a latent width ℓ between routed_expert_down_proj and an RMSNorm + routed_expert_up_proj.
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
class Moe;

// Runs the routed experts of one MoE layer on their rows: xs_MD holds the (token, slot) rows in
// expert order, counts[j] rows for expert j (j = 0 … n-1); the result has the same rows, each the
// output of its expert. The module runs them itself (Moe::run_experts) unless a runner is
// installed: a trainer installs one that sends the rows to the ranks holding the experts and
// brings the outputs back (expert parallel), which this module never needs to know about.
class ExpertRunner {
 public:
  virtual ~ExpertRunner() = default;
  virtual Tensor run(const Moe& moe, const Tensor& xs_MD,
                     const std::vector<int64_t>& counts) const = 0;
};

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
  // Experts first, first + 1, … on rows in expert order (counts[i] rows for expert first + i):
  // one grouped GEMM per projection over the experts that have rows (the others take no part and
  // get no gradient). Output rows = input rows, width = the expert width.
  Tensor run_experts(const Tensor& xs_MD, const std::vector<int64_t>& counts, int64_t first) const;
  int64_t num_experts() const { return n_; }
  // The runner for later forwards (null: run_experts on all experts here). An execution setting,
  // like a thread count, not model state; the runner must outlive its use.
  void set_runner(const ExpertRunner* r) const { runner_ = r; }

 private:
  const Tensor& w(const std::string& name) const { return w_->get(prefix_ + name); }
  // x . W^T through project() (int8 where the weights have a copy).
  Tensor lin(const Tensor& x, const std::string& name) const {
    return project(x, *w_, prefix_ + name);
  }
  std::string expert(int64_t j, int which) const;  // which: 0 gate, 1 up, 2 down
  const Weights* w_;
  std::string prefix_;
  bool deepseek_names_;
  GluAct act_;
  int64_t n_, k_, groups_, topk_group_, shared_;
  bool renorm_, latent_, latent_norm_, latent_router_;
  double scale_, eps_, router_scale_;  // router_scale_ = 1/√d_r
  std::vector<std::string> x_projs_;   // routed_expert_down_proj [, shared gate, shared up]
  mutable RouteStats last_;            // overwritten by every route()
  mutable const ExpertRunner* runner_ = nullptr;
};

}  // namespace myriad::model
