// The scale planner behind `myriad plan`: parameter counts, per-device training memory,
// communication and a roofline step time for every dp/ep/pp/cp factorisation of the device
// count (or the one asked for), layouts that fit ranked by step time, and a serving plan
// (devices for a context length at a batch size). Printed as a terminal report or as JSON.
#pragma once
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "plan/roofline.h"

namespace myriad::plan {

struct PlanRequest {
  std::string model_name;  // for the report
  std::string hardware = "h200";
  int64_t gpus = 1;
  std::optional<int64_t> dp, ep, pp, cp;  // fixed degrees; the rest are enumerated
  int64_t seq = 4096;
  int64_t batch = 0;  // global sequences per step; 0: one sequence per data-parallel rank
  int64_t micro_batch = 1;
  std::optional<Recompute> recompute;  // unset: none when it fits, else full
  Optimizer optimizer = Optimizer::Muon;
  bool bf16 = true;
  int zero = 1;
  // Serving.
  int64_t serve_context = 1 << 20;
  int64_t serve_batch = 1;
  std::string serve_experts = "bf16";  // bf16 | fp8 | mxfp4 (routed experts; the rest bf16)
  int top = 10;
};

struct LayoutPlan {
  TrainSetup setup;
  MemoryBreakdown memory;
  CommBreakdown comm;
  StepEstimate step;
};

struct ServeRow {
  int64_t batch = 0;
  double cache_bytes = 0;                // all sequences
  int64_t devices_min = 0, devices = 0;  // by memory; rounded to a deployable count
  double decode_step_s = 0, decode_tokens_per_s = 0;
};

struct ServePlan {
  int64_t context = 0;
  std::string experts_format;
  double weight_bytes = 0, expert_weight_bytes = 0;
  double cache_mla_per_token = 0, cache_kda_per_seq = 0, cache_per_seq = 0;
  double cache_all_mla_per_seq = 0;  // the same depth with MLA in every layer, for comparison
  double prefill_flops = 0, prefill_s = 0;  // one sequence of `context` on `devices` devices
  ServeRow asked;                           // at the requested batch
  std::vector<ServeRow> sweep;              // batch 1, 4, 16, 64, 256
};

struct Plan {
  PlanRequest request;
  Hardware hw;
  ParamCounts params;
  CacheFootprint caches;
  FlopCounts flops;                // forward, per token, at request.seq
  std::vector<LayoutPlan> ranked;  // fitting layouts, fastest first (at most request.top)
  int64_t considered = 0, feasible = 0;
  std::vector<std::string> rejected;        // a few "layout: reason" lines
  std::optional<LayoutPlan> smallest_miss;  // when nothing fits: the layout closest to fitting
  ServePlan serve;
  std::vector<std::string> notes;
};

Plan make_plan(const ModelConfig& c, const PlanRequest& r);
ServePlan serving_plan(const ModelConfig& c, const ParamCounts& pc, const Hardware& hw,
                       int64_t context, int64_t batch, const std::string& experts_format);
std::string format_plan(const Plan& p);
nlohmann::json plan_json(const Plan& p);

}  // namespace myriad::plan
