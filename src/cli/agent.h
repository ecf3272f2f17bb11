// `myriad rl RECIPE --out DIR [--resume]`: agentic RL post-training (train/rl.h).
// `myriad agent-eval MODEL_DIR --env NAME`: held-out pass@1 / pass@k of a model on an environment.
// `myriad agent-step ENV --task I`: replays held-out task I on the assistant messages read from
// stdin (a JSON array of strings) and prints the environment's state as JSON (the first
// message, the OpenAI tools, the last reply, rewards, done, solved): an external agent loop (the
// official openai client against myriad serve) is scored by the very code the RL evaluator uses.
#pragma once
#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

namespace myriad::cli {

struct AgentArgs {
  CLI::App* rl = nullptr;
  CLI::App* eval = nullptr;
  CLI::App* step = nullptr;
  std::string recipe, out, model_dir, env, json_out, init, split = "heldout";
  bool resume = false, greedy = true;
  int64_t tasks = 200, k = 8, show = 0, max_total_tokens = 256, max_new_tokens_per_turn = 64;
  double temperature = 1.0;
  uint64_t seed = 0, task = 0;
  bool selected() const;
};
void add_agent_commands(CLI::App& app, AgentArgs& a);
int agent_command(const AgentArgs& a);

}  // namespace myriad::cli
