// `myriad plan CONFIG --gpus N --gpu h200 [--dp --ep --pp --cp] --seq S --batch B ...`: sizes a
// model config (a path or a preset name) on a cluster; see plan/planner.h.
#pragma once
#include <cstdint>
#include <string>

namespace CLI {
class App;
}

namespace myriad::cli {

struct PlanArgs {
  std::string config;  // config.json, a model directory, or a preset name
  std::string gpu = "h200";
  int64_t gpus = 8;
  int64_t dp = 0, ep = 0, pp = 0, cp = 0;  // 0: enumerate
  int64_t seq = 4096, batch = 0, micro_batch = 1;
  std::string optimizer = "muon", precision = "bf16", recompute = "auto";
  int zero = 1;
  int64_t serve_context = 1 << 20, serve_batch = 1;
  std::string serve_experts = "bf16";
  int top = 10;
  bool json = false;     // print the plan as JSON
  bool tensors = false;  // print the expected tensor list (name and shape) instead
};

// Registers the `plan` subcommand on `app`, parsing into `args`.
CLI::App* add_plan_command(CLI::App& app, PlanArgs& args);
int plan_command(const PlanArgs& args);

}  // namespace myriad::cli
