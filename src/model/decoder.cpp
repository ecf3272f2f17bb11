#include "model/decoder.h"

#include <cmath>
#include <nlohmann/json.hpp>

#include "core/autograd.h"
#include "core/error.h"
#include "ops/attn_res.h"
#include "ops/ops.h"

namespace myriad::model {

Decoder::Decoder(ModelConfig config, Weights weights)
    : config_(std::move(config)), weights_(std::make_unique<Weights>(std::move(weights))) {
  const ModelConfig& c = config_;
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    Layer l;
    if (c.is_mla_layer(i))
      l.mla.emplace(c, weights_.get(), i);
    else
      l.kda.emplace(c, weights_.get(), i);
    if (c.is_moe_layer(i))
      l.moe.emplace(c, weights_.get(), i);
    else
      l.dense.emplace(c, weights_.get(), i);
    layers_.push_back(std::move(l));
  }
  for (const auto& s : param_specs(c))
    MYRIAD_CHECK(weights_->contains(s.name), "model: weights lack ", s.name);
}

std::vector<ParamSpec> Decoder::param_specs(const ModelConfig& c) {
  c.validate();
  const int64_t d = c.hidden_size, V = c.vocab_size;
  std::vector<ParamSpec> out;
  out.push_back({"model.embed_tokens.weight", {V, d}, Init::Normal, true, {}, {}});
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = layer_prefix(i);
    out.push_back({p + "input_layernorm.weight", {d}, Init::Ones, true, {}, {}});
    out.push_back({p + "post_attention_layernorm.weight", {d}, Init::Ones, true, {}, {}});
    if (c.uses_attn_res())
      for (const char* n : {"self_attention_res_", "mlp_res_"}) {
        out.push_back({p + n + "norm.weight", {d}, Init::Ones, true, {}, {}});
        out.push_back({p + n + "proj.weight", {1, d}, Init::Zeros, true, {}, {}});
      }
    // §12.1: γ_{i-1} lives on layer i (the first layer carries nothing). In gamma_input mode
    // `gamma` is the bias inside the sigmoid (gamma_bias_init, default 0: γ starts at 0.5).
    const std::string& carry = c.myriad.residual.attn_carry;
    if (i > 0 && carry != "none") {
      const std::string q = p + "attn_carry.";
      if (carry == "gamma_input") {
        const double b0 = c.myriad.residual.gamma_bias_init.value_or(0.0);
        out.push_back({q + "gamma", {1}, Init::Const, true, {}, {}, b0});
        out.push_back({q + "w", {d}, Init::Zeros, true, {}, {}});
        out.push_back({q + "norm.weight", {d}, Init::Ones, true, {}, {}});
      } else {
        out.push_back({q + "gamma", {carry == "gamma_vector" ? d : 1}, Init::Zeros, true, {}, {}});
      }
    }
    if (c.is_mla_layer(i))
      MlaLayer::add_specs(c, i, out);
    else
      KdaLayer::add_specs(c, i, out);
    if (c.is_moe_layer(i))
      Moe::add_specs(c, i, out);
    else
      DenseFfn::add_specs(c, i, out);
  }
  out.push_back({"model.norm.weight", {d}, Init::Ones, true, {}, {}});
  if (c.uses_attn_res()) {
    out.push_back({"model.output_attn_res_norm.weight", {d}, Init::Ones, true, {}, {}});
    out.push_back({"model.output_attn_res_proj.weight", {1, d}, Init::Zeros, true, {}, {}});
  }
  out.push_back({"lm_head.weight", {V, d}, Init::Normal, true, {}, {}});
  // A multimodal checkpoint holds the text model under `language_model.` (transformers' kimi_k25
  // writes language_model.model.layers.{i} or .blocks.{i}; the K3 release, language_model.model.*),
  // so those spellings are read for every model. kimi_k25 and kimi_k3 wrapped models are saved
  // that way, and the K3 release stores A_log as [H] (docs/CHECKPOINTS.md).
  const std::string wrapper =
      c.wrapper_json.empty() ? "" : nlohmann::json::parse(c.wrapper_json).value("model_type", "");
  const bool k25 = wrapper == "kimi_k25" || (c.vision && wrapper.empty() && c.is_deepseek());
  const bool k3 = wrapper == "kimi_k3" ||
                  (wrapper.empty() && ((c.vision && !c.is_deepseek()) || c.is_k3_form()));
  for (ParamSpec& s : out) {
    const std::string prefixed = "language_model." + s.name;
    std::string blocks = prefixed;
    if (const auto at = blocks.find("model.layers."); at != std::string::npos)
      blocks.replace(at, 13, "model.blocks.");
    s.aliases.push_back(prefixed);
    if (blocks != prefixed) s.aliases.push_back(blocks);
    if (k25 || k3) s.save_as = prefixed;
    if (s.name.ends_with(".A_log")) {
      s.stored_shape = {s.shape[2]};  // [1, 1, H, 1] as [H]
      s.save_stored_shape = k3;
    }
  }
  if (c.vision)
    for (ParamSpec& s : vision::param_specs(*c.vision, d)) out.push_back(std::move(s));
  return out;
}

Decoder Decoder::load(const std::string& dir, DType dtype) {
  ModelConfig c = ModelConfig::load(dir);
  return Decoder(c, Weights::load(dir, param_specs(c), dtype));
}

int64_t Decoder::quantize(int bits, int act_bits) {
  const auto ends = [](const std::string& s, std::string_view e) {
    return s.size() >= e.size() && s.compare(s.size() - e.size(), e.size(), e) == 0;
  };
  std::vector<std::string> names;
  for (const ParamSpec& s : weights_->specs()) {
    const std::string& n = s.name;
    if (s.shape.size() != 2 || s.shape[1] % ops::kQuantGroup != 0) continue;
    // Kimi's routed experts are w1 / w3 / w2 (gate, up, down), DeepSeek's *_proj.
    const bool kimi_expert =
        n.find(".experts.") != std::string::npos &&
        (ends(n, ".w1.weight") || ends(n, ".w2.weight") || ends(n, ".w3.weight"));
    if (!(ends(n, "_proj.weight") || n == "lm_head.weight" || kimi_expert)) continue;
    if (ends(n, "kv_b_proj.weight") || ends(n, "_res_proj.weight") ||
        n.find("gate.latent_proj") != std::string::npos)
      continue;
    names.push_back(n);
  }
  weights_->quantize(names, bits, act_bits);
  return static_cast<int64_t>(names.size());
}

Decoder Decoder::random(const ModelConfig& c, uint64_t seed, DType dtype) {
  return Decoder(c, Weights::init(param_specs(c), seed, c.initializer_range, dtype));
}

Tensor Decoder::attn(int64_t i, const Tensor& x_BTD, const std::vector<DecodeCache*>& caches,
                     Tensor* gate_BT) const {
  const Layer& l = layers_[i];
  if (caches.size() > 1) {  // batched decode: row n belongs to caches[n]
    if (l.kda) {
      std::vector<KdaState*> st;
      for (DecodeCache* c : caches) st.push_back(&c->kda[i]);
      return l.kda->forward_batch(x_BTD, st);
    }
    std::vector<MlaState*> st;
    std::vector<int64_t> pos;
    for (DecodeCache* c : caches) st.push_back(&c->mla[i]), pos.push_back(c->position);
    return l.mla->forward_batch(x_BTD, st, pos, gate_BT);
  }
  DecodeCache* cache = caches.empty() ? nullptr : caches[0];
  if (l.kda) return l.kda->forward(x_BTD, cache ? &cache->kda[i] : nullptr);
  return l.mla->forward(x_BTD, cache ? &cache->mla[i] : nullptr, cache ? cache->position : 0,
                        gate_BT);
}

Tensor Decoder::carry(int64_t i, const Tensor& x_BTD, const Tensor& prev) const {
  const std::string p = layer_prefix(i) + "attn_carry.";
  Tensor g = w(p + "gamma");  // [1] or [d]
  if (config_.myriad.residual.attn_carry == "gamma_input") {
    // γ = σ(w · RMSNorm_γ(x) + b), one scalar per token.
    Tensor n = ops::rms_norm(x_BTD, w(p + "norm.weight"), config_.rms_norm_eps);
    g = ops::sigmoid(ops::add(ops::sum(ops::mul(n, w(p + "w")), {-1}, true), g));
  }
  return ops::mul(g, prev);
}

Tensor admission_regulariser(const ModelConfig& c, const Tensor& rate) {
  const auto& a = c.myriad.admission;
  return ops::mul(ops::square(ops::add(rate, -a.target_rate)), a.lambda);
}

Tensor Decoder::ffn(int64_t i, const Tensor& x_BTD) const {
  const Layer& l = layers_[i];
  return l.moe ? l.moe->forward(x_BTD) : l.dense->forward(x_BTD);
}

ForwardOutput Decoder::forward(const Tensor& ids_BT, DecodeCache* cache, ForwardOptions opt) const {
  return forward_impl(ids_BT,
                      cache ? std::vector<DecodeCache*>{cache} : std::vector<DecodeCache*>{}, opt);
}

ForwardOutput Decoder::forward_batch(const Tensor& ids_N1, const std::vector<DecodeCache*>& caches,
                                     ForwardOptions opt) const {
  MYRIAD_CHECK(ids_N1.dim() == 2 && ids_N1.size(1) == 1 &&
                   ids_N1.size(0) == static_cast<int64_t>(caches.size()) && !caches.empty(),
               "model: a batched decode step takes ids [N, 1] and N caches, got ", ids_N1.desc(),
               " and ", caches.size(), " caches");
  for (const DecodeCache* k : caches)
    MYRIAD_CHECK(k && k->position > 0, "model: a batched decode step needs prefilled caches");
  return forward_impl(ids_N1, caches, opt);
}

Tensor Decoder::encode_images(const Tensor& pixel_values,
                              const std::vector<vision::Grid>& grids) const {
  MYRIAD_CHECK(config_.vision.has_value(),
               "model: encode_images needs a model with a vision tower");
  return vision::encode(*config_.vision, *weights_, pixel_values, grids);
}

namespace {

// MODEL.md §10 step 6: the embeddings at the placeholder positions are replaced, in row-major
// order, by the projector outputs (zeroed there, then the image rows added at those positions).
Tensor splice_images(const ModelConfig& c, const Tensor& ids_BT, const Tensor& h_BTD,
                     const Tensor& embeds_ND) {
  MYRIAD_CHECK(c.media_placeholder_token_id.has_value(),
               "model: image_embeds given to a model without media_placeholder_token_id");
  const int64_t B = h_BTD.size(0), T = h_BTD.size(1), D = h_BTD.size(2);
  const std::vector<double> ids = ids_BT.to_doubles();
  std::vector<int64_t> at;
  std::vector<double> keep(ids.size(), 1.0);
  for (size_t i = 0; i < ids.size(); ++i)
    if (static_cast<int64_t>(ids[i]) == *c.media_placeholder_token_id) {
      at.push_back(static_cast<int64_t>(i));
      keep[i] = 0.0;
    }
  MYRIAD_CHECK(embeds_ND.dim() == 2 && embeds_ND.size(0) == static_cast<int64_t>(at.size()) &&
                   embeds_ND.size(1) == D && embeds_ND.dtype() == h_BTD.dtype(),
               "model: image_embeds must be [", at.size(), ", ", D,
               "] in the embeddings' dtype (one row per placeholder token in input_ids), got ",
               embeds_ND.desc());
  if (at.empty()) return h_BTD;
  const Tensor mask = Tensor::from_doubles(keep, {B * T, 1}, h_BTD.dtype());
  const Tensor idx = Tensor::from_ints(at, {static_cast<int64_t>(at.size())});
  const Tensor flat = ops::mul(ops::reshape(h_BTD, {B * T, D}), mask);
  return ops::reshape(ops::index_add(flat, 0, idx, embeds_ND), {B, T, D});
}

}  // namespace

ForwardOutput Decoder::forward_impl(const Tensor& ids_BT, const std::vector<DecodeCache*>& caches,
                                    ForwardOptions opt) const {
  const ModelConfig& c = config_;
  MYRIAD_CHECK(ids_BT.dim() == 2 && ids_BT.size(1) >= 1, "model: input_ids must be [B, T], got ",
               ids_BT.desc());
  for (const DecodeCache* k : caches)
    MYRIAD_CHECK(static_cast<int64_t>(k->kda.size()) == c.num_hidden_layers,
                 "model: the cache was made for another model");
  const double eps = c.rms_norm_eps;
  ForwardOutput out;
  Tensor h = ops::embedding(w("model.embed_tokens.weight"), ids_BT);
  if (opt.image_embeds.defined()) h = splice_images(c, ids_BT, h, opt.image_embeds);
  auto keep = [&](std::vector<Tensor>& v, const Tensor& t) {
    if (opt.record) v.push_back(t);
  };
  // Layer i's attention sublayer on stream input X (normalised by `norm`), with the carry of §12.1:
  // Â replaces A wherever the output is consumed.
  const bool carry_on = c.myriad.residual.attn_carry != "none";
  Tensor carried;  // Â of the previous layer
  std::vector<Tensor> gates;
  // With opt.recompute a sublayer keeps only its input and runs again in the backward pass; its
  // closure holds copies, as it outlives this call. A cached attention sublayer extends its cache
  // and a gated MLA one returns its gate besides, so those are never wrapped.
  const bool adm = c.myriad.admission.enabled;
  auto attend = [&](int64_t i, const Tensor& X, const std::string& norm) {
    Tensor gate, a;
    if (opt.recompute && caches.empty() && !adm)
      a = recompute(
          "attention sublayer",
          [this, i, norm, eps](const Tensor& x) {
            return attn(i, ops::rms_norm(x, w(norm), eps), {}, nullptr);
          },
          X);
    else
      a = attn(i, ops::rms_norm(X, w(norm), eps), caches, &gate);
    if (gate.defined()) gates.push_back(gate);
    keep(out.attn_out, a);
    if (carry_on) {
      if (i > 0) a = ops::add(a, carry(i, X, carried));
      carried = a;
    }
    return a;
  };
  auto sublayer_ffn = [&](int64_t i, const Tensor& X, const std::string& norm) {
    auto fn = [this, i, norm, eps](const Tensor& x) {
      return ffn(i, ops::rms_norm(x, w(norm), eps));
    };
    return opt.recompute ? recompute("ffn sublayer", fn, X) : fn(X);
  };
  if (!c.uses_attn_res()) {
    for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
      const std::string p = layer_prefix(i);
      Tensor a = attend(i, h, p + "input_layernorm.weight");
      h = ops::add(h, a);
      Tensor f = sublayer_ffn(i, h, p + "post_attention_layernorm.weight");
      h = ops::add(h, f);
      keep(out.ffn_out, f), keep(out.hidden, h);
    }
  } else {
    // Block AttnRes, the exact K3 code path (MODEL.md §7): B = completed block sums, P = the
    // running partial sum of the current block.
    const int64_t S = c.attn_res_block_size;
    std::vector<Tensor> blocks;
    Tensor P = h;
    auto mix = [&](const std::string& pair, const Tensor& partial) {
      std::vector<Tensor> src = blocks;
      src.push_back(partial);
      return ops::attn_res(src, w(pair + "proj.weight"), w(pair + "norm.weight"), eps);
    };
    for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
      const std::string p = layer_prefix(i);
      Tensor X = blocks.empty() ? P : mix(p + "self_attention_res_", P);
      bool fresh = false;
      if (i % S == 0) blocks.push_back(P), fresh = true;
      Tensor a = attend(i, X, p + "input_layernorm.weight");
      P = fresh ? a : ops::add(P, a);
      X = mix(p + "mlp_res_", P);
      Tensor f = sublayer_ffn(i, X, p + "post_attention_layernorm.weight");
      P = ops::add(P, f);
      keep(out.ffn_out, f), keep(out.hidden, P);
    }
    h = mix("model.output_attn_res_", P);
  }
  if (!gates.empty()) {  // every MLA layer sees the same tokens: the mean of the layer means
    Tensor sum = ops::mean(gates[0]);
    for (size_t g = 1; g < gates.size(); ++g) sum = ops::add(sum, ops::mean(gates[g]));
    out.admission_rate = ops::mul(sum, 1.0 / static_cast<double>(gates.size()));
    out.admission_loss = admission_regulariser(c, out.admission_rate);
  }
  for (DecodeCache* k : caches) k->position += ids_BT.size(1);
  out.normed_BTD = ops::rms_norm(h, w("model.norm.weight"), eps);
  if (opt.logits) out.logits_BTV = project(out.normed_BTD, *weights_, "lm_head.weight");
  return out;
}

const RouteStats& Decoder::last_route(int64_t layer) const {
  MYRIAD_CHECK(layer >= 0 && layer < static_cast<int64_t>(layers_.size()) && layers_[layer].moe,
               "model: layer ", layer, " is not a MoE layer");
  return layers_[layer].moe->last_route();
}

void Decoder::set_expert_runner(const ExpertRunner* r) const {
  for (const Layer& l : layers_)
    if (l.moe) l.moe->set_runner(r);
}

Tensor Decoder::selection_bias(int64_t layer) const {
  MYRIAD_CHECK(layer >= 0 && layer < static_cast<int64_t>(layers_.size()) && layers_[layer].moe,
               "model: layer ", layer, " is not a MoE layer");
  return w(Moe::prefix(config_, layer) + "gate.e_score_correction_bias");
}

Tensor Decoder::loss(const Tensor& ids_BT) const {
  const int64_t B = ids_BT.size(0), T = ids_BT.size(1);
  ForwardOutput f = forward(ids_BT, nullptr, {.logits = false});
  std::vector<int64_t> ids = ids_BT.to_ints(), tgt(B * T, ops::kIgnoreIndex);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t + 1 < T; ++t) tgt[b * T + t] = ids[b * T + t + 1];
  Tensor targets = Tensor::from_ints(tgt, {B * T}, DType::I64, ids_BT.device());
  const int64_t d = config_.hidden_size;
  return ops::linear_cross_entropy(ops::reshape(f.normed_BTD, {B * T, d}), w("lm_head.weight"),
                                   targets);
}

Decoder::Generation Decoder::generate_greedy(const Tensor& prompt_1T, int64_t new_tokens) const {
  MYRIAD_CHECK(prompt_1T.dim() == 2 && prompt_1T.size(0) == 1,
               "generate: the prompt must be [1, T], got ", prompt_1T.desc());
  NoGradGuard ng;
  Generation g;
  DecodeCache cache = new_cache();
  Tensor in = prompt_1T;
  for (int64_t k = 0; k < new_tokens; ++k) {
    Tensor logits = forward(in, &cache).logits_BTV;
    const int64_t T = logits.size(1);
    Tensor last = ops::contiguous(ops::reshape(ops::slice(logits, 1, T - 1, T), {-1}));
    const int64_t next = ops::max(last, 0).indices.to_ints()[0];
    g.ids.push_back(next);
    g.step_logits.push_back(last);
    in = Tensor::from_ints(std::vector<int64_t>{next}, {1, 1}, DType::I64, prompt_1T.device());
  }
  return g;
}

Decoder export_linear_router(const Decoder& m) {
  const ModelConfig& c = m.config();
  MYRIAD_CHECK(c.myriad.router.mode == "latent_similarity",
               "export_linear_router: the model's router mode is ", c.myriad.router.mode,
               ", not latent_similarity");
  NoGradGuard ng;
  ModelConfig plain = c;
  plain.myriad.router.mode = "linear";
  std::map<std::string, Tensor> t;
  for (const auto& [n, v] : m.weights().tensors()) t[n] = v.detach();
  const double s = 1.0 / std::sqrt(static_cast<double>(c.myriad.router.latent_dim));
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    if (!c.is_moe_layer(i)) continue;
    const std::string p = Moe::prefix(c, i) + "gate.";
    const Tensor E = t.at(p + "expert_embed"), W = t.at(p + "latent_proj.weight");
    t[p + "weight"] = ops::mul(ops::matmul(E.to(DType::F64), W.to(DType::F64)), s).to(E.dtype());
    t.erase(p + "expert_embed"), t.erase(p + "latent_proj.weight");
  }
  return Decoder(plain, Weights::from(Decoder::param_specs(plain), std::move(t)));
}

}  // namespace myriad::model
