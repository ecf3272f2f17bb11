// The native vision encoder (MODEL.md §10): a MoonViT image tower and the projector into the
// decoder's width, as transformers' kimi_k25 (Kimi K2.5) computes them (docs/REFERENCE_NOTES.md
// §11). Built from ops only: patch embedding, the position table resampled bicubically to each
// image's grid, ViT blocks with axial 2D RoPE and bidirectional attention inside each image
// (packed images of different sizes attend only within themselves), the kh × kw merge and the
// projector. Video chunks (t > 1 frames) add a temporal sinusoid, attend across their frames and
// average them in the merge. Forward and backward through autograd.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "model/weights.h"

namespace myriad::vision {

// kimi_k25's vision_config, field names as transformers 5.24 writes them (Kimi_K25VisionConfig;
// the hub's remote-code spellings init_pos_emb_*, vt_* and projector_ln_eps are read as aliases).
// The JSON functions live in model/config.cpp beside the other config readers.
struct VisionConfig {
  std::string model_type = "kimi_k25_vision";
  int64_t patch_size = 14;
  // The learned position table (square: transformers resamples it with pos_emb_height as the
  // side for both axes) and the number of temporal sinusoid rows (frames per video chunk).
  int64_t pos_emb_height = 64, pos_emb_width = 64, pos_emb_time = 4;
  int64_t num_attention_heads = 16, num_hidden_layers = 27;
  int64_t hidden_size = 1152, intermediate_size = 4304;
  std::string hidden_act = "gelu_pytorch_tanh";    // the only activation of the ViT MLP
  int64_t merge_kernel_h = 2, merge_kernel_w = 2;  // merge_kernel_size [h, w]
  double rope_theta = 10000.0;                     // rope_parameters {rope_type "axial"}
  // The projector's LayerNorm eps: kimi_k25 keeps it in the outer config
  // (projection_layer_norm_eps); ModelConfig reads and writes it there.
  double projection_layer_norm_eps = 1e-5;
  nlohmann::json extra = nlohmann::json::object();  // other keys, written back unchanged
  bool operator==(const VisionConfig&) const = default;

  // `where` prefixes error messages ("config.json: "); fields are named vision_config.<key>.
  static VisionConfig from_json(const nlohmann::json& j, const std::string& where);
  nlohmann::json to_json() const;  // the vision_config object
  // Throws a myriad::Error naming the vision_config field and the conflict.
  void validate() const;
  int64_t patch_values() const { return 3 * patch_size * patch_size; }  // RGB patch vector
  int64_t head_dim() const { return hidden_size / num_attention_heads; }
  int64_t merge_size() const { return merge_kernel_h * merge_kernel_w; }
};

// The Fashion-MNIST tower (MODEL.md §10 `tiny`): patch 4, width 64, 2 layers, 4 heads, MLP 256,
// 2 x 2 merge, an 8 x 8 position table and one temporal row (images only).
VisionConfig tiny_vision();

// An image (or video chunk) as the processor cut it: t frames of h × w patches. h and w are
// multiples of the merge kernel (the processor pads); 1 <= t <= pos_emb_time.
struct Grid {
  int64_t t = 1, h = 0, w = 0;
  bool operator==(const Grid&) const = default;
};

// The text of one image in a prompt (Kimi K2.5's processor, MODEL.md §10):
// <|media_begin|>image<|media_content|>, then merged_tokens × <|media_pad|>, then <|media_end|>;
// template text, so the markers become their special tokens.
std::string image_block(int64_t merged_tokens);

// Merged tokens of one image: the number of <img_pad> placeholders it takes in the text.
int64_t merged_tokens(const VisionConfig& c, const Grid& g);

// Tower and projector parameters in the names transformers 5.24's save_pretrained writes for
// kimi_k25 (vision_tower.encoder.blocks.{i}.wqkv.weight, mm_projector.proj.0.weight,
// model.mm_projector.pre_norm.weight, ...), the hub checkpoints' spellings as aliases; fused
// wqkv and the interleaved-pair RoPE layout of the original checkpoints. The projector ends in
// the decoder width text_hidden.
std::vector<model::ParamSpec> param_specs(const VisionConfig& c, int64_t text_hidden);

struct VisionTrace {
  Tensor tower_out;  // [Σ merged_tokens, kh·kw, hidden]: the merged output, before the projector
};

// pixel_values [Σ t·h·w, 3·p·p] in the processor's patch order (image after image), grids one
// per image -> [Σ merged_tokens, text_hidden]: the embeddings that replace the images'
// placeholders, image after image in raster order.
Tensor encode(const VisionConfig& c, const model::Weights& w, const Tensor& pixel_values,
              const std::vector<Grid>& grids, VisionTrace* trace = nullptr);

}  // namespace myriad::vision
