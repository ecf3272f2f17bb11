#include "plan/params.h"

#include <algorithm>

namespace myriad::plan {

const char* part_name(Part p) {
  static const char* names[kNumParts] = {
      "embedding",      "lm_head",     "kda_attention", "mla_attention", "routed_experts",
      "shared_experts", "latent_proj", "router",        "dense_ffn",     "norms"};
  return names[static_cast<int>(p)];
}

namespace {

// Collects the tensors of one scope (a layer or the model level) under a name prefix.
struct Table {
  std::vector<ParamTensor>& out;
  int64_t layer;
  void add(Part part, std::string name, Shape shape, bool trainable = true) {
    // Muon takes the 2-D hidden matrices (TRAINING.md §1.1); router, embeddings, head and
    // every vector, conv filter and AttnRes projection stay with AdamW.
    const bool hidden = part == Part::KdaAttention || part == Part::MlaAttention ||
                        part == Part::RoutedExperts || part == Part::SharedExperts ||
                        part == Part::LatentProj || part == Part::DenseFfn;
    const bool muon = hidden && shape.size() == 2 && trainable;
    out.push_back({std::move(name), std::move(shape), part, layer, muon, trainable});
  }
};

void add_mla(const ModelConfig& c, Table& t, const std::string& p) {
  const int64_t d = c.hidden_size, H = c.num_attention_heads, dn = c.qk_nope_head_dim,
                dr = c.qk_rope_head_dim, dv = c.v_head_dim, r = c.kv_lora_rank;
  const Part m = Part::MlaAttention;
  if (c.q_lora_rank) {  // §3.1
    t.add(m, p + "q_a_proj.weight", {*c.q_lora_rank, d});
    t.add(m, p + "q_a_layernorm.weight", {*c.q_lora_rank});
    t.add(m, p + "q_b_proj.weight", {H * (dn + dr), *c.q_lora_rank});
  } else {
    t.add(m, p + "q_proj.weight", {H * (dn + dr), d});
  }
  t.add(m, p + "kv_a_proj_with_mqa.weight", {r + dr, d});
  t.add(m, p + "kv_a_layernorm.weight", {r});
  t.add(m, p + "kv_b_proj.weight", {H * (dn + dv), r});
  t.add(m, p + "o_proj.weight", {d, H * dv});
  if (c.mla_use_output_gate) t.add(m, p + "g_proj.weight", {H * dv, d});
  const auto& adm = c.myriad.admission;  // §12.4
  if (adm.enabled) {
    t.add(m, p + "admission.w1.weight", {adm.hidden, d + r});
    t.add(m, p + "admission.w1.bias", {adm.hidden});
    t.add(m, p + "admission.w2.weight", {1, adm.hidden});
    t.add(m, p + "admission.w2.bias", {1});
  }
}

void add_kda(const ModelConfig& c, Table& t, const std::string& p) {  // §4.1
  const auto& lac = c.linear_attn_config;
  const int64_t d = c.hidden_size, H = lac.num_heads, dk = lac.head_dim, P = H * dk,
                K = lac.short_conv_kernel_size;
  const Part k = Part::KdaAttention;
  for (const char* x : {"q", "k", "v"}) t.add(k, p + x + "_proj.weight", {P, d});
  for (const char* x : {"q", "k", "v"}) t.add(k, p + x + "_conv1d.weight", {P, 1, K});
  t.add(k, p + "f_a_proj.weight", {dk, d});
  t.add(k, p + "f_b_proj.weight", {P, dk});
  t.add(k, p + "dt_bias", {P});
  t.add(k, p + "A_log", {1, 1, H, 1});  // Kimi Linear layout; K3's reported [128] is unverified
  t.add(k, p + "b_proj.weight", {H, d});
  if (lac.use_full_rank_gate) {
    t.add(k, p + "g_proj.weight", {P, d});
  } else {
    t.add(k, p + "g_a_proj.weight", {dk, d});
    t.add(k, p + "g_b_proj.weight", {P, dk});
  }
  t.add(k, p + "o_norm.weight", {dk});
  t.add(k, p + "o_proj.weight", {d, P});
}

void add_moe(const ModelConfig& c, Table& t, const std::string& layer_prefix) {  // §6, §11.2
  const bool ds = c.is_deepseek();
  const std::string p = layer_prefix + (ds ? "mlp." : "block_sparse_moe.");
  const int64_t d = c.hidden_size, n = c.num_experts, I = c.moe_intermediate_size;
  const int64_t l = c.routed_expert_hidden_size.value_or(d);
  if (c.myriad.router.mode == "latent_similarity") {  // §12.2: replaces gate.weight
    t.add(Part::Router, p + "gate.latent_proj.weight", {c.myriad.router.latent_dim, d});
    t.add(Part::Router, p + "gate.expert_embed", {n, c.myriad.router.latent_dim});
  } else {
    t.add(Part::Router, p + "gate.weight", {n, d});
  }
  t.add(Part::Router, p + "gate.e_score_correction_bias", {n}, false);
  if (c.uses_latent_moe()) t.add(Part::LatentProj, p + "routed_expert_down_proj.weight", {l, d});
  const char* names[3] = {ds ? "gate_proj" : "w1", ds ? "up_proj" : "w3", ds ? "down_proj" : "w2"};
  for (int64_t j = 0; j < n; ++j) {
    const std::string e = p + "experts." + std::to_string(j) + ".";
    t.add(Part::RoutedExperts, e + names[0] + ".weight", {I, l});
    t.add(Part::RoutedExperts, e + names[1] + ".weight", {I, l});
    t.add(Part::RoutedExperts, e + names[2] + ".weight", {l, I});
  }
  if (c.uses_latent_moe()) {
    if (c.latent_moe_use_norm) t.add(Part::LatentProj, p + "routed_expert_norm.weight", {l});
    t.add(Part::LatentProj, p + "routed_expert_up_proj.weight", {d, l});
  }
  if (c.num_shared_experts > 0) {  // n_s experts fused into one GLU MLP
    const int64_t Is = c.num_shared_experts * I;
    t.add(Part::SharedExperts, p + "shared_experts.gate_proj.weight", {Is, d});
    t.add(Part::SharedExperts, p + "shared_experts.up_proj.weight", {Is, d});
    t.add(Part::SharedExperts, p + "shared_experts.down_proj.weight", {d, Is});
  }
}

void add_dense(const ModelConfig& c, Table& t, const std::string& layer_prefix) {
  const int64_t d = c.hidden_size, I = c.intermediate_size;
  t.add(Part::DenseFfn, layer_prefix + "mlp.gate_proj.weight", {I, d});
  t.add(Part::DenseFfn, layer_prefix + "mlp.up_proj.weight", {I, d});
  t.add(Part::DenseFfn, layer_prefix + "mlp.down_proj.weight", {d, I});
}

// §12.1: the carry into layer i >= 1 (Â_1 = A_1 needs none).
void add_carry(const ModelConfig& c, Table& t, const std::string& layer_prefix) {
  const auto& r = c.myriad.residual;
  const std::string p = layer_prefix + "attn_carry.";
  const int64_t d = c.hidden_size;
  if (r.attn_carry == "gamma_scalar") {
    t.add(Part::Norms, p + "gamma", {1});
  } else if (r.attn_carry == "gamma_vector") {
    t.add(Part::Norms, p + "gamma", {d});
  } else if (r.attn_carry == "gamma_input") {
    // "gamma" is the scalar bias inside σ (initialised to gamma_bias_init, else 0).
    t.add(Part::Norms, p + "gamma", {1});
    t.add(Part::Norms, p + "w", {d});
    t.add(Part::Norms, p + "norm.weight", {d});
  }
}

}  // namespace

std::vector<ParamTensor> param_table(const ModelConfig& c) {
  c.validate();
  const int64_t d = c.hidden_size, V = c.vocab_size;
  std::vector<ParamTensor> out;
  Table top{out, -1};
  top.add(Part::Embedding, "model.embed_tokens.weight", {V, d});
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    Table t{out, i};
    const std::string p = "model.layers." + std::to_string(i) + ".";
    t.add(Part::Norms, p + "input_layernorm.weight", {d});
    t.add(Part::Norms, p + "post_attention_layernorm.weight", {d});
    if (c.uses_attn_res())
      for (const char* n : {"self_attention_res_", "mlp_res_"}) {
        t.add(Part::Norms, p + n + "norm.weight", {d});
        t.add(Part::Norms, p + n + "proj.weight", {1, d});
      }
    if (i > 0) add_carry(c, t, p);
    if (c.is_mla_layer(i))
      add_mla(c, t, p + "self_attn.");
    else
      add_kda(c, t, p + "self_attn.");
    if (c.is_moe_layer(i))
      add_moe(c, t, p);
    else
      add_dense(c, t, p);
  }
  top.add(Part::Norms, "model.norm.weight", {d});
  if (c.uses_attn_res()) {
    top.add(Part::Norms, "model.output_attn_res_norm.weight", {d});
    top.add(Part::Norms, "model.output_attn_res_proj.weight", {1, d});
  }
  top.add(Part::Head, "lm_head.weight", {V, d});
  return out;
}

std::vector<std::pair<std::string, Shape>> expected_tensors(const ModelConfig& c) {
  std::vector<std::pair<std::string, Shape>> out;
  for (auto& t : param_table(c)) out.emplace_back(std::move(t.name), std::move(t.shape));
  return out;
}

ParamCounts count_params(const ModelConfig& c) {
  ParamCounts pc;
  pc.layers.resize(c.num_hidden_layers);
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    pc.layers[i].mla = c.is_mla_layer(i);
    pc.layers[i].moe = c.is_moe_layer(i);
  }
  const int64_t n = c.num_experts, k = c.num_experts_per_token;
  for (const auto& t : param_table(c)) {
    const int64_t numel = shape_numel(t.shape);
    const int part = static_cast<int>(t.part);
    const bool routed = t.part == Part::RoutedExperts;
    pc.total_by_part[part] += numel;
    pc.total += numel;
    ++pc.num_tensors;
    if (t.muon) pc.muon += numel;
    if (t.trainable) pc.trainable += numel;
    // A routed expert is active for k of n experts; every expert has the same shape, so the
    // active share is exactly k/n of each layer's routed total (summed exactly below).
    if (!routed) {
      pc.active_by_part[part] += numel;
      if (t.shape.size() == 2 && t.part != Part::Embedding) pc.matmul_active += numel;
    }
    if (t.layer < 0) {
      if (t.part == Part::Embedding)
        pc.embedding += numel;
      else if (t.part == Part::Head)
        pc.head += numel;
      else
        pc.model_level_other += numel;
      continue;
    }
    LayerParams& lp = pc.layers[t.layer];
    (routed ? lp.routed : lp.shared) += numel;
    if (!routed && !t.trainable) lp.frozen += numel;
    if (t.muon) {
      (routed ? lp.muon_routed : lp.muon_shared) += numel;
      (routed ? lp.muon_ns_flops_routed : lp.muon_ns_flops_shared) +=
          newton_schulz_flops(t.shape[0], t.shape[1]);
    }
  }
  for (const auto& lp : pc.layers)
    if (lp.moe && n > 0) {
      pc.expert_size = lp.routed / n;
      const int64_t act = pc.expert_size * k;
      pc.active_by_part[static_cast<int>(Part::RoutedExperts)] += act;
      pc.matmul_active += act;
    }
  for (int p = 0; p < kNumParts; ++p) pc.active_with_embedding += pc.active_by_part[p];
  pc.active = pc.active_with_embedding - pc.embedding;
  pc.mtp_layers_not_built = c.num_nextn_predict_layers;
  return pc;
}

double newton_schulz_flops(int64_t rows, int64_t cols) {
  const double a = static_cast<double>(std::min(rows, cols));
  const double b = static_cast<double>(std::max(rows, cols));
  return 5 * (4 * a * a * b + 2 * a * a * a);
}

double CacheFootprint::mla_tokens(int64_t tokens) const {
  if (admission_window < 0 || tokens <= admission_window) return static_cast<double>(tokens);
  return static_cast<double>(admission_window) +
         admission_rate * static_cast<double>(tokens - admission_window);
}

double CacheFootprint::per_sequence(int64_t tokens) const {
  return mla_tokens(tokens) * static_cast<double>(mla_bytes_per_token) +
         static_cast<double>(kda_state_bytes + kda_conv_bytes);
}

CacheFootprint cache_footprint(const ModelConfig& c, int64_t state_bytes) {
  CacheFootprint s;
  s.mla_layers = c.num_mla_layers();
  s.kda_layers = c.num_hidden_layers - s.mla_layers;
  s.mla_bytes_per_token = s.mla_layers * (c.kv_lora_rank + c.qk_rope_head_dim) * 2;
  const auto& lac = c.linear_attn_config;
  const int64_t P = lac.num_heads * lac.head_dim;
  s.kda_state_bytes = s.kda_layers * P * lac.head_dim * state_bytes;  // H·d_k·d_v, d_v = d_k
  s.kda_conv_bytes = s.kda_layers * 3 * (lac.short_conv_kernel_size - 1) * P * 2;
  if (c.myriad.admission.enabled) {
    s.admission_window = c.myriad.admission.window;
    s.admission_rate = c.myriad.admission.target_rate;
  }
  return s;
}

}  // namespace myriad::plan
