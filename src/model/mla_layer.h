// The MLA attention sublayer (MODEL.md §3; REFERENCE_NOTES §6). Uncached calls (training, the
// reference forward) run "MHA mode": the latents are expanded per head through kv_b_proj. Cached
// calls (prefill into a cache, continuing segments, decode) append [ĉ ; k^pe] to the latent cache
// and run the absorbed "MQA mode": q^nope is absorbed through W^UK, one attention over the latent
// cache with v = its first r_kv channels, then W^UV. Options: decoupled RoPE with YaRN
// (deepseek_v3 only; kimi_linear is NoPE whatever d_pe), K3's sigmoid output gate.
#pragma once
#include <string>
#include <vector>

#include "model/cache.h"
#include "model/config.h"
#include "model/weights.h"

namespace myriad::model {

// RoPE/YaRN tables (REFERENCE_NOTES §6.2).
struct Rope {
  std::vector<double> inv_freq;   // d_pe / 2
  double attention_factor = 1.0;  // multiplies cos and sin
  double softmax_mscale = 1.0;    // multiplies τ
  bool interleave = true;         // pairs (2i, 2i+1); else (i, i + d_pe/2)
  static Rope from(const ModelConfig& c);
};

class MlaLayer {
 public:
  MlaLayer(const ModelConfig& c, const Weights* w, int64_t layer);
  static void add_specs(const ModelConfig& c, int64_t layer, std::vector<ParamSpec>& out);
  // x [B, T, d] (after the pre-norm) at absolute positions pos0.. -> [B, T, d].
  Tensor forward(const Tensor& x_BTD, MlaState* state = nullptr, int64_t pos0 = 0) const;
  double softmax_scale() const { return tau_; }

 private:
  const Tensor& w(const char* name) const { return w_->get(prefix_ + name); }
  Tensor rotate(const Tensor& x, int64_t pos0) const;  // x [B, T, (H,) d_pe]
  const Weights* w_;
  std::string prefix_;
  int64_t H_, dn_, dr_, dv_, r_;
  bool q_lora_, gate_, rope_on_;
  Rope rope_;
  double tau_;
};

}  // namespace myriad::model
