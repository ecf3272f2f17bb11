#include "model/mla_layer.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "core/autograd.h"
#include "core/error.h"
#include "ops/attention.h"
#include "ops/ops.h"

namespace myriad::model {

namespace {

constexpr double kLoraNormEps = 1e-6;  // q_a / kv_a layernorms, whatever rms_norm_eps says

double yarn_mscale(double s, double m) {
  return s <= 1.0 ? 1.0 : 0.1 * m * std::log(s) + 1.0;
}

DType compute_dtype(const Tensor& x) {
  return x.dtype() == DType::F64 ? DType::F64 : DType::F32;
}

// A differentiable dtype conversion: the admission gate is computed in fp32 whatever the storage.
Tensor to_dtype(const Tensor& x, DType t) {
  if (x.dtype() == t) return x;
  Tensor out = x.to(t);
  const DType src = x.dtype();
  record("to_dtype", out, {x},
         [src](const Tensor& g) -> std::vector<Tensor> { return {g.to(src)}; });
  return out;
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
      adm_(c.myriad.admission.enabled),
      adm_stopgrad_(c.myriad.admission.stopgrad_mean),
      window_(c.myriad.admission.window),
      tau_adm_(c.myriad.admission.tau),
      rope_(Rope::from(c)) {
  tau_ = 1.0 / std::sqrt(static_cast<double>(dn_ + dr_));
  if (rope_on_) tau_ *= rope_.softmax_mscale;
  auto proj = [&](const char* n, int64_t cols) {
    x_projs_.push_back(prefix_ + n + ".weight");
    x_cols_.push_back(cols);
  };
  if (q_lora_) {
    proj("q_a_proj", *c.q_lora_rank);
  } else {
    proj("q_proj", H_ * (dn_ + dr_));
  }
  proj("kv_a_proj_with_mqa", r_ + dr_);
  if (gate_) proj("g_proj", H_ * dv_);
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
  if (c.myriad.admission.enabled) {
    const int64_t ha = c.myriad.admission.hidden;
    add("admission.w1.weight", {ha, d + r});
    add("admission.w1.bias", {ha}, Init::Zeros);
    add("admission.w2.weight", {1, ha});
    // +4: a ≈ 0.98 at init, so the model starts as plain MLA.
    out.push_back(
        {p + "admission.w2.bias", {1}, Init::Const, true, {}, {}, c.myriad.admission.init_bias});
  }
}

Tensor MlaLayer::admission_gate(const Tensor& x_BTD, const Tensor& c_BTR, MlaState* state) const {
  const int64_t B = x_BTD.size(0), T = x_BTD.size(1);
  const DType cd = compute_dtype(x_BTD);
  const Device dev = x_BTD.device();
  Tensor c = to_dtype(adm_stopgrad_ ? c_BTR.detach() : c_BTR, cd);
  // m_{t-1} = Σ_{s<t} ĉ_s / t: an exclusive cumsum plus what the cache has already summed.
  Tensor cs = ops::cumsum(c, 1);
  Tensor prev = Tensor::zeros({B, 1, r_}, cd, dev);
  if (T > 1) prev = ops::concat({prev, ops::slice(cs, 1, 0, T - 1)}, 1);
  const int64_t n0 = state ? state->count : 0;
  if (n0 > 0) prev = ops::add(prev, ops::unsqueeze(state->latent_sum_BR, 1));
  std::vector<double> inv(T);
  for (int64_t t = 0; t < T; ++t) inv[t] = 1.0 / static_cast<double>(std::max<int64_t>(n0 + t, 1));
  Tensor m = ops::mul(prev, Tensor::from_doubles(inv, {1, T, 1}, cd, dev));
  if (state) {
    Tensor sum = ops::squeeze(ops::slice(cs, 1, T - 1, T), 1).detach();
    state->latent_sum_BR = n0 > 0 ? ops::add(state->latent_sum_BR, sum) : ops::contiguous(sum);
    state->count = n0 + T;
  }
  auto p = [&](const char* n) { return to_dtype(w(n), cd); };
  Tensor h = ops::silu(ops::linear(ops::concat({to_dtype(x_BTD, cd), m}, -1),
                                   p("admission.w1.weight"), p("admission.w1.bias")));
  Tensor a = ops::sigmoid(ops::linear(h, p("admission.w2.weight"), p("admission.w2.bias")));
  return ops::reshape(a, {B, T});
}

Tensor MlaLayer::admitted_attention(const Tensor& qa, const Tensor& lat, const Tensor& a_BT,
                                    MlaState& st) const {
  const int64_t B = lat.size(0), T = lat.size(1);
  const int64_t N = st.admitted(), R = st.length(), S = N + R + T, U = R + T;
  const DType cd = a_BT.dtype();
  // Gates of the window's and the new keys; the rule is decided on these host copies.
  std::vector<double> gate(B * U);
  {
    const std::vector<double> wg = R ? st.window_gate_BS.to_doubles() : std::vector<double>{};
    const std::vector<double> ag = a_BT.to_doubles();
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t j = 0; j < R; ++j) gate[b * U + j] = wg[b * R + j];
      for (int64_t t = 0; t < T; ++t) gate[b * U + R + t] = ag[b * T + t];
    }
  }
  auto log_gate = [](double g) { return std::log(std::max(g, 1e-6)); };
  // Keys in order [admitted ; window ; new], the query at q_offset = N + R: window and new keys
  // keep their distance to every query, so the op's band (distance > W) selects exactly the keys
  // that have left the window: + log a_j if admitted, -inf (gone) if not. Admitted keys are
  // always more than W behind.
  std::vector<double> bias(B * S);
  const std::vector<double> ab = N ? st.admitted_bias_BN.to_doubles() : std::vector<double>{};
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t n = 0; n < N; ++n) bias[b * S + n] = ab[b * N + n];
    for (int64_t j = 0; j < U; ++j) {
      const double g = gate[b * U + j];
      bias[b * S + N + j] = g >= tau_adm_ ? log_gate(g) : -INFINITY;
    }
  }
  Tensor win = R ? ops::concat({st.latent_BSC, lat}, 1) : lat;
  Tensor keys = N ? ops::concat({st.admitted_BNC, win}, 1) : win;
  Tensor kc = ops::unsqueeze(keys, 1);  // [B, 1, S, r + dr]
  Tensor oc = ops::attention(qa, kc, ops::slice(kc, -1, 0, r_), tau_, true, N + R,
                             Tensor::from_doubles(bias, {B, S}, cd, lat.device()), window_);
  // The first `leave` keys of [window ; new] leave the window: admitted iff a_j >= tau_adm.
  // Rows that admit fewer are padded to a common count with a -inf bias (never attended).
  const int64_t leave = std::max<int64_t>(0, U - window_);
  std::vector<std::vector<int64_t>> kept(B);
  size_t M = 0;
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t j = 0; j < leave; ++j)
      if (gate[b * U + j] >= tau_adm_) kept[b].push_back(j);
    M = std::max(M, kept[b].size());
  }
  if (M > 0) {
    const int64_t Mi = static_cast<int64_t>(M);
    std::vector<Tensor> rows;
    std::vector<double> nb(B * M, -INFINITY);
    for (int64_t b = 0; b < B; ++b) {
      std::vector<int64_t> idx(M, 0);
      for (size_t i = 0; i < kept[b].size(); ++i)
        idx[i] = kept[b][i], nb[b * M + i] = log_gate(gate[b * U + kept[b][i]]);
      rows.push_back(ops::index_select(ops::slice(win, 0, b, b + 1), 1,
                                       Tensor::from_ints(idx, {Mi}, DType::I64, lat.device())));
    }
    Tensor blk = B > 1 ? ops::concat(rows, 0) : rows[0];
    Tensor bb = Tensor::from_doubles(nb, {B, Mi}, cd, lat.device());
    st.admitted_BNC = N ? ops::concat({st.admitted_BNC, blk}, 1) : ops::contiguous(blk);
    st.admitted_bias_BN = N ? ops::concat({st.admitted_bias_BN, bb}, 1) : bb;
  }
  if (leave < U) {
    st.latent_BSC = ops::contiguous(ops::slice(win, 1, leave, U));
    st.window_gate_BS = ops::contiguous(
        ops::slice(Tensor::from_doubles(gate, {B, U}, cd, lat.device()), 1, leave, U));
  } else {
    st.latent_BSC = st.window_gate_BS = Tensor();
  }
  return oc;
}

Tensor MlaLayer::rotate(const Tensor& x, int64_t pos0, const std::vector<int64_t>& row_pos) const {
  const bool rows = !row_pos.empty();  // then T = 1 and the table runs over B
  const int64_t T = rows ? static_cast<int64_t>(row_pos.size()) : x.size(1), half = dr_ / 2;
  std::vector<double> cs(T * half), sn(T * half);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < half; ++i) {
      // The angle is formed in f32, as transformers does.
      const int64_t pos = rows ? row_pos[t] : pos0 + t;
      const float ang = static_cast<float>(pos) * static_cast<float>(rope_.inv_freq[i]);
      cs[t * half + i] = std::cos(static_cast<double>(ang)) * rope_.attention_factor;
      sn[t * half + i] = std::sin(static_cast<double>(ang)) * rope_.attention_factor;
    }
  Shape tab = x.dim() == 4 ? Shape{T, 1, half} : Shape{T, half};
  if (rows) tab.insert(tab.begin() + 1, 1);  // [B, 1, (1,) half]
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

Tensor MlaLayer::forward(const Tensor& x_BTD, MlaState* state, int64_t pos0,
                         Tensor* gate_BT) const {
  return forward_impl(x_BTD, state ? std::vector<MlaState*>{state} : std::vector<MlaState*>{},
                      {pos0}, gate_BT);
}

Tensor MlaLayer::forward_batch(const Tensor& x_N1D, const std::vector<MlaState*>& states,
                               const std::vector<int64_t>& pos, Tensor* gate_N1) const {
  const int64_t N = x_N1D.size(0);
  MYRIAD_CHECK(x_N1D.dim() == 3 && x_N1D.size(1) == 1 && static_cast<int64_t>(states.size()) == N &&
                   static_cast<int64_t>(pos.size()) == N,
               "mla: a batched decode step takes x [N, 1, d] and N states and positions, got ",
               x_N1D.desc(), ", ", states.size(), " states, ", pos.size(), " positions");
  for (const MlaState* s : states) MYRIAD_CHECK(s, "mla: a batched decode step needs every state");
  return forward_impl(x_N1D, states, pos, gate_N1);
}

Tensor MlaLayer::cached_attention(const Tensor& qa, const Tensor& lat, const Tensor& a_BT,
                                  MlaState& st) const {
  if (adm_) return admitted_attention(qa, lat, a_BT, st);
  const int64_t S0 = st.length();
  Tensor keys;
  // Paged with a sliding window (unbounded pages go through ops::paged_attention in forward):
  // attend over [held pages ; new latents] before storing, since storing may recycle pages the
  // new queries still see.
  if (st.pages) {
    keys = S0 ? ops::concat({st.pages->gather(), lat}, 1) : lat;
    st.pages->append(lat);
  } else {
    keys = st.latent_BSC = S0 ? ops::concat({st.latent_BSC, lat}, 1) : lat;
  }
  Tensor kc = ops::unsqueeze(keys, 1);  // [B, 1, S, r + dr]
  return ops::attention(qa, kc, ops::slice(kc, -1, 0, r_), tau_, true, S0);
}

Tensor MlaLayer::forward_impl(const Tensor& x_BTD, const std::vector<MlaState*>& states,
                              const std::vector<int64_t>& pos, Tensor* gate_BT) const {
  const int64_t B = x_BTD.size(0), T = x_BTD.size(1);
  const bool batched = states.size() > 1;  // row b has states[b] and position pos[b]
  MlaState* state = states.empty() ? nullptr : states[0];
  const int64_t pos0 = pos[0];
  const std::vector<int64_t> no_rows;
  const std::vector<int64_t>& row_pos = batched ? pos : no_rows;
  // Every projection of x as one product: q (or its low-rank q_a), kv_a, and the output gate's.
  const auto xs = ops::split(project_cat(x_BTD, *w_, x_projs_), x_cols_, -1);
  Tensor q = q_lora_ ? lin(ops::rms_norm(xs[0], w("q_a_layernorm.weight"), kLoraNormEps),
                           "q_b_proj.weight")
                     : xs[0];
  Tensor q_BTHQ = ops::reshape(q, {B, T, H_, dn_ + dr_});
  Tensor q_nope = q_BTHQ, q_pe;
  Tensor kva = xs[1];
  Tensor c_BTR = kva, k_pe;
  if (dr_ > 0) {
    auto qs = ops::split(q_BTHQ, {dn_, dr_}, -1);
    q_nope = qs[0], q_pe = qs[1];
    auto ks = ops::split(kva, {r_, dr_}, -1);
    c_BTR = ks[0], k_pe = ks[1];
    if (rope_on_) q_pe = rotate(q_pe, pos0, row_pos), k_pe = rotate(k_pe, pos0, row_pos);
  }
  c_BTR = ops::rms_norm(c_BTR, w("kv_a_layernorm.weight"), kLoraNormEps);
  Tensor W_HDR = ops::reshape(w("kv_b_proj.weight"), {H_, dn_ + dv_, r_});
  Tensor o_BTO, a_BT;
  if (adm_ && !batched) a_BT = admission_gate(x_BTD, c_BTR, state);
  if (adm_ && batched) {  // each row's prefix mean continues from its own state
    std::vector<Tensor> rows;
    for (int64_t b = 0; b < B; ++b)
      rows.push_back(admission_gate(ops::slice(x_BTD, 0, b, b + 1), ops::slice(c_BTR, 0, b, b + 1),
                                    states[b]));
    a_BT = ops::concat(rows, 0);
  }
  if (gate_BT) *gate_BT = a_BT;
  if (!state) {
    // MHA mode: per-head keys [k^nope ; k^pe] and values from the expanded latents.
    auto kv = ops::split(ops::reshape(lin(c_BTR, "kv_b_proj.weight"), {B, T, H_, dn_ + dv_}),
                         {dn_, dv_}, -1);
    Tensor k = kv[0], qf = q_BTHQ;
    if (dr_ > 0) {  // k^pe is shared by all heads
      std::vector<Tensor> rep(H_, ops::unsqueeze(k_pe, 2));
      k = ops::concat({k, ops::concat(rep, 2)}, -1);
      if (rope_on_) qf = ops::concat({q_nope, q_pe}, -1);
    }
    // Soft admission rule: + log max(a_j, 1e-6) on keys more than W behind the query.
    Tensor bias;
    if (adm_)
      bias = ops::log(ops::maximum(a_BT, Tensor::full({1}, 1e-6, a_BT.dtype(), a_BT.device())));
    Tensor o = ops::attention(ops::permute(qf, {0, 2, 1, 3}), ops::permute(k, {0, 2, 1, 3}),
                              ops::permute(kv[1], {0, 2, 1, 3}), tau_, true, 0, bias, window_);
    o_BTO = ops::reshape(ops::permute(o, {0, 2, 1, 3}), {B, T, H_ * dv_});
  } else {
    // MQA (absorbed) mode over the latent cache.
    Tensor lat = dr_ > 0 ? ops::concat({c_BTR, k_pe}, -1) : c_BTR;
    auto wk = ops::split(W_HDR, {dn_, dv_}, 1);  // W^UK [H, dn, r], W^UV [H, dv, r]
    Tensor qn_HNd = ops::reshape(ops::permute(q_nope, {2, 0, 1, 3}), {H_, B * T, dn_});
    Tensor qt = ops::bmm(qn_HNd, wk[0]);  // [H, B*T, r]
    Tensor qa = ops::permute(ops::reshape(qt, {H_, B, T, r_}), {1, 0, 2, 3});
    if (dr_ > 0) qa = ops::concat({qa, ops::permute(q_pe, {0, 2, 1, 3})}, -1);
    Tensor oc;  // [B, H, T, r]
    const auto row_state = [&](int64_t b) { return batched ? states[b] : state; };
    bool in_pages = !adm_ && (batched || B == 1);  // every row's latents in unbounded pages
    for (int64_t b = 0; b < B && in_pages; ++b)
      in_pages = row_state(b)->pages && row_state(b)->pages->max_pages == 0;
    if (in_pages) {  // store the new latents, then one call over every row's pages in place
      std::vector<std::vector<Tensor>> tables;
      std::vector<int64_t> lengths;
      for (int64_t b = 0; b < B; ++b) {
        LatentPages& pg = *row_state(b)->pages;
        pg.append(B == 1 ? lat : ops::slice(lat, 0, b, b + 1));
        tables.push_back(pg.table), lengths.push_back(pg.length);
      }
      oc = ops::paged_attention(qa, tables, lengths, r_, tau_);
    } else if (!batched) {
      oc = cached_attention(qa, lat, a_BT, *state);
    } else {  // each row over its own cache
      std::vector<Tensor> rows;
      for (int64_t b = 0; b < B; ++b) {
        auto row = [&](const Tensor& t) { return t.defined() ? ops::slice(t, 0, b, b + 1) : t; };
        rows.push_back(cached_attention(row(qa), row(lat), row(a_BT), *states[b]));
      }
      oc = ops::concat(rows, 0);
    }
    Tensor oc_HNr = ops::reshape(ops::permute(oc, {1, 0, 2, 3}), {H_, B * T, r_});
    // W^UV's rows as they are stored ([dv, r] per head: the few-row kernel's layout), no copy.
    Tensor o = ops::bmm(oc_HNr, ops::transpose(wk[1], 1, 2));  // [H, B*T, dv]
    o_BTO = ops::reshape(ops::permute(ops::reshape(o, {H_, B, T, dv_}), {1, 2, 0, 3}),
                         {B, T, H_ * dv_});
  }
  if (gate_) o_BTO = ops::mul(o_BTO, ops::sigmoid(xs[2]));
  return lin(o_BTO, "o_proj.weight");
}

}  // namespace myriad::model
