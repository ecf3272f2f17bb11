#include "model/commands.h"

#include <cstdio>
#include <sstream>

#include "core/autograd.h"
#include "core/error.h"
#include "io/safetensors.h"
#include "model/cache.h"
#include "model/decoder.h"

namespace myriad::model {

void logits_command(const std::string& model_dir, const std::string& tokens_path,
                    const std::string& out_path) {
  auto in = safetensors::open(tokens_path);
  const auto names = in.names();
  MYRIAD_CHECK(in.contains("input_ids") || names.size() == 1, "logits: ", tokens_path,
               " has no tensor named input_ids");
  Tensor ids = in.load(in.contains("input_ids") ? "input_ids" : names[0]);
  MYRIAD_CHECK(ids.dtype() == DType::I64 && ids.dim() == 2, "logits: input_ids in ", tokens_path,
               " must be i64 [B, T], got ", ids.desc());
  Decoder m = Decoder::load(model_dir);
  NoGradGuard ng;
  Tensor logits = m.forward(ids).logits_BTV;
  safetensors::save(out_path, {{"logits", logits.to(DType::F32)}});
}

ParamCounts count_params(const ModelConfig& c) {
  ParamCounts n;
  for (const auto& s : Decoder::param_specs(c)) n.total += shape_numel(s.shape);
  const int64_t l = c.routed_expert_hidden_size.value_or(c.hidden_size);
  const int64_t per_expert = 3 * l * c.moe_intermediate_size;
  n.active = n.total;
  for (int64_t i = 0; i < c.num_hidden_layers; ++i)
    if (c.is_moe_layer(i)) n.active -= (c.num_experts - c.num_experts_per_token) * per_expert;
  return n;
}

namespace {

std::string human(double v, const char* unit) {
  const char* pre[] = {"", "K", "M", "G", "T"};
  int k = 0;
  while (v >= 1000 && k < 4) v /= 1000, ++k;
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.4g %s%s", v, pre[k], unit);
  return buf;
}

std::string bytes(double b) {
  const char* pre[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int k = 0;
  double v = b;
  while (v >= 1024 && k < 4) v /= 1024, ++k;
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.0f B (%.4g %s)", b, v, pre[k]);
  return buf;
}

}  // namespace

std::string inspect_report(const ModelConfig& c) {
  std::ostringstream os;
  os << "model_type " << c.model_type << ": " << c.num_hidden_layers << " layers, hidden "
     << c.hidden_size << ", vocab " << c.vocab_size << ", "
     << (c.uses_attn_res() ? "Block AttnRes (S = " + std::to_string(c.attn_res_block_size) + ")"
                           : std::string("pre-norm residuals"))
     << ", activation " << c.hidden_act << "\n";
  os << "layers:\n";
  int64_t n_mla = 0, n_kda = 0, n_moe = 0;
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const bool mla = c.is_mla_layer(i), moe = c.is_moe_layer(i);
    n_mla += mla, n_kda += !mla, n_moe += moe;
    os << "  " << i << ": " << (mla ? "MLA" : "KDA") << " + "
       << (moe ? (c.uses_latent_moe() ? "LatentMoE" : "MoE") : "dense FFN") << "\n";
  }
  os << "  (" << n_kda << " KDA, " << n_mla << " MLA, " << n_moe << " MoE)\n";
  const ParamCounts p = count_params(c);
  os << "parameters: total " << p.total << " (" << human(static_cast<double>(p.total), "") << ")"
     << ", active per token " << p.active << " (" << human(static_cast<double>(p.active), "")
     << ")\n";
  const CacheSizes s = cache_sizes(c);
  os << "decode cache (bf16 values, f32 KDA state):\n";
  os << "  MLA: " << s.mla_bytes_per_token_per_layer << " B per token per layer ("
     << c.kv_lora_rank + c.qk_rope_head_dim << " values), " << s.mla_bytes_per_token
     << " B per token over " << n_mla << " layers\n";
  os << "  MLA cache at 128K tokens: " << bytes(131072.0 * s.mla_bytes_per_token)
     << "; at 1M tokens: " << bytes(1048576.0 * s.mla_bytes_per_token) << "\n";
  os << "  KDA: 0 B per token; per layer state " << bytes(s.kda_state_bytes_per_layer) << " + conv "
     << bytes(s.kda_conv_bytes_per_layer) << "; all " << n_kda << " layers " << bytes(s.kda_bytes)
     << "\n";
  return os.str();
}

}  // namespace myriad::model
