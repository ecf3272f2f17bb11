// The pretraining loop (TRAINING.md §1-§5; pretraining issue items 2, 5, 6): data and tokenizer
// built on first use, the decoder, Muon/AdamW with the recipe's schedule, gradient accumulation
// over micro-batches, one balancer per MoE layer updating the selection bias in place, the §4
// monitor with skip / rollback, run report and TensorBoard logging, checkpoints (every N steps,
// at the end, on SIGINT/SIGTERM) with exact resume (weights, optimiser, data cursor, monitor,
// balancer and stage-end evaluator state), and the context stages in order, each ending with a
// held-out loss and, with [eval], the §6 grids and the §5.4 gate (StageEvaluator). precision =
// "bf16" runs forward/backward on a bf16 working copy with fp32 master weights (Bf16Copy); balancer
// mode aux_loss adds each MoE layer's α n Σ f_j P_j on the router's live scores to the loss (logged
// as loss/aux).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "data/tokenizer.h"
#include "dist/comm.h"
#include "model/decoder.h"
#include "train/evals.h"
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

class RunReport;

// What a stage-end hook sees (e.g. the §6 evaluation grid for the stage's length).
struct StageEnd {
  size_t index = 0;
  std::string name;
  int64_t seq_len = 0, step = 0;
  const model::Decoder& decoder;
  const data::Tokenizer& tokenizer;
  RunReport* report = nullptr;  // null when [log] jsonl and html are off
  double heldout_loss = 0;
  const StageOutcome* outcome = nullptr;  // the [eval] grids and gate; null without [eval]
};

class Trainer {
 public:
  // out_dir holds the tokenizer, shards, checkpoints and logs (relative recipe paths). comm: the
  // ranks to train over (null: dist::world(), every rank mpirun started). Every rank must use the
  // same recipe and out_dir (a shared folder); rank 0 writes the files, logs and prints.
  Trainer(Recipe recipe, std::string out_dir, dist::Comm* comm = nullptr);
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
  // What this rank's collectives moved over the steps this process ran, by name (all groups:
  // data, context and expert parallel).
  const std::map<std::string, dist::CollectiveStats>& collective_totals() const;
  const std::vector<StageResult>& stage_results() const;
  int64_t step() const;
  bool finished() const;
  const model::Decoder& decoder() const;
  const Monitor& monitor() const;
  // [eval]: every ended stage's grids and gate (restored on resume); empty without [eval].
  const std::vector<StageOutcome>& stage_outcomes() const;
  // A stage gate failed with [eval] gate = "stop": run() returned after that stage.
  bool gate_stopped() const;

  // Called after each stage's held-out loss and [eval] evaluation (and before its checkpoint),
  // if set.
  std::function<void(const StageEnd&)> on_stage_end;

  // Mean next-token loss of one micro-batch (ids, labels [B, T]) as the trainer computes it:
  // one pass, or segment_len segments carrying the decode state (detach_state: truncated BPTT).
  // recompute: activation recomputation (model::ForwardOptions::recompute). weights_BT (f32
  // [B, T], optional): per-label loss weights, the loss then being their weighted mean.
  // after_forward runs after each segment's forward; a defined tensor it returns (e.g. the
  // auxiliary balancing loss) is added to that segment's loss with the same L / T weight.
  // image_embeds: the rows that replace the placeholders of ids (model::ForwardOptions), one
  // pass only.
  // The parameters the optimiser updates: every trainable weight except the balancer-owned
  // selection biases, by checkpoint name. Call after weights().requires_grad_(true), which
  // replaces the tensors.
  static NamedParams optimizer_params(const model::Decoder& dec);

  // The gradient of scale · sequence_loss(dec, ids, labels, segment_len, weights) accumulated into
  // the parameters' gradients (exact, through the carried decode state) with the memory of one
  // segment: a first pass without a graph keeps the cache at each segment boundary, then the
  // segments run again last first, each back-propagating its loss plus the gradient its
  // outgoing state received from the segment after it. About one extra forward. Returns the loss.
  static double segmented_backward(const model::Decoder& dec, const Tensor& ids_BT,
                                   const Tensor& labels_BT, int64_t segment_len,
                                   const Tensor& weights_BT = Tensor(), double scale = 1.0,
                                   bool recompute = false);

  static Tensor sequence_loss(const model::Decoder& dec, const Tensor& ids_BT,
                              const Tensor& labels_BT, int64_t segment_len = 0,
                              bool detach_state = false,
                              const std::function<Tensor()>& after_forward = {},
                              bool recompute = false, const Tensor& weights_BT = Tensor(),
                              const Tensor& image_embeds = Tensor());

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace myriad::train
