// Long-context evaluation (TRAINING.md §6) and the curriculum stage gates (§5.4).
// Every item is generated from an evaluation seed (< 2^63, disjoint from training's) and runs
// through the serving path, infer::Engine (chunked prefill, paged MLA cache, batched greedy
// decode), scored by exact match on the decoded text.
//
// Cost: one item costs a prefill of about `length` tokens plus up to max_new_tokens decode steps,
// batched 16 items at a time, so a passkey grid costs lengths × depths × seeds items and an
// MK-NIAH or VT grid lengths × seeds items (their needles land at seeded random depths). The §6
// default ({L/8..2L} × 11 depths × 20 seeds) is 1,100 passkey prefills per stage; on the CPU pick
// fewer seeds/depths (e.g. seeds = 2, depths {0, .5, 1}) for per-stage checks. Measured on a
// 2-core machine, `tiny` preset: a stage's passkey grid at lengths {128, 256, 512} × 3 depths ×
// 4 seeds takes 1-2 s; prefill runs at about 6-12K tokens/s up to 16K tokens.
#pragma once
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "data/synthetic.h"
#include "data/tokenizer.h"
#include "model/decoder.h"
#include "train/recipe.h"

namespace myriad::train {

struct EvalConfig {
  std::vector<int64_t> lengths;  // prompt lengths in tokens (approximate, as the generators make)
  std::vector<double> depths = {0, .1, .2, .3, .4, .5, .6, .7, .8, .9, 1.0};  // passkey only
  int seeds = 20;                                                             // items per cell
  int64_t segment = 4096;  // prefill segment in tokens
  int max_new_tokens = 16;
  bool wordnet_filler = true;  // WordNet evaluation half when installed; false: the fixed set
  // The engine the items run through (see greedy_completions).
  int64_t cache_budget_bytes = 4ll << 30;
  // Past the budget the MLA cache slides (a window of pages per layer, KDA state whole): constant
  // memory at any length. false: an item that does not fit the budget is an error.
  bool allow_sliding = false;
  // Items shared out over processes (data-parallel ranks): this one runs items i with
  // i % shards == shard, and `sum` (an element-wise sum over the processes, an all-reduce) gives
  // every process every item's answer. The grids are then the same everywhere.
  int shard = 0, shards = 1;
  std::function<void(std::vector<double>&)> sum;
};
// Lengths {L/8, L/4, L/2, L, 2L} for stage length L (§6), the other fields at their defaults.
EvalConfig grid_for_stage(int64_t stage_len);

struct EvalGrid {
  std::string task;  // "passkey", "mk_niah_k<K>", "vt_h<hops>"
  std::vector<int64_t> lengths;
  // Passkey: the configured depths. MK-NIAH and VT place needles at random depths: depths is
  // empty and each accuracy row has one entry.
  std::vector<double> depths;
  std::vector<std::vector<double>> accuracy;  // [length][depth], fractions in [0, 1]
  // VT only (same shape): mean fraction of the asked-for variables recovered (§6).
  std::vector<std::vector<double>> recovered;
  double mean = 0;               // over all cells
  double seconds = 0;            // wall time of the grid's generation
  int64_t cache_bytes_peak = 0;  // the engine's high-water mark of cache memory
  int64_t prompt_tokens = 0;     // over all items
  // Mean over depths at lengths[i].
  double at(size_t i) const;
};

// Filler for evaluation: the WordNet evaluation half (odd synsets) when wordnet is set and
// WordNet is installed, else the fixed set. Read once per process.
const data::Filler& eval_filler(bool wordnet);

EvalGrid eval_passkey(const model::Decoder& m, const data::Tokenizer& tok, const EvalConfig& cfg,
                      uint64_t seed);
EvalGrid eval_mk_niah(const model::Decoder& m, const data::Tokenizer& tok, const EvalConfig& cfg,
                      uint64_t seed, int K);
EvalGrid eval_variable_tracking(const model::Decoder& m, const data::Tokenizer& tok,
                                const EvalConfig& cfg, uint64_t seed, int hops);

// ---- Serving path pieces (exposed for tests) ----
// Prefill of `ids` into `cache`, `segment` tokens per forward. Returns the logits [1, T, V] of
// every position when all_logits, else those of the last position [V] (the only ones decoding
// needs; earlier segments then skip the LM head). Used to check that a segmented prefill equals a
// single one (§6).
Tensor segmented_prefill(const model::Decoder& m, const std::vector<int32_t>& ids, int64_t segment,
                         model::DecodeCache& cache, bool all_logits = false);
// Greedy completions of every prompt through one infer::Engine, the server's generation path:
// chunked prefill (`segment` tokens per chunk), the paged MLA cache and batched decode of up to
// 16 prompts at a time, until EOS or max_new tokens. Throws when a prompt cannot run within
// cache_budget_bytes (in full, or with a sliding MLA window when allow_sliding).
struct Completions {
  std::vector<std::vector<int32_t>> tokens;  // in prompt order, without the EOS
  int64_t cache_bytes_peak = 0;
};
Completions greedy_completions(const model::Decoder& m, const data::Tokenizer& tok,
                               const std::vector<std::vector<int32_t>>& prompts, int64_t segment,
                               int max_new, int64_t cache_budget_bytes = 4ll << 30,
                               bool allow_sliding = false);
// greedy_completions with cfg's segment, max_new_tokens, budget and sliding, shared out over
// processes when cfg.shards > 1 (every process calls it with the same prompts): this one runs its
// share and cfg.sum brings the others' answers. The cache peak is the largest any process saw.
Completions shared_completions(const model::Decoder& m, const data::Tokenizer& tok,
                               const std::vector<std::vector<int32_t>>& prompts,
                               const EvalConfig& cfg);

// Induction probe: `rows` rows of n tokens drawn uniformly from `alphabet`, each followed by the
// same n tokens again. The mean next-token loss on the first copy (its tokens 2..n) and on the
// second (its tokens 2..n; its first token cannot be predicted from context). A model that copies
// from context has a far lower loss on the second copy; one that does not, about the same.
struct CopyLosses {
  double first = 0, second = 0;
};
CopyLosses induction_probe(const model::Decoder& m, const std::vector<int32_t>& alphabet, int64_t n,
                           int64_t rows, uint64_t seed);

// Exact match (§6). A numeric answer matches when the first number in the output equals it
// ("12345" and " 12345." match "12345"; "123456" does not). A non-numeric answer (VT: names
// separated by spaces) matches when the set of upper-case words before the first '.' or newline
// equals the answer's set.
bool exact_match(const std::string& output, const std::string& answer);
// VT: the fraction of the answer's names found in that set.
double recovered_fraction(const std::string& output, const std::string& answer);

// Longest length, among those in every grid, whose mean accuracy over the grids (tasks) is
// ≥ 0.90 (§6); 0 when none is.
double effective_length(const std::vector<EvalGrid>& grids);

struct GateResult {
  bool pass = true;
  std::vector<std::string> reasons;  // one per failed rule
  std::vector<std::string> notes;    // reported, not gated: accuracy at 2× the stage length
};
// §5.4: (1) passkey mean over depths ≥ 0.95 at every grid length ≤ stage_len; (2) every MK-NIAH
// and VT grid of `previous` with the same task name: at the lengths the previous stage gated
// (≤ its stage length, i.e. half its longest grid length) that the new grid also has, accuracy
// drops by at most 0.02 (absolute);
// (3) short_val_loss ≤ 1.02 × stage0_val_loss; (4) no unresolved spike.
GateResult stage_gate(const std::vector<EvalGrid>& now, const std::vector<EvalGrid>& previous,
                      double short_val_loss, double stage0_val_loss, bool unresolved_spike,
                      int64_t stage_len);

// ---- The curriculum's stage-end evaluation ([eval] of a recipe) ----
struct StageOutcome {
  std::string stage;
  int64_t seq_len = 0, step = 0;
  double heldout_loss = 0;
  std::vector<EvalGrid> grids;  // in EvalRecipe::tasks order
  double effective_length = 0;
  GateResult gate;
  double seconds = 0;  // evaluation time
};

// Runs the recipe's grids at each stage end and gates it against the previous stage. Stateful:
// it keeps every stage's outcome (the previous stage's grids, stage 0's held-out loss, and the
// count that picks the next stage's item seed); state() / load_state() carry that through a
// checkpoint, so a resumed run evaluates and gates exactly as the uninterrupted one.
class StageEvaluator {
 public:
  StageEvaluator(EvalRecipe recipe, uint64_t seed) : r_(std::move(recipe)), seed_(seed) {}
  // The grid config for a stage length (lengths stage_len × factors ≤ max_length, deduplicated,
  // at least 16 tokens).
  EvalConfig config_for(int64_t stage_len) const;
  // Shares the items out over processes (EvalConfig::shard, shards, sum); every process calls
  // evaluate() together.
  void share(int shard, int shards, std::function<void(std::vector<double>&)> sum) {
    shard_ = shard, shards_ = shards, sum_ = std::move(sum);
  }
  StageOutcome evaluate(const model::Decoder& m, const data::Tokenizer& tok,
                        const std::string& stage, int64_t seq_len, int64_t step,
                        double heldout_loss, bool unresolved_spike);
  const std::vector<StageOutcome>& outcomes() const { return done_; }
  // Exact (doubles round-trip through JSON; non-finite ones are written as strings).
  nlohmann::json state() const;
  void load_state(const nlohmann::json& j);
  // Drops the outcomes of stages that ended after `step` (a rollback past a stage end redoes it).
  void forget_after(int64_t step);

 private:
  EvalRecipe r_;
  uint64_t seed_;
  int shard_ = 0, shards_ = 1;
  std::function<void(std::vector<double>&)> sum_;
  std::vector<StageOutcome> done_;
};

}  // namespace myriad::train
