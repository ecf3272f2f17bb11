// The decoder (MODEL.md §2, §5, §7, §9): token embedding, L layers of {KDA or MLA} + {dense or
// MoE FFN} with pre-norm residuals or K3 Block AttnRes, final RMSNorm and the untied LM head.
// The layout comes from the config. Forward runs uncached (training, reference parity) or with a
// DecodeCache (prefill, continuing segments, token-by-token decode). Options of MODEL.md §12: the
// attention carry Â_l = A_l + γ_{l-1} ⊙ Â_{l-1} (residual.attn_carry, no cache needed: it runs
// across depth within one token), the latent_similarity router (see Moe) with its exact export,
// and the MLA cache admission gate (see MlaLayer) with its regulariser.
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "model/cache.h"
#include "model/config.h"
#include "model/ffn.h"
#include "model/kda_layer.h"
#include "model/mla_layer.h"
#include "model/moe.h"
#include "model/weights.h"

namespace myriad::model {

struct ForwardOptions {
  bool logits = true;   // compute [B, T, V] logits (the loss needs only the normed hidden)
  bool record = false;  // keep the per-layer tensors below
  // Activation recomputation (training long sequences): each FFN / MoE sublayer, and each
  // attention sublayer of an uncached forward, keeps only its input and runs again in the backward
  // pass (core recompute()). Gradients are unchanged. Not with auxiliary router losses, which
  // need the router's graph after the forward.
  bool recompute = false;
  // Native vision (MODEL.md §10): [N, d] rows that replace the embeddings of the N placeholder
  // tokens (config media_placeholder_token_id) in ids, in row-major order (Decoder::encode_images
  // gives them image after image). Undefined: text only.
  Tensor image_embeds{};
};

struct ForwardOutput {
  Tensor logits_BTV;                              // when requested
  Tensor normed_BTD;                              // the final-norm output that feeds the LM head
  std::vector<Tensor> hidden, attn_out, ffn_out;  // per layer, when recorded (attn_out: raw A_l)
  // MLA admission gate (§12.4) only: ā, the mean gate over tokens and MLA layers, and
  // L_adm = λ (ā − ρ)², which a trainer adds to the loss (both differentiable).
  Tensor admission_rate, admission_loss;
};

// L_adm = lambda (rate − target_rate)² with the config's admission.{lambda, target_rate}.
Tensor admission_regulariser(const ModelConfig& c, const Tensor& rate);

class Decoder {
 public:
  Decoder(ModelConfig config, Weights weights);
  // Everything a config expects, in checkpoint names and shapes.
  static std::vector<ParamSpec> param_specs(const ModelConfig& c);
  // config.json + safetensors from a model directory (f32).
  static Decoder load(const std::string& dir, DType dtype = DType::F32);
  // Fresh parameters (MODEL.md init rules), deterministic for a seed.
  static Decoder random(const ModelConfig& c, uint64_t seed, DType dtype = DType::F32);

  const ModelConfig& config() const { return config_; }
  Weights& weights() { return *weights_; }
  const Weights& weights() const { return *weights_; }
  DecodeCache new_cache() const { return DecodeCache(config_.num_hidden_layers); }
  // Weight-only int8 or int4 for inference (ops/quant.h, bits 8 or 4): quantized copies of every
  // projection whose input dimension is a multiple of 32 and of the LM head. Not the embedding (a
  // row lookup), the router, AttnRes' vectors, or MLA's kv_b_proj (decode absorbs it into the
  // queries). act_bits 8 (with bits 8): decode's products quantize their activations to int8
  // per 32 too ("w8a8", ops/quant.h). Returns how many weights were quantized.
  int64_t quantize(int bits = 8, int act_bits = 0);

  // ids [B, T] (i32/i64). With a cache, continues from it and extends it.
  ForwardOutput forward(const Tensor& ids_BT, DecodeCache* cache = nullptr,
                        ForwardOptions opt = {}) const;
  // One batched decode step: ids [N, 1], row n the next token of the sequence whose (prefilled)
  // cache is caches[n]. Everything but the attention runs over the N rows at once; each row
  // attends over its own cache. Row n gets what forward(ids[n], caches[n]) gives.
  ForwardOutput forward_batch(const Tensor& ids_N1, const std::vector<DecodeCache*>& caches,
                              ForwardOptions opt = {}) const;
  // The vision tower + projector over processed images (vision::encode): the rows that replace
  // the images' placeholders, image after image. Needs a config with `vision`.
  Tensor encode_images(const Tensor& pixel_values, const std::vector<vision::Grid>& grids) const;
  // Mean next-token cross-entropy: position t is scored against ids[t+1]; the last is ignored.
  Tensor loss(const Tensor& ids_BT) const;

  struct Generation {
    std::vector<int64_t> ids;         // the new tokens
    std::vector<Tensor> step_logits;  // [V] logits that picked each one
  };
  // Routing of the last forward in MoE layer `layer` (a decoder layer index; throws for dense).
  const RouteStats& last_route(int64_t layer) const;
  // The selection bias e_score_correction_bias of MoE layer `layer`: a handle on the weight's
  // storage (not trainable), so balancers update it in place.
  Tensor selection_bias(int64_t layer) const;

  // How every MoE layer runs its routed experts in later forwards (null: here; see ExpertRunner).
  void set_expert_runner(const ExpertRunner* r) const;

  // Greedy decoding from a prompt [1, T]: prefill into a fresh cache, then one token at a time.
  Generation generate_greedy(const Tensor& prompt_1T, int64_t new_tokens) const;

 private:
  struct Layer {
    std::optional<KdaLayer> kda;
    std::optional<MlaLayer> mla;
    std::optional<DenseFfn> dense;
    std::optional<Moe> moe;
  };
  ForwardOutput forward_impl(const Tensor& ids_BT, const std::vector<DecodeCache*>& caches,
                             ForwardOptions opt) const;
  Tensor attn(int64_t i, const Tensor& x_BTD, const std::vector<DecodeCache*>& caches,
              Tensor* gate_BT) const;
  // γ ⊙ Â_prev for layer i > 0 whose attention sublayer takes the stream input x (§12.1).
  Tensor carry(int64_t i, const Tensor& x_BTD, const Tensor& prev) const;
  Tensor ffn(int64_t i, const Tensor& x_BTD) const;
  const Tensor& w(const std::string& name) const { return weights_->get(name); }

  ModelConfig config_;
  std::unique_ptr<Weights> weights_;  // stable address for the layers' pointers
  std::vector<Layer> layers_;
};

// §12.2 exact export: gate.weight = E·W_rd / √d_r (formed in f64) in every MoE layer of a
// latent_similarity model; the result is the same model with the plain linear router, which
// saves and loads as a plain kimi_linear checkpoint.
Decoder export_linear_router(const Decoder& m);

}  // namespace myriad::model
