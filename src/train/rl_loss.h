// The arithmetic of agentic RL (TRAINING.md §7.3-§7.6): group advantages with process rewards,
// GAE over trainable tokens, and the policy loss (clipped token ratio with clip-higher and dual
// clip, the GSPO sequence ratio, truncated importance weights, k3 KL, the three aggregations).
// Everything here is plain arithmetic on host vectors, so every pitfall of §7.6 is a unit test.
//
// The policy loss is returned with its gradient with respect to each token's log-prob under the
// policy being trained, dL/dlogp_θ[t]. The trainer then back-propagates Σ_t g_t · logp_θ[t] (with
// g held constant) through the model, which has exactly the gradient of L.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace myriad::train::rl {

// One sample as the loss sees it; all vectors have the sample's token count T.
struct Sample {
  std::vector<uint8_t> mask;   // 1: sampled by the policy (trainable)
  std::vector<int32_t> turn;   // assistant turn index of each mask-1 token (-1 elsewhere)
  std::vector<double> r_turn;  // process reward per assistant turn
  double R = 0;                // terminal reward
  bool truncated = false;
};

struct AdvantageConfig {
  bool std_norm = true;         // divide by the group std (off: Dr. GRPO)
  double lambda_process = 0.5;  // λ_p; 0 turns process rewards off
  double gamma_turn = 1.0;
  double eps = 1e-6;
};

// A per token for every sample of one group (same task), §7.3: outcome part plus λ_p times the
// turn part (turn returns normalised over all (sample, turn) pairs of the group), 0 where
// mask = 0. all_equal is set when every R and every turn reward of the group is equal (the
// advantages are then all exactly 0 and the group should be dropped).
struct GroupAdvantages {
  std::vector<std::vector<double>> A;  // [sample][t]
  bool all_equal = false;
};
GroupAdvantages group_advantages(const std::vector<Sample>& group, const AdvantageConfig& cfg);

// §7.5 GAE over the mask-1 positions u_1 < ... < u_N only. values[t] is read only where
// mask = 1. Process reward of turn k lands on that turn's last mask-1 token, R on u_N; mask-0
// tokens add no δ and no decay step. bootstrap: V(u_{N+1}) (used when the sample was truncated
// under truncation = "bootstrap"; 0 otherwise). Returns advantages (0 where mask = 0) and
// returns = Â + V.
struct Gae {
  std::vector<double> advantages, returns;
};
Gae gae(const Sample& s, const std::vector<double>& values, double gamma, double lambda,
        double bootstrap = 0);

struct LossConfig {
  std::string ratio_level = "token";      // "token" or "sequence" (GSPO)
  double eps_low = 0.2, eps_high = 0.28;  // clip range (GSPO: e.g. 3e-4 / 4e-4)
  double dual_clip = 0;                   // c > 1 enables the dual clip for A < 0; 0: off
  double tis_cap = 0;                     // C > 0 enables truncated importance weights
  std::string tis_mode = "truncate";      // "truncate": w = min(ratio, C); "mask": drop ratio > C
  double kl_beta = 0;                     // k3 KL weight against the reference policy
  std::string loss_agg = "token_mean";    // "token_mean", "constant", "seq_mean"
  int64_t max_len = 0;                    // L_max of "constant" (0: the longest sample's T)
};

// One sample's per-token inputs to the loss.
struct LossInput {
  std::vector<uint8_t> mask;
  std::vector<double> A;              // advantages
  std::vector<double> logp;           // log-prob under the policy being trained (θ)
  std::vector<double> logp_old;       // under the policy that made the rollout batch (θ_old)
  std::vector<double> logp_behavior;  // what the sampler reported (may differ: TIS)
  std::vector<double> logp_ref;       // reference policy (only read when kl_beta > 0)
};

struct LossResult {
  double loss = 0;
  std::vector<std::vector<double>> grad;  // dL/dlogp[t] per sample (0 where mask = 0)
  double clip_fraction = 0;  // share of mask-1 tokens (GSPO: of samples) whose ratio was clipped
  double kl = 0;             // mean k3 over mask-1 tokens
  double tis_mean = 1;       // mean importance weight over mask-1 tokens
  double normaliser = 0;     // N_norm of the aggregation
};
// Throws std::invalid_argument for an unknown mode or mismatched lengths.
LossResult policy_loss(const std::vector<LossInput>& batch, const LossConfig& cfg);

// k3 estimator D = e^x - x - 1 with x = logp_ref - logp clamped to [-10, 10].
double k3(double logp, double logp_ref);

// §7.6 item 14: how a trajectory `staleness` policy versions old is used: 1 (keep), 0 (reject),
// or a down-weight. mode "reject": 0 when staleness > max_staleness; "downweight": 0.5^(staleness
// - max_staleness) past it.
double staleness_weight(int64_t staleness, int64_t max_staleness, const std::string& mode);

}  // namespace myriad::train::rl
