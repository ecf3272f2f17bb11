// A name -> Tensor store for one model, in checkpoint layout and spelling (MODEL.md §11.2).
// The model lists what it expects as ParamSpecs; loading checks a checkpoint against that list:
// a missing, extra or misshaped tensor raises an error naming it. Modules then read tensors by
// their canonical name.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/tensor.h"
#include "ops/quant.h"

namespace myriad::model {

// How a fresh (untrained) parameter starts (MODEL.md §3.1, §4.1, §7; Const: §12.1, §12.4).
enum class Init : uint8_t { Normal, Zeros, Ones, ALog, DtBias, Const };

// A slice of a fused checkpoint tensor that can stand for a spec'd one: t[index, begin:end] (the
// whole second dimension when end <= begin), e.g. expert j's w1 = gate_up_proj[j, :I].
struct FusedSource {
  std::string name;
  int64_t index = 0, begin = 0, end = 0;
};

struct ParamSpec {
  std::string name;  // canonical checkpoint name
  Shape shape;
  Init init = Init::Normal;
  bool trainable = true;             // false for buffers (e_score_correction_bias)
  std::vector<std::string> aliases;  // other accepted checkpoint spellings
  std::vector<FusedSource> fused;    // fused layouts it may be read from (MODEL.md §11.2)
  double value = 0.0;                // the fill of Init::Const
  std::string save_as{};             // the name save() writes (also read); empty: name
  // Another stored shape of the same element count, also read: K3's release stores A_log as [H]
  // where Kimi Linear has [1, 1, H, 1]. save() writes it when save_stored_shape is set.
  Shape stored_shape{};
  bool save_stored_shape = false;
};

class Weights {
 public:
  Weights() = default;
  // Reads every spec'd tensor from a checkpoint (a directory, a .safetensors file or an index),
  // converted to `dtype`. Missing, extra and misshaped tensors raise errors naming them.
  static Weights load(const std::string& path, const std::vector<ParamSpec>& specs,
                      DType dtype = DType::F32);
  // Fresh parameters: Normal ~ N(0, std^2), the rest per Init; deterministic for a seed.
  static Weights init(const std::vector<ParamSpec>& specs, uint64_t seed, double std = 0.02,
                      DType dtype = DType::F32);
  // A store from tensors already in hand (an export): exactly the spec'd names and shapes.
  static Weights from(const std::vector<ParamSpec>& specs, std::map<std::string, Tensor> tensors);

  bool contains(const std::string& name) const { return tensors_.count(name) != 0; }
  // The tensor, or an error naming it.
  const Tensor& get(const std::string& name) const;
  void set(const std::string& name, const Tensor& t);
  // Every tensor by name, in name order (handles to the store's tensors, not copies).
  std::map<std::string, Tensor> tensors() const;
  const std::vector<ParamSpec>& specs() const { return specs_; }
  // The canonical name a checkpoint spelling maps to (itself when it is canonical).
  std::string canonical(const std::string& name) const;

  // Marks every trainable tensor as a leaf that wants a gradient (or not), clearing old grads.
  void requires_grad_(bool on = true);
  // Tensors of a checkpoint that no spec claims but that load() let pass: a multimodal release's
  // vision_tower.* / mm_projector.* when the config has no vision tower (the text model runs),
  // and DeepSeek-V3's multi-token-prediction layers (a model.layers.{i}. holding eh_proj).
  const std::vector<std::string>& skipped() const { return skipped_; }
  // A copy (new storage) of every tensor in another dtype.
  Weights to(DType dtype) const;
  // Every tensor on `device` (cuda(0), say): copies, except tensors already there, which are
  // shared; quantized copies (quantize()) move with them.
  Weights to(Device device) const;
  // Writes the store in checkpoint layout to `path` (a .safetensors file).
  void save(const std::string& path) const;

  // Inference with weight-only int8 or int4 (ops/quant.h, bits 8 or 4; act_bits 8 with int8:
  // int8 activations in decode's products too): a quantized copy of each named [out, in] weight,
  // which project() then uses. The f32/bf16 tensors stay: training, export and the ops that read a
  // weight directly (MLA's absorbed decode) use them.
  void quantize(const std::vector<std::string>& names, int bits, int act_bits = 0);
  const ops::QuantWeight* quant(const std::string& name) const;  // nullptr: none
  int64_t quant_bytes() const;                                   // codes + scales of all copies

 private:
  // Hashed: get() and quant() run for every projection of every step, and the names share long
  // prefixes ("model.layers.12.mlp.experts.3."), which an ordered map compares at every node.
  std::unordered_map<std::string, Tensor> tensors_;
  std::vector<ParamSpec> specs_;
  std::vector<std::string> skipped_;
  std::unordered_map<std::string, ops::QuantWeight> quant_;
};

// x [..., in] . W^T for the [out, in] weight `name` (nn.Linear without bias), through its
// quantized copy when quantize() made one.
Tensor project(const Tensor& x, const Weights& w, const std::string& name);
// Several projections of one x side by side ([..., sum of outs], names[0]'s columns first), in
// one product where they are all quantized or none is (ops::linear_cat, ops::linear_quant_cat).
Tensor project_cat(const Tensor& x, const Weights& w, const std::vector<std::string>& names);
// grouped_linear over the named weights (a MoE's experts), quantized when every one has a copy.
Tensor project_grouped(const Tensor& x, const std::vector<int64_t>& offsets, const Weights& w,
                       const std::vector<std::string>& names);
// Several of those side by side (names[s][g]: set s, group g; set 0's columns first), in one
// ops::grouped_linear_cat, or one quantized grouped product per set and a concat when every
// weight has a quantized copy.
Tensor project_grouped_cat(const Tensor& x, const std::vector<int64_t>& offsets, const Weights& w,
                           const std::vector<std::vector<std::string>>& names);

// "model.layers.{i}." (0-based i).
inline std::string layer_prefix(int64_t i) {
  return "model.layers." + std::to_string(i) + ".";
}

}  // namespace myriad::model
