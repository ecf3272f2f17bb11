#include "model/config.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.h"
#include "io/file.h"

namespace myriad::model {

using json = nlohmann::json;

namespace {

constexpr int kMaxJsonDepth = 64;
// Far above any real model; keeps layout loops bounded on hostile input.
constexpr int64_t kMaxLayers = 4096;

std::string short_dump(const json& v) {
  if (v.is_structured()) return v.is_array() ? "an array" : "an object";
  std::string s = v.dump();
  return s.size() > 40 ? s.substr(0, 40) + "..." : s;
}

// Reads typed fields of one JSON object and remembers which keys it consumed. `where` prefixes
// messages ("config.json: "), `prefix` names nested fields ("linear_attn_config.").
class Reader {
 public:
  Reader(const json& obj, std::string where, std::string prefix = "")
      : obj_(obj), where_(std::move(where)), prefix_(std::move(prefix)) {}

  // The value under the first present name (canonical name first, then aliases); all present
  // spellings must agree. Null when none is present.
  const json* find(std::initializer_list<const char*> names) {
    const json* found = nullptr;
    const char* found_name = nullptr;
    for (const char* n : names) {
      auto it = obj_.find(n);
      if (it == obj_.end()) continue;
      used_.insert(n);
      if (!found) {
        found = &*it;
        found_name = n;
      } else {
        MYRIAD_CHECK(*found == *it, where_, prefix_, found_name, " (", short_dump(*found),
                     ") and its alias ", n, " (", short_dump(*it), ") disagree");
      }
    }
    return found;
  }
  std::string name(const char* n) const { return prefix_ + n; }
  [[noreturn]] void type_error(const char* n, const char* want, const json& v) const {
    throw Error(cat(where_, name(n), " must be ", want, ", got ", short_dump(v)));
  }

  static bool to_int(const json& v, int64_t& out) {
    if (v.is_number_integer() && !(v.is_number_unsigned() && v.get<uint64_t>() > INT64_MAX)) {
      out = v.get<int64_t>();
      return true;
    }
    // 4096.0 is accepted as an integer; 4096.5 is not.
    if (v.is_number_float()) {
      double d = v.get<double>();
      if (std::abs(d) < 9e15 && d == std::trunc(d)) {
        out = static_cast<int64_t>(d);
        return true;
      }
    }
    return false;
  }

  void get(std::initializer_list<const char*> names, int64_t& out) {
    if (const json* v = find(names))
      if (!to_int(*v, out)) type_error(*names.begin(), "an integer", *v);
  }
  void get(std::initializer_list<const char*> names, double& out) {
    if (const json* v = find(names)) {
      if (!v->is_number()) type_error(*names.begin(), "a number", *v);
      out = v->get<double>();
    }
  }
  void get(std::initializer_list<const char*> names, bool& out) {
    if (const json* v = find(names)) {
      if (!v->is_boolean()) type_error(*names.begin(), "true or false", *v);
      out = v->get<bool>();
    }
  }
  void get(std::initializer_list<const char*> names, std::string& out) {
    if (const json* v = find(names)) {
      if (!v->is_string()) type_error(*names.begin(), "a string", *v);
      out = v->get<std::string>();
    }
  }
  // Absent leaves `out` alone; null resets it.
  void get(std::initializer_list<const char*> names, std::optional<int64_t>& out) {
    if (const json* v = find(names)) {
      int64_t x = 0;
      if (v->is_null())
        out.reset();
      else if (to_int(*v, x))
        out = x;
      else
        type_error(*names.begin(), "an integer or null", *v);
    }
  }
  void get(std::initializer_list<const char*> names, std::optional<bool>& out) {
    if (const json* v = find(names)) {
      if (v->is_null())
        out.reset();
      else if (v->is_boolean())
        out = v->get<bool>();
      else
        type_error(*names.begin(), "true, false or null", *v);
    }
  }
  void get(std::initializer_list<const char*> names, std::optional<double>& out) {
    if (const json* v = find(names)) {
      if (v->is_null())
        out.reset();
      else if (v->is_number())
        out = v->get<double>();
      else
        type_error(*names.begin(), "a number or null", *v);
    }
  }
  // Returns whether the key was present.
  bool get(std::initializer_list<const char*> names, std::vector<int64_t>& out) {
    const json* v = find(names);
    if (!v) return false;
    if (!v->is_array()) type_error(*names.begin(), "a list of integers", *v);
    out.clear();
    for (const auto& e : *v) {
      int64_t x = 0;
      if (!to_int(e, x)) type_error(*names.begin(), "a list of integers", e);
      out.push_back(x);
    }
    return true;
  }
  void get(std::initializer_list<const char*> names, std::vector<std::string>& out) {
    if (const json* v = find(names)) {
      if (!v->is_array()) type_error(*names.begin(), "a list of strings", *v);
      out.clear();
      for (const auto& e : *v) {
        if (!e.is_string()) type_error(*names.begin(), "a list of strings", e);
        out.push_back(e.get<std::string>());
      }
    }
  }
  // A nested object (or null when absent or null); anything else is a type error.
  const json* object(const char* n) {
    const json* v = find({n});
    if (!v || v->is_null()) return nullptr;
    if (!v->is_object()) type_error(n, "an object", *v);
    return v;
  }
  Reader sub(const json& obj, const char* n) const { return Reader(obj, where_, name(n) + "."); }

  bool used(const std::string& k) const { return used_.count(k) != 0; }
  const std::string& where() const { return where_; }

 private:
  const json& obj_;
  std::string where_, prefix_;
  std::set<std::string> used_;
};

json parse(std::string_view text, const std::string& where) {
  auto depth_guard = [&](int depth, json::parse_event_t, json&) {
    MYRIAD_CHECK(depth <= kMaxJsonDepth, where, "JSON nests deeper than ", kMaxJsonDepth,
                 " levels");
    return true;
  };
  try {
    return json::parse(text.begin(), text.end(), depth_guard);
  } catch (const json::exception& e) {
    throw Error(cat(where, "not valid JSON: ", e.what()));
  }
}

void read_myriad(Reader r, MyriadOptions& m) {
  if (const json* o = r.object("residual")) {
    Reader s = r.sub(*o, "residual");
    s.get({"attn_carry"}, m.residual.attn_carry);
    s.get({"gamma_bias_init"}, m.residual.gamma_bias_init);
  }
  if (const json* o = r.object("router")) {
    Reader s = r.sub(*o, "router");
    s.get({"mode"}, m.router.mode);
    s.get({"latent_dim"}, m.router.latent_dim);
  }
  if (const json* o = r.object("balancer")) {
    Reader s = r.sub(*o, "balancer");
    auto& b = m.balancer;
    s.get({"mode"}, b.mode);
    s.get({"bins"}, b.bins);
    s.get({"ema"}, b.ema);
    s.get({"rho_lo"}, b.rho_lo);
    s.get({"rho_hi"}, b.rho_hi);
    s.get({"eta"}, b.eta);
    s.get({"v_max"}, b.v_max);
    s.get({"recentre"}, b.recentre);
    s.get({"gamma_b"}, b.gamma_b);
    s.get({"freeze_after"}, b.freeze_after);
    s.get({"aux_alpha"}, b.aux_alpha);
    s.get({"aux_scope"}, b.aux_scope);
  }
  if (const json* o = r.object("mla")) {
    Reader s = r.sub(*o, "mla");
    if (const json* a = s.object("admission")) {
      Reader t = s.sub(*a, "admission");
      auto& d = m.admission;
      t.get({"enabled"}, d.enabled);
      t.get({"hidden"}, d.hidden);
      t.get({"window"}, d.window);
      t.get({"tau"}, d.tau);
      t.get({"init_bias"}, d.init_bias);
      t.get({"target_rate"}, d.target_rate);
      t.get({"lambda"}, d.lambda);
      t.get({"stopgrad_mean"}, d.stopgrad_mean);
    }
  }
}

json write_myriad(const MyriadOptions& m) {
  const auto& b = m.balancer;
  const auto& a = m.admission;
  json j;
  j["residual"] = {
      {"attn_carry", m.residual.attn_carry},
      {"gamma_bias_init",
       m.residual.gamma_bias_init ? json(*m.residual.gamma_bias_init) : json(nullptr)}};
  j["router"] = {{"mode", m.router.mode}, {"latent_dim", m.router.latent_dim}};
  j["balancer"] = {{"mode", b.mode},
                   {"bins", b.bins},
                   {"ema", b.ema},
                   {"rho_lo", b.rho_lo},
                   {"rho_hi", b.rho_hi},
                   {"eta", b.eta},
                   {"v_max", b.v_max},
                   {"recentre", b.recentre},
                   {"gamma_b", b.gamma_b},
                   {"freeze_after", b.freeze_after ? json(*b.freeze_after) : json(nullptr)},
                   {"aux_alpha", b.aux_alpha},
                   {"aux_scope", b.aux_scope}};
  j["mla"]["admission"] = {{"enabled", a.enabled},     {"hidden", a.hidden},
                           {"window", a.window},       {"tau", a.tau},
                           {"init_bias", a.init_bias}, {"target_rate", a.target_rate},
                           {"lambda", a.lambda},       {"stopgrad_mean", a.stopgrad_mean}};
  return j;
}

json opt(const std::optional<int64_t>& v) {
  return v ? json(*v) : json(nullptr);
}

// The vision fields of a kimi_k25 / kimi_k3 wrapper (MODEL.md §10), spelled as transformers'
// Kimi_K25Config: vision_config, and beside it projection_layer_norm_eps, projection_hidden_size
// and image_token_id (the hub's media_placeholder_token_id). kimi_k25 takes transformers'
// defaults for absent ones (its vision_config too); a kimi_k3 wrapper without vision_config is
// text-only. The keys read leave `outer` (to_json writes them back).
void read_vision(json& outer, bool k25, const std::string& where, ModelConfig& c) {
  Reader r(outer, where);
  const json* vc = r.object("vision_config");
  if (vc)
    c.vision = vision::VisionConfig::from_json(*vc, where);
  else if (k25)
    c.vision = vision::VisionConfig{};
  // transformers' kimi_k25 default: Kimi's <|media_pad|> (the K3-style variant shares it).
  if (c.vision) c.media_placeholder_token_id = 163605;
  r.get({"image_token_id", "media_placeholder_token_id"}, c.media_placeholder_token_id);
  if (c.vision) {
    auto& v = *c.vision;
    double eps = v.projection_layer_norm_eps;
    r.get({"projection_layer_norm_eps"}, eps);
    MYRIAD_CHECK(!(vc && vc->contains("projector_ln_eps")) || eps == v.projection_layer_norm_eps,
                 where, "projection_layer_norm_eps (", eps,
                 ") and vision_config.projector_ln_eps (", v.projection_layer_norm_eps,
                 ") disagree");
    v.projection_layer_norm_eps = eps;
    int64_t width = v.hidden_size;
    r.get({"projection_hidden_size"}, width);
    MYRIAD_CHECK(width == v.hidden_size, where, "projection_hidden_size (", width,
                 ") must equal vision_config.hidden_size (", v.hidden_size,
                 "): the projector's LayerNorm normalises the tower's output");
  }
  for (const char* k : {"vision_config", "image_token_id", "media_placeholder_token_id",
                        "projection_layer_norm_eps", "projection_hidden_size"})
    outer.erase(k);
}

bool one_of(const std::string& v, std::initializer_list<const char*> allowed) {
  for (const char* a : allowed)
    if (v == a) return true;
  return false;
}

std::string list_str(std::initializer_list<const char*> allowed) {
  std::string s;
  for (const char* a : allowed) s += (s.empty() ? "" : " | ") + std::string(a);
  return s;
}

// The keys every reader consumes without storing (derived keys and the wrapper's own).
constexpr const char* kIgnoredKeys[] = {"qk_head_dim", "head_dim", "layer_types",
                                        "mlp_layer_types"};

}  // namespace

// ---- Layout ----

void default_layout(int64_t num_layers, std::vector<int64_t>& kda_layers,
                    std::vector<int64_t>& full_attn_layers) {
  kda_layers.clear();
  full_attn_layers.clear();
  for (int64_t l = 1; l <= num_layers; ++l)
    (l % 4 == 0 || l == num_layers ? full_attn_layers : kda_layers).push_back(l);
}

bool ModelConfig::is_mla_layer(int64_t i) const {
  MYRIAD_CHECK(i >= 0 && i < num_hidden_layers, "is_mla_layer: layer ", i, " outside 0..",
               num_hidden_layers - 1);
  if (is_deepseek()) return true;
  const auto& lac = linear_attn_config;
  if (lac.kda_layers.empty() && lac.full_attn_layers.empty())
    return (i + 1) % 4 == 0 || i + 1 == num_hidden_layers;
  return std::find(lac.full_attn_layers.begin(), lac.full_attn_layers.end(), i + 1) !=
         lac.full_attn_layers.end();
}

bool ModelConfig::is_moe_layer(int64_t i) const {
  MYRIAD_CHECK(i >= 0 && i < num_hidden_layers, "is_moe_layer: layer ", i, " outside 0..",
               num_hidden_layers - 1);
  return num_experts > 0 && i >= first_k_dense_replace && moe_layer_freq > 0 &&
         i % moe_layer_freq == 0;
}

int64_t ModelConfig::num_mla_layers() const {
  int64_t n = 0;
  for (int64_t i = 0; i < num_hidden_layers; ++i) n += is_mla_layer(i);
  return n;
}

// ---- Validation ----

void ModelConfig::validate() const {
  auto positive = [](const char* field, int64_t v) {
    MYRIAD_CHECK(v > 0, "config: ", field, " must be > 0, got ", v);
  };
  auto positive_d = [](const char* field, double v) {
    MYRIAD_CHECK(v > 0, "config: ", field, " must be > 0, got ", v);
  };
  auto choice = [](const char* field, const std::string& v,
                   std::initializer_list<const char*> allowed) {
    MYRIAD_CHECK(one_of(v, allowed), "config: ", field, " = '", v, "' is not one of ",
                 list_str(allowed));
  };

  choice("model_type", model_type, {"kimi_linear", "deepseek_v3"});
  choice("dtype", dtype, {"bfloat16", "float16", "float32"});
  positive("vocab_size", vocab_size);
  positive("hidden_size", hidden_size);
  positive("num_hidden_layers", num_hidden_layers);
  MYRIAD_CHECK(num_hidden_layers <= kMaxLayers, "config: num_hidden_layers = ", num_hidden_layers,
               " exceeds the limit of ", kMaxLayers);
  positive("num_attention_heads", num_attention_heads);
  MYRIAD_CHECK(num_key_value_heads == num_attention_heads,
               "config: num_key_value_heads = ", num_key_value_heads,
               " must equal num_attention_heads = ", num_attention_heads,
               " (MLA has one key per head)");
  positive_d("rms_norm_eps", rms_norm_eps);
  positive_d("initializer_range", initializer_range);
  MYRIAD_CHECK(!tie_word_embeddings,
               "config: tie_word_embeddings must be false (Kimi and "
               "DeepSeek models keep lm_head separate)");

  // MLA.
  MYRIAD_CHECK(!q_lora_rank || *q_lora_rank > 0,
               "config: q_lora_rank must be null or positive, got ", q_lora_rank.value_or(0));
  positive("kv_lora_rank", kv_lora_rank);
  positive("qk_nope_head_dim", qk_nope_head_dim);
  positive("v_head_dim", v_head_dim);
  MYRIAD_CHECK(qk_rope_head_dim >= 0, "config: qk_rope_head_dim must be >= 0, got ",
               qk_rope_head_dim);
  if (!mla_use_nope)
    MYRIAD_CHECK(qk_rope_head_dim % 2 == 0 && qk_rope_head_dim > 0,
                 "config: qk_rope_head_dim = ", qk_rope_head_dim,
                 " must be even and positive when RoPE is on (mla_use_nope = false)");
  positive_d("rope_theta", rope_theta);
  if (rope_scaling) {
    choice("rope_scaling.type", rope_scaling->type, {"yarn"});
    MYRIAD_CHECK(rope_scaling->factor >= 1.0, "config: rope_scaling.factor must be >= 1, got ",
                 rope_scaling->factor);
    positive("rope_scaling.original_max_position_embeddings",
             rope_scaling->original_max_position_embeddings);
  }

  // FFN and MoE.
  MYRIAD_CHECK(first_k_dense_replace >= 0 && first_k_dense_replace <= num_hidden_layers,
               "config: first_k_dense_replace = ", first_k_dense_replace, " outside 0..",
               num_hidden_layers);
  positive("moe_layer_freq", moe_layer_freq);
  bool any_dense = false, any_moe = false;
  for (int64_t i = 0; i < num_hidden_layers; ++i) (is_moe_layer(i) ? any_moe : any_dense) = true;
  if (any_dense) positive("intermediate_size", intermediate_size);
  MYRIAD_CHECK(num_experts >= 0, "config: num_experts must be >= 0, got ", num_experts);
  MYRIAD_CHECK(num_shared_experts >= 0, "config: num_shared_experts must be >= 0, got ",
               num_shared_experts);
  if (any_moe) {
    positive("moe_intermediate_size", moe_intermediate_size);
    positive("num_experts_per_token", num_experts_per_token);
    MYRIAD_CHECK(num_experts_per_token <= num_experts,
                 "config: num_experts_per_token = ", num_experts_per_token,
                 " exceeds num_experts = ", num_experts);
    positive("num_expert_group", num_expert_group);
    MYRIAD_CHECK(num_experts % num_expert_group == 0,
                 "config: num_expert_group = ", num_expert_group,
                 " does not divide num_experts = ", num_experts);
    MYRIAD_CHECK(topk_group >= 1 && topk_group <= num_expert_group,
                 "config: topk_group = ", topk_group,
                 " outside 1..num_expert_group = ", num_expert_group);
    const __int128 reachable = __int128(topk_group) * (num_experts / num_expert_group);
    if (use_grouped_topk)
      MYRIAD_CHECK(num_experts_per_token <= reachable,
                   "config: num_experts_per_token = ", num_experts_per_token, " exceeds the ",
                   int64_t(reachable), " experts in topk_group = ", topk_group, " groups");
    positive_d("routed_scaling_factor", routed_scaling_factor);
    choice("moe_router_activation_func", moe_router_activation_func, {"sigmoid", "softmax"});
    choice("topk_method", topk_method, {"noaux_tc", "greedy", "group_limited_greedy"});
  }
  MYRIAD_CHECK(num_nextn_predict_layers >= 0, "config: num_nextn_predict_layers must be >= 0");
  positive("model_max_length", model_max_length);
  if (vision) {
    vision->validate();
    MYRIAD_CHECK(media_placeholder_token_id.has_value(),
                 "config: a vision tower needs image_token_id (media_placeholder_token_id), the "
                 "placeholder its embeddings replace");
  }
  for (auto [field, id] :
       {std::pair{"bos_token_id", bos_token_id}, std::pair{"eos_token_id", eos_token_id},
        std::pair{"pad_token_id", pad_token_id},
        std::pair{"image_token_id", media_placeholder_token_id}})
    MYRIAD_CHECK(!id || (*id >= 0 && *id < vocab_size), "config: ", field, " = ", id.value_or(0),
                 " outside the vocabulary 0..", vocab_size - 1);

  // Attention layout.
  const auto& lac = linear_attn_config;
  if (is_deepseek()) {
    MYRIAD_CHECK(lac.kda_layers.empty(),
                 "config: deepseek_v3 has no KDA layers, but kda_layers "
                 "lists ",
                 lac.kda_layers.size());
  } else {
    const int64_t L = num_hidden_layers;
    std::vector<int> seen(L + 1, 0);  // bit 1: KDA, bit 2: MLA
    for (auto [list_name, list, bit] : {std::tuple{"kda_layers", &lac.kda_layers, 1},
                                        std::tuple{"full_attn_layers", &lac.full_attn_layers, 2}}) {
      for (int64_t l : *list) {
        MYRIAD_CHECK(l >= 1 && l <= L, "config: linear_attn_config.", list_name, " contains ", l,
                     ", outside the 1-based layers 1..", L);
        MYRIAD_CHECK(!(seen[l] & bit), "config: linear_attn_config.", list_name, " lists layer ", l,
                     " twice");
        MYRIAD_CHECK(!(seen[l] & ~bit), "config: kda_layers and full_attn_layers overlap at layer ",
                     l);
        seen[l] |= bit;
      }
    }
    if (!lac.kda_layers.empty() || !lac.full_attn_layers.empty())
      for (int64_t l = 1; l <= L; ++l)
        MYRIAD_CHECK(seen[l], "config: layer ", l,
                     " is in neither kda_layers nor full_attn_layers");
    // With no lists, the §5 default has KDA layers whenever L > 1.
    bool any_kda = !lac.kda_layers.empty() || (lac.full_attn_layers.empty() && L > 1);
    if (any_kda) {
      positive("linear_attn_config.num_heads", lac.num_heads);
      positive("linear_attn_config.head_dim", lac.head_dim);
      positive("linear_attn_config.short_conv_kernel_size", lac.short_conv_kernel_size);
    }
    if (lac.gate_lower_bound)
      MYRIAD_CHECK(*lac.gate_lower_bound < 0,
                   "config: linear_attn_config.gate_lower_bound must "
                   "be < 0, got ",
                   *lac.gate_lower_bound);
  }

  // K3 extensions.
  choice("hidden_act", hidden_act, {"silu", "situ"});
  positive_d("activation_situ_beta", activation_situ_beta);
  positive_d("activation_situ_linear_beta", activation_situ_linear_beta);
  MYRIAD_CHECK(attn_res_block_size >= 0,
               "config: attn_res_block_size must be >= 0 (0 = pre-norm "
               "residuals), got ",
               attn_res_block_size);
  MYRIAD_CHECK(!routed_expert_hidden_size || *routed_expert_hidden_size > 0,
               "config: routed_expert_hidden_size must be null or positive, got ",
               routed_expert_hidden_size.value_or(0));
  MYRIAD_CHECK(!latent_moe_use_norm || routed_expert_hidden_size,
               "config: latent_moe_use_norm needs routed_expert_hidden_size (the latent width)");

  // Myriad options.
  const auto& m = myriad;
  choice("myriad.residual.attn_carry", m.residual.attn_carry,
         {"none", "gamma_scalar", "gamma_vector", "gamma_input"});
  choice("myriad.router.mode", m.router.mode, {"linear", "latent_similarity"});
  positive("myriad.router.latent_dim", m.router.latent_dim);
  const auto& b = m.balancer;
  choice("myriad.balancer.mode", b.mode, {"quantile", "quantile_band", "sign", "aux_loss", "none"});
  positive("myriad.balancer.bins", b.bins);
  MYRIAD_CHECK(b.ema > 0 && b.ema <= 1, "config: myriad.balancer.ema must be in (0, 1], got ",
               b.ema);
  MYRIAD_CHECK(b.rho_lo > 0 && b.rho_lo <= 1 && b.rho_hi >= 1, "config: myriad.balancer band [",
               b.rho_lo, ", ", b.rho_hi, "] must satisfy 0 < rho_lo <= 1 <= rho_hi");
  positive_d("myriad.balancer.eta", b.eta);
  positive_d("myriad.balancer.v_max", b.v_max);
  positive_d("myriad.balancer.gamma_b", b.gamma_b);
  MYRIAD_CHECK(!b.freeze_after || *b.freeze_after >= 0,
               "config: myriad.balancer.freeze_after must be null or >= 0");
  MYRIAD_CHECK(b.aux_alpha >= 0, "config: myriad.balancer.aux_alpha must be >= 0, got ",
               b.aux_alpha);
  choice("myriad.balancer.aux_scope", b.aux_scope, {"batch", "sequence"});
  const auto& a = m.admission;
  positive("myriad.mla.admission.hidden", a.hidden);
  MYRIAD_CHECK(a.window >= 0, "config: myriad.mla.admission.window must be >= 0, got ", a.window);
  // tau = 0 admits every key that leaves the window (the soft rule, evaluated exactly).
  MYRIAD_CHECK(a.tau >= 0 && a.tau < 1, "config: myriad.mla.admission.tau must be in [0, 1), got ",
               a.tau);
  MYRIAD_CHECK(a.target_rate > 0 && a.target_rate < 1,
               "config: myriad.mla.admission.target_rate must be in (0, 1), got ", a.target_rate);
  MYRIAD_CHECK(a.lambda >= 0, "config: myriad.mla.admission.lambda must be >= 0, got ", a.lambda);
}

// ---- Reading ----

ModelConfig ModelConfig::from_json(std::string_view text, std::string_view source) {
  const std::string where = cat(source, ": ");
  json root = parse(text, where);
  MYRIAD_CHECK(root.is_object(), where, "the config is ", short_dump(root), ", not an object");

  ModelConfig c;
  const json* top = &root;
  json inner;
  // kimi_k3 and kimi_k25: the text model sits in text_config beside the vision fields.
  if (auto mt = root.find("model_type");
      mt != root.end() && mt->is_string() && (*mt == "kimi_k3" || *mt == "kimi_k25")) {
    const std::string wrapper = *mt;
    auto tc = root.find("text_config");
    MYRIAD_CHECK(tc != root.end() && tc->is_object(), where, "model_type ", wrapper,
                 " needs a text_config object");
    inner = *tc;
    // transformers reads the hub's kimi_k25 text model_type "kimi_k2" as deepseek_v3.
    if (auto tm = inner.find("model_type");
        wrapper == "kimi_k25" && tm != inner.end() && *tm == "kimi_k2")
      *tm = "deepseek_v3";
    top = &inner;
    json outer = root;
    outer.erase("text_config");
    read_vision(outer, wrapper == "kimi_k25", where, c);
    c.wrapper_json = outer.dump();
  }
  const std::string w = c.wrapper_json.empty() ? where : where + "text_config.";
  Reader r(*top, w);

  r.get({"architectures"}, c.architectures);
  r.get({"model_type"}, c.model_type);
  r.get({"dtype", "torch_dtype"}, c.dtype);
  r.get({"transformers_version"}, c.transformers_version);
  const bool ds = c.model_type == "deepseek_v3";
  if (ds) {  // DeepSeek's own defaults where its config omits a key
    c.architectures = {"DeepseekV3ForCausalLM"};
    r.get({"architectures"}, c.architectures);
    c.mla_use_nope = false;
  }

  r.get({"vocab_size"}, c.vocab_size);
  r.get({"hidden_size"}, c.hidden_size);
  r.get({"intermediate_size"}, c.intermediate_size);
  r.get({"moe_intermediate_size"}, c.moe_intermediate_size);
  r.get({"num_hidden_layers"}, c.num_hidden_layers);
  r.get({"num_attention_heads"}, c.num_attention_heads);
  c.num_key_value_heads = c.num_attention_heads;
  r.get({"num_key_value_heads"}, c.num_key_value_heads);
  r.get({"rms_norm_eps"}, c.rms_norm_eps);
  r.get({"initializer_range"}, c.initializer_range);
  r.get({"tie_word_embeddings"}, c.tie_word_embeddings);
  r.get({"use_cache"}, c.use_cache);

  r.get({"q_lora_rank"}, c.q_lora_rank);
  r.get({"kv_lora_rank"}, c.kv_lora_rank);
  r.get({"qk_nope_head_dim"}, c.qk_nope_head_dim);
  r.get({"qk_rope_head_dim"}, c.qk_rope_head_dim);
  r.get({"v_head_dim"}, c.v_head_dim);
  r.get({"mla_use_nope"}, c.mla_use_nope);
  r.get({"rope_theta"}, c.rope_theta);
  r.get({"rope_interleave"}, c.rope_interleave);
  auto read_yarn = [](Reader s, RopeScaling& y) {
    s.get({"factor"}, y.factor);
    s.get({"original_max_position_embeddings"}, y.original_max_position_embeddings);
    s.get({"beta_fast"}, y.beta_fast);
    s.get({"beta_slow"}, y.beta_slow);
    s.get({"mscale"}, y.mscale);
    s.get({"mscale_all_dim"}, y.mscale_all_dim);
  };
  if (const json* rs = r.object("rope_scaling")) {
    Reader s = r.sub(*rs, "rope_scaling");
    RopeScaling y;
    s.get({"type", "rope_type"}, y.type);
    read_yarn(s, y);
    c.rope_scaling = y;
  }
  // transformers 5 spelling: rope_theta and the scaling in one object.
  if (const json* rp = r.object("rope_parameters")) {
    Reader s = r.sub(*rp, "rope_parameters");
    double theta = c.rope_theta;
    s.get({"rope_theta"}, theta);
    MYRIAD_CHECK(!top->contains("rope_theta") || theta == c.rope_theta, w,
                 "rope_parameters.rope_theta (", theta, ") and rope_theta (", c.rope_theta,
                 ") disagree");
    c.rope_theta = theta;
    RopeScaling y;
    y.type = "default";
    s.get({"rope_type", "type"}, y.type);
    if (y.type != "default") {
      read_yarn(s, y);
      MYRIAD_CHECK(!c.rope_scaling || *c.rope_scaling == y, w,
                   "rope_scaling and rope_parameters disagree");
      c.rope_scaling = y;
    }
  }

  r.get({"num_experts", "num_local_experts", "n_routed_experts"}, c.num_experts);
  r.get({"num_experts_per_token", "num_experts_per_tok"}, c.num_experts_per_token);
  r.get({"num_shared_experts", "n_shared_experts"}, c.num_shared_experts);
  r.get({"moe_renormalize", "norm_topk_prob"}, c.moe_renormalize);
  r.get({"moe_router_activation_func", "scoring_func"}, c.moe_router_activation_func);
  r.get({"routed_scaling_factor"}, c.routed_scaling_factor);
  r.get({"num_expert_group", "n_group"}, c.num_expert_group);
  r.get({"topk_group"}, c.topk_group);
  c.use_grouped_topk = ds && c.num_expert_group > 1;
  r.get({"use_grouped_topk"}, c.use_grouped_topk);
  r.get({"first_k_dense_replace"}, c.first_k_dense_replace);
  r.get({"moe_layer_freq"}, c.moe_layer_freq);
  r.get({"num_nextn_predict_layers"}, c.num_nextn_predict_layers);

  r.get({"model_max_length", "max_position_embeddings"}, c.model_max_length);
  r.get({"bos_token_id"}, c.bos_token_id);
  // transformers allows a list of eos ids; such a value is kept verbatim in `extra`.
  if (auto it = top->find("eos_token_id"); it == top->end() || !it->is_array())
    r.get({"eos_token_id"}, c.eos_token_id);
  r.get({"pad_token_id"}, c.pad_token_id);

  auto& lac = c.linear_attn_config;
  bool have_kda = false, have_full = false;
  if (const json* o = r.object("linear_attn_config")) {
    Reader s = r.sub(*o, "linear_attn_config");
    s.get({"num_heads"}, lac.num_heads);
    s.get({"head_dim"}, lac.head_dim);
    s.get({"short_conv_kernel_size"}, lac.short_conv_kernel_size);
    have_kda = s.get({"kda_layers"}, lac.kda_layers);
    have_full = s.get({"full_attn_layers"}, lac.full_attn_layers);
    s.get({"gate_lower_bound"}, lac.gate_lower_bound);
    s.get({"use_full_rank_gate"}, lac.use_full_rank_gate);
  }
  if (!ds && c.num_hidden_layers > 0 && c.num_hidden_layers <= kMaxLayers) {
    // One list given: the other is its complement. None: layer_types, else the §5 default.
    auto complement = [&](const std::vector<int64_t>& from, std::vector<int64_t>& to) {
      to.clear();
      for (int64_t l = 1; l <= c.num_hidden_layers; ++l)
        if (std::find(from.begin(), from.end(), l) == from.end()) to.push_back(l);
    };
    if (have_kda && !have_full) complement(lac.kda_layers, lac.full_attn_layers);
    if (have_full && !have_kda) complement(lac.full_attn_layers, lac.kda_layers);
    auto lt = top->find("layer_types");
    if (!have_kda && !have_full && lt != top->end() && lt->is_array() &&
        static_cast<int64_t>(lt->size()) == c.num_hidden_layers) {
      for (int64_t l = 1; l <= c.num_hidden_layers; ++l)
        ((*lt)[l - 1] == "full_attention" ? lac.full_attn_layers : lac.kda_layers).push_back(l);
    } else if (!have_kda && !have_full) {
      default_layout(c.num_hidden_layers, lac.kda_layers, lac.full_attn_layers);
    }
  }

  r.get({"hidden_act"}, c.hidden_act);
  r.get({"activation_situ_beta"}, c.activation_situ_beta);
  r.get({"activation_situ_linear_beta"}, c.activation_situ_linear_beta);
  r.get({"mla_use_output_gate"}, c.mla_use_output_gate);
  if (const json* v = r.find({"attn_res_block_size"}); v && !v->is_null())
    if (!Reader::to_int(*v, c.attn_res_block_size))
      r.type_error("attn_res_block_size", "an integer or null", *v);
  r.get({"routed_expert_hidden_size"}, c.routed_expert_hidden_size);
  r.get({"latent_moe_use_norm"}, c.latent_moe_use_norm);
  r.get({"topk_method"}, c.topk_method);

  if (const json* o = r.object("myriad")) read_myriad(r.sub(*o, "myriad"), c.myriad);
  if (auto k25 = root.find("model_type"); k25 != root.end() && *k25 == "kimi_k25") {
    // transformers ties kimi_k25's lm_head by the outer key; the hub's configs set the inner one.
    if (auto t = root.find("tie_word_embeddings"); t != root.end()) {
      MYRIAD_CHECK(t->is_boolean(), where, "tie_word_embeddings must be true or false, got ",
                   short_dump(*t));
      MYRIAD_CHECK(!top->contains("tie_word_embeddings") || *t == c.tie_word_embeddings, where,
                   "tie_word_embeddings (", t->dump(), ") and text_config.tie_word_embeddings (",
                   c.tie_word_embeddings ? "true" : "false", ") disagree");
      c.tie_word_embeddings = t->get<bool>();
    }
  }

  for (const char* k : kIgnoredKeys) r.find({k});
  for (const auto& [k, v] : top->items())
    if (!r.used(k)) c.extra[k] = v.dump();
  // The plain K3 release wrapper around a K3-form text model is what to_json writes for it
  // anyway: not kept, so a K3 model reads back equal to the one written.
  if (!c.vision && c.is_k3_form() && !c.wrapper_json.empty() &&
      json::parse(c.wrapper_json) ==
          json{{"model_type", "kimi_k3"},
               {"architectures", json::array({"KimiK3ForConditionalGeneration"})}})
    c.wrapper_json.clear();
  return c;
}

ModelConfig ModelConfig::load(const std::string& path) {
  std::string file = path;
  if (std::filesystem::is_directory(path)) file = (std::filesystem::path(path) / "config.json");
  ModelConfig c = from_json(io::read_file(file, 64 << 20), file);
  try {
    c.validate();
  } catch (const Error& e) {
    throw Error(cat(file, ": ", e.what()));
  }
  return c;
}

// ---- Writing ----

std::string ModelConfig::to_json() const {
  json j;  // std::map keys: sorted, as transformers writes them
  for (const auto& [k, v] : extra) j[k] = json::parse(v);
  const bool ds = is_deepseek();
  j["architectures"] = architectures;
  j["model_type"] = model_type;
  j["dtype"] = dtype;
  if (!transformers_version.empty()) j["transformers_version"] = transformers_version;
  j["vocab_size"] = vocab_size;
  j["hidden_size"] = hidden_size;
  j["intermediate_size"] = intermediate_size;
  j["moe_intermediate_size"] = moe_intermediate_size;
  j["num_hidden_layers"] = num_hidden_layers;
  j["num_attention_heads"] = num_attention_heads;
  j["num_key_value_heads"] = num_key_value_heads;
  j["rms_norm_eps"] = rms_norm_eps;
  j["initializer_range"] = initializer_range;
  j["tie_word_embeddings"] = tie_word_embeddings;
  j["use_cache"] = use_cache;
  j["q_lora_rank"] = opt(q_lora_rank);
  j["kv_lora_rank"] = kv_lora_rank;
  j["qk_nope_head_dim"] = qk_nope_head_dim;
  j["qk_rope_head_dim"] = qk_rope_head_dim;
  j["v_head_dim"] = v_head_dim;
  j["rope_theta"] = rope_theta;
  if (rope_scaling) {
    const auto& y = *rope_scaling;
    j["rope_scaling"] = {{"type", y.type},
                         {"rope_type", y.type},
                         {"factor", y.factor},
                         {"original_max_position_embeddings", y.original_max_position_embeddings},
                         {"beta_fast", y.beta_fast},
                         {"beta_slow", y.beta_slow},
                         {"mscale", y.mscale},
                         {"mscale_all_dim", y.mscale_all_dim}};
  } else {
    j["rope_scaling"] = nullptr;
  }
  if (ds) {  // transformers 5 reads this object in preference to the two keys above
    json rp = j["rope_scaling"].is_null() ? json{{"rope_type", "default"}} : j["rope_scaling"];
    rp.erase("type");
    rp["rope_theta"] = rope_theta;
    j["rope_parameters"] = rp;
  }
  if (rope_interleave) j["rope_interleave"] = *rope_interleave;
  j[ds ? "n_routed_experts" : "num_experts"] = num_experts;
  j[ds ? "num_experts_per_tok" : "num_experts_per_token"] = num_experts_per_token;
  j[ds ? "n_shared_experts" : "num_shared_experts"] = num_shared_experts;
  j[ds ? "norm_topk_prob" : "moe_renormalize"] = moe_renormalize;
  j[ds ? "scoring_func" : "moe_router_activation_func"] = moe_router_activation_func;
  j[ds ? "n_group" : "num_expert_group"] = num_expert_group;
  j[ds ? "max_position_embeddings" : "model_max_length"] = model_max_length;
  j["routed_scaling_factor"] = routed_scaling_factor;
  j["topk_group"] = topk_group;
  j["use_grouped_topk"] = use_grouped_topk;
  j["first_k_dense_replace"] = first_k_dense_replace;
  j["moe_layer_freq"] = moe_layer_freq;
  j["num_nextn_predict_layers"] = num_nextn_predict_layers;
  j["topk_method"] = topk_method;
  j["bos_token_id"] = opt(bos_token_id);
  if (!extra.count("eos_token_id")) j["eos_token_id"] = opt(eos_token_id);
  j["pad_token_id"] = opt(pad_token_id);
  j["hidden_act"] = hidden_act;

  // Kimi-only keys; a deepseek_v3 config gets them only when it departs from their absence.
  const auto& lac = linear_attn_config;
  if (!ds || mla_use_nope) j["mla_use_nope"] = mla_use_nope;
  if (!ds || lac != LinearAttnConfig{}) {
    json la = {{"num_heads", lac.num_heads},
               {"head_dim", lac.head_dim},
               {"short_conv_kernel_size", lac.short_conv_kernel_size},
               {"kda_layers", lac.kda_layers},
               {"full_attn_layers", lac.full_attn_layers}};
    if (lac.gate_lower_bound) la["gate_lower_bound"] = *lac.gate_lower_bound;
    if (lac.use_full_rank_gate) la["use_full_rank_gate"] = true;
    j["linear_attn_config"] = la;
  }
  // K3 extensions: written only when they depart from the Kimi Linear form.
  const ModelConfig plain;
  if (hidden_act == "situ" || activation_situ_beta != plain.activation_situ_beta ||
      activation_situ_linear_beta != plain.activation_situ_linear_beta) {
    j["activation_situ_beta"] = activation_situ_beta;
    j["activation_situ_linear_beta"] = activation_situ_linear_beta;
  }
  if (mla_use_output_gate) j["mla_use_output_gate"] = true;
  if (attn_res_block_size != 0) j["attn_res_block_size"] = attn_res_block_size;
  if (routed_expert_hidden_size) j["routed_expert_hidden_size"] = *routed_expert_hidden_size;
  if (routed_expert_hidden_size || latent_moe_use_norm)
    j["latent_moe_use_norm"] = latent_moe_use_norm;
  if (!ds) {
    // Derived keys (transformers 5.x reads layer_types before the lists).
    j["qk_head_dim"] = qk_head_dim();
    j["head_dim"] = qk_rope_head_dim;
    MYRIAD_CHECK(num_hidden_layers >= 0 && num_hidden_layers <= kMaxLayers,
                 "config: num_hidden_layers = ", num_hidden_layers, " outside 0..", kMaxLayers);
    std::vector<std::string> lt(num_hidden_layers, "linear_attention"), mt;
    for (int64_t l : lac.full_attn_layers)
      if (l >= 1 && l <= num_hidden_layers) lt[l - 1] = "full_attention";
    if (lac.full_attn_layers.empty() && lac.kda_layers.empty())
      for (int64_t i = 0; i < num_hidden_layers; ++i)
        if (is_mla_layer(i)) lt[i] = "full_attention";
    for (int64_t i = 0; i < num_hidden_layers; ++i)
      mt.push_back(is_moe_layer(i) ? "sparse" : "dense");
    j["layer_types"] = lt;
    j["mlp_layer_types"] = mt;
  }
  j["myriad"] = write_myriad(myriad);

  if (!wrapper_json.empty() || vision || is_k3_form()) {
    // A vision model without a wrapper read from disk gets transformers' kimi_k25 one around a
    // DeepSeek-V3 text model, else the K3 release's kimi_k3 one (K3-form text models too).
    json outer;
    if (!wrapper_json.empty())
      outer = json::parse(wrapper_json);
    else if (ds)
      outer = {{"model_type", "kimi_k25"},
               {"architectures", json::array({"Kimi_K25ForConditionalGeneration"})}};
    else
      outer = {{"model_type", "kimi_k3"},
               {"architectures", json::array({"KimiK3ForConditionalGeneration"})}};
    const bool k25 = outer.value("model_type", "") == "kimi_k25";
    if (vision) {
      outer["vision_config"] = vision->to_json();
      outer["projection_layer_norm_eps"] = vision->projection_layer_norm_eps;
      outer["projection_hidden_size"] = vision->hidden_size;
    }
    if (media_placeholder_token_id)
      outer[k25 ? "image_token_id" : "media_placeholder_token_id"] = *media_placeholder_token_id;
    if (k25) outer["tie_word_embeddings"] = tie_word_embeddings;
    outer["text_config"] = std::move(j);
    j = std::move(outer);
  }
  try {
    return j.dump(2) + "\n";
  } catch (const json::exception& e) {  // strings set in code must be valid UTF-8
    throw Error(cat("config: cannot write JSON: ", e.what()));
  }
}

void ModelConfig::save(const std::string& path) const {
  validate();
  std::string file = path;
  if (std::filesystem::is_directory(path)) file = (std::filesystem::path(path) / "config.json");
  io::write_file_atomic(file, to_json());
}

// ---- Presets ----

namespace {

ModelConfig kimi_linear_base() {
  ModelConfig c;
  c.bos_token_id = 163584;
  c.eos_token_id = 163586;
  c.pad_token_id = 163839;
  c.moe_router_activation_func = "sigmoid";
  c.moe_renormalize = true;
  c.use_grouped_topk = true;
  c.num_expert_group = 1;
  c.topk_group = 1;
  c.first_k_dense_replace = 1;
  c.moe_layer_freq = 1;
  c.mla_use_nope = true;
  c.rms_norm_eps = 1e-5;
  return c;
}

// The K3 switches of MODEL.md §13 on top of a shape (latent width and block size vary).
void apply_k3(ModelConfig& c, int64_t latent, int64_t block) {
  c.linear_attn_config.gate_lower_bound = -5.0;
  c.linear_attn_config.use_full_rank_gate = true;
  c.mla_use_output_gate = true;
  c.attn_res_block_size = block;
  c.routed_expert_hidden_size = latent;
  c.latent_moe_use_norm = true;
  c.hidden_act = "situ";
  c.activation_situ_beta = 4.0;
  c.activation_situ_linear_beta = 25.0;
  c.routed_scaling_factor = 1.0;
  c.use_grouped_topk = false;
  c.topk_method = "noaux_tc";
  c.myriad.balancer.mode = "quantile";
}

void set_layers(ModelConfig& c, int64_t L) {
  c.num_hidden_layers = L;
  default_layout(L, c.linear_attn_config.kda_layers, c.linear_attn_config.full_attn_layers);
}

}  // namespace

ModelConfig medium() {
  ModelConfig c = kimi_linear_base();
  c.vocab_size = 32000;
  c.hidden_size = 1024;
  c.intermediate_size = 2816;
  c.moe_intermediate_size = 256;
  set_layers(c, 12);
  c.num_attention_heads = c.num_key_value_heads = 16;
  c.q_lora_rank.reset();
  c.kv_lora_rank = 256;
  c.qk_nope_head_dim = 64;
  c.qk_rope_head_dim = 32;
  c.v_head_dim = 64;
  c.linear_attn_config.num_heads = 16;
  c.linear_attn_config.head_dim = 64;
  c.linear_attn_config.short_conv_kernel_size = 4;
  c.num_experts = 64;
  c.num_experts_per_token = 6;
  c.num_shared_experts = 1;
  c.routed_scaling_factor = 2.446;
  c.model_max_length = 65536;
  c.bos_token_id = c.eos_token_id = c.pad_token_id = std::nullopt;  // Myriad's own tokenizer
  c.myriad.balancer.mode = "quantile";                              // MODEL.md §1: QB for medium
  return c;
}

ModelConfig medium_k3() {
  ModelConfig c = medium();
  apply_k3(c, 512, 4);
  return c;
}

ModelConfig tiny() {
  ModelConfig c = kimi_linear_base();
  c.vocab_size = 512;
  c.hidden_size = 128;
  c.intermediate_size = 256;
  c.moe_intermediate_size = 64;
  set_layers(c, 8);
  c.num_attention_heads = c.num_key_value_heads = 2;
  c.q_lora_rank = 64;
  c.kv_lora_rank = 64;
  c.qk_nope_head_dim = 32;
  c.qk_rope_head_dim = 16;
  c.v_head_dim = 32;
  c.linear_attn_config.num_heads = 2;
  c.linear_attn_config.head_dim = 32;
  c.linear_attn_config.short_conv_kernel_size = 4;
  c.num_experts = 8;
  c.num_experts_per_token = 2;
  c.num_shared_experts = 1;
  c.model_max_length = 16384;
  c.bos_token_id = c.eos_token_id = c.pad_token_id = std::nullopt;
  apply_k3(c, 64, 2);
  c.mla_use_output_gate = false;  // MODEL.md §1 lists tiny's MLA as plain NoPE
  c.myriad.admission.window = 64;
  return c;
}

ModelConfig kimi_linear_48b() {
  ModelConfig c = kimi_linear_base();
  c.vocab_size = 163840;
  c.hidden_size = 2304;
  c.intermediate_size = 9216;
  c.moe_intermediate_size = 1024;
  set_layers(c, 27);
  c.num_attention_heads = c.num_key_value_heads = 32;
  c.q_lora_rank.reset();
  c.kv_lora_rank = 512;
  c.qk_nope_head_dim = 128;
  c.qk_rope_head_dim = 64;
  c.v_head_dim = 128;
  c.linear_attn_config.num_heads = 32;
  c.linear_attn_config.head_dim = 128;
  c.linear_attn_config.short_conv_kernel_size = 4;
  c.num_experts = 256;
  c.num_experts_per_token = 8;
  c.num_shared_experts = 1;
  c.routed_scaling_factor = 2.446;
  c.model_max_length = 1048576;
  c.myriad.balancer.mode = "sign";  // MODEL.md §13: the Kimi Linear preset uses the sign rule
  return c;
}

ModelConfig kimi_k3() {
  ModelConfig c = kimi_linear_base();
  c.vocab_size = 163840;
  c.hidden_size = 7168;
  c.intermediate_size = 33792;
  c.moe_intermediate_size = 3072;
  set_layers(c, 93);
  c.num_attention_heads = c.num_key_value_heads = 96;
  c.q_lora_rank = 1536;
  c.kv_lora_rank = 512;
  c.qk_nope_head_dim = 128;
  c.qk_rope_head_dim = 64;
  c.v_head_dim = 128;
  c.linear_attn_config.num_heads = 96;
  c.linear_attn_config.head_dim = 128;
  c.linear_attn_config.short_conv_kernel_size = 4;
  c.num_experts = 896;
  c.num_experts_per_token = 16;
  c.num_shared_experts = 2;
  c.model_max_length = 1048576;
  apply_k3(c, 3584, 12);
  return c;
}

ModelConfig deepseek_v3() {
  ModelConfig c;
  c.architectures = {"DeepseekV3ForCausalLM"};
  c.model_type = "deepseek_v3";
  c.vocab_size = 129280;
  c.hidden_size = 7168;
  c.intermediate_size = 18432;
  c.moe_intermediate_size = 2048;
  c.num_hidden_layers = 61;
  c.num_attention_heads = c.num_key_value_heads = 128;
  c.rms_norm_eps = 1e-6;
  c.q_lora_rank = 1536;
  c.kv_lora_rank = 512;
  c.qk_nope_head_dim = 128;
  c.qk_rope_head_dim = 64;
  c.v_head_dim = 128;
  c.mla_use_nope = false;
  c.rope_theta = 10000.0;
  c.rope_scaling = RopeScaling{"yarn", 40.0, 4096, 32.0, 1.0, 1.0, 1.0};
  c.num_experts = 256;
  c.num_experts_per_token = 8;
  c.num_shared_experts = 1;
  c.routed_scaling_factor = 2.5;
  c.use_grouped_topk = true;
  c.num_expert_group = 8;
  c.topk_group = 4;
  c.first_k_dense_replace = 3;
  c.num_nextn_predict_layers = 1;
  c.model_max_length = 131072;
  c.bos_token_id = 0;
  c.eos_token_id = 1;
  c.myriad.balancer.mode = "sign";  // plus a sequence-wise auxiliary loss (MODEL.md §12.3)
  c.myriad.balancer.aux_scope = "sequence";
  c.myriad.balancer.aux_alpha = 1e-4;
  return c;
}

std::vector<std::string> preset_names() {
  return {"tiny", "medium", "medium-k3", "kimi-linear-48b", "kimi-k3", "deepseek-v3"};
}

ModelConfig preset(std::string_view name) {
  std::string n(name);
  std::replace(n.begin(), n.end(), '_', '-');
  if (n == "tiny") return tiny();
  if (n == "medium") return medium();
  if (n == "medium-k3") return medium_k3();
  if (n == "kimi-linear-48b") return kimi_linear_48b();
  if (n == "kimi-k3") return kimi_k3();
  if (n == "deepseek-v3") return deepseek_v3();
  throw Error(cat("unknown model preset '", name,
                  "' (expected tiny, medium, medium-k3, kimi-linear-48b, kimi-k3 or deepseek-v3)"));
}

}  // namespace myriad::model

// ---- The vision tower's config (declared in vision/tower.h; read here with the same Reader) ----

namespace myriad::vision {

using json = nlohmann::json;

VisionConfig VisionConfig::from_json(const json& j, const std::string& where) {
  MYRIAD_CHECK(j.is_object(), where, "vision_config must be an object, got ", model::short_dump(j));
  model::Reader r(j, where, "vision_config.");
  VisionConfig c;
  r.get({"model_type"}, c.model_type);
  r.get({"patch_size"}, c.patch_size);
  r.get({"pos_emb_height", "init_pos_emb_height"}, c.pos_emb_height);
  r.get({"pos_emb_width", "init_pos_emb_width"}, c.pos_emb_width);
  r.get({"pos_emb_time", "init_pos_emb_time"}, c.pos_emb_time);
  r.get({"num_attention_heads", "vt_num_attention_heads"}, c.num_attention_heads);
  r.get({"num_hidden_layers", "vt_num_hidden_layers"}, c.num_hidden_layers);
  r.get({"hidden_size", "vt_hidden_size"}, c.hidden_size);
  r.get({"intermediate_size", "vt_intermediate_size"}, c.intermediate_size);
  r.get({"hidden_act"}, c.hidden_act);
  std::vector<int64_t> kernel;
  if (r.get({"merge_kernel_size"}, kernel)) {
    MYRIAD_CHECK(kernel.size() == 2, where,
                 "vision_config.merge_kernel_size must be a list of two integers [h, w], got ",
                 kernel.size());
    c.merge_kernel_h = kernel[0];
    c.merge_kernel_w = kernel[1];
  }
  if (const json* rp = r.object("rope_parameters")) {
    model::Reader s = r.sub(*rp, "rope_parameters");
    std::string type = "axial";
    s.get({"rope_type", "type"}, type);
    MYRIAD_CHECK(type == "axial", where, "vision_config.rope_parameters.rope_type = '", type,
                 "' is not 'axial', the tower's only RoPE");
    s.get({"rope_theta"}, c.rope_theta);
  }
  r.get({"projector_ln_eps"}, c.projection_layer_norm_eps);  // the hub's spelling
  for (const auto& [k, v] : j.items())
    if (!r.used(k)) c.extra[k] = v;
  return c;
}

json VisionConfig::to_json() const {
  json j = extra;
  j["model_type"] = model_type;
  j["patch_size"] = patch_size;
  j["pos_emb_height"] = pos_emb_height;
  j["pos_emb_width"] = pos_emb_width;
  j["pos_emb_time"] = pos_emb_time;
  j["num_attention_heads"] = num_attention_heads;
  j["num_hidden_layers"] = num_hidden_layers;
  j["hidden_size"] = hidden_size;
  j["intermediate_size"] = intermediate_size;
  j["hidden_act"] = hidden_act;
  j["merge_kernel_size"] = {merge_kernel_h, merge_kernel_w};
  j["rope_parameters"] = {{"rope_type", "axial"}, {"rope_theta", rope_theta}};
  return j;
}

void VisionConfig::validate() const {
  auto positive = [](const char* field, int64_t v) {
    MYRIAD_CHECK(v > 0, "config: vision_config.", field, " must be > 0, got ", v);
  };
  positive("patch_size", patch_size);
  positive("pos_emb_height", pos_emb_height);
  positive("pos_emb_time", pos_emb_time);
  positive("num_attention_heads", num_attention_heads);
  positive("num_hidden_layers", num_hidden_layers);
  positive("hidden_size", hidden_size);
  positive("intermediate_size", intermediate_size);
  positive("merge_kernel_size[0]", merge_kernel_h);
  positive("merge_kernel_size[1]", merge_kernel_w);
  MYRIAD_CHECK(pos_emb_width == pos_emb_height,
               "config: vision_config.pos_emb_width = ", pos_emb_width,
               " must equal vision_config.pos_emb_height = ", pos_emb_height,
               " (transformers resamples a square position table)");
  MYRIAD_CHECK(hidden_size % num_attention_heads == 0 && head_dim() % 4 == 0,
               "config: vision_config.hidden_size = ", hidden_size,
               " must be num_attention_heads = ", num_attention_heads,
               " heads of a multiple of 4 (axial RoPE splits each head's pairs between rows and "
               "columns)");
  MYRIAD_CHECK(hidden_act == "gelu_pytorch_tanh", "config: vision_config.hidden_act = '",
               hidden_act, "' is not gelu_pytorch_tanh, the tower's only activation");
  MYRIAD_CHECK(rope_theta > 0, "config: vision_config.rope_parameters.rope_theta must be > 0, got ",
               rope_theta);
  MYRIAD_CHECK(projection_layer_norm_eps > 0, "config: projection_layer_norm_eps must be > 0, got ",
               projection_layer_norm_eps);
}

}  // namespace myriad::vision
