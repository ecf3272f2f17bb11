// `myriad eval MODEL_DIR --lengths ...`: the long-context grids of TRAINING.md §6 (passkey over
// length × depth, MK-NIAH, VT) on a saved model, through the serving engine, at any length; with
// --sliding the MLA cache slides past --cache-budget so memory stays constant; --heldout DIR
// --loss-lengths adds the held-out loss at each length. Prints each grid, its time and cache
// peak, and the process's peak RSS; --json writes them.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace myriad::cli {

struct EvalArgs {
  std::string model_dir, json;
  std::vector<std::string> tasks = {"passkey"};
  std::vector<int64_t> lengths;
  std::vector<double> depths = {0.0, 0.5, 1.0};
  int seeds = 4;
  int64_t segment = 4096, mk_niah_keys = 4, vt_hops = 2;
  uint64_t seed = 1;
  std::string cache_budget = "4G";
  bool sliding = false;
  // Held-out loss at each of loss_lengths: rows of that length from heldout_dir's held-out split
  // (a shard directory), about loss_tokens tokens per length, segment tokens per forward.
  std::string heldout_dir;
  std::vector<int64_t> loss_lengths;
  int64_t loss_tokens = 32768;
  // Induction probe: rows of `induction` random tokens, each repeated once; the mean loss on the
  // first copy and on the second (a model that copies from context predicts the second copy).
  int64_t induction = 0;
  CLI::App* cmd = nullptr;
};

void add_eval_command(CLI::App& app, EvalArgs& args);
int eval_command(const EvalArgs& args);

}  // namespace myriad::cli
