// The MoonViT tower and projector as transformers' kimi_k25 computes them (MODEL.md §10;
// docs/REFERENCE_NOTES.md "kimi_k25 vision" has the steps), from differentiable ops only.
#include "vision/tower.h"

#include <algorithm>
#include <cmath>
#include <span>

#include "core/error.h"
#include "ops/attention.h"
#include "ops/elementwise.h"
#include "ops/gelu.h"
#include "ops/layer_norm.h"
#include "ops/matmul.h"
#include "ops/reduce.h"
#include "ops/shape.h"

namespace myriad::vision {

using model::Init;
using model::ParamSpec;

namespace {

// Checkpoint names (transformers 5.24 save_pretrained spelling; the hub's as aliases).
const std::string kPatchW = "vision_tower.encoder.patch_embed.proj.weight";
const std::string kPatchB = "vision_tower.encoder.patch_embed.proj.bias";
const std::string kPosTable = "vision_tower.patch_embed.pos_emb.weight";
const std::string kFinalNorm = "vision_tower.encoder.final_layernorm.";
const std::string kPreNorm = "model.mm_projector.pre_norm.";
const std::string kProj0 = "mm_projector.proj.0.", kProj2 = "mm_projector.proj.2.";
std::string block(int64_t i) {
  return "vision_tower.encoder.blocks." + std::to_string(i) + ".";
}

// The ViT's LayerNorms (norm0, norm1, final_layernorm) are nn.LayerNorm(eps=1e-5).
constexpr double kTowerLnEps = 1e-5;

Tensor constant(std::span<const double> v, const Shape& shape, const Tensor& like) {
  return Tensor::from_doubles(v, shape, like.dtype(), like.device());
}

// F.interpolate(mode="bicubic", align_corners=False) along one axis as a [size, side] matrix:
// output i reads source coordinate s = (i + 0.5)·side/size - 0.5 through taps floor(s)-1 ..
// floor(s)+2, clamped to the border, with Keys' cubic weights (a = -0.75). transformers'
// get_vision_interpolation_indices_and_weights gathers the same taps; size == side gives the
// identity.
std::vector<double> bicubic_matrix(int64_t size, int64_t side) {
  std::vector<double> m(size * side, 0.0);
  const double a = -0.75;
  for (int64_t i = 0; i < size; ++i) {
    const double s = (i + 0.5) * static_cast<double>(side) / static_cast<double>(size) - 0.5;
    const double fl = std::floor(s);
    for (int64_t off = -1; off <= 2; ++off) {
      const double d = std::abs(s - (fl + off));
      const double wt =
          d <= 1 ? ((a + 2) * d - (a + 3)) * d * d + 1 : ((a * d - 5 * a) * d + 8 * a) * d - 4 * a;
      const int64_t tap = std::clamp<int64_t>(static_cast<int64_t>(fl) + off, 0, side - 1);
      m[i * side + tap] += wt;
    }
  }
  return m;
}

// The additive position embedding of one image [t·h·w, D]: the S × S table resampled to h × w
// (separably: rows, then columns; skipped when the grid is the table), repeated per frame, plus
// for a multi-frame chunk the sinusoid of frame f: [sin(f·ω_k), cos(f·ω_k)], ω_k = 10000^(-2k/D)
// for k < D/2 (a single frame adds nothing: row 0 of transformers' temporal table is zero).
Tensor position_embedding(const VisionConfig& c, const Tensor& table, const Grid& g) {
  const int64_t S = c.pos_emb_height, D = c.hidden_size;
  Tensor pos = ops::reshape(table, {S * S, D});
  if (g.h != S || g.w != S) {
    const Tensor rh = constant(bicubic_matrix(g.h, S), {g.h, S}, table);
    const Tensor rw = constant(bicubic_matrix(g.w, S), {g.w, S}, table);
    const Tensor rows = ops::reshape(ops::matmul(rh, ops::reshape(table, {S, S * D})), {g.h, S, D});
    pos = ops::reshape(ops::matmul(rw, rows), {g.h * g.w, D});  // [h, w, D] by batched matmul
  }
  if (g.t == 1) return pos;
  std::vector<double> sincos(g.t * D);
  for (int64_t f = 0; f < g.t; ++f)
    for (int64_t k = 0; k < D / 2; ++k) {
      const double ang = f * std::pow(10000.0, -2.0 * k / D);
      sincos[f * D + k] = std::sin(ang);
      sincos[f * D + D / 2 + k] = std::cos(ang);
    }
  const Tensor time = constant(sincos, {g.t, 1, D}, table);
  return ops::reshape(ops::add(ops::unsqueeze(pos, 0), time), {g.t * g.h * g.w, D});
}

// Axial 2D RoPE angles [N, 1, hd/2, 1] (cos, sin) over the packed patches. In the checkpoint's
// layout (the original MoonViT; transformers permutes q/k rows on load to rotate halves instead),
// pair j = (2j, 2j+1) of each head turns by col·ω_{j/2} for even j and row·ω_{j/2} for odd j,
// ω_k = rope_theta^(-4k/hd), k < hd/4; row and col restart in every image and repeat per frame.
std::pair<Tensor, Tensor> rope_tables(const VisionConfig& c, const std::vector<Grid>& grids,
                                      int64_t n, const Tensor& like) {
  const int64_t half = c.head_dim() / 2;
  std::vector<double> cos(n * half), sin(n * half);
  int64_t at = 0;
  for (const Grid& g : grids)
    for (int64_t f = 0; f < g.t; ++f)
      for (int64_t r = 0; r < g.h; ++r)
        for (int64_t col = 0; col < g.w; ++col, ++at)
          for (int64_t j = 0; j < half; ++j) {
            const double w = std::pow(c.rope_theta, -4.0 * (j / 2) / c.head_dim());
            const double ang = (j % 2 == 0 ? col : r) * w;
            cos[at * half + j] = std::cos(ang);
            sin[at * half + j] = std::sin(ang);
          }
  return {constant(cos, {n, 1, half, 1}, like), constant(sin, {n, 1, half, 1}, like)};
}

// x [N, H, hd] -> each pair (a, b) = (x[2j], x[2j+1]) becomes (a·cos - b·sin, a·sin + b·cos).
Tensor rotate_pairs(const Tensor& x, const Tensor& cos, const Tensor& sin) {
  const int64_t n = x.size(0), heads = x.size(1), hd = x.size(2);
  const Tensor p = ops::reshape(x, {n, heads, hd / 2, 2});
  const Tensor a = ops::slice(p, 3, 0, 1), b = ops::slice(p, 3, 1, 2);
  const Tensor ra = ops::sub(ops::mul(a, cos), ops::mul(b, sin));
  const Tensor rb = ops::add(ops::mul(a, sin), ops::mul(b, cos));
  return ops::reshape(ops::concat({ra, rb}, 3), {n, heads, hd});
}

// Bidirectional attention inside each image (chunk), so packed images never see each other:
// one flash call per run of consecutive images of one length, batched over the run (no mask).
// q, k, v [N, H, hd] -> [N, H·hd].
Tensor attention_per_image(const Tensor& q, const Tensor& k, const Tensor& v,
                           const std::vector<int64_t>& starts, double scale) {
  const int64_t heads = q.size(1), hd = q.size(2);
  std::vector<Tensor> outs;
  for (size_t i = 0, j = 0; i + 1 < starts.size(); i = j) {
    const int64_t len = starts[i + 1] - starts[i];
    for (j = i + 1; j + 1 < starts.size() && starts[j + 1] - starts[j] == len;) ++j;
    const int64_t b = static_cast<int64_t>(j - i), s0 = starts[i], s1 = starts[j];
    auto batched = [&](const Tensor& t) {  // [b·len, H, hd] -> [b, H, len, hd]
      return ops::permute(ops::reshape(ops::slice(t, 0, s0, s1), {b, len, heads, hd}),
                          {0, 2, 1, 3});
    };
    const Tensor o = ops::attention(batched(q), batched(k), batched(v), scale, /*causal=*/false);
    outs.push_back(ops::reshape(ops::permute(o, {0, 2, 1, 3}), {s1 - s0, heads * hd}));
  }
  return outs.size() == 1 ? outs[0] : ops::concat(outs, 0);
}

// The merge (transformers' temporal_merge): patch (f, r, c) of an image goes to merged token
// (r / kh)·(w / kw) + c / kw, slot (r % kh)·kw + c % kw, averaged over the frames f.
// x [t·h·w, D] -> [(h/kh)·(w/kw), kh·kw, D].
Tensor merge(const VisionConfig& c, const Tensor& x, const Grid& g) {
  const int64_t kh = c.merge_kernel_h, kw = c.merge_kernel_w, D = c.hidden_size;
  const int64_t m = merged_tokens(c, g);
  Tensor y = ops::reshape(x, {g.t, g.h / kh, kh, g.w / kw, kw, D});
  y = ops::reshape(ops::permute(y, {1, 3, 0, 2, 4, 5}), {m, g.t, kh * kw, D});
  return g.t == 1 ? ops::squeeze(y, 1) : ops::mean(y, {1});
}

}  // namespace

VisionConfig tiny_vision() {
  VisionConfig c;
  c.patch_size = 4;
  c.pos_emb_height = c.pos_emb_width = 8;
  c.pos_emb_time = 1;
  c.num_attention_heads = 4;
  c.num_hidden_layers = 2;
  c.hidden_size = 64;
  c.intermediate_size = 256;
  return c;
}

int64_t merged_tokens(const VisionConfig& c, const Grid& g) {
  return (g.h / c.merge_kernel_h) * (g.w / c.merge_kernel_w);
}

std::vector<ParamSpec> param_specs(const VisionConfig& c, int64_t text_hidden) {
  const int64_t D = c.hidden_size, M = D * c.merge_size();
  std::vector<ParamSpec> out;
  auto add = [&](const std::string& name, Shape shape, Init init,
                 std::vector<std::string> aliases = {}) {
    out.push_back({name, std::move(shape), init, true, std::move(aliases), {}});
  };
  auto norm = [&](const std::string& p, int64_t n, const std::string& hub = "") {
    for (auto [leaf, init] : {std::pair{"weight", Init::Ones}, std::pair{"bias", Init::Zeros}})
      add(p + leaf, {n}, init, hub.empty() ? std::vector<std::string>{} : std::vector{hub + leaf});
  };
  auto linear = [&](const std::string& p, int64_t n_out, int64_t n_in) {
    add(p + "weight", {n_out, n_in}, Init::Normal);
    add(p + "bias", {n_out}, Init::Zeros);
  };
  add(kPatchW, {D, 3, c.patch_size, c.patch_size}, Init::Normal,
      {"vision_tower.patch_embed.proj.weight"});
  add(kPatchB, {D}, Init::Zeros, {"vision_tower.patch_embed.proj.bias"});
  add(kPosTable, {c.pos_emb_height, c.pos_emb_width, D}, Init::Normal);
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string b = block(i);
    norm(b + "norm0.", D);
    linear(b + "wqkv.", 3 * D, D);
    linear(b + "wo.", D, D);
    norm(b + "norm1.", D);
    linear(b + "mlp.fc0.", c.intermediate_size, D);
    linear(b + "mlp.fc1.", D, c.intermediate_size);
  }
  norm(kFinalNorm, D);
  norm(kPreNorm, D, "mm_projector.pre_norm.");
  linear(kProj0, M, M);
  linear(kProj2, text_hidden, M);
  return out;
}

Tensor encode(const VisionConfig& c, const model::Weights& w, const Tensor& pixel_values,
              const std::vector<Grid>& grids, VisionTrace* trace) {
  c.validate();
  const int64_t D = c.hidden_size, H = c.num_attention_heads, hd = c.head_dim();
  MYRIAD_CHECK(pixel_values.dim() == 2 && pixel_values.size(1) == c.patch_values(),
               "vision::encode: pixel_values must be [patches, 3·", c.patch_size, "·", c.patch_size,
               " = ", c.patch_values(), "], got ", pixel_values.desc());
  MYRIAD_CHECK(!grids.empty(), "vision::encode: no image grids");
  std::vector<int64_t> starts = {0};  // patch offset of each image, then the total
  for (size_t i = 0; i < grids.size(); ++i) {
    const Grid& g = grids[i];
    MYRIAD_CHECK(g.t >= 1 && g.t <= c.pos_emb_time, "vision::encode: image ", i, " has t = ", g.t,
                 " frames; 1..vision_config.pos_emb_time = ", c.pos_emb_time, " are supported");
    MYRIAD_CHECK(g.h >= 1 && g.w >= 1 && g.h % c.merge_kernel_h == 0 && g.w % c.merge_kernel_w == 0,
                 "vision::encode: image ", i, " has a grid of ", g.h, " x ", g.w,
                 " patches, not a positive multiple of the ", c.merge_kernel_h, " x ",
                 c.merge_kernel_w, " merge kernel (the processor pads images to one)");
    starts.push_back(starts.back() + g.t * g.h * g.w);
  }
  const int64_t n = starts.back();
  MYRIAD_CHECK(pixel_values.size(0) == n, "vision::encode: the grids hold ", n,
               " patches, but pixel_values has ", pixel_values.size(0), " rows");
  auto W = [&](const std::string& name) -> const Tensor& { return w.get(name); };

  // 1. Patch embedding: the stride-p conv is a linear map of the flattened (c, y, x) patch.
  Tensor x = ops::linear(pixel_values, ops::reshape(W(kPatchW), {D, c.patch_values()}), W(kPatchB));
  // 2. Position embeddings, image after image.
  std::vector<Tensor> pos;
  for (const Grid& g : grids) pos.push_back(position_embedding(c, W(kPosTable), g));
  x = ops::add(x, pos.size() == 1 ? pos[0] : ops::concat(pos, 0));
  // 3. Pre-norm ViT blocks: x += Wo·attn(RoPE(q), RoPE(k), v); x += fc1(gelu_tanh(fc0(LN(x)))).
  const auto [cos, sin] = rope_tables(c, grids, n, x);
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string b = block(i);
    const Tensor h = ops::layer_norm(x, W(b + "norm0.weight"), W(b + "norm0.bias"), kTowerLnEps);
    const Tensor qkv = ops::linear(h, W(b + "wqkv.weight"), W(b + "wqkv.bias"));  // q | k | v
    auto part = [&](int64_t j) {
      return ops::reshape(ops::slice(qkv, 1, j * D, (j + 1) * D), {n, H, hd});
    };
    const Tensor att = attention_per_image(rotate_pairs(part(0), cos, sin),
                                           rotate_pairs(part(1), cos, sin), part(2), starts, scale);
    x = ops::add(x, ops::linear(att, W(b + "wo.weight"), W(b + "wo.bias")));
    const Tensor h2 = ops::layer_norm(x, W(b + "norm1.weight"), W(b + "norm1.bias"), kTowerLnEps);
    const Tensor f =
        ops::gelu_tanh(ops::linear(h2, W(b + "mlp.fc0.weight"), W(b + "mlp.fc0.bias")));
    x = ops::add(x, ops::linear(f, W(b + "mlp.fc1.weight"), W(b + "mlp.fc1.bias")));
  }
  x = ops::layer_norm(x, W(kFinalNorm + "weight"), W(kFinalNorm + "bias"), kTowerLnEps);
  // 4. Merge each kh × kw window into one token (frames averaged).
  std::vector<Tensor> merged;
  for (size_t i = 0; i < grids.size(); ++i)
    merged.push_back(merge(c, ops::slice(x, 0, starts[i], starts[i + 1]), grids[i]));
  const Tensor tower = merged.size() == 1 ? merged[0] : ops::concat(merged, 0);
  if (trace) trace->tower_out = tower;
  // 5. Projector: LayerNorm per patch, then the MLP over the concatenated window.
  Tensor y = ops::layer_norm(tower, W(kPreNorm + "weight"), W(kPreNorm + "bias"),
                             c.projection_layer_norm_eps);
  y = ops::reshape(y, {tower.size(0), c.merge_size() * D});
  y = ops::gelu(ops::linear(y, W(kProj0 + "weight"), W(kProj0 + "bias")));
  return ops::linear(y, W(kProj2 + "weight"), W(kProj2 + "bias"));
}

std::string image_block(int64_t merged) {
  std::string s = "<|media_begin|>image<|media_content|>";
  for (int64_t i = 0; i < merged; ++i) s += "<|media_pad|>";
  s += "<|media_end|>";
  return s;
}

}  // namespace myriad::vision
