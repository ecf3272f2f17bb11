// The pretraining loop (TRAINING.md §1-§5; pretraining issue items 2, 5, 6): data and tokenizer
// built on first use, the decoder, Muon/AdamW with the recipe's schedule, gradient accumulation
// over micro-batches, one balancer per MoE layer updating the selection bias in place, the §4
// monitor with skip / rollback, run report and TensorBoard logging, checkpoints (every N steps,
// at the end, on SIGINT/SIGTERM) with exact resume, and the context stages in order.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/decoder.h"
#include "train/monitor.h"
#include "train/recipe.h"

namespace myriad::train {

struct StepRecord {
  int64_t step = 0;  // 1-based optimiser step
  std::string stage;
  double loss = 0, grad_norm = 0, lr = 0;
  double max_violation = 0;  // max over MoE layers of load/maxvio
  Decision decision = Decision::Apply;
};

struct StageResult {
  std::string name;
  int64_t end_step = 0;
  double heldout_loss = 0;
};

class Trainer {
 public:
  // out_dir holds the tokenizer, shards, checkpoints and logs (relative recipe paths).
  Trainer(Recipe recipe, std::string out_dir);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // Trains to the end of the last stage. resume: continue from the newest checkpoint, if any.
  // Returns early (after saving) on SIGINT/SIGTERM or once stop_after() steps are done.
  void run(bool resume = false);

  // Test hook: stop as a stop signal would once `step` steps are done.
  void stop_after(int64_t step);
  // No progress line on stdout.
  void set_quiet(bool quiet);

  const std::vector<StepRecord>& history() const;
  const std::vector<StageResult>& stage_results() const;
  int64_t step() const;
  bool finished() const;
  const model::Decoder& decoder() const;
  const Monitor& monitor() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace myriad::train
