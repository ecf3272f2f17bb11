#include "cli/plan.h"

#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>

#include "core/error.h"
#include "plan/planner.h"

namespace myriad::cli {

CLI::App* add_plan_command(CLI::App& app, PlanArgs& a) {
  auto* p = app.add_subcommand(
      "plan", "size a model on a cluster: parameters, memory, communication, step time, serving");
  p->add_option("config", a.config, "config.json, a model directory, or a preset name")->required();
  p->add_option("--gpus", a.gpus, "devices in all")->check(CLI::PositiveNumber);
  p->add_option("--gpu", a.gpu, "hardware: h200, h100 or zen5");
  p->add_option("--dp", a.dp, "data-parallel degree (default: enumerate)");
  p->add_option("--ep", a.ep, "expert-parallel degree, dividing dp*cp (default: enumerate)");
  p->add_option("--pp", a.pp, "pipeline stages (default: enumerate)");
  p->add_option("--cp", a.cp, "context-parallel degree (default: enumerate)");
  p->add_option("--seq", a.seq, "training sequence length")->check(CLI::PositiveNumber);
  p->add_option("--batch", a.batch, "global batch in sequences (default: one per device)");
  p->add_option("--micro-batch", a.micro_batch, "sequences per micro-batch")
      ->check(CLI::PositiveNumber);
  p->add_option("--optimizer", a.optimizer, "muon or adamw")
      ->check(CLI::IsMember({"muon", "adamw"}));
  p->add_option("--precision", a.precision, "bf16 (fp32 master) or f32")
      ->check(CLI::IsMember({"bf16", "f32"}));
  p->add_option("--recompute", a.recompute, "auto, none or full")
      ->check(CLI::IsMember({"auto", "none", "full"}));
  p->add_option("--zero", a.zero, "ZeRO stage 0-3")->check(CLI::Range(0, 3));
  p->add_option("--serve-context", a.serve_context, "serving context length")
      ->check(CLI::PositiveNumber);
  p->add_option("--serve-batch", a.serve_batch, "concurrent sequences when serving")
      ->check(CLI::PositiveNumber);
  p->add_option("--serve-experts", a.serve_experts, "routed-expert format: bf16, fp8 or mxfp4")
      ->check(CLI::IsMember({"bf16", "fp8", "mxfp4"}));
  p->add_option("--top", a.top, "layouts to list")->check(CLI::PositiveNumber);
  p->add_flag("--json", a.json, "print JSON instead of tables");
  p->add_flag("--tensors", a.tensors, "print the tensors the config implies (name and shape)");
  return p;
}

int plan_command(const PlanArgs& a) {
  const model::ModelConfig c = std::filesystem::exists(a.config)
                                   ? model::ModelConfig::load(a.config)
                                   : model::preset(a.config);
  if (a.tensors) {
    for (const auto& [name, shape] : plan::expected_tensors(c))
      std::printf("%s %s\n", name.c_str(), shape_str(shape).c_str());
    return 0;
  }
  plan::PlanRequest r;
  r.model_name = a.config;
  r.hardware = a.gpu;
  r.gpus = a.gpus;
  auto degree = [](int64_t v) { return v > 0 ? std::optional<int64_t>(v) : std::nullopt; };
  r.dp = degree(a.dp), r.ep = degree(a.ep), r.pp = degree(a.pp), r.cp = degree(a.cp);
  r.seq = a.seq, r.batch = a.batch, r.micro_batch = a.micro_batch;
  r.optimizer = a.optimizer == "adamw" ? plan::Optimizer::AdamW : plan::Optimizer::Muon;
  r.bf16 = a.precision == "bf16";
  if (a.recompute != "auto")
    r.recompute = a.recompute == "full" ? plan::Recompute::Full : plan::Recompute::None;
  r.zero = a.zero;
  r.serve_context = a.serve_context, r.serve_batch = a.serve_batch;
  r.serve_experts = a.serve_experts;
  r.top = a.top;
  const plan::Plan p = plan::make_plan(c, r);
  if (a.json)
    std::printf("%s\n", plan::plan_json(p).dump(2).c_str());
  else
    std::fputs(plan::format_plan(p).c_str(), stdout);
  return 0;
}

}  // namespace myriad::cli
