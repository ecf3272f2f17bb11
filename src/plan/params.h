// Parameter accounting derived purely from a ModelConfig, following the tensor tables of
// MODEL.md §2, §3.1, §4.1, §6, §7 and the §12 options. expected_tensors() is the contract with
// the engine: the model's param_specs() must list exactly these names and shapes.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "model/config.h"

namespace myriad::plan {

using model::ModelConfig;

// Which budget line a tensor belongs to (MODEL.md §9 breakdown).
enum class Part : uint8_t {
  Embedding,      // model.embed_tokens
  Head,           // lm_head
  KdaAttention,   // KDA self_attn.*
  MlaAttention,   // MLA self_attn.* (admission gate included)
  RoutedExperts,  // experts.{j}.*
  SharedExperts,  // shared_experts.*
  LatentProj,     // routed_expert_{down,up}_proj, routed_expert_norm
  Router,         // gate.* (incl. the balancer's e_score_correction_bias)
  DenseFfn,       // mlp.* of dense layers
  Norms,          // layer norms, final norm, AttnRes vectors, attn_carry
};
constexpr int kNumParts = 10;
const char* part_name(Part p);

struct ParamTensor {
  std::string name;
  Shape shape;
  Part part;
  int64_t layer = -1;     // 0-based decoder layer, -1 for model-level tensors
  bool muon = false;      // a 2-D hidden matrix: Muon group (TRAINING.md §1.1)
  bool trainable = true;  // false for e_score_correction_bias (set by the balancer)
};

// Every tensor the engine builds for `c`, in checkpoint names (MODEL.md §11.2) and order:
// embedding, then per layer (norms, AttnRes, attn_carry, attention, FFN), then the final norm,
// the output AttnRes pair and the head. DeepSeek-V3's MTP module is not built (and not listed).
std::vector<ParamTensor> param_table(const ModelConfig& c);
std::vector<std::pair<std::string, Shape>> expected_tensors(const ModelConfig& c);

struct LayerParams {
  bool mla = false, moe = false;
  int64_t shared = 0;       // everything except routed experts (replicated over EP)
  int64_t routed = 0;       // all routed experts of the layer (sharded over EP)
  int64_t frozen = 0;       // of `shared`, not trained (set by the balancer): no gradient traffic
  int64_t muon_shared = 0;  // of which in the Muon group
  int64_t muon_routed = 0;
  // Newton-Schulz FLOPs of one Muon step over the layer's matrices (TRAINING.md §1.3).
  double muon_ns_flops_shared = 0, muon_ns_flops_routed = 0;
};

struct ParamCounts {
  std::array<int64_t, kNumParts> total_by_part{};   // all parameters
  std::array<int64_t, kNumParts> active_by_part{};  // touched by one token
  int64_t total = 0;
  // Active per token, without the embedding table (a lookup, no FLOPs): the convention that
  // reproduces K3's published 104.2B and DeepSeek-V3's 37B (MODEL.md §1).
  int64_t active = 0;
  int64_t active_with_embedding = 0;
  int64_t matmul_active = 0;  // active 2-D matrix parameters (2 FLOPs each per token forward)
  int64_t muon = 0, trainable = 0;
  int64_t expert_size = 0;                                 // parameters of one routed expert
  int64_t embedding = 0, head = 0, model_level_other = 0;  // final norm, output AttnRes
  std::vector<LayerParams> layers;
  int64_t num_tensors = 0;
  int64_t mtp_layers_not_built = 0;  // num_nextn_predict_layers (excluded from every count)
};

ParamCounts count_params(const ModelConfig& c);

// FLOPs of Muon's 5 Newton-Schulz iterations for one [rows, cols] matrix: with a = min and
// b = max of the two, each iteration forms X·Xᵀ (2a²b), its square (2a³) and the update (2a²b).
double newton_schulz_flops(int64_t rows, int64_t cols);

// ---- Decode caches (MODEL.md §3.3, §4.8) ----
struct CacheFootprint {
  int64_t mla_layers = 0, kda_layers = 0;
  int64_t mla_bytes_per_token = 0;  // bf16 latent [c_kv ; k_pe] over all MLA layers
  int64_t kda_state_bytes = 0;      // S over all KDA layers, per sequence
  int64_t kda_conv_bytes = 0;       // bf16 conv tails over all KDA layers, per sequence
  int64_t admission_window = -1;    // W when the §12.4 admission gate is on, else -1
  double admission_rate = 1.0;      // share of keys past the window that are kept
  // Latent-cache tokens kept for a sequence of `tokens`: all of them, or W plus the admitted
  // share of the rest under the admission gate.
  double mla_tokens(int64_t tokens) const;
  double per_sequence(int64_t tokens) const;  // bytes: MLA latents + KDA state + conv tails
};
// state_bytes: 2 for a bf16-stored S (serving, FlashKDA), 4 for f32.
CacheFootprint cache_footprint(const ModelConfig& c, int64_t state_bytes = 2);

}  // namespace myriad::plan
