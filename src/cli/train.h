// `myriad train RECIPE.toml [--resume] [--out DIR]`: runs a training recipe (train/recipe.h)
// with the trainer of train/trainer.h, the recipe's stage-end evaluations ([eval]), and exports
// the final model to DIR/model (config.json, model.safetensors, tokenizer.model: what
// `myriad serve` and `myriad chat` load). `myriad report RUN_DIR [--contrast DIR]` rebuilds a
// run's report.html from its metrics.jsonl, optionally with a second run drawn for contrast;
// `myriad report OUT_DIR --compare LABEL=RUN_DIR ...` writes several runs side by side.
#pragma once
#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace myriad::cli {

struct TrainArgs {
  std::string recipe;
  std::string out;  // default: runs/<recipe file stem>
  bool resume = false;
  std::string init;  // --init: start from this model directory (overrides the recipe's [model])
  // report
  std::string report_dir, contrast, contrast_label = "contrast";
  // report --compare LABEL=RUN_DIR ... (--out DIR): the runs side by side (write_comparison)
  std::vector<std::string> compare;
  std::string compare_title = "Myriad run comparison";
  CLI::App* train = nullptr;
  CLI::App* report = nullptr;
  bool selected() const;
};

// Registers the `train` and `report` subcommands on `app`, parsing into `args`.
CLI::App* add_train_command(CLI::App& app, TrainArgs& args);
int train_command(const TrainArgs& args);

}  // namespace myriad::cli
