// `myriad train RECIPE.toml [--resume] [--out DIR]`: runs a training recipe (train/recipe.h)
// with the trainer of train/trainer.h.
#pragma once
#include <string>

namespace CLI {
class App;
}

namespace myriad::cli {

struct TrainArgs {
  std::string recipe;
  std::string out;  // default: runs/<recipe file stem>
  bool resume = false;
};

// Registers the `train` subcommand on `app`, parsing into `args`.
CLI::App* add_train_command(CLI::App& app, TrainArgs& args);
int train_command(const TrainArgs& args);

}  // namespace myriad::cli
