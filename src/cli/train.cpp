#include "cli/train.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <optional>

#include "core/error.h"
#include "core/tensor.h"
#include "dist/comm.h"
#include "train/recipe.h"
#include "train/report.h"
#include "train/trainer.h"

namespace myriad::cli {
namespace fs = std::filesystem;
using train::Recipe;
using train::RunReport;

bool TrainArgs::selected() const {
  return (train && train->parsed()) || (report && report->parsed());
}

CLI::App* add_train_command(CLI::App& app, TrainArgs& a) {
  auto* c = app.add_subcommand("train",
                               "train a model from a TOML recipe (checkpoints, logs, "
                               "report.html, TensorBoard events and the final model go to --out)");
  c->add_option("recipe", a.recipe, "recipe file, e.g. configs/recipes/tiny-cpu.toml")
      ->required()
      ->check(CLI::ExistingFile);
  c->add_option("--out", a.out, "output directory (default runs/<recipe name>)");
  c->add_flag("--resume", a.resume, "continue from the newest checkpoint in the output directory");
  c->add_option("--init", a.init,
                "start from this model directory (its config, weights and tokenizer), e.g. SFT "
                "after pretraining; replaces the recipe's [model] table")
      ->check(CLI::ExistingDirectory);
  c->add_option("--contrast", a.contrast,
                "another run directory to draw in this run's report for contrast");
  c->add_option("--contrast-label", a.contrast_label, "legend of the contrast run");
  a.train = c;
  auto* r = app.add_subcommand("report", "rebuild a run's report.html from its metrics.jsonl");
  r->add_option("run_dir", a.report_dir,
                "run directory (--out of myriad train); with --compare, where compare.html and "
                "compare.md go")
      ->required();
  r->add_option("--compare", a.compare,
                "LABEL=RUN_DIR: compare these runs (training, and each run's eval.json from "
                "myriad eval --json) side by side");
  r->add_option("--title", a.compare_title, "title of the comparison");
  r->add_option("--contrast", a.contrast, "another run directory to draw for contrast")
      ->check(CLI::ExistingDirectory);
  r->add_option("--contrast-label", a.contrast_label, "legend of the contrast run");
  a.report = r;
  return c;
}

namespace {

// The final model as a directory `myriad serve`, `myriad chat` and Decoder::load read.
void export_model(const model::Decoder& dec, const std::string& tokenizer, const fs::path& dir) {
  fs::create_directories(dir);
  dec.config().save((dir / "config.json").string());
  dec.weights().save((dir / "model.safetensors").string());
  fs::copy_file(tokenizer, dir / "tokenizer.model", fs::copy_options::overwrite_existing);
  // An SFT run's chat template (the server then renders chats as training did).
  const fs::path tmpl = fs::path(tokenizer).parent_path() / "chat_template.txt";
  if (fs::exists(tmpl))
    fs::copy_file(tmpl, dir / "chat_template.txt", fs::copy_options::overwrite_existing);
  else
    fs::remove(dir / "chat_template.txt");
}

// Expert-load max-violation (TRAINING.md §4, per MoE layer) after warm-up, per stage: the mean
// over layers and steps, and the mean over steps of the worst layer.
void print_balance(const std::string& out, const Recipe& r) {
  const RunReport rep(out);
  const auto& series = rep.series();
  std::map<int64_t, std::vector<double>> by_step;  // step -> per-layer maxvio
  for (const auto& [k, v] : series)
    if (k.size() > 12 && k.compare(k.size() - 12, 12, "/load/maxvio") == 0)
      for (const auto& [step, x] : v) by_step[step].push_back(x);
  std::map<int64_t, double> stage_of;
  if (series.count("stage"))
    for (const auto& [step, x] : series.at("stage")) stage_of[step] = x;
  if (by_step.empty()) return;
  std::printf(
      "expert load max-violation after warm-up (step > %lld): mean over layers / worst "
      "layer\n",
      static_cast<long long>(r.schedule.warmup));
  for (size_t i = 0; i < r.stages.size(); ++i) {
    double mean = 0, worst = 0;
    int64_t n = 0;
    for (const auto& [step, v] : by_step)
      if (step > r.schedule.warmup && stage_of.count(step) && stage_of[step] == double(i)) {
        double s = 0, m = 0;
        for (double x : v) s += x, m = std::max(m, x);
        mean += s / static_cast<double>(v.size()), worst += m, ++n;
      }
    if (n)
      std::printf("  %-12s %.3f / %.3f over %lld steps\n", r.stages[i].name.c_str(), mean / n,
                  worst / n, static_cast<long long>(n));
  }
}

void print_samples(const model::Decoder& dec, const data::Tokenizer& tok) {
  std::printf("sample generations (greedy, 24 tokens):\n");
  for (const char* p : {"The meaning of the word", "A small river", "To run is to"}) {
    std::vector<int32_t> ids = tok.encode(p);
    ids.insert(ids.begin(), tok.bos());
    const std::vector<int64_t> ids64(ids.begin(), ids.end());
    const Tensor prompt = Tensor::from_ints(ids64, {1, static_cast<int64_t>(ids.size())});
    const auto g = dec.generate_greedy(prompt, 24);
    std::vector<int32_t> out(g.ids.begin(), g.ids.end());
    const auto eos = std::find(out.begin(), out.end(), tok.eos());
    out.erase(eos, out.end());
    std::printf("  %s|%s\n", p, tok.decode(out).c_str());
  }
}

int report_command(const TrainArgs& a) {
  if (!a.compare.empty()) {
    std::vector<std::pair<std::string, std::string>> runs;
    for (const std::string& c : a.compare) {
      const size_t eq = c.find('=');
      MYRIAD_CHECK(eq != std::string::npos && eq > 0, "--compare: '", c, "' is not LABEL=RUN_DIR");
      runs.emplace_back(c.substr(0, eq), c.substr(eq + 1));
    }
    std::fputs(train::write_comparison(runs, a.report_dir, a.compare_title).c_str(), stdout);
    std::printf("wrote %s/compare.html and compare.md\n", a.report_dir.c_str());
    return 0;
  }
  MYRIAD_CHECK(fs::is_directory(a.report_dir), "report: ", a.report_dir, " is not a directory");
  RunReport rep(a.report_dir);
  if (!a.contrast.empty()) rep.add_contrast(a.contrast_label, a.contrast);
  rep.write_html();
  std::printf("wrote %s/report.html\n", a.report_dir.c_str());
  return 0;
}

}  // namespace

int train_command(const TrainArgs& a) {
  if (a.report && a.report->parsed()) return report_command(a);
  const std::string out =
      a.out.empty() ? (fs::path("runs") / fs::path(a.recipe).stem()).string() : a.out;
  Recipe recipe = Recipe::load(a.recipe);
  if (!a.init.empty()) {
    MYRIAD_CHECK(recipe.model_overrides.empty(), "--init: the recipe's model.overrides would ",
                 "change the initial model's config");
    recipe.model_preset.clear();
    recipe.model_init = recipe.model_config = a.init;
  }
  train::Trainer t(recipe, out);
  t.run(a.resume);
  if (t.gate_stopped()) {
    std::printf("stage gate failed and [eval] gate = \"stop\": training ends here\n");
    return 3;
  }
  if (!t.finished()) return 130;            // stopped by a signal; the checkpoint is saved
  if (dist::world().rank() != 0) return 0;  // rank 0 exports the model and prints the summary
  const fs::path model_dir = fs::path(out) / "model";
  const fs::path tok_path = fs::path(recipe.tokenizer).is_absolute()
                                ? fs::path(recipe.tokenizer)
                                : fs::path(out) / recipe.tokenizer;
  export_model(t.decoder(), tok_path.string(), model_dir);
  if (!a.contrast.empty()) {
    RunReport rep(out);
    rep.add_contrast(a.contrast_label, a.contrast);
    rep.write_html();
  }
  for (const auto& s : t.stage_results())
    std::printf("stage %-12s end step %6lld  held-out loss %.4f\n", s.name.c_str(),
                static_cast<long long>(s.end_step), s.heldout_loss);
  for (const auto& o : t.stage_outcomes()) {
    std::printf("passkey %-10s", o.stage.c_str());
    for (const auto& g : o.grids)
      if (g.task == "passkey")
        for (size_t i = 0; i < g.lengths.size(); ++i)
          std::printf("  %lld: %.2f", static_cast<long long>(g.lengths[i]), g.at(i));
    std::printf("   gate %s\n", o.gate.pass ? "pass" : "fail");
  }
  print_balance(out, recipe);
  std::printf("skipped steps %lld, rollbacks %lld; report: %s/report.html\n",
              static_cast<long long>(t.monitor().skips()),
              static_cast<long long>(t.monitor().rollbacks()), out.c_str());
  print_samples(t.decoder(), data::Tokenizer::load(tok_path.string()));
  std::printf(
      "model: %s\n  chat:  build/release/myriad chat %s\n  serve: build/release/myriad serve %s "
      "--port 8000   (OpenAI API at http://127.0.0.1:8000/v1)\n",
      model_dir.c_str(), model_dir.c_str(), model_dir.c_str());
  return 0;
}

}  // namespace myriad::cli
