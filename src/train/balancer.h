// Expert balancers (TRAINING.md §3, MODEL.md §12.3). Each MoE layer owns one Balancer: it
// accumulates the routing of every micro-batch of an optimiser step (observe), then update()
// writes the next step's selection bias b in place (causality: b^(t+1) is used from step t+1 on)
// and resets the accumulators. Modes:
//   quantile       Quantile Balancing with the histogram estimator (§3.2, B bins, EMA ω);
//                  set_exact(true) keeps every margin and takes the exact ⌈q⌉-th smallest (tests);
//   quantile_band  b_j -= η clip(v_j, ±v_max) outside [ρ_lo q, ρ_hi q], optional recentre;
//   sign           b_j += γ_b sign(q − c_j) until freeze_after updates;
//   aux_loss       b ≡ 0, aux_loss() = α n Σ_j f_j P_j (differentiable in the scores);
//   none           b ≡ 0.
// The mixture weights never see b (MODEL.md §6); only the selection does.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <vector>

#include "core/tensor.h"
#include "dist/comm.h"
#include "model/config.h"

namespace myriad::train {

using BalancerConfig = model::MyriadOptions::Balancer;

class Balancer {
 public:
  Balancer(BalancerConfig c, int64_t n_experts, int64_t top_k);

  // One micro-batch: scores [N, n] (sigmoid, fp32 or any float), selected [N, k] (integer).
  // `bias` is the b these tokens were routed with (default: the one the last update() wrote,
  // initially 0); quantile mode needs it for the cut-offs α_i and the histogram range.
  void observe(const Tensor& scores_Nn, const Tensor& selected_Nk, const Tensor& bias = {});
  // Applies the mode's rule for the step to bias [n] (f32, in place) and resets the accumulators.
  void update(Tensor& bias);
  // aux_loss mode: α n Σ_j f_j P_j, f_j = c_j/(m k) from `selected` (no gradient), P_j the mean
  // normalised score. seq_len > 0 with aux_scope = "sequence" averages the loss per sequence of
  // seq_len consecutive tokens.
  Tensor aux_loss(const Tensor& scores_Nn, const Tensor& selected_Nk, int64_t seq_len = 0) const;

  // Everything carried between calls (last bias, update count, histogram range, accumulators),
  // exact through JSON, for checkpoints: a resumed run makes the same decisions.
  nlohmann::json state() const;
  void load_state(const nlohmann::json& j);

  // Data parallel: sums the step's accumulators (counts, tokens, the §3.2 histogram) over the
  // ranks, so update() decides on the global batch (one all-reduce). The histogram range depends
  // only on the bias, which every rank shares: a rank that saw no tokens this step (fewer
  // micro-batches than ranks) takes it from `bias`, as observe() would have. Not for
  // set_exact(true).
  void all_reduce(dist::Comm& c, const Tensor& bias);

  void set_exact(bool on) { exact_ = on; }
  // Accumulated since the last update: per-expert counts and tokens m.
  const std::vector<int64_t>& counts() const { return counts_; }
  int64_t tokens() const { return m_; }
  int64_t updates() const { return updates_; }
  double bin_width() const { return w_; }  // w of the last histogram update
  const BalancerConfig& config() const { return c_; }

 private:
  void quantile_update(std::vector<double>& b);
  void set_range(const std::vector<double>& b);
  BalancerConfig c_;
  int64_t n_, k_, m_ = 0, updates_ = 0;
  bool exact_ = false;
  std::vector<double> b_;  // the bias of the last update (observe's default)
  std::vector<int64_t> counts_;
  double lo_ = 0, w_ = 0;                 // histogram range start b_min − 1 and bin width
  std::vector<int32_t> hist_;             // [n, B] margin counts
  std::vector<std::vector<float>> marg_;  // exact mode: every margin per expert
};

// §3.3 exact alternating variant for one batch of scores [m, n]: T sweeps of
// α_i = cut between the k-th and (k+1)-th largest_j (s_ij − β_j), β_j = cut between the ⌈q⌉-th
// and (⌈q⌉+1)-th largest_i (s_ij − α_i); returns b = −β, mean-centred, f64 [n]. Cuts are the
// midpoints of the two order statistics: §3.3's literal (k+1)-th / (⌈q⌉+1)-th values put every
// boundary exactly on a score, and the sweep then stalls in ties (loads 59..67 for q = 64 even
// after 1000 sweeps); with midpoints it reaches q exactly (q ± 1 by ~20 sweeps).
Tensor qb_exact(const Tensor& scores_Nn, int64_t k, int64_t iters = 20);

// Per-expert token counts of a selection [N, k] over n experts.
std::vector<int64_t> expert_counts(const Tensor& selected_Nk, int64_t n);
// Top-k of s + b per row (ties to the lower index), as i64 [N, k]; the selection rule of §3.1.
Tensor route_topk(const Tensor& scores_Nn, const Tensor& bias_n, int64_t k);

}  // namespace myriad::train
