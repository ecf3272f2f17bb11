#include "model/moe.h"

#include <algorithm>
#include <cmath>

#include "core/autograd.h"
#include "core/error.h"
#include "ops/ops.h"

namespace myriad::model {

Moe::Moe(const ModelConfig& c, const Weights* w, int64_t layer)
    : w_(w),
      prefix_(prefix(c, layer)),
      deepseek_names_(c.is_deepseek()),
      act_(GluAct::from(c)),
      n_(c.num_experts),
      k_(c.num_experts_per_token),
      groups_(c.num_expert_group),
      topk_group_(c.topk_group),
      shared_(c.num_shared_experts),
      renorm_(c.moe_renormalize),
      latent_(c.uses_latent_moe()),
      latent_norm_(c.latent_moe_use_norm),
      latent_router_(c.myriad.router.mode == "latent_similarity"),
      scale_(c.routed_scaling_factor),
      eps_(c.rms_norm_eps),
      router_scale_(1.0 / std::sqrt(static_cast<double>(c.myriad.router.latent_dim))) {
  MYRIAD_CHECK(c.moe_router_activation_func == "sigmoid", "model: router activation ",
               c.moe_router_activation_func, " is not supported (sigmoid only)");
  MYRIAD_CHECK(groups_ >= 1 && n_ % groups_ == 0 && topk_group_ >= 1 && topk_group_ <= groups_,
               "model: ", n_, " experts do not split into ", groups_, " groups (topk_group ",
               topk_group_, ")");
  if (latent_) x_projs_.push_back(prefix_ + "routed_expert_down_proj.weight");
  if (shared_ > 0)
    for (const char* n : {"gate_proj", "up_proj"})
      x_projs_.push_back(prefix_ + "shared_experts." + n + ".weight");
}

std::string Moe::prefix(const ModelConfig& c, int64_t layer) {
  return layer_prefix(layer) + (c.is_deepseek() ? "mlp." : "block_sparse_moe.");
}

std::string Moe::expert(int64_t j, int which) const {
  static const char* kimi[] = {"w1", "w3", "w2"};
  static const char* ds[] = {"gate_proj", "up_proj", "down_proj"};
  return "experts." + std::to_string(j) + "." + (deepseek_names_ ? ds : kimi)[which] + ".weight";
}

void Moe::add_specs(const ModelConfig& c, int64_t layer, std::vector<ParamSpec>& out) {
  const std::string p = prefix(c, layer);
  const int64_t d = c.hidden_size, n = c.num_experts, I = c.moe_intermediate_size;
  const int64_t l = c.routed_expert_hidden_size.value_or(d);
  // transformers keeps the kimi MoE under mlp.* in memory, with fused experts (MODEL.md §11.2).
  const std::string alt = c.is_deepseek() ? "" : layer_prefix(layer) + "mlp.";
  auto add = [&](const std::string& nm, Shape s, Init init = Init::Normal, bool train = true,
                 std::vector<FusedSource> fused = {}) {
    std::vector<std::string> aliases;
    if (!alt.empty()) aliases.push_back(alt + nm);
    out.push_back({p + nm, std::move(s), init, train, aliases, std::move(fused)});
  };
  if (c.myriad.router.mode == "latent_similarity") {
    add("gate.latent_proj.weight", {c.myriad.router.latent_dim, d});
    add("gate.expert_embed", {n, c.myriad.router.latent_dim});
  } else {
    add("gate.weight", {n, d});
  }
  add("gate.e_score_correction_bias", {n}, Init::Zeros, false);
  if (c.uses_latent_moe()) add("routed_expert_down_proj.weight", {l, d});
  Moe names(c, nullptr, layer);
  for (int64_t j = 0; j < n; ++j) {
    std::vector<FusedSource> gu, dn;
    for (const std::string& q : {p, alt})
      if (!q.empty()) {
        gu.push_back({q + "experts.gate_up_proj", j, 0, I});
        dn.push_back({q + "experts.down_proj", j, 0, 0});
      }
    auto up = gu;
    for (auto& f : up) f.begin = I, f.end = 2 * I;
    add(names.expert(j, 0), {I, l}, Init::Normal, true, gu);
    add(names.expert(j, 1), {I, l}, Init::Normal, true, up);
    add(names.expert(j, 2), {l, I}, Init::Normal, true, dn);
  }
  if (c.uses_latent_moe()) {
    if (c.latent_moe_use_norm) add("routed_expert_norm.weight", {l}, Init::Ones);
    add("routed_expert_up_proj.weight", {d, l});
  }
  if (c.num_shared_experts > 0) {
    const int64_t Is = c.num_shared_experts * I;
    add("shared_experts.gate_proj.weight", {Is, d});
    add("shared_experts.up_proj.weight", {Is, d});
    add("shared_experts.down_proj.weight", {d, Is});
  }
}

Routing Moe::route(const Tensor& x_ND) const {
  const int64_t N = x_ND.size(0);
  Tensor s_NE = ops::sigmoid(
      latent_router_
          ? ops::mul(ops::linear(lin(x_ND, "gate.latent_proj.weight"), w("gate.expert_embed")),
                     router_scale_)
          : ops::linear(x_ND, w("gate.weight")));
  Tensor idx;
  {
    NoGradGuard ng;  // selection carries no gradient; the bias only selects
    Tensor sel = ops::add(s_NE.detach(), w("gate.e_score_correction_bias"));
    if (groups_ > 1) {
      const int64_t gsz = n_ / groups_;
      Tensor top =
          ops::topk(ops::reshape(sel, {N, groups_, gsz}), std::min<int64_t>(2, gsz)).values;
      Tensor gidx = ops::topk(ops::sum(top, {-1}), topk_group_).indices;  // [N, topk_group]
      Tensor keep =
          ops::scatter_add(Tensor::zeros({N, groups_}, sel.dtype(), sel.device()), 1, gidx,
                           Tensor::ones({N, topk_group_}, sel.dtype(), sel.device()));
      Tensor keep_NE =
          ops::reshape(ops::mul(Tensor::ones({N, groups_, gsz}, sel.dtype(), sel.device()),
                                ops::unsqueeze(keep, -1)),
                       {N, n_});
      sel = ops::add(sel, ops::mul(ops::add(keep_NE, -1.0), 1e30));  // dropped groups -> -1e30
    }
    idx = ops::topk(sel, k_).indices;
    last_ = {s_NE.detach().to(DType::F32), idx, s_NE.requires_grad() ? s_NE : Tensor()};
  }
  Tensor p = ops::gather(s_NE, 1, idx);
  if (renorm_) p = ops::div(p, ops::add(ops::sum(p, {-1}, true), 1e-20));
  return {idx, ops::mul(p, scale_)};
}

Tensor Moe::run_experts(const Tensor& xs_MD, const std::vector<int64_t>& counts,
                        int64_t first) const {
  MYRIAD_CHECK(first >= 0 && first + static_cast<int64_t>(counts.size()) <= n_, "model: experts ",
               first, " + ", counts.size(), " of ", n_);
  std::vector<int64_t> offsets = {0};
  std::vector<std::string> wg, wu, wd;
  for (size_t i = 0; i < counts.size(); ++i) {
    if (counts[i] == 0) continue;
    const int64_t j = first + static_cast<int64_t>(i);
    offsets.push_back(offsets.back() + counts[i]);
    wg.push_back(prefix_ + expert(j, 0)), wu.push_back(prefix_ + expert(j, 1));
    wd.push_back(prefix_ + expert(j, 2));
  }
  MYRIAD_CHECK(offsets.back() == xs_MD.size(0), "model: expert counts sum to ", offsets.back(),
               " but ", xs_MD.size(0), " rows came");
  // No rows (a rank whose experts got no tokens): an empty result that stays in the graph.
  if (wg.empty()) return ops::mul(xs_MD, 0.0);
  // Every expert's gate and up projections in one grouped product, [gate | up] per row.
  const Tensor gu = project_grouped_cat(xs_MD, offsets, *w_, {wg, wu});
  return project_grouped(glu_fused(act_, gu), offsets, *w_, wd);
}

Tensor Moe::forward(const Tensor& x_BTD) const {
  const int64_t B = x_BTD.size(0), T = x_BTD.size(1), d = x_BTD.size(2), N = B * T;
  Tensor x_ND = ops::reshape(x_BTD, {N, d});
  Routing r = route(x_ND);
  // Every (token, slot) choice in expert order, tokens ascending within an expert: counts and
  // offsets in one pass (host bookkeeping of the discrete choice). The experts then run as
  // grouped GEMMs over those contiguous rows, and the outputs are weighted and summed back per
  // token in one op (weighted_index_add), in increasing expert order, as transformers sums.
  const std::vector<int64_t> ids = r.idx_NK.to_ints();
  std::vector<int64_t> count(n_ + 1, 0);
  for (int64_t j : ids) ++count[j + 1];
  std::vector<int64_t> at(count.begin(), count.end() - 1);
  for (int64_t j = 1; j < n_; ++j) at[j] = at[j - 1] + count[j];
  std::vector<int64_t> tok(ids.size()), slot(ids.size());
  for (int64_t t = 0; t < N; ++t)
    for (int64_t s = 0; s < k_; ++s) {
      const int64_t q = at[ids[t * k_ + s]]++;
      tok[q] = t, slot[q] = t * k_ + s;
    }
  // The products of x that do not wait for the routing, as one: the latent down-projection and
  // the shared experts' gate and up.
  std::vector<int64_t> cols;
  for (const std::string& n : x_projs_) cols.push_back(w_->get(n).size(0));
  std::vector<Tensor> xp;
  if (!x_projs_.empty()) xp = ops::split(project_cat(x_ND, *w_, x_projs_), cols, -1);
  Tensor xin = latent_ ? xp[0] : x_ND;
  const int64_t M = N * k_;
  Tensor tok_t = Tensor::from_ints(tok, {M}, DType::I64, xin.device());
  Tensor slot_t = Tensor::from_ints(slot, {M}, DType::I64, xin.device());
  Tensor xs = ops::index_select(xin, 0, tok_t);
  const std::vector<int64_t> per_expert(count.begin() + 1, count.end());
  Tensor ys = runner_ ? runner_->run(*this, xs, per_expert) : run_experts(xs, per_expert, 0);
  Tensor p_M = ops::index_select(ops::reshape(r.p_NK, {M}), 0, slot_t);
  Tensor y = ops::weighted_index_add(N, tok_t, ys, p_M.to(ys.dtype()));
  if (latent_) {
    if (latent_norm_) y = ops::rms_norm(y, w("routed_expert_norm.weight"), eps_);
    y = lin(y, "routed_expert_up_proj.weight");
  }
  if (shared_ > 0) {
    const size_t g = latent_ ? 1 : 0;
    y = ops::add(y, lin(glu(act_, xp[g], xp[g + 1]), "shared_experts.down_proj.weight"));
  }
  return ops::reshape(y, {B, T, d});
}

}  // namespace myriad::model
