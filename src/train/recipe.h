// Training recipes (pretraining issue item 2): one TOML file that names the model, the data, the
// optimiser and schedule, the balancer, precision, seed, checkpointing, logging and the context
// curriculum stages (TRAINING.md §1, §3, §5). Unknown keys and bad values raise errors that name
// the key ("optimizer.lr: ...").
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "model/config.h"
#include "train/optim.h"
#include "train/schedule.h"

namespace myriad::train {

struct StageSpec {
  std::string name;
  int64_t seq_len = 0, steps = 0, tokens_per_step = 0;
  int64_t batch_size = 0;  // sequences per micro-batch; 0: min(tokens_per_step, 2048) / seq_len
  double lr_scale = 1.0;
  // "base": the train shards; "long": a §5.2 long-context mix (mix_long_context) built at stage
  // start into <out>/stage-<name>/ from the corpus plus synthetic retrieval items.
  std::string data_mix = "base";
  // "long" mix only: the share of tokens from synthetic retrieval items (passkey, MK-NIAH, VT,
  // MQAR), in [0, data::kMaxSyntheticFraction = 0.45] so that text stays the majority. §5.2's
  // default is 0.2.
  double synthetic_fraction = 0.2;
  // "long" mix only: the loss weight of retrieval items' answer tokens, in [1, 255] (1: plain
  // mean). The training loss is then the weighted mean within each micro-batch (micro-batches
  // still count equally in a step) and is logged as such; held-out losses stay unweighted.
  int64_t answer_weight = 1;
  // > 0: each [B, T] sequence runs as T / segment_len segments in order, carrying the decode
  // state (KDA state + conv, MLA latents); gradients flow through it unless detach_state
  // (truncated BPTT). The loss equals the one-pass mean loss.
  int64_t segment_len = 0;
  bool detach_state = false;
  // Activation recomputation: sublayers keep only their inputs and run again in the backward pass
  // (model::ForwardOptions::recompute); less memory, about one more forward of compute.
  bool recompute = false;
  int64_t micro_batches() const { return tokens_per_step / (batch_size * seq_len); }
};

// [eval]: the stage-end long-context evaluation (TRAINING.md §6) and its gate (§5.4). Grid
// lengths are stage_len × length_factors, capped at max_length; passkey runs every depth, MK-NIAH
// and VT place their needles at seeded random depths. Each (task, length, depth) cell has `seeds`
// items.
struct EvalRecipe {
  bool enabled = false;
  std::vector<std::string> tasks = {"passkey", "mk_niah", "vt"};
  std::vector<double> length_factors = {0.25, 0.5, 1.0, 2.0};
  int64_t max_length = 16384;
  std::vector<double> depths = {0.0, 0.5, 1.0};
  int64_t seeds = 2;
  int64_t mk_niah_keys = 4;  // K of MK-NIAH
  int64_t vt_hops = 2;
  int64_t segment = 4096;       // prefill segment
  std::string gate = "report";  // "report": record pass / fail; "stop": end the run on a fail
};

// [parallel] (docs/DISTRIBUTED.md): the layout over the ranks mpirun started, dp x cp of them.
// dp = 0: world size / cp; a non-zero dp must equal it. Each optimiser step's micro-batches are
// dealt round-robin to the dp groups, so a step sees the same global batch at any dp (a rank may
// get one fewer, or none; with ep > 1 micro_batches must divide by dp). Stage-end evaluations and
// held-out batches are shared out over all ranks too. cp > 1: each sequence is split into cp
// chunks, one per rank of a group, with the decode state passed rank to rank (segment_len must be 0
// or seq_len / cp). ep > 1: each group of ep consecutive data-parallel ranks shares out the routed
// experts of every MoE layer (ep divides dp and the expert count; not with cp > 1 or image rows).
// zero = 1: ZeRO-1 (optimizer state sharded by parameter); 0: replicated. A collective waiting
// longer than timeout_s ends the job with a message (unset: the MYRIAD_COMM_TIMEOUT_S environment
// variable, else 600 s).
struct ParallelRecipe {
  int64_t dp = 0, ep = 1, cp = 1;
  int64_t zero = 1;
  double timeout_s = 0;  // 0: unset
};

struct Recipe {
  std::string text;  // the TOML source, stored in checkpoints

  // [model]: a preset name or a config path (file or directory), plus config.json overrides.
  std::string model_preset, model_config;
  // [model] init: a model directory (myriad train's model/) to start from: its config, weights
  // and tokenizer (post-training after pretraining). Exclusive with preset and config.
  std::string model_init;
  nlohmann::json model_overrides = nlohmann::json::object();
  // [model] vision: "tiny" adds the Fashion-MNIST image tower (vision::tiny_vision, MODEL.md §10)
  // with Myriad's <|media_pad|> as the placeholder. Empty: text only (or the init model's).
  std::string model_vision;

  // [data]: relative paths are taken inside the run's output directory.
  std::string tokenizer = "tokenizer.model";  // trained when missing
  int64_t vocab_size = 512;                   // for a tokenizer trained here
  // "builtin" (WordNet + GCIDE), "synthetic", or "sft": chat conversations (agent::sft_documents)
  // from sft_sources, trained on the assistant's tokens only, rows starting at conversations.
  std::string corpus = "builtin";
  std::vector<std::string> sft_sources;  // environment names (agent::make_environment)
  std::vector<double> sft_noise;         // per source (environments' expert noise); default 0
  int64_t sft_examples = 20000;          // conversations per source
  int64_t sft_max_tokens = 256;          // a longer conversation is cut (episode total budget)
  int64_t max_corpus_bytes = 4 << 20;
  // corpus = "fashion_mnist" (TRAINING.md §9): image conversations (vision::ImageTextStream) with
  // text rows from the builtin corpus mixed in; question_weights over caption, grid_what,
  // grid_where, grid_count, grid_exists; vision_eval_images test images captioned at each stage
  // end (plus a fifth as many of each grid question), logged as vision/* (and every
  // vision_eval_every steps).
  double text_fraction = 0.25;
  std::vector<double> question_weights = {0.6, 0.1, 0.1, 0.1, 0.1};
  int64_t vision_eval_images = 1000;
  int64_t vision_eval_every = 0;     // > 0: the same evaluation every N steps too
  std::string shard_dir = "shards";  // built when it has no meta.json
  int64_t shard_tokens = 1 << 20;
  double heldout_fraction = 0.02;
  int64_t heldout_batches = 4;  // micro-batches of the held-out split per stage-end evaluation

  OptimConfig optimizer;
  Schedule schedule;          // peak = optimizer.lr, total = the sum of the stages' steps
  std::string balancer_mode;  // empty: the model config's myriad.balancer.mode
  std::string precision = "f32";
  uint64_t seed = 0;
  // Runs are always seeded (init, data order); with equal thread counts the losses repeat bit for
  // bit. true also sums each step's micro-batch gradients in micro-batch order, so a data-parallel
  // run equals one process bit for bit (Optimizer::stash_gradients; one gradient-sized buffer
  // more in one process, one per local micro-batch under dp). false: gradients accumulate in
  // place and are reduce-scattered (the planner's traffic; sums round differently at each dp).
  bool deterministic = true;

  std::string checkpoint_dir = "checkpoints";
  int64_t checkpoint_every = 0;  // 0: only at the end and on a stop signal
  int keep_last = 3;

  int64_t log_every = 1;
  bool log_jsonl = true, log_tensorboard = true, log_html = true;

  EvalRecipe eval;
  ParallelRecipe parallel;
  std::vector<StageSpec> stages;
  std::vector<int64_t> poison_steps;  // [debug]: steps (1-based) whose loss is made NaN

  static Recipe parse(std::string_view toml_text, std::string_view source = "recipe");
  static Recipe load(const std::string& path);
  int64_t total_steps() const;
  // The model config with overrides applied and vocab_size set; validated.
  model::ModelConfig model(int64_t vocab) const;
};

}  // namespace myriad::train
