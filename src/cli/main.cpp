// The myriad command line: one binary, one subcommand per job.
#include <CLI/CLI.hpp>
#include <cstdio>

#include "cli/agent.h"
#include "cli/commands.h"
#include "cli/data.h"
#include "cli/eval.h"
#include "cli/plan.h"
#include "cli/serve.h"
#include "cli/train.h"
#include "cli/vision.h"
#include "core/error.h"
#include "dist/comm.h"

int main(int argc, char** argv) {
  CLI::App app{"Myriad: an engine for sparse-expert, long-context language models"};
  app.require_subcommand(1);
  myriad::cli::SelfcheckOptions sc;
  auto* selfcheck = app.add_subcommand(
      "selfcheck", "check every op against its reference and time both (prints what it measured)");
  selfcheck->add_option("--scale", sc.scale, "problem size multiplier")->check(CLI::Range(1, 64));
  selfcheck->add_option("--reps", sc.reps, "timed repetitions per op")->check(CLI::Range(1, 1000));
  std::string model_dir, tokens, out;
  auto* logits = app.add_subcommand("logits", "run a model on token ids and write its logits");
  logits->add_option("model_dir", model_dir, "model directory (config.json + safetensors)")
      ->required();
  logits->add_option("--tokens", tokens, "safetensors file with i64 input_ids [B, T]")->required();
  logits->add_option("--out", out, "where to write f32 logits [B, T, V]")->required();
  auto* inspect = app.add_subcommand(
      "inspect", "print a model's layers, parameter counts and decode-cache sizes");
  inspect->add_option("model_dir", model_dir, "model directory, config.json, or a preset name")
      ->required();
  myriad::cli::PlanArgs plan_args;
  auto* plan = myriad::cli::add_plan_command(app, plan_args);
  myriad::cli::TrainArgs train_args;
  myriad::cli::add_train_command(app, train_args);
  myriad::cli::DataArgs data_args;
  myriad::cli::add_data_commands(app, data_args);
  myriad::cli::InferArgs infer_args;
  myriad::cli::add_infer_commands(app, infer_args);
  myriad::cli::EvalArgs eval_args;
  myriad::cli::add_eval_command(app, eval_args);
  myriad::cli::AgentArgs agent_args;
  myriad::cli::add_agent_commands(app, agent_args);
  myriad::cli::VisionArgs vision_args;
  myriad::cli::add_vision_commands(app, vision_args);
  CLI11_PARSE(app, argc, argv);
  try {
    if (*selfcheck) return myriad::cli::selfcheck(sc);
    if (*logits) return myriad::cli::logits(model_dir, tokens, out);
    if (*inspect) return myriad::cli::inspect(model_dir);
    if (*plan) return myriad::cli::plan_command(plan_args);
    if (train_args.selected()) return myriad::cli::train_command(train_args);
    if (data_args.selected()) return myriad::cli::data_command(data_args);
    if (infer_args.selected()) return myriad::cli::infer_command(infer_args);
    if (*eval_args.cmd) return myriad::cli::eval_command(eval_args);
    if (agent_args.selected()) return myriad::cli::agent_command(agent_args);
    if (vision_args.selected()) return myriad::cli::vision_command(vision_args);
  } catch (const std::exception& e) {
    // Under mpirun the other ranks may wait in a collective: end them all now.
    if (myriad::dist::Comm* w = myriad::dist::started_world())
      w->abort(1, std::string("error: ") + e.what());
    std::fprintf(stderr, "myriad: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
