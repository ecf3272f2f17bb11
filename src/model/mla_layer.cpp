#include "model/mla_layer.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "core/error.h"
#include "ops/attention.h"
#include "ops/ops.h"

namespace myriad::model {

namespace {

constexpr double kLoraNormEps = 1e-6;  // q_a / kv_a layernorms, whatever rms_norm_eps says

double yarn_mscale(double s, double m) {
  return s <= 1.0 ? 1.0 : 0.1 * m * std::log(s) + 1.0;
}

}  // namespace

Rope Rope::from(const ModelConfig& c) {
  Rope r;
  const int64_t dr = c.qk_rope_head_dim;
  const double base = c.rope_theta;
  r.interleave = c.rope_interleave.value_or(true);
  for (int64_t i = 0; i < dr / 2; ++i)
    r.inv_freq.push_back(std::pow(base, -2.0 * static_cast<double>(i) / static_cast<double>(dr)));
  if (!c.rope_scaling || c.rope_scaling->type != "yarn") return r;
  // YaRN (transformers _compute_yarn_parameters): always applied, whatever the length.
  const RopeScaling& y = *c.rope_scaling;
  const double s = y.factor, L0 = static_cast<double>(y.original_max_position_embeddings);
  const double bf = y.beta_fast > 0 ? y.beta_fast : 32.0, bs = y.beta_slow > 0 ? y.beta_slow : 1.0;
  auto corr = [&](double n) {
    return static_cast<double>(dr) * std::log(L0 / (2 * std::numbers::pi * n)) /
           (2 * std::log(base));
  };
  double low = std::max(std::floor(corr(bf)), 0.0);
  double high = std::min(std::ceil(corr(bs)), static_cast<double>(dr - 1));
  if (low == high) high += 0.001;
  for (int64_t i = 0; i < dr / 2; ++i) {
    const double ramp = std::clamp((static_cast<double>(i) - low) / (high - low), 0.0, 1.0);
    r.inv_freq[i] = r.inv_freq[i] * (1 - ramp) + r.inv_freq[i] / s * ramp;
  }
  // ModelConfig always carries mscale / mscale_all_dim (default 1), so the "both set" branch.
  r.attention_factor = y.mscale && y.mscale_all_dim
                           ? yarn_mscale(s, y.mscale) / yarn_mscale(s, y.mscale_all_dim)
                           : yarn_mscale(s, 1.0);
  if (y.mscale_all_dim) r.softmax_mscale = std::pow(yarn_mscale(s, y.mscale_all_dim), 2);
  return r;
}

MlaLayer::MlaLayer(const ModelConfig& c, const Weights* w, int64_t layer)
    : w_(w),
      prefix_(layer_prefix(layer) + "self_attn."),
      H_(c.num_attention_heads),
      dn_(c.qk_nope_head_dim),
      dr_(c.qk_rope_head_dim),
      dv_(c.v_head_dim),
      r_(c.kv_lora_rank),
      q_lora_(c.q_lora_rank.has_value()),
      gate_(c.mla_use_output_gate),
      rope_on_(c.is_deepseek() && c.qk_rope_head_dim > 0),
      rope_(Rope::from(c)) {
  tau_ = 1.0 / std::sqrt(static_cast<double>(dn_ + dr_));
  if (rope_on_) tau_ *= rope_.softmax_mscale;
}

void MlaLayer::add_specs(const ModelConfig& c, int64_t layer, std::vector<ParamSpec>& out) {
  const int64_t d = c.hidden_size, H = c.num_attention_heads, dn = c.qk_nope_head_dim,
                dr = c.qk_rope_head_dim, dv = c.v_head_dim, r = c.kv_lora_rank;
  const std::string p = layer_prefix(layer) + "self_attn.";
  auto add = [&](const char* n, Shape s, Init init = Init::Normal) {
    out.push_back({p + n, std::move(s), init, true, {}, {}});
  };
  if (c.q_lora_rank) {
    add("q_a_proj.weight", {*c.q_lora_rank, d});
    add("q_a_layernorm.weight", {*c.q_lora_rank}, Init::Ones);
    add("q_b_proj.weight", {H * (dn + dr), *c.q_lora_rank});
  } else {
    add("q_proj.weight", {H * (dn + dr), d});
  }
  add("kv_a_proj_with_mqa.weight", {r + dr, d});
  add("kv_a_layernorm.weight", {r}, Init::Ones);
  add("kv_b_proj.weight", {H * (dn + dv), r});
  add("o_proj.weight", {d, H * dv});
  if (c.mla_use_output_gate) add("g_proj.weight", {H * dv, d});
}

Tensor MlaLayer::rotate(const Tensor& x, int64_t pos0) const {
  const int64_t T = x.size(1), half = dr_ / 2;
  std::vector<double> cs(T * half), sn(T * half);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < half; ++i) {
      // The angle is formed in f32, as transformers does.
      const float ang = static_cast<float>(pos0 + t) * static_cast<float>(rope_.inv_freq[i]);
      cs[t * half + i] = std::cos(static_cast<double>(ang)) * rope_.attention_factor;
      sn[t * half + i] = std::sin(static_cast<double>(ang)) * rope_.attention_factor;
    }
  Shape tab = x.dim() == 4 ? Shape{T, 1, half} : Shape{T, half};
  Tensor cos = Tensor::from_doubles(cs, tab, x.dtype(), x.device());
  Tensor sin = Tensor::from_doubles(sn, tab, x.dtype(), x.device());
  Tensor a, b;
  if (rope_.interleave) {
    Shape pairs = x.shape();
    pairs.back() = half;
    pairs.push_back(2);
    auto ab = ops::split(ops::reshape(x, pairs), {1, 1}, -1);
    a = ops::squeeze(ab[0], -1), b = ops::squeeze(ab[1], -1);
  } else {
    auto ab = ops::split(x, {half, half}, -1);
    a = ab[0], b = ab[1];
  }
  Tensor ra = ops::sub(ops::mul(a, cos), ops::mul(b, sin));
  Tensor rb = ops::add(ops::mul(b, cos), ops::mul(a, sin));
  if (!rope_.interleave) return ops::concat({ra, rb}, -1);
  return ops::reshape(ops::concat({ops::unsqueeze(ra, -1), ops::unsqueeze(rb, -1)}, -1), x.shape());
}

Tensor MlaLayer::forward(const Tensor& x_BTD, MlaState* state, int64_t pos0) const {
  const int64_t B = x_BTD.size(0), T = x_BTD.size(1);
  Tensor q = q_lora_ ? ops::linear(ops::rms_norm(ops::linear(x_BTD, w("q_a_proj.weight")),
                                                 w("q_a_layernorm.weight"), kLoraNormEps),
                                   w("q_b_proj.weight"))
                     : ops::linear(x_BTD, w("q_proj.weight"));
  Tensor q_BTHQ = ops::reshape(q, {B, T, H_, dn_ + dr_});
  Tensor q_nope = q_BTHQ, q_pe;
  Tensor kva = ops::linear(x_BTD, w("kv_a_proj_with_mqa.weight"));
  Tensor c_BTR = kva, k_pe;
  if (dr_ > 0) {
    auto qs = ops::split(q_BTHQ, {dn_, dr_}, -1);
    q_nope = qs[0], q_pe = qs[1];
    auto ks = ops::split(kva, {r_, dr_}, -1);
    c_BTR = ks[0], k_pe = ks[1];
    if (rope_on_) q_pe = rotate(q_pe, pos0), k_pe = rotate(k_pe, pos0);
  }
  c_BTR = ops::rms_norm(c_BTR, w("kv_a_layernorm.weight"), kLoraNormEps);
  Tensor W_HDR = ops::reshape(w("kv_b_proj.weight"), {H_, dn_ + dv_, r_});
  Tensor o_BTO;
  if (!state) {
    // MHA mode: per-head keys [k^nope ; k^pe] and values from the expanded latents.
    auto kv =
        ops::split(ops::reshape(ops::linear(c_BTR, w("kv_b_proj.weight")), {B, T, H_, dn_ + dv_}),
                   {dn_, dv_}, -1);
    Tensor k = kv[0], qf = q_BTHQ;
    if (dr_ > 0) {  // k^pe is shared by all heads
      std::vector<Tensor> rep(H_, ops::unsqueeze(k_pe, 2));
      k = ops::concat({k, ops::concat(rep, 2)}, -1);
      if (rope_on_) qf = ops::concat({q_nope, q_pe}, -1);
    }
    Tensor o = ops::attention(ops::permute(qf, {0, 2, 1, 3}), ops::permute(k, {0, 2, 1, 3}),
                              ops::permute(kv[1], {0, 2, 1, 3}), tau_, true);
    o_BTO = ops::reshape(ops::permute(o, {0, 2, 1, 3}), {B, T, H_ * dv_});
  } else {
    // MQA (absorbed) mode over the latent cache.
    const int64_t S0 = state->length();
    Tensor lat = dr_ > 0 ? ops::concat({c_BTR, k_pe}, -1) : c_BTR;
    state->latent_BSC = S0 ? ops::concat({state->latent_BSC, lat}, 1) : lat;
    auto wk = ops::split(W_HDR, {dn_, dv_}, 1);  // W^UK [H, dn, r], W^UV [H, dv, r]
    Tensor qn_HNd = ops::reshape(ops::permute(q_nope, {2, 0, 1, 3}), {H_, B * T, dn_});
    Tensor qt = ops::bmm(qn_HNd, ops::contiguous(wk[0]));  // [H, B*T, r]
    Tensor qa = ops::permute(ops::reshape(qt, {H_, B, T, r_}), {1, 0, 2, 3});
    if (dr_ > 0) qa = ops::concat({qa, ops::permute(q_pe, {0, 2, 1, 3})}, -1);
    Tensor kc = ops::unsqueeze(state->latent_BSC, 1);  // [B, 1, S, r + dr]
    Tensor oc = ops::attention(qa, kc, ops::slice(kc, -1, 0, r_), tau_, true, S0);  // [B,H,T,r]
    Tensor oc_HNr = ops::reshape(ops::permute(oc, {1, 0, 2, 3}), {H_, B * T, r_});
    Tensor o = ops::bmm(oc_HNr, ops::contiguous(ops::transpose(wk[1], 1, 2)));  // [H, B*T, dv]
    o_BTO = ops::reshape(ops::permute(ops::reshape(o, {H_, B, T, dv_}), {1, 2, 0, 3}),
                         {B, T, H_ * dv_});
  }
  if (gate_) o_BTO = ops::mul(o_BTO, ops::sigmoid(ops::linear(x_BTD, w("g_proj.weight"))));
  return ops::linear(o_BTO, w("o_proj.weight"));
}

}  // namespace myriad::model
