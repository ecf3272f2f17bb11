#include "cli/train.h"

#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>

#include "train/recipe.h"
#include "train/trainer.h"

namespace myriad::cli {

CLI::App* add_train_command(CLI::App& app, TrainArgs& a) {
  auto* c = app.add_subcommand("train",
                               "train a model from a TOML recipe (checkpoints, logs, "
                               "report.html and TensorBoard events go to --out)");
  c->add_option("recipe", a.recipe, "recipe file, e.g. configs/recipes/tiny-cpu.toml")
      ->required()
      ->check(CLI::ExistingFile);
  c->add_option("--out", a.out, "output directory (default runs/<recipe name>)");
  c->add_flag("--resume", a.resume, "continue from the newest checkpoint in the output directory");
  return c;
}

int train_command(const TrainArgs& a) {
  const std::string out =
      a.out.empty()
          ? (std::filesystem::path("runs") / std::filesystem::path(a.recipe).stem()).string()
          : a.out;
  train::Trainer t(train::Recipe::load(a.recipe), out);
  t.run(a.resume);
  if (!t.finished()) return 130;  // stopped by a signal; the checkpoint is saved
  for (const auto& s : t.stage_results())
    std::printf("stage %-12s end step %6lld  held-out loss %.4f\n", s.name.c_str(),
                static_cast<long long>(s.end_step), s.heldout_loss);
  std::printf("skipped steps %lld, rollbacks %lld; report: %s/report.html\n",
              static_cast<long long>(t.monitor().skips()),
              static_cast<long long>(t.monitor().rollbacks()), out.c_str());
  return 0;
}

}  // namespace myriad::cli
