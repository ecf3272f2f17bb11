// Agentic RL post-training (TRAINING.md §7, post-training issue item 4): rollout and update
// alternate in one process. Each step draws tasks_per_step training tasks, samples group_size
// episodes of each through infer::Engine (which reads the very weights the optimiser updates, so
// every rollout comes from the policy just updated), scores them, forms group advantages
// (outcome + λ_p · process), drops all-equal groups (dynamic sampling refills the batch), and
// takes `minibatches` optimiser steps on the clipped policy loss of rl_loss.h. Held-out pass@1 /
// pass@k with 95% intervals every eval.every steps; TensorBoard, metrics.jsonl, report.html,
// rollouts/*.jsonl (every trajectory record) and trajectories.html (a few rendered episodes);
// checkpoints with exact resume.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "agent/rollout.h"
#include "agent/trajectory.h"
#include "infer/engine.h"
#include "model/decoder.h"
#include "train/optim.h"
#include "train/rl_loss.h"

namespace myriad::train {

struct RlRecipe {
  std::string text;  // the TOML source, stored in checkpoints
  std::string init;  // [model] init: the model directory to start from (an SFT run's model/)
  uint64_t seed = 0;

  // [task]
  std::vector<std::string> envs;  // tasks cycle through these environments
  int64_t tasks_per_step = 16, group_size = 8;
  double temperature = 1.0;
  agent::EpisodeLimits limits;

  rl::AdvantageConfig advantage;
  // "group": critic-free group advantages (§7.3); "gae": PPO + GAE (§7.5) with a value head,
  // Linear(d -> 1) on the final hidden state (not back-propagated into the trunk), trained at
  // value_lr_scale x the actor's rate with the value clip; advantages whitened over the batch.
  std::string estimator = "group";
  double gae_gamma = 1.0, gae_lambda = 0.95, value_lr_scale = 10, value_clip = 0.5;
  rl::LossConfig loss;
  std::string truncation = "mask";  // "mask": out of the loss; "penalty": R = truncation_reward
  double truncation_reward = 0;
  int64_t max_staleness = 4;
  std::string staleness_mode = "reject";  // or "downweight"

  OptimConfig optimizer;  // matrix_optimizer defaults to adamw here
  // [train]
  int64_t steps = 20;
  int64_t minibatches = 1;  // optimiser steps per rollout batch (1: on-policy, ρ ≡ 1)
  bool dynamic_sampling = true;
  int64_t max_sampling_rounds = 3;
  int64_t micro_batch = 32;   // trajectories per forward in the update
  int64_t engine_batch = 64;  // sequences the engine decodes together
  // > 0: trajectories longer than this are updated segment by segment, carrying the KDA state and
  // MLA latents (exact gradients, as the curriculum's segments); recompute: activation
  // recomputation. Long agent trajectories then fit in memory.
  int64_t segment_len = 0;
  bool recompute = false;

  // [eval]
  int64_t eval_every = 10, eval_tasks = 200, eval_k = 8;
  std::string eval_split = "heldout";  // or "train" (tasks the run may have trained on)
  // [checkpoint], [log]
  std::string checkpoint_dir = "checkpoints";
  int64_t checkpoint_every = 10;
  int keep_last = 2;
  bool log_jsonl = true, log_tensorboard = true, log_html = true;

  static RlRecipe parse(std::string_view toml_text, std::string_view source = "recipe");
  static RlRecipe load(const std::string& path);
};

// Held-out evaluation: `tasks` held-out tasks of env (train_split: training tasks, seeds 0, 1,
// ...), k samples each at `temperature`.
struct AgentEval {
  std::string env;
  int64_t tasks = 0, k = 0;
  double pass1 = 0, pass1_ci = 0;  // mean of per-task c/k; ± half-width of the 95% interval
  double passk = 0, passk_lo = 0, passk_hi = 0;        // any of k solved; 95% Wilson interval
  double greedy = -1;                                  // greedy pass@1 when measured (else -1)
  std::vector<int> greedy_solved;                      // per task, when measured
  std::vector<std::vector<std::string>> greedy_texts;  // per task: assistant messages (greedy)
  double mean_reward = 0, tool_call_rate = 0, tool_error_rate = 0, mean_turns = 0;
  double response_tokens = 0, truncated = 0;
  nlohmann::json to_json() const;
};
AgentEval evaluate_agent(infer::Engine& engine, const data::Tokenizer& tok,
                         const serve::ChatTemplate& tmpl, const std::string& env, int64_t tasks,
                         int64_t k, double temperature, const agent::EpisodeLimits& limits,
                         uint64_t seed, bool greedy = true,
                         std::vector<agent::Trajectory>* samples = nullptr,
                         bool train_split = false);

struct RlStepRecord {
  int64_t step = 0;
  double mean_reward = 0, solved = 0, loss = 0, grad_norm = 0, clip_fraction = 0, kl = 0;
  int64_t groups_kept = 0, groups_dropped = 0;
  uint64_t weights_hash = 0;  // FNV-1a of every parameter's bytes after the step
};

class RlTrainer {
 public:
  RlTrainer(RlRecipe recipe, std::string out_dir);
  ~RlTrainer();
  RlTrainer(const RlTrainer&) = delete;
  RlTrainer& operator=(const RlTrainer&) = delete;
  // Runs to recipe.steps (resume: from the newest checkpoint). Returns early after saving on
  // SIGINT / SIGTERM.
  void run(bool resume = false);
  void set_quiet(bool quiet);
  // Test hook: stop (saving a checkpoint) once `step` steps are done, as a signal would.
  void stop_after(int64_t step);
  const std::vector<RlStepRecord>& history() const;
  const std::vector<AgentEval>& evals() const;
  const model::Decoder& decoder() const;
  bool finished() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The log-prob of every token of each trajectory under `dec` (index 0 gets NaN), one no-grad
// forward per micro-batch of padded trajectories.
// hidden (optional): each trajectory's final normed hidden states, [T * d] row-major.
std::vector<std::vector<double>> token_logprobs(const model::Decoder& dec,
                                                const std::vector<agent::Trajectory>& batch,
                                                int64_t micro_batch,
                                                std::vector<double>* entropy = nullptr,
                                                std::vector<std::vector<float>>* hidden = nullptr);

// Back-propagates Σ_t grad[i][t] · logp_θ(token t of trajectory i) (scaled by weight) into the
// parameters' gradients, which then equal weight · dL/dθ for the loss whose per-token log-prob
// gradient is `grad` (rl::policy_loss). With c = -g it is S+ · wmean(CE; c+) - S- · wmean(CE; c-):
// weighted cross-entropies, so mask-0 positions (g = 0) weigh exactly 0. segment_len > 0 runs
// each micro-batch as segments carrying the decode state (Trainer::sequence_loss).
void policy_backward(const model::Decoder& dec, const std::vector<agent::Trajectory>& batch,
                     const std::vector<std::vector<double>>& grad, double weight,
                     int64_t micro_batch, int64_t segment_len = 0, bool recompute = false);

}  // namespace myriad::train
