// Helpers shared by the model tests.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "core/random.h"
#include "model/decoder.h"

namespace myriad::model {

inline std::string fixture_dir(const std::string& name) {
  return std::string(MYRIAD_SOURCE_DIR) + "/tests/fixtures/models/" + name;
}

inline double max_abs_diff(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.shape(), b.shape());
  if (a.shape() != b.shape()) return INFINITY;
  auto x = a.to_doubles(), y = b.to_doubles();
  double m = 0;
  for (size_t i = 0; i < x.size(); ++i) m = std::max(m, std::abs(x[i] - y[i]));
  return m;
}

// The tiny preset cut to three layers (KDA + dense, KDA + MoE, MLA + MoE; 0-based layer 2 is the
// MLA layer) with widths of a few units, for gradient checks; AttnRes blocks of `attn_res_block`
// layers (0: pre-norm). Callers add their switches and validate().
inline ModelConfig three_layer_config(int64_t attn_res_block) {
  ModelConfig c = tiny();
  c.vocab_size = 32;
  c.hidden_size = 16;
  c.intermediate_size = 24;
  c.moe_intermediate_size = 8;
  c.num_hidden_layers = 3;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 2;
  c.q_lora_rank = 8;
  c.kv_lora_rank = 8;
  c.qk_nope_head_dim = 4;
  c.qk_rope_head_dim = 2;
  c.v_head_dim = 4;
  c.num_experts = 4;
  c.num_experts_per_token = 2;
  c.num_shared_experts = 1;
  c.routed_expert_hidden_size = 12;
  c.latent_moe_use_norm = true;
  c.attn_res_block_size = attn_res_block;
  c.linear_attn_config.num_heads = 2;
  c.linear_attn_config.head_dim = 4;
  c.linear_attn_config.kda_layers = {1, 2};
  c.linear_attn_config.full_attn_layers = {3};
  return c;
}

// three_layer_config with every K3 switch on (lower-bounded and full-rank KDA gates, SiTU, the
// MLA output gate) and AttnRes blocks of 2 layers, so both the intra-block sum and a completed
// block are exercised.
inline ModelConfig k3_three_layer_config() {
  ModelConfig c = three_layer_config(2);
  c.linear_attn_config.gate_lower_bound = -5.0;
  c.linear_attn_config.use_full_rank_gate = true;
  c.hidden_act = "situ";
  c.mla_use_output_gate = true;
  c.validate();
  return c;
}

// A random model whose zero-initialised tensors (AttnRes projections, A_log, the selection bias)
// are made random too, so no path is trivially flat, with O(1) activations; ones and constants
// keep their init.
inline Decoder random_model(const ModelConfig& c, DType dtype, uint64_t seed) {
  Decoder m = Decoder::random(c, seed, dtype);
  Generator gen(seed + 1);
  for (const auto& s : m.weights().specs())
    if (s.init == Init::Zeros || s.init == Init::Normal)
      m.weights().set(s.name, gen.normal(s.shape, 0.0, s.init == Init::Zeros ? 0.5 : 0.3, dtype));
  return m;
}

}  // namespace myriad::model
