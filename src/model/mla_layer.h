// The MLA attention sublayer (MODEL.md §3; REFERENCE_NOTES §6). Uncached calls (training, the
// reference forward) run "MHA mode": the latents are expanded per head through kv_b_proj. Cached
// calls (prefill into a cache, continuing segments, decode) append [ĉ ; k^pe] to the latent cache
// and run the absorbed "MQA mode": q^nope is absorbed through W^UK, one attention over the latent
// cache with v = its first r_kv channels, then W^UV. Options: decoupled RoPE with YaRN
// (deepseek_v3 only; kimi_linear is NoPE whatever d_pe), K3's sigmoid output gate, and the cache
// admission gate (MODEL.md §12.4): a_t = σ(W2 SiLU(W1 [x_t ; m_{t-1}] + b1) + b2) from the input
// and the prefix mean of earlier normalised latents. Uncached (training) it is the soft rule, a
// key bias log max(a_j, 1e-6) on keys more than W behind the query; cached (inference) it is the
// hard rule: a window of W latents, keys leaving it kept (with the same bias) iff a_j >= tau_adm.
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
  // x [B, T, d] (after the pre-norm) at absolute positions pos0.. -> [B, T, d]. With the
  // admission gate on, `gate_BT` (when given) receives a_t [B, T] (differentiable).
  Tensor forward(const Tensor& x_BTD, MlaState* state = nullptr, int64_t pos0 = 0,
                 Tensor* gate_BT = nullptr) const;
  // Batched decode: x [N, 1, d] holds one token of each of N sequences, row n at absolute
  // position pos[n] with its own state. Projections run over all rows at once; each row attends
  // over its own cache. Gives each row what forward(x[n], states[n], pos[n]) gives.
  Tensor forward_batch(const Tensor& x_N1D, const std::vector<MlaState*>& states,
                       const std::vector<int64_t>& pos, Tensor* gate_N1 = nullptr) const;
  // The admission gate a [B, T] (f32, f64 for f64 inputs) for sublayer input x and normalised
  // latents ĉ; with a state, the prefix mean continues from its running sum, which it extends.
  Tensor admission_gate(const Tensor& x_BTD, const Tensor& c_BTR, MlaState* state) const;
  double softmax_scale() const { return tau_; }

 private:
  const Tensor& w(const char* name) const { return w_->get(prefix_ + name); }
  // x . W^T through project() (int8 where the weights have a copy).
  Tensor lin(const Tensor& x, const char* name) const { return project(x, *w_, prefix_ + name); }
  // x [B, T, (H,) d_pe] at positions pos0 + t, or (row_pos given, T = 1) row b at row_pos[b].
  Tensor rotate(const Tensor& x, int64_t pos0, const std::vector<int64_t>& row_pos = {}) const;
  Tensor forward_impl(const Tensor& x_BTD, const std::vector<MlaState*>& states,
                      const std::vector<int64_t>& pos, Tensor* gate_BT) const;
  // Absorbed attention of queries qa [B, H, T, r + dr] over the state's cache extended by the
  // new latents lat [B, T, r + dr] (which it then holds) -> [B, H, T, r].
  Tensor cached_attention(const Tensor& qa, const Tensor& lat, const Tensor& a_BT,
                          MlaState& st) const;
  // The absorbed attention over the admission cache (hard rule), which it then updates.
  Tensor admitted_attention(const Tensor& qa, const Tensor& lat_BTC, const Tensor& gate_BT,
                            MlaState& st) const;
  const Weights* w_;
  std::string prefix_;
  int64_t H_, dn_, dr_, dv_, r_;
  bool q_lora_, gate_, rope_on_, adm_, adm_stopgrad_;
  int64_t window_;
  double tau_adm_;
  Rope rope_;
  std::vector<std::string> x_projs_;  // q_a_proj or q_proj, kv_a_proj_with_mqa [, g_proj]
  std::vector<int64_t> x_cols_;       // their output widths
  double tau_;
};

}  // namespace myriad::model
