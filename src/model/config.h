// ModelConfig: every config.json field of MODEL.md §11.1 (checkpoint spelling), the K3 extensions,
// and Myriad's own options of §12 (stored under a "myriad" object). Reads transformers aliases and
// the kimi_k3 / kimi_k25 wrappers; writes the checkpoint spelling plus the derived keys
// transformers reads.
// Layer lists in the JSON are 1-based; every helper here takes 0-based layer indices.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "vision/tower.h"

namespace myriad::model {

struct RopeScaling {  // DeepSeek-V3 / K2 YaRN (MODEL.md §3.4)
  std::string type = "yarn";
  double factor = 1.0;
  int64_t original_max_position_embeddings = 4096;
  double beta_fast = 32.0, beta_slow = 1.0;
  double mscale = 1.0, mscale_all_dim = 1.0;
  bool operator==(const RopeScaling&) const = default;
};

struct LinearAttnConfig {  // KDA (MODEL.md §4)
  int64_t num_heads = 0, head_dim = 0, short_conv_kernel_size = 4;
  std::vector<int64_t> kda_layers, full_attn_layers;  // 1-based
  std::optional<double> gate_lower_bound;  // K3: -5 (lower-bounded gate); absent: softplus gate
  bool use_full_rank_gate = false;         // K3: true; false: low-rank output gate
  bool operator==(const LinearAttnConfig&) const = default;
};

// Myriad's own switches (MODEL.md §12); defaults are the published K3 form.
struct MyriadOptions {
  struct Residual {
    std::string attn_carry = "none";  // none | gamma_scalar | gamma_vector | gamma_input
    std::optional<double> gamma_bias_init;
    bool operator==(const Residual&) const = default;
  } residual;
  struct Router {
    std::string mode = "linear";  // linear | latent_similarity
    int64_t latent_dim = 64;
    bool operator==(const Router&) const = default;
  } router;
  struct Balancer {
    std::string mode = "quantile";  // quantile | quantile_band | sign | aux_loss | none
    int64_t bins = 1000;            // quantile: histogram bins B
    double ema = 1.0;               // quantile: omega
    double rho_lo = 0.8, rho_hi = 1.25, eta = 1e-3, v_max = 1.0;  // quantile_band
    bool recentre = false;
    double gamma_b = 1e-3;  // sign
    std::optional<int64_t> freeze_after;
    double aux_alpha = 1e-2;          // aux_loss
    std::string aux_scope = "batch";  // batch | sequence
    bool operator==(const Balancer&) const = default;
  } balancer;
  struct Admission {  // mla.admission (§12.4)
    bool enabled = false;
    int64_t hidden = 64;     // h_a
    int64_t window = 4096;   // W
    double tau = 0.5;        // admission threshold
    double init_bias = 4.0;  // w2.bias init
    double target_rate = 0.25, lambda = 1e-2;
    bool stopgrad_mean = true;
    bool operator==(const Admission&) const = default;
  } admission;
  bool operator==(const MyriadOptions&) const = default;
};

struct ModelConfig {
  // Identity.
  std::vector<std::string> architectures = {"KimiLinearForCausalLM"};
  std::string model_type = "kimi_linear";  // kimi_linear | deepseek_v3
  std::string dtype = "bfloat16";
  std::string transformers_version;  // written only when set

  // Sizes.
  int64_t vocab_size = 0, hidden_size = 0;
  int64_t intermediate_size = 0;      // dense FFN width
  int64_t moe_intermediate_size = 0;  // routed expert width I_e
  int64_t num_hidden_layers = 0, num_attention_heads = 0, num_key_value_heads = 0;
  double rms_norm_eps = 1e-5, initializer_range = 0.02;
  bool tie_word_embeddings = false, use_cache = true;

  // MLA.
  std::optional<int64_t> q_lora_rank;
  int64_t kv_lora_rank = 0, qk_nope_head_dim = 0, qk_rope_head_dim = 0, v_head_dim = 0;
  bool mla_use_nope = true;
  double rope_theta = 10000.0;
  std::optional<RopeScaling> rope_scaling;  // read from rope_scaling or rope_parameters
  // transformers' deepseek_v3 flag for DeepSeek's interleaved (complex-pair) q/k rope layout;
  // absent means transformers' default (true). Kept and written back as found.
  std::optional<bool> rope_interleave;

  // MoE.
  int64_t num_experts = 0, num_experts_per_token = 0, num_shared_experts = 0;
  bool moe_renormalize = true;
  std::string moe_router_activation_func = "sigmoid";
  double routed_scaling_factor = 1.0;
  bool use_grouped_topk = false;
  int64_t num_expert_group = 1, topk_group = 1;
  int64_t first_k_dense_replace = 1, moe_layer_freq = 1;
  int64_t num_nextn_predict_layers = 0;

  // Context and tokens.
  int64_t model_max_length = 0;
  std::optional<int64_t> bos_token_id, eos_token_id, pad_token_id;

  LinearAttnConfig linear_attn_config;

  // K3 extensions (defaults = their absence, i.e. the Kimi Linear form).
  std::string hidden_act = "silu";  // silu | situ
  double activation_situ_beta = 4.0, activation_situ_linear_beta = 25.0;
  bool mla_use_output_gate = false;
  int64_t attn_res_block_size = 0;                   // 0: pre-norm residuals; S > 0: Block AttnRes
  std::optional<int64_t> routed_expert_hidden_size;  // latent width; absent: no latent projection
  bool latent_moe_use_norm = false;
  std::string topk_method = "noaux_tc";  // noaux_tc | greedy | group_limited_greedy

  MyriadOptions myriad;

  // Native vision (MODEL.md §10): the image tower and projector, and the placeholder token whose
  // embeddings the projector outputs replace. Read from the vision_config of a kimi_k25 wrapper
  // (transformers' Kimi K2.5, text model deepseek_v3) or of Myriad's K3-style kimi_k3 one; the
  // id is spelled image_token_id (kimi_k25) or media_placeholder_token_id (the hub's, kimi_k3).
  // Absent: a text-only model.
  std::optional<vision::VisionConfig> vision;
  std::optional<int64_t> media_placeholder_token_id;

  // Read from a kimi_k3 / kimi_k25 wrapper: the outer object without text_config and the vision
  // fields above, re-emitted on write.
  std::string wrapper_json;
  // Top-level keys Myriad does not model (auto_map, quantization_config, ...), as JSON text,
  // kept so a read-write round trip loses nothing.
  std::map<std::string, std::string> extra;

  bool operator==(const ModelConfig&) const = default;

  // ---- Layout (0-based layer index i) ----
  bool is_deepseek() const { return model_type == "deepseek_v3"; }
  bool is_mla_layer(int64_t i) const;
  bool is_kda_layer(int64_t i) const { return !is_mla_layer(i); }
  bool is_moe_layer(int64_t i) const;
  bool uses_attn_res() const { return attn_res_block_size > 0; }
  // A Kimi Linear text model with the K3 extensions (AttnRes or SiTU): written in the K3 release
  // layout, a kimi_k3 wrapper (KimiK3ForConditionalGeneration, text_config) with the tensors
  // under language_model. and A_log as [H] (docs/CHECKPOINTS.md).
  bool is_k3_form() const {
    return model_type == "kimi_linear" && (uses_attn_res() || hidden_act == "situ");
  }
  bool uses_latent_moe() const { return routed_expert_hidden_size.has_value(); }
  int64_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  int64_t num_mla_layers() const;

  // Throws a myriad::Error naming the field and the conflict.
  void validate() const;

  // ---- JSON ----
  // `source` names the file in error messages. Does not validate; call validate().
  static ModelConfig from_json(std::string_view text, std::string_view source = "config.json");
  // Reads `path`, or `path`/config.json when path is a directory, and validates.
  static ModelConfig load(const std::string& path);
  std::string to_json() const;               // pretty-printed, with a trailing newline
  void save(const std::string& path) const;  // atomic; validates first
};

// MODEL.md §5 default layout: 1-based layer l is MLA iff l % 4 == 0 or l == L.
void default_layout(int64_t num_layers, std::vector<int64_t>& kda_layers,
                    std::vector<int64_t>& full_attn_layers);

// Presets (MODEL.md §1 and §13).
ModelConfig tiny();
ModelConfig medium();
ModelConfig medium_k3();
ModelConfig kimi_linear_48b();
ModelConfig kimi_k3();
ModelConfig deepseek_v3();
// "tiny", "medium", "medium-k3", "kimi-linear-48b", "kimi-k3", "deepseek-v3" ('_' works too).
ModelConfig preset(std::string_view name);
std::vector<std::string> preset_names();

}  // namespace myriad::model
