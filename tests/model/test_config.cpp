// ModelConfig: presets (MODEL.md §1, §13) and their configs/<name>/config.json files, reading
// (aliases, the kimi_k3 wrapper, DeepSeek-V3 spelling), writing, layout helpers, and one test per
// validation rule. Set MYRIAD_WRITE_CONFIGS=1 to regenerate configs/ from the presets.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/file.h"
#include "model/config.h"

namespace myriad::model {

// gtest prints configs as their JSON.
void PrintTo(const ModelConfig& c, std::ostream* os) {
  *os << c.to_json();
}

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

template <class F>
void expect_error(F&& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "expected an error mentioning " << parts.at(0);
  } catch (const Error& e) {
    for (const auto& p : parts)
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what() << "\n  lacks: " << p;
  }
}

std::vector<int64_t> mla_layers(const ModelConfig& c) {  // 1-based, from the layout helper
  std::vector<int64_t> out;
  for (int64_t i = 0; i < c.num_hidden_layers; ++i)
    if (c.is_mla_layer(i)) out.push_back(i + 1);
  return out;
}

std::vector<int64_t> range(int64_t from, int64_t to, int64_t step) {
  std::vector<int64_t> v;
  for (int64_t x = from; x <= to; x += step) v.push_back(x);
  return v;
}

ModelConfig from(const json& j) {
  return ModelConfig::from_json(j.dump(), "config.json");
}

// ---- Presets ----

TEST(ConfigPresets, AllValidateAndRoundTrip) {
  for (const auto& name : preset_names()) {
    SCOPED_TRACE(name);
    ModelConfig c = preset(name);
    EXPECT_NO_THROW(c.validate());
    ModelConfig back = ModelConfig::from_json(c.to_json());
    EXPECT_EQ(back, c);
    EXPECT_EQ(back.to_json(), c.to_json());
  }
  EXPECT_EQ(preset("medium_k3"), medium_k3());
  expect_error([] { preset("huge"); }, {"unknown model preset 'huge'"});
}

TEST(ConfigPresets, KimiK3) {
  ModelConfig c = kimi_k3();
  EXPECT_EQ(c.num_hidden_layers, 93);
  EXPECT_EQ(c.hidden_size, 7168);
  EXPECT_EQ(c.vocab_size, 163840);
  std::vector<int64_t> mla = range(4, 92, 4);
  mla.push_back(93);
  EXPECT_EQ(mla_layers(c), mla);
  EXPECT_EQ(c.num_mla_layers(), 24);
  EXPECT_EQ(c.linear_attn_config.kda_layers.size(), 69u);
  EXPECT_EQ(c.num_attention_heads, 96);
  EXPECT_EQ(c.linear_attn_config.num_heads, 96);
  EXPECT_EQ(c.q_lora_rank, 1536);
  EXPECT_EQ(c.kv_lora_rank, 512);
  EXPECT_EQ(c.qk_nope_head_dim, 128);
  EXPECT_EQ(c.qk_rope_head_dim, 64);
  EXPECT_EQ(c.v_head_dim, 128);
  EXPECT_TRUE(c.mla_use_nope);
  EXPECT_TRUE(c.mla_use_output_gate);
  EXPECT_EQ(c.linear_attn_config.head_dim, 128);
  EXPECT_EQ(c.linear_attn_config.short_conv_kernel_size, 4);
  EXPECT_EQ(c.linear_attn_config.gate_lower_bound, -5.0);
  EXPECT_TRUE(c.linear_attn_config.use_full_rank_gate);
  EXPECT_EQ(c.attn_res_block_size, 12);
  EXPECT_EQ(c.num_experts, 896);
  EXPECT_EQ(c.num_experts_per_token, 16);
  EXPECT_EQ(c.num_shared_experts, 2);
  EXPECT_EQ(c.moe_intermediate_size, 3072);
  EXPECT_EQ(c.routed_expert_hidden_size, 3584);
  EXPECT_TRUE(c.latent_moe_use_norm);
  EXPECT_EQ(c.intermediate_size, 33792);
  EXPECT_EQ(c.routed_scaling_factor, 1.0);
  EXPECT_FALSE(c.use_grouped_topk);
  EXPECT_EQ(c.hidden_act, "situ");
  EXPECT_EQ(c.activation_situ_beta, 4.0);
  EXPECT_EQ(c.activation_situ_linear_beta, 25.0);
  EXPECT_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_EQ(c.model_max_length, 1048576);
  EXPECT_EQ(c.first_k_dense_replace, 1);
  EXPECT_FALSE(c.is_moe_layer(0));
  EXPECT_TRUE(c.is_moe_layer(1));
  EXPECT_EQ(c.bos_token_id, 163584);
  EXPECT_EQ(c.eos_token_id, 163586);
  EXPECT_EQ(c.pad_token_id, 163839);
  // §13: every Myriad switch at its K3-exact default.
  EXPECT_EQ(c.myriad, MyriadOptions{});
  EXPECT_EQ(c.myriad.balancer.mode, "quantile");
  EXPECT_EQ(c.myriad.residual.attn_carry, "none");
  EXPECT_EQ(c.myriad.router.mode, "linear");
  EXPECT_FALSE(c.myriad.admission.enabled);
}

TEST(ConfigPresets, KimiLinear48B) {
  ModelConfig c = kimi_linear_48b();
  EXPECT_EQ(c.num_hidden_layers, 27);
  EXPECT_EQ(c.hidden_size, 2304);
  std::vector<int64_t> mla = range(4, 24, 4);
  mla.push_back(27);
  EXPECT_EQ(mla_layers(c), mla);
  EXPECT_EQ(c.linear_attn_config.kda_layers.size(), 20u);
  EXPECT_EQ(c.num_attention_heads, 32);
  EXPECT_FALSE(c.q_lora_rank.has_value());
  EXPECT_EQ(c.kv_lora_rank, 512);
  EXPECT_FALSE(c.linear_attn_config.gate_lower_bound.has_value());
  EXPECT_FALSE(c.linear_attn_config.use_full_rank_gate);
  EXPECT_FALSE(c.mla_use_output_gate);
  EXPECT_FALSE(c.uses_attn_res());
  EXPECT_FALSE(c.uses_latent_moe());
  EXPECT_EQ(c.num_experts, 256);
  EXPECT_EQ(c.num_experts_per_token, 8);
  EXPECT_EQ(c.num_shared_experts, 1);
  EXPECT_EQ(c.moe_intermediate_size, 1024);
  EXPECT_EQ(c.intermediate_size, 9216);
  EXPECT_EQ(c.routed_scaling_factor, 2.446);
  EXPECT_EQ(c.hidden_act, "silu");
  EXPECT_EQ(c.myriad.balancer.mode, "sign");
}

TEST(ConfigPresets, DeepSeekV3) {
  ModelConfig c = deepseek_v3();
  EXPECT_EQ(c.model_type, "deepseek_v3");
  EXPECT_EQ(c.num_hidden_layers, 61);
  EXPECT_EQ(c.num_mla_layers(), 61);
  EXPECT_EQ(c.first_k_dense_replace, 3);
  EXPECT_FALSE(c.is_moe_layer(2));
  EXPECT_TRUE(c.is_moe_layer(3));
  EXPECT_EQ(c.vocab_size, 129280);
  EXPECT_EQ(c.num_attention_heads, 128);
  EXPECT_EQ(c.q_lora_rank, 1536);
  EXPECT_FALSE(c.mla_use_nope);
  ASSERT_TRUE(c.rope_scaling.has_value());
  EXPECT_EQ(c.rope_scaling->factor, 40.0);
  EXPECT_EQ(c.rope_scaling->original_max_position_embeddings, 4096);
  EXPECT_EQ(c.rope_scaling->beta_fast, 32.0);
  EXPECT_EQ(c.rope_scaling->beta_slow, 1.0);
  EXPECT_EQ(c.num_experts, 256);
  EXPECT_EQ(c.num_expert_group, 8);
  EXPECT_EQ(c.topk_group, 4);
  EXPECT_TRUE(c.use_grouped_topk);
  EXPECT_EQ(c.moe_intermediate_size, 2048);
  EXPECT_EQ(c.intermediate_size, 18432);
  EXPECT_EQ(c.routed_scaling_factor, 2.5);
  EXPECT_EQ(c.rms_norm_eps, 1e-6);
  EXPECT_EQ(c.model_max_length, 131072);
  // The DeepSeek spelling on write.
  json j = json::parse(c.to_json());
  EXPECT_EQ(j.at("n_routed_experts"), 256);
  EXPECT_EQ(j.at("num_experts_per_tok"), 8);
  EXPECT_EQ(j.at("n_group"), 8);
  EXPECT_EQ(j.at("norm_topk_prob"), true);
  EXPECT_EQ(j.at("scoring_func"), "sigmoid");
  EXPECT_EQ(j.at("max_position_embeddings"), 131072);
  EXPECT_EQ(j.at("rope_scaling").at("type"), "yarn");
  EXPECT_FALSE(j.contains("num_experts"));
  EXPECT_FALSE(j.contains("linear_attn_config"));
  EXPECT_FALSE(j.contains("layer_types"));
}

TEST(ConfigPresets, TinyMediumAndMediumK3) {
  ModelConfig t = tiny();
  EXPECT_EQ(t.num_hidden_layers, 8);
  EXPECT_EQ(t.hidden_size, 128);
  EXPECT_EQ(t.vocab_size, 512);
  EXPECT_EQ(mla_layers(t), (std::vector<int64_t>{4, 8}));
  EXPECT_EQ(t.num_attention_heads, 2);
  EXPECT_EQ(t.q_lora_rank, 64);
  EXPECT_EQ(t.kv_lora_rank, 64);
  EXPECT_EQ(t.qk_nope_head_dim, 32);
  EXPECT_EQ(t.qk_rope_head_dim, 16);
  EXPECT_EQ(t.linear_attn_config.head_dim, 32);
  EXPECT_EQ(t.linear_attn_config.gate_lower_bound, -5.0);
  EXPECT_TRUE(t.linear_attn_config.use_full_rank_gate);
  EXPECT_EQ(t.attn_res_block_size, 2);
  EXPECT_EQ(t.num_experts, 8);
  EXPECT_EQ(t.num_experts_per_token, 2);
  EXPECT_EQ(t.moe_intermediate_size, 64);
  EXPECT_EQ(t.routed_expert_hidden_size, 64);
  EXPECT_EQ(t.intermediate_size, 256);
  EXPECT_EQ(t.hidden_act, "situ");
  EXPECT_EQ(t.model_max_length, 16384);
  EXPECT_EQ(t.myriad.admission.window, 64);
  EXPECT_FALSE(t.bos_token_id.has_value());

  ModelConfig m = medium();
  EXPECT_EQ(m.num_hidden_layers, 12);
  EXPECT_EQ(m.hidden_size, 1024);
  EXPECT_EQ(m.vocab_size, 32000);
  EXPECT_EQ(mla_layers(m), (std::vector<int64_t>{4, 8, 12}));
  EXPECT_EQ(m.num_attention_heads, 16);
  EXPECT_FALSE(m.q_lora_rank.has_value());
  EXPECT_EQ(m.kv_lora_rank, 256);
  EXPECT_EQ(m.qk_nope_head_dim, 64);
  EXPECT_EQ(m.qk_rope_head_dim, 32);
  EXPECT_EQ(m.v_head_dim, 64);
  EXPECT_EQ(m.linear_attn_config.num_heads, 16);
  EXPECT_EQ(m.linear_attn_config.head_dim, 64);
  EXPECT_EQ(m.num_experts, 64);
  EXPECT_EQ(m.num_experts_per_token, 6);
  EXPECT_EQ(m.moe_intermediate_size, 256);
  EXPECT_EQ(m.intermediate_size, 2816);
  EXPECT_EQ(m.routed_scaling_factor, 2.446);
  EXPECT_EQ(m.model_max_length, 65536);
  EXPECT_FALSE(m.uses_attn_res());
  EXPECT_EQ(m.myriad.balancer.mode, "quantile");

  ModelConfig k = medium_k3();
  EXPECT_EQ(k.hidden_size, m.hidden_size);
  EXPECT_EQ(k.num_experts, m.num_experts);
  EXPECT_EQ(k.routed_expert_hidden_size, 512);
  EXPECT_EQ(k.attn_res_block_size, 4);
  EXPECT_EQ(k.hidden_act, "situ");
  EXPECT_TRUE(k.mla_use_output_gate);
  EXPECT_EQ(k.linear_attn_config.gate_lower_bound, -5.0);
  EXPECT_EQ(k.routed_scaling_factor, 1.0);
}

// configs/<name>/config.json are exactly the presets' output.
TEST(ConfigPresets, FilesInConfigsMatchPresets) {
  const bool regenerate = std::getenv("MYRIAD_WRITE_CONFIGS") != nullptr;
  for (const auto& name : preset_names()) {
    SCOPED_TRACE(name);
    ModelConfig c = preset(name);
    fs::path dir = fs::path(MYRIAD_SOURCE_DIR) / "configs" / name;
    if (regenerate) {
      fs::create_directories(dir);
      c.save(dir.string());
    }
    ASSERT_TRUE(fs::exists(dir / "config.json")) << "run with MYRIAD_WRITE_CONFIGS=1";
    EXPECT_EQ(io::read_file((dir / "config.json").string()), c.to_json());
    EXPECT_EQ(ModelConfig::load(dir.string()), c);
  }
}

// ---- Reading ----

json kimi_linear_checkpoint_json() {  // the published Kimi-Linear-48B-A3B config.json shape
  return json::parse(R"({
    "architectures": ["KimiLinearForCausalLM"],
    "auto_map": {"AutoConfig": "configuration_kimi.KimiLinearConfig"},
    "bos_token_id": 163584, "eos_token_id": 163586, "pad_token_id": 163839,
    "dtype": "bfloat16", "torch_dtype": "bfloat16",
    "first_k_dense_replace": 1, "hidden_act": "silu", "hidden_size": 2304,
    "initializer_range": 0.02, "intermediate_size": 9216, "kv_lora_rank": 512,
    "linear_attn_config": {"full_attn_layers": [4, 8, 12, 16, 20, 24, 27], "head_dim": 128,
      "kda_layers": [1, 2, 3, 5, 6, 7, 9, 10, 11, 13, 14, 15, 17, 18, 19, 21, 22, 23, 25, 26],
      "num_heads": 32, "short_conv_kernel_size": 4},
    "mla_use_nope": true, "model_max_length": 1048576, "model_type": "kimi_linear",
    "moe_intermediate_size": 1024, "moe_layer_freq": 1, "moe_renormalize": true,
    "moe_router_activation_func": "sigmoid", "num_attention_heads": 32, "num_expert_group": 1,
    "num_experts": 256, "num_experts_per_token": 8, "num_hidden_layers": 27,
    "num_key_value_heads": 32, "num_nextn_predict_layers": 0, "num_shared_experts": 1,
    "q_lora_rank": null, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "rms_norm_eps": 1e-05,
    "rope_scaling": null, "rope_theta": 10000.0, "routed_scaling_factor": 2.446,
    "tie_word_embeddings": false, "topk_group": 1, "transformers_version": "4.56.0",
    "use_cache": true, "use_grouped_topk": true, "v_head_dim": 128, "vocab_size": 163840})");
}

TEST(ConfigRead, KimiLinearCheckpointMatchesPreset) {
  ModelConfig c = from(kimi_linear_checkpoint_json());
  ModelConfig want = kimi_linear_48b();
  want.transformers_version = "4.56.0";
  want.myriad = MyriadOptions{};  // no "myriad" object: K3 defaults
  EXPECT_EQ(c.extra.size(), 1u);  // auto_map, kept verbatim
  EXPECT_EQ(c.extra.at("auto_map"), R"({"AutoConfig":"configuration_kimi.KimiLinearConfig"})");
  c.extra.clear();
  EXPECT_EQ(c, want);
  // Written back: the unknown key survives, and the derived keys appear.
  json j = json::parse(from(kimi_linear_checkpoint_json()).to_json());
  EXPECT_EQ(j.at("auto_map").at("AutoConfig"), "configuration_kimi.KimiLinearConfig");
  EXPECT_EQ(j.at("qk_head_dim"), 192);
  EXPECT_EQ(j.at("head_dim"), 64);
  EXPECT_EQ(j.at("layer_types").size(), 27u);
  EXPECT_EQ(j.at("layer_types")[3], "full_attention");
  EXPECT_EQ(j.at("layer_types")[26], "full_attention");
  EXPECT_EQ(j.at("layer_types")[25], "linear_attention");
  EXPECT_EQ(j.at("mlp_layer_types")[0], "dense");
  EXPECT_EQ(j.at("mlp_layer_types")[1], "sparse");
  EXPECT_FALSE(j.contains("attn_res_block_size"));  // K3 keys only when used
  EXPECT_FALSE(j.contains("activation_situ_beta"));
}

TEST(ConfigRead, TransformersAliases) {
  json j = kimi_linear_checkpoint_json();
  for (auto [canon, alias] : {std::pair{"model_max_length", "max_position_embeddings"},
                              {"moe_renormalize", "norm_topk_prob"},
                              {"num_expert_group", "n_group"},
                              {"num_experts", "num_local_experts"},
                              {"num_experts_per_token", "num_experts_per_tok"},
                              {"num_shared_experts", "n_shared_experts"}}) {
    j[alias] = j[canon];
    j.erase(canon);
  }
  j.erase("dtype");  // torch_dtype alone
  EXPECT_EQ(from(j), from(kimi_linear_checkpoint_json()));
  // Both spellings present must agree.
  json k = kimi_linear_checkpoint_json();
  k["num_local_experts"] = 128;
  expect_error([&] { from(k); }, {"config.json",
                                  "num_experts (256) and its alias "
                                  "num_local_experts (128) disagree"});
}

TEST(ConfigRead, KimiK3WrapperRoundTrips) {
  // A K3-form model is written in the release's wrapper (docs/CHECKPOINTS.md).
  const json written = json::parse(kimi_k3().to_json());
  EXPECT_EQ(written.at("model_type"), "kimi_k3");
  EXPECT_EQ(written.at("architectures"), json::array({"KimiK3ForConditionalGeneration"}));
  EXPECT_EQ(ModelConfig::from_json(kimi_k3().to_json()), kimi_k3());
  json inner = written.at("text_config");
  json outer = {{"model_type", "kimi_k3"},
                {"architectures", {"KimiK3ForConditionalGeneration"}},
                {"vision_config", {{"hidden_size", 1152}, {"num_hidden_layers", 27}}},
                {"text_config", inner}};
  ModelConfig c = from(outer);
  EXPECT_NO_THROW(c.validate());
  ModelConfig plain = c;
  plain.wrapper_json.clear();
  plain.vision.reset();  // the wrapper's vision_config is read into these two
  plain.media_placeholder_token_id.reset();
  EXPECT_EQ(plain, kimi_k3());
  json back = json::parse(c.to_json());
  EXPECT_EQ(back.at("model_type"), "kimi_k3");
  EXPECT_EQ(back.at("vision_config").at("num_hidden_layers"), 27);
  EXPECT_EQ(back.at("text_config"), inner);
  EXPECT_EQ(ModelConfig::from_json(c.to_json()), c);
  expect_error([] { ModelConfig::from_json(R"({"model_type": "kimi_k3"})"); },
               {"kimi_k3 needs a text_config object"});
  outer["text_config"]["hidden_size"] = "wide";
  expect_error([&] { from(outer); }, {"config.json: text_config.hidden_size must be an integer"});
}

TEST(ConfigRead, DeepSeekV3Checkpoint) {
  json j = json::parse(R"({
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
    "bos_token_id": 0, "eos_token_id": 1, "first_k_dense_replace": 3, "hidden_act": "silu",
    "hidden_size": 7168, "initializer_range": 0.02, "intermediate_size": 18432,
    "kv_lora_rank": 512, "max_position_embeddings": 131072, "moe_intermediate_size": 2048,
    "moe_layer_freq": 1, "n_group": 8, "n_routed_experts": 256, "n_shared_experts": 1,
    "norm_topk_prob": true, "num_attention_heads": 128, "num_experts_per_tok": 8,
    "num_hidden_layers": 61, "num_key_value_heads": 128, "num_nextn_predict_layers": 1,
    "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "rms_norm_eps": 1e-06,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0,
      "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096, "type": "yarn"},
    "rope_theta": 10000, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid",
    "tie_word_embeddings": false, "topk_group": 4, "topk_method": "noaux_tc",
    "torch_dtype": "bfloat16", "use_cache": true, "v_head_dim": 128, "vocab_size": 129280,
    "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}})");
  ModelConfig c = from(j);
  EXPECT_NO_THROW(c.validate());
  EXPECT_EQ(c.extra.count("quantization_config"), 1u);
  c.extra.clear();
  ModelConfig want = deepseek_v3();
  want.myriad = MyriadOptions{};
  EXPECT_EQ(c, want);
}

// transformers 5 writes rope_theta and the YaRN settings as one rope_parameters object.
TEST(ConfigRead, RopeParametersSpelling) {
  json j = json::parse(deepseek_v3().to_json());
  j.erase("rope_scaling");
  j.erase("rope_theta");
  j["rope_parameters"] = {{"rope_type", "yarn"}, {"rope_theta", 50000.0},
                          {"factor", 32.0},      {"original_max_position_embeddings", 4096},
                          {"beta_fast", 1.0},    {"beta_slow", 1.0},
                          {"mscale", 1.0},       {"mscale_all_dim", 1.0}};
  j["rope_interleave"] = true;
  ModelConfig c = from(j);
  EXPECT_EQ(c.rope_theta, 50000.0);
  ASSERT_TRUE(c.rope_scaling.has_value());
  EXPECT_EQ(c.rope_scaling->factor, 32.0);
  EXPECT_EQ(c.rope_scaling->beta_fast, 1.0);
  EXPECT_EQ(c.rope_interleave, true);
  EXPECT_EQ(ModelConfig::from_json(c.to_json()), c);
  json back = json::parse(c.to_json());  // both spellings are written, and agree
  EXPECT_EQ(back.at("rope_parameters").at("rope_theta"), 50000.0);
  EXPECT_EQ(back.at("rope_scaling").at("factor"), 32.0);
  EXPECT_EQ(back.at("rope_interleave"), true);
  // No scaling: rope_type "default".
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 10.0}};
  EXPECT_FALSE(from(j).rope_scaling.has_value());
  EXPECT_EQ(from(j).rope_theta, 10.0);
  // Both spellings must agree.
  j["rope_theta"] = 20.0;
  expect_error([&] { from(j); }, {"rope_parameters.rope_theta (10) and rope_theta (20) disagree"});
  j.erase("rope_theta");
  j["rope_parameters"] = {{"rope_type", "yarn"}, {"factor", 8.0}};
  j["rope_scaling"] = {{"type", "yarn"}, {"factor", 4.0}};
  expect_error([&] { from(j); }, {"rope_scaling and rope_parameters disagree"});
  j["rope_interleave"] = "yes";
  expect_error([&] { from(j); }, {"rope_interleave must be true, false or null"});
}

TEST(ConfigRead, LayoutDefaultsWhenListsAreMissing) {
  json j = kimi_linear_checkpoint_json();
  j["linear_attn_config"].erase("kda_layers");
  j["linear_attn_config"].erase("full_attn_layers");
  ModelConfig c = from(j);  // MODEL.md §5 rule, with the final MLA layer
  EXPECT_EQ(c.linear_attn_config.full_attn_layers,
            (std::vector<int64_t>{4, 8, 12, 16, 20, 24, 27}));
  j["linear_attn_config"]["full_attn_layers"] = {2, 27};  // one list: the other is the complement
  ModelConfig d = from(j);
  EXPECT_EQ(mla_layers(d), (std::vector<int64_t>{2, 27}));
  EXPECT_EQ(d.linear_attn_config.kda_layers.size(), 25u);
  j["linear_attn_config"].erase("full_attn_layers");  // no lists: layer_types if given
  j["layer_types"] = std::vector<std::string>(27, "linear_attention");
  j["layer_types"][0] = "full_attention";
  EXPECT_EQ(mla_layers(from(j)), (std::vector<int64_t>{1}));
  // The helper on a config without lists applies the same rule.
  ModelConfig e = tiny();
  e.linear_attn_config.kda_layers.clear();
  e.linear_attn_config.full_attn_layers.clear();
  EXPECT_EQ(mla_layers(e), (std::vector<int64_t>{4, 8}));
  expect_error([&] { e.is_mla_layer(8); }, {"layer 8 outside 0..7"});
}

TEST(ConfigRead, MyriadOptionsAndK3ExtensionsRoundTrip) {
  ModelConfig c = tiny();
  c.myriad.residual.attn_carry = "gamma_input";
  c.myriad.residual.gamma_bias_init = -6.0;
  c.myriad.router.mode = "latent_similarity";
  c.myriad.router.latent_dim = 32;
  c.myriad.balancer.mode = "quantile_band";
  c.myriad.balancer.recentre = true;
  c.myriad.balancer.freeze_after = 1000;
  c.myriad.admission.enabled = true;
  c.myriad.admission.tau = 0.25;
  c.mla_use_output_gate = true;
  c.linear_attn_config.gate_lower_bound = -3.5;
  c.activation_situ_beta = 3.0;
  c.validate();
  json j = json::parse(c.to_json()).at("text_config");  // K3 form: the release wrapper
  EXPECT_EQ(j.at("myriad").at("residual").at("attn_carry"), "gamma_input");
  EXPECT_EQ(j.at("myriad").at("mla").at("admission").at("enabled"), true);
  EXPECT_EQ(j.at("linear_attn_config").at("gate_lower_bound"), -3.5);
  EXPECT_EQ(j.at("attn_res_block_size"), 2);
  EXPECT_EQ(j.at("routed_expert_hidden_size"), 64);
  EXPECT_EQ(j.at("latent_moe_use_norm"), true);
  EXPECT_EQ(j.at("activation_situ_beta"), 3.0);
  EXPECT_EQ(ModelConfig::from_json(c.to_json()), c);
  // A partial "myriad" object keeps the other defaults.
  json k = json::parse(tiny().to_json());
  ASSERT_TRUE(tiny().is_k3_form());
  k["text_config"]["myriad"] = {{"router", {{"mode", "latent_similarity"}}}};
  ModelConfig d = from(k);
  EXPECT_EQ(d.myriad.router.mode, "latent_similarity");
  EXPECT_EQ(d.myriad.router.latent_dim, 64);
  EXPECT_EQ(d.myriad.balancer, MyriadOptions::Balancer{});
}

TEST(ConfigRead, EosListIsKeptVerbatim) {
  json j = kimi_linear_checkpoint_json();
  j["eos_token_id"] = {163586, 163585};
  ModelConfig c = from(j);
  EXPECT_FALSE(c.eos_token_id.has_value());
  EXPECT_EQ(json::parse(c.to_json()).at("eos_token_id"), j["eos_token_id"]);
}

TEST(ConfigRead, MalformedJsonAndWrongTypesNameTheField) {
  expect_error([] { ModelConfig::from_json("{\"hidden_size\": 12", "cfg/config.json"); },
               {"cfg/config.json", "not valid JSON"});
  expect_error([] { ModelConfig::from_json("[1, 2]"); },
               {"config.json", "is an array, not an object"});
  json j = kimi_linear_checkpoint_json();
  auto with = [&](const char* key, json v) {
    json k = j;
    k[key] = v;
    return k;
  };
  expect_error([&] { from(with("hidden_size", "abc")); },
               {"config.json: hidden_size must be an integer, got \"abc\""});
  expect_error([&] { from(with("hidden_size", 2304.5)); }, {"hidden_size must be an integer"});
  EXPECT_EQ(from(with("hidden_size", 2304.0)).hidden_size, 2304);  // integral floats are fine
  expect_error([&] { from(with("hidden_size", 1.2e83)); }, {"hidden_size must be an integer"});
  expect_error([&] { from(with("hidden_size", 18446744073709551615ull)); },
               {"hidden_size must be an integer, got 18446744073709551615"});
  expect_error([&] { from(with("rms_norm_eps", "small")); }, {"rms_norm_eps must be a number"});
  expect_error([&] { from(with("use_cache", 1)); }, {"use_cache must be true or false, got 1"});
  expect_error([&] { from(with("hidden_act", 3)); }, {"hidden_act must be a string"});
  expect_error([&] { from(with("q_lora_rank", "none")); },
               {"q_lora_rank must be an integer or null"});
  expect_error([&] { from(with("architectures", "Kimi")); },
               {"architectures must be a list of strings"});
  expect_error([&] { from(with("linear_attn_config", 5)); },
               {"linear_attn_config must be an object, got 5"});
  json k = j;
  k["linear_attn_config"]["kda_layers"] = {1, "two"};
  expect_error([&] { from(k); },
               {"linear_attn_config.kda_layers must be a list of integers, got \"two\""});
  k = j;
  k["myriad"] = {{"router", {{"latent_dim", "64"}}}};
  expect_error([&] { from(k); }, {"myriad.router.latent_dim must be an integer"});
  k = j;
  k["rope_scaling"] = {{"factor", "forty"}};
  expect_error([&] { from(k); }, {"rope_scaling.factor must be a number"});
  std::string deep = "{\"auto_map\": " + std::string(100, '[') + std::string(100, ']') + "}";
  expect_error([&] { ModelConfig::from_json(deep); }, {"nests deeper than 64"});
}

TEST(ConfigFiles, LoadAndSave) {
  fs::path d = fs::path(::testing::TempDir()) / "myriad_test_config";
  fs::remove_all(d);
  fs::create_directories(d);
  medium_k3().save(d.string());  // a directory: writes config.json in it
  EXPECT_EQ(ModelConfig::load(d.string()), medium_k3());
  EXPECT_EQ(ModelConfig::load((d / "config.json").string()), medium_k3());
  ModelConfig bad = medium();
  bad.hidden_size = 0;
  expect_error([&] { bad.save(d.string()); }, {"hidden_size must be > 0"});
  io::write_file_atomic((d / "config.json").string(), "{\"hidden_size\": -1}");
  expect_error([&] { ModelConfig::load(d.string()); }, {"config.json", "must be > 0"});
  expect_error([&] { ModelConfig::load((d / "nope").string()); }, {"nope", "cannot open"});
}

// ---- Validation: one case per rule ----

struct Rule {
  const char* name;
  std::function<void(ModelConfig&)> mutate;
  const char* message;
  std::function<ModelConfig()> base = tiny;
};

class ConfigValidate : public ::testing::TestWithParam<Rule> {};

TEST_P(ConfigValidate, NamesFieldAndConflict) {
  ModelConfig c = GetParam().base();
  c.validate();
  GetParam().mutate(c);
  expect_error([&] { c.validate(); }, {GetParam().message});
}

const Rule kRules[] = {
    {"ModelType", [](ModelConfig& c) { c.model_type = "llama"; },
     "model_type = 'llama' is not one of kimi_linear | deepseek_v3"},
    {"DType", [](ModelConfig& c) { c.dtype = "int8"; }, "dtype = 'int8' is not one of"},
    {"VocabSize", [](ModelConfig& c) { c.vocab_size = 0; }, "vocab_size must be > 0, got 0"},
    {"HiddenSize", [](ModelConfig& c) { c.hidden_size = -4; }, "hidden_size must be > 0, got -4"},
    {"NumLayers", [](ModelConfig& c) { c.num_hidden_layers = 0; }, "num_hidden_layers must be > 0"},
    {"TooManyLayers", [](ModelConfig& c) { c.num_hidden_layers = 100000; },
     "num_hidden_layers = 100000 exceeds the limit of 4096"},
    {"Heads", [](ModelConfig& c) { c.num_attention_heads = c.num_key_value_heads = 0; },
     "num_attention_heads must be > 0"},
    {"KvHeads", [](ModelConfig& c) { c.num_key_value_heads = 1; },
     "num_key_value_heads = 1 must equal num_attention_heads = 2"},
    {"Eps", [](ModelConfig& c) { c.rms_norm_eps = 0; }, "rms_norm_eps must be > 0"},
    {"InitRange", [](ModelConfig& c) { c.initializer_range = -1; },
     "initializer_range must be > 0"},
    {"TiedEmbeddings", [](ModelConfig& c) { c.tie_word_embeddings = true; },
     "tie_word_embeddings must be false"},
    {"QLoraRank", [](ModelConfig& c) { c.q_lora_rank = 0; },
     "q_lora_rank must be null or positive"},
    {"KvLoraRank", [](ModelConfig& c) { c.kv_lora_rank = 0; }, "kv_lora_rank must be > 0"},
    {"NopeDim", [](ModelConfig& c) { c.qk_nope_head_dim = 0; }, "qk_nope_head_dim must be > 0"},
    {"VHeadDim", [](ModelConfig& c) { c.v_head_dim = 0; }, "v_head_dim must be > 0"},
    {"RopeDimNegative", [](ModelConfig& c) { c.qk_rope_head_dim = -2; },
     "qk_rope_head_dim must be >= 0"},
    {"RopeDimOdd",
     [](ModelConfig& c) {
       c.mla_use_nope = false;
       c.qk_rope_head_dim = 15;
     },
     "qk_rope_head_dim = 15 must be even and positive when RoPE is on"},
    {"RopeTheta", [](ModelConfig& c) { c.rope_theta = 0; }, "rope_theta must be > 0"},
    {"RopeScalingType", [](ModelConfig& c) { c.rope_scaling->type = "linear"; },
     "rope_scaling.type = 'linear' is not one of yarn", deepseek_v3},
    {"RopeScalingFactor", [](ModelConfig& c) { c.rope_scaling->factor = 0.5; },
     "rope_scaling.factor must be >= 1", deepseek_v3},
    {"RopeScalingLength",
     [](ModelConfig& c) { c.rope_scaling->original_max_position_embeddings = 0; },
     "rope_scaling.original_max_position_embeddings must be > 0", deepseek_v3},
    {"FirstKDense", [](ModelConfig& c) { c.first_k_dense_replace = 9; },
     "first_k_dense_replace = 9 outside 0..8"},
    {"MoeLayerFreq", [](ModelConfig& c) { c.moe_layer_freq = 0; }, "moe_layer_freq must be > 0"},
    {"DenseWidth", [](ModelConfig& c) { c.intermediate_size = 0; },
     "intermediate_size must be > 0"},
    {"NegativeExperts", [](ModelConfig& c) { c.num_experts = -1; },
     "num_experts must be >= 0, got -1"},
    {"SharedExperts", [](ModelConfig& c) { c.num_shared_experts = -1; },
     "num_shared_experts must be >= 0"},
    {"ExpertWidth", [](ModelConfig& c) { c.moe_intermediate_size = 0; },
     "moe_intermediate_size must be > 0"},
    {"TopKZero", [](ModelConfig& c) { c.num_experts_per_token = 0; },
     "num_experts_per_token must be > 0"},
    {"TopKExceedsExperts", [](ModelConfig& c) { c.num_experts_per_token = 9; },
     "num_experts_per_token = 9 exceeds num_experts = 8"},
    {"ExpertGroupsDivide", [](ModelConfig& c) { c.num_expert_group = 3; },
     "num_expert_group = 3 does not divide num_experts = 8"},
    {"TopkGroup", [](ModelConfig& c) { c.topk_group = 2; },
     "topk_group = 2 outside 1..num_expert_group = 1"},
    {"GroupedTopKReach",
     [](ModelConfig& c) {
       c.use_grouped_topk = true;
       c.num_expert_group = 4;
       c.topk_group = 1;
       c.num_experts_per_token = 3;
     },
     "num_experts_per_token = 3 exceeds the 2 experts in topk_group = 1 groups"},
    {"ScalingFactor", [](ModelConfig& c) { c.routed_scaling_factor = 0; },
     "routed_scaling_factor must be > 0"},
    {"RouterActivation", [](ModelConfig& c) { c.moe_router_activation_func = "relu"; },
     "moe_router_activation_func = 'relu' is not one of sigmoid | softmax"},
    {"TopkMethod", [](ModelConfig& c) { c.topk_method = "random"; },
     "topk_method = 'random' is not one of"},
    {"NextN", [](ModelConfig& c) { c.num_nextn_predict_layers = -1; },
     "num_nextn_predict_layers must be >= 0"},
    {"Context", [](ModelConfig& c) { c.model_max_length = 0; }, "model_max_length must be > 0"},
    {"TokenId", [](ModelConfig& c) { c.eos_token_id = 512; },
     "eos_token_id = 512 outside the vocabulary 0..511"},
    {"LayerOutOfRange", [](ModelConfig& c) { c.linear_attn_config.kda_layers.push_back(9); },
     "linear_attn_config.kda_layers contains 9, outside the 1-based layers 1..8"},
    {"LayerZero", [](ModelConfig& c) { c.linear_attn_config.full_attn_layers.push_back(0); },
     "full_attn_layers contains 0"},
    {"LayerTwice", [](ModelConfig& c) { c.linear_attn_config.kda_layers.push_back(1); },
     "linear_attn_config.kda_layers lists layer 1 twice"},
    {"ListsOverlap", [](ModelConfig& c) { c.linear_attn_config.kda_layers.push_back(4); },
     "kda_layers and full_attn_layers overlap at layer 4"},
    {"LayerUncovered",
     [](ModelConfig& c) {
       auto& k = c.linear_attn_config.kda_layers;
       k.erase(std::find(k.begin(), k.end(), 7));
     },
     "layer 7 is in neither kda_layers nor full_attn_layers"},
    {"KdaHeads", [](ModelConfig& c) { c.linear_attn_config.num_heads = 0; },
     "linear_attn_config.num_heads must be > 0"},
    {"KdaHeadDim", [](ModelConfig& c) { c.linear_attn_config.head_dim = 0; },
     "linear_attn_config.head_dim must be > 0"},
    {"KdaConv", [](ModelConfig& c) { c.linear_attn_config.short_conv_kernel_size = 0; },
     "linear_attn_config.short_conv_kernel_size must be > 0"},
    {"GateLowerBound", [](ModelConfig& c) { c.linear_attn_config.gate_lower_bound = 1.0; },
     "linear_attn_config.gate_lower_bound must be < 0, got 1"},
    {"DeepSeekHasNoKda", [](ModelConfig& c) { c.linear_attn_config.kda_layers = {1}; },
     "deepseek_v3 has no KDA layers", deepseek_v3},
    {"HiddenAct", [](ModelConfig& c) { c.hidden_act = "gelu"; },
     "hidden_act = 'gelu' is not one of silu | situ"},
    {"SituBeta", [](ModelConfig& c) { c.activation_situ_beta = 0; },
     "activation_situ_beta must be > 0"},
    {"SituLinearBeta", [](ModelConfig& c) { c.activation_situ_linear_beta = -25; },
     "activation_situ_linear_beta must be > 0"},
    {"AttnResBlock", [](ModelConfig& c) { c.attn_res_block_size = -1; },
     "attn_res_block_size must be >= 0"},
    {"LatentWidth", [](ModelConfig& c) { c.routed_expert_hidden_size = 0; },
     "routed_expert_hidden_size must be null or positive"},
    {"LatentNormNeedsLatent", [](ModelConfig& c) { c.routed_expert_hidden_size.reset(); },
     "latent_moe_use_norm needs routed_expert_hidden_size"},
    {"AttnCarry", [](ModelConfig& c) { c.myriad.residual.attn_carry = "gamma"; },
     "myriad.residual.attn_carry = 'gamma' is not one of none | gamma_scalar"},
    {"RouterMode", [](ModelConfig& c) { c.myriad.router.mode = "hash"; },
     "myriad.router.mode = 'hash' is not one of linear | latent_similarity"},
    {"RouterLatentDim", [](ModelConfig& c) { c.myriad.router.latent_dim = 0; },
     "myriad.router.latent_dim must be > 0"},
    {"BalancerMode", [](ModelConfig& c) { c.myriad.balancer.mode = "qb"; },
     "myriad.balancer.mode = 'qb' is not one of quantile | quantile_band | sign"},
    {"BalancerBins", [](ModelConfig& c) { c.myriad.balancer.bins = 0; },
     "myriad.balancer.bins must be > 0"},
    {"BalancerEma", [](ModelConfig& c) { c.myriad.balancer.ema = 1.5; },
     "myriad.balancer.ema must be in (0, 1]"},
    {"BalancerBand", [](ModelConfig& c) { c.myriad.balancer.rho_hi = 0.9; },
     "myriad.balancer band [0.8, 0.9] must satisfy 0 < rho_lo <= 1 <= rho_hi"},
    {"BalancerEta", [](ModelConfig& c) { c.myriad.balancer.eta = 0; },
     "myriad.balancer.eta must be > 0"},
    {"BalancerVmax", [](ModelConfig& c) { c.myriad.balancer.v_max = 0; },
     "myriad.balancer.v_max must be > 0"},
    {"BalancerGammaB", [](ModelConfig& c) { c.myriad.balancer.gamma_b = 0; },
     "myriad.balancer.gamma_b must be > 0"},
    {"BalancerFreeze", [](ModelConfig& c) { c.myriad.balancer.freeze_after = -1; },
     "myriad.balancer.freeze_after must be null or >= 0"},
    {"BalancerAuxAlpha", [](ModelConfig& c) { c.myriad.balancer.aux_alpha = -1; },
     "myriad.balancer.aux_alpha must be >= 0"},
    {"BalancerAuxScope", [](ModelConfig& c) { c.myriad.balancer.aux_scope = "token"; },
     "myriad.balancer.aux_scope = 'token' is not one of batch | sequence"},
    {"AdmissionHidden", [](ModelConfig& c) { c.myriad.admission.hidden = 0; },
     "myriad.mla.admission.hidden must be > 0"},
    {"AdmissionWindow", [](ModelConfig& c) { c.myriad.admission.window = -1; },
     "myriad.mla.admission.window must be >= 0"},
    {"AdmissionTau", [](ModelConfig& c) { c.myriad.admission.tau = 1.0; },
     "myriad.mla.admission.tau must be in [0, 1)"},
    {"AdmissionRate", [](ModelConfig& c) { c.myriad.admission.target_rate = 0; },
     "myriad.mla.admission.target_rate must be in (0, 1)"},
    {"AdmissionLambda", [](ModelConfig& c) { c.myriad.admission.lambda = -1; },
     "myriad.mla.admission.lambda must be >= 0"},
};

INSTANTIATE_TEST_SUITE_P(Rules, ConfigValidate, ::testing::ValuesIn(kRules),
                         [](const ::testing::TestParamInfo<Rule>& i) { return i.param.name; });

}  // namespace
}  // namespace myriad::model
