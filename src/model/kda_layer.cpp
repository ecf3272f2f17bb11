#include "model/kda_layer.h"

#include "core/error.h"
#include "ops/ops.h"

namespace myriad::model {

KdaLayer::KdaLayer(const ModelConfig& c, const Weights* w, int64_t layer)
    : w_(w),
      prefix_(layer_prefix(layer) + "self_attn."),
      H_(c.linear_attn_config.num_heads),
      dk_(c.linear_attn_config.head_dim),
      K_(c.linear_attn_config.short_conv_kernel_size),
      eps_(c.rms_norm_eps),
      lower_bound_(c.linear_attn_config.gate_lower_bound.has_value()),
      full_rank_gate_(c.linear_attn_config.use_full_rank_gate),
      g_min_(c.linear_attn_config.gate_lower_bound.value_or(-5.0)) {
  for (const char* n : {"q_proj", "k_proj", "v_proj", "f_a_proj", "b_proj",
                        full_rank_gate_ ? "g_proj" : "g_a_proj"})
    x_projs_.push_back(prefix_ + n + ".weight");
}

void KdaLayer::add_specs(const ModelConfig& c, int64_t layer, std::vector<ParamSpec>& out) {
  const auto& lac = c.linear_attn_config;
  const int64_t d = c.hidden_size, H = lac.num_heads, dk = lac.head_dim, P = H * dk,
                K = lac.short_conv_kernel_size;
  const std::string p = layer_prefix(layer) + "self_attn.";
  auto add = [&](const std::string& n, Shape s, Init init = Init::Normal) {
    out.push_back({p + n, std::move(s), init, true, {}, {}});
  };
  for (const char* x : {"q", "k", "v"}) add(std::string(x) + "_proj.weight", {P, d});
  for (const char* x : {"q", "k", "v"}) add(std::string(x) + "_conv1d.weight", {P, 1, K});
  add("f_a_proj.weight", {dk, d});
  add("f_b_proj.weight", {P, dk});
  add("dt_bias", {P}, Init::DtBias);
  // The K3 lower-bounded gate starts from A_log = 0 (MODEL.md §4.1).
  add("A_log", {1, 1, H, 1}, lac.gate_lower_bound ? Init::Zeros : Init::ALog);
  add("b_proj.weight", {H, d});
  if (lac.use_full_rank_gate) {
    add("g_proj.weight", {P, d});
  } else {
    add("g_a_proj.weight", {dk, d});
    add("g_b_proj.weight", {P, dk});
  }
  add("o_norm.weight", {dk}, Init::Ones);
  add("o_proj.weight", {d, P});
}

Tensor KdaLayer::forward(const Tensor& x_BTD, KdaState* state) const {
  const int64_t B = x_BTD.size(0), T = x_BTD.size(1), P = H_ * dk_;
  // Every projection of x as one product: q̂ k̂ v̂, the decay gate's f_a, the write strength's b
  // and the output gate's g_a (or full-rank g). Then the short conv over [q̂; k̂; v̂] (tap K-1
  // multiplies the current token).
  auto xs = ops::split(project_cat(x_BTD, *w_, x_projs_),
                       {3 * P, dk_, H_, full_rank_gate_ ? P : dk_}, -1);
  Tensor qkv_BTC = xs[0];
  Tensor wconv_CK = ops::concat(
      {ops::reshape(w("q_conv1d.weight"), {P, K_}), ops::reshape(w("k_conv1d.weight"), {P, K_}),
       ops::reshape(w("v_conv1d.weight"), {P, K_})},
      0);
  Tensor prev_conv = state ? state->conv_BCK : Tensor();
  Tensor u_BTC = ops::silu(ops::conv1d_causal(qkv_BTC, wconv_CK, prev_conv));
  if (state) state->conv_BCK = ops::conv1d_next_state(qkv_BTC, prev_conv, K_);
  auto parts = ops::split(u_BTC, {P, P, P}, -1);
  const Shape heads = {B, T, H_, dk_};
  Tensor q = ops::l2norm(ops::reshape(parts[0], heads));
  Tensor k = ops::l2norm(ops::reshape(parts[1], heads));
  Tensor v = ops::reshape(parts[2], heads);
  // Decay gate (f32) and write strength.
  Tensor z_BTP = lin(xs[1], "f_b_proj.weight");
  Tensor g = lower_bound_ ? ops::kda_gate_lower_bound(z_BTP, w("A_log"), w("dt_bias"), g_min_)
                          : ops::kda_gate_softplus(z_BTP, w("A_log"), w("dt_bias"));
  g = ops::reshape(g, heads);
  Tensor beta_BTH = ops::sigmoid(xs[2]);
  Tensor s0 = state ? state->S_BHKV : Tensor();
  ops::KdaOutput r = state && T == 1 ? ops::kda_step(q, k, v, g, beta_BTH, s0)
                                     : ops::kda(q, k, v, g, beta_BTH, s0);
  if (state) state->S_BHKV = r.final_state;
  // Gated RMSNorm per head (one weight shared by all heads), then o_proj.
  Tensor gate = full_rank_gate_ ? xs[3] : lin(xs[3], "g_b_proj.weight");
  Tensor o = ops::mul(ops::rms_norm(r.o, w("o_norm.weight"), eps_),
                      ops::sigmoid(ops::reshape(gate, heads)));
  return lin(ops::reshape(o, {B, T, P}), "o_proj.weight");
}

// Rows [1, ...] stacked into [N, ...]: the tensor they are consecutive rows of when they are (the
// views a batched step left, same sequences in the same order), else a copy.
Tensor KdaLayer::stacked(const std::vector<Tensor>& rows) {
  const Tensor& a = rows[0];
  const int64_t n = static_cast<int64_t>(rows.size()), row = a.numel();
  bool views = a.size(0) == 1 && a.is_contiguous();
  for (int64_t i = 1; views && i < n; ++i) {
    const Tensor& r = rows[static_cast<size_t>(i)];
    views = r.storage() == a.storage() && r.offset() == a.offset() + i * row &&
            r.shape() == a.shape() && r.is_contiguous();
  }
  if (!views) return ops::concat(rows, 0);
  Shape s = a.shape();
  s[0] = n;
  return a.view_as_strided(s, contiguous_strides(s), a.offset());
}

Tensor KdaLayer::forward_batch(const Tensor& x_N1D, const std::vector<KdaState*>& states) const {
  const int64_t N = x_N1D.size(0);
  MYRIAD_CHECK(x_N1D.dim() == 3 && x_N1D.size(1) == 1 && static_cast<int64_t>(states.size()) == N,
               "kda: a batched decode step takes x [N, 1, d] and N states, got ", x_N1D.desc(),
               " and ", states.size(), " states");
  if (N == 1) return forward(x_N1D, states[0]);  // the state as it is: no stacking copies
  std::vector<Tensor> conv, S;
  for (const KdaState* s : states) {
    MYRIAD_CHECK(s && s->conv_BCK.defined() && s->S_BHKV.defined(),
                 "kda: a batched decode step needs prefilled states");
    conv.push_back(s->conv_BCK), S.push_back(s->S_BHKV);
  }
  KdaState all{stacked(conv), stacked(S)};
  Tensor y = forward(x_N1D, &all);
  // Each sequence keeps its row of the new states as a view: the next step of the same batch
  // finds them stacked already (a sequence that leaves keeps its row alive, not a copy).
  for (int64_t n = 0; n < N; ++n) {
    states[n]->conv_BCK = ops::slice(all.conv_BCK, 0, n, n + 1);
    states[n]->S_BHKV = ops::slice(all.S_BHKV, 0, n, n + 1);
  }
  return y;
}

}  // namespace myriad::model
