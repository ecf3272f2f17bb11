#include "cli/agent.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>

#include "agent/rollout.h"
#include "core/error.h"
#include "model/decoder.h"
#include "train/rl.h"

namespace myriad::cli {
namespace fs = std::filesystem;

bool AgentArgs::selected() const {
  return (rl && rl->parsed()) || (eval && eval->parsed()) || (step && step->parsed());
}

void add_agent_commands(CLI::App& app, AgentArgs& a) {
  a.rl = app.add_subcommand(
      "rl",
      "agentic RL post-training from a TOML recipe (rollouts through the engine, group "
      "advantages, clipped policy loss; checkpoints, logs and the final model go to --out)");
  a.rl->add_option("recipe", a.recipe, "RL recipe, e.g. configs/recipes/agent/calculator-rl.toml")
      ->required()
      ->check(CLI::ExistingFile);
  a.rl->add_option("--out", a.out, "output directory (default runs/<recipe name>)");
  a.rl->add_flag("--resume", a.resume, "continue from the newest checkpoint in --out");
  a.rl->add_option("--init", a.init, "the model to start from (replaces the recipe's model.init)")
      ->check(CLI::ExistingDirectory);
  a.eval = app.add_subcommand("agent-eval",
                              "held-out pass@1 and pass@k of a model on an agent environment");
  a.eval->add_option("model_dir", a.model_dir, "model directory")
      ->required()
      ->check(CLI::ExistingDirectory);
  a.eval->add_option("--env", a.env, "environment (calculator, kv_lookup, gridworld)")->required();
  a.eval->add_option("--tasks", a.tasks, "held-out tasks")->check(CLI::PositiveNumber);
  a.eval->add_option("--k", a.k, "samples per task")->check(CLI::PositiveNumber);
  a.eval->add_option("--temperature", a.temperature, "sampling temperature")
      ->check(CLI::PositiveNumber);
  a.eval->add_option("--max-total-tokens", a.max_total_tokens, "episode token budget")
      ->check(CLI::PositiveNumber);
  a.eval->add_option("--max-turn-tokens", a.max_new_tokens_per_turn, "tokens per assistant turn")
      ->check(CLI::PositiveNumber);
  a.eval->add_option("--seed", a.seed, "sampling seed");
  a.eval->add_option("--split", a.split, "heldout (default) or train: which tasks")
      ->check(CLI::IsMember({"heldout", "train"}));
  a.eval->add_option("--show", a.show, "print this many sampled episodes (tokens as text)");
  a.eval->add_option("--json", a.json_out, "also write the result as JSON to this file");
  a.step =
      app.add_subcommand("agent-step",
                         "replay a held-out task of an environment on assistant messages (stdin: a "
                         "JSON array of strings) and print its state as JSON");
  a.step->add_option("env", a.env, "environment")->required();
  a.step->add_option("--task", a.task, "held-out task index (as agent-eval numbers them)");
}

namespace {

int agent_step(const AgentArgs& a) {
  using json = nlohmann::json;
  std::string in((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
  const json msgs =
      in.find_first_not_of(" \t\r\n") == std::string::npos ? json::array() : json::parse(in);
  MYRIAD_CHECK(msgs.is_array(), "agent-step: stdin must be a JSON array of strings");
  std::unique_ptr<agent::Environment> env = agent::make_environment(a.env);
  json out;
  out["first_message"] = env->reset(agent::kHeldoutSeedBase + a.task);
  out["tools"] = json::array();
  for (const agent::ToolSpec& t : env->tools())
    out["tools"].push_back(
        {{"type", "function"},
         {"function",
          {{"name", t.name}, {"description", t.description}, {"parameters", t.parameters}}}});
  json rewards = json::array();
  agent::StepResult last;
  for (const json& m : msgs) {
    MYRIAD_CHECK(m.is_string(), "agent-step: every message must be a string");
    MYRIAD_CHECK(!env->done(), "agent-step: a message after the episode ended");
    last = env->step(m.get<std::string>());
    rewards.push_back(last.process_reward);
  }
  out["observation"] = last.observation;
  out["role"] = last.role;
  out["process_rewards"] = rewards;
  out["done"] = env->done();
  out["R"] = env->done() ? env->terminal_reward() : 0.0;
  out["solved"] = env->done() && env->solved();
  std::printf("%s\n", out.dump().c_str());
  return 0;
}

}  // namespace

int agent_command(const AgentArgs& a) {
  if (a.step && a.step->parsed()) return agent_step(a);
  if (a.rl && a.rl->parsed()) {
    train::RlRecipe r = train::RlRecipe::load(a.recipe);
    if (!a.init.empty()) r.init = a.init;
    const std::string out =
        a.out.empty() ? (fs::path("runs") / fs::path(a.recipe).stem()).string() : a.out;
    train::RlTrainer t(r, out);
    t.run(a.resume);
    if (!t.finished()) return 130;
    std::printf("model: %s/model   evaluations: %s/eval.json   report: %s/report.html\n",
                out.c_str(), out.c_str(), out.c_str());
    return 0;
  }
  const data::Tokenizer tok = data::Tokenizer::from_dir(a.model_dir);
  const model::Decoder dec = model::Decoder::load(a.model_dir);
  infer::EngineConfig ec;
  ec.max_batch = 64;
  ec.prefix_cache_entries = 0;
  ec.block_tokens = 64;
  infer::Engine engine(dec, tok, ec);
  agent::EpisodeLimits lim;
  lim.max_total_tokens = a.max_total_tokens;
  lim.max_new_tokens_per_turn = a.max_new_tokens_per_turn;
  std::vector<agent::Trajectory> samples;
  const train::AgentEval ev = train::evaluate_agent(
      engine, tok, serve::ChatTemplate::from_model_dir(a.model_dir), a.env, a.tasks, a.k,
      a.temperature, lim, a.seed, a.greedy, &samples, a.split == "train");
  for (int64_t i = 0; i < a.show && i < static_cast<int64_t>(samples.size()); ++i) {
    const agent::Trajectory& t = samples[static_cast<size_t>(i * a.k)];
    std::printf("--- task %llu: R %.2f%s, turn rewards", static_cast<unsigned long long>(t.task_id),
                t.R, t.solved ? " (solved)" : "");
    for (double x : t.r_turn) std::printf(" %+.2f", x);
    const std::string cut = t.truncated ? " truncated: " + t.truncation_reason : "";
    std::printf("%s\n%s\n", cut.c_str(), tok.decode(t.tokens).c_str());
  }
  std::printf(
      "%s: %lld %s tasks x %lld samples: pass@1 %.3f ± %.3f  pass@%lld %.3f [%.3f, %.3f]  "
      "greedy pass@1 %.3f  mean reward %.3f  tool-call rate %.2f  tool-error rate %.2f  turns "
      "%.2f  response tokens %.1f\n",
      a.env.c_str(), static_cast<long long>(a.tasks), a.split == "train" ? "training" : "held-out",
      static_cast<long long>(a.k), ev.pass1, ev.pass1_ci, static_cast<long long>(a.k), ev.passk,
      ev.passk_lo, ev.passk_hi, ev.greedy, ev.mean_reward, ev.tool_call_rate, ev.tool_error_rate,
      ev.mean_turns, ev.response_tokens);
  if (!a.json_out.empty()) {
    std::ofstream f(a.json_out, std::ios::trunc);
    nlohmann::json j = ev.to_json();
    j["greedy_texts"] = ev.greedy_texts;
    f << j.dump(1) << "\n";
  }
  return 0;
}

}  // namespace myriad::cli
