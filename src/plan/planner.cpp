#include "plan/planner.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "core/error.h"

namespace myriad::plan {

namespace {

constexpr double GiB = 1024.0 * 1024.0 * 1024.0;

std::vector<int64_t> divisors(int64_t n) {
  std::vector<int64_t> out;
  for (int64_t i = 1; i <= n; ++i)
    if (n % i == 0) out.push_back(i);
  return out;
}

// The layout with the recomputation mode asked for, or the cheapest that fits.
LayoutPlan evaluate(const ModelConfig& c, const ParamCounts& pc, const Hardware& hw, TrainSetup s,
                    std::optional<Recompute> rc) {
  LayoutPlan lp;
  s.recompute = rc.value_or(Recompute::None);
  lp.memory = training_memory(c, pc, hw, s);
  if (!rc && !lp.memory.fits()) {
    s.recompute = Recompute::Full;
    lp.memory = training_memory(c, pc, hw, s);
  }
  lp.setup = s;
  lp.step = training_step(c, pc, hw, s, &lp.comm);
  return lp;
}

// Bytes per routed-expert parameter in a serving format.
double expert_bytes_per_param(const std::string& f) {
  if (f == "bf16") return 2;
  if (f == "fp8") return 1 + 4.0 / 128;         // e4m3 with one f32 scale per 128 values
  if (f == "mxfp4") return (4 + 8.0 / 32) / 8;  // e2m1 with one e8m0 scale per 32 values
  throw Error(cat("plan: unknown expert format '", f, "' (expected bf16, fp8 or mxfp4)"));
}

// DeepEP low-latency dispatch + combine for one MoE layer (ANCHORS.md §6: 77 + 114 µs at EP8,
// 194 + 360 µs at EP256 across nodes); inside one NVLink node, 40 µs assumed.
double ep_decode_latency(const Hardware& hw, int64_t g) {
  if (g <= 1) return 0;
  if (g <= hw.node_size) return 40e-6;
  const double x = std::clamp((std::log2(static_cast<double>(g)) - 3) / 5, 0.0, 1.0);
  return (191 + x * (554 - 191)) * 1e-6;
}

int64_t deployable(const Hardware& hw, int64_t n) {
  if (n <= 1) return 1;
  if (n <= hw.node_size) {
    int64_t p = 1;
    while (p < n) p *= 2;
    return p;
  }
  return (n + hw.node_size - 1) / hw.node_size * hw.node_size;
}

ServeRow serve_row(const ModelConfig& c, const ParamCounts& pc, const Hardware& hw,
                   const CacheFootprint& cs, const ServePlan& sp, int64_t batch) {
  ServeRow r;
  r.batch = batch;
  const double B = static_cast<double>(batch);
  r.cache_bytes = B * sp.cache_per_seq;
  r.devices_min = static_cast<int64_t>(
      std::ceil((sp.weight_bytes + r.cache_bytes) / (hw.mem_bytes * hw.usable)));
  r.devices = deployable(hw, r.devices_min);
  const double G = static_cast<double>(r.devices);
  // One decode step reads the non-expert weights, the experts the batch touches (expected
  // distinct of n when B tokens pick k each), every sequence's latents, and reads and writes
  // every KDA state.
  double bytes = sp.weight_bytes - sp.expert_weight_bytes;
  const double n = c.num_experts, k = c.num_experts_per_token;
  int64_t moe_layers = 0;
  for (const auto& l : pc.layers) moe_layers += l.moe;
  if (n > 0) {
    const double touched = n * (1 - std::pow(1 - k / n, B));
    bytes += sp.expert_weight_bytes / n * touched;
  }
  bytes += B * (cs.mla_tokens(sp.context) * cs.mla_bytes_per_token + 2 * cs.kda_state_bytes +
                2 * cs.kda_conv_bytes);
  // Absorbed MLA decode: scores over 576 and values over 512 latent channels per key and head.
  const double attn = 2.0 * c.num_attention_heads *
                      (c.kv_lora_rank + c.qk_rope_head_dim + c.kv_lora_rank) *
                      cs.mla_tokens(sp.context) * cs.mla_layers;
  const double kda = 4.0 * c.linear_attn_config.num_heads * c.linear_attn_config.head_dim *
                     c.linear_attn_config.head_dim * cs.kda_layers;
  const double flops = B * (2 * static_cast<double>(pc.matmul_active) + attn + kda);
  const double t = std::max(bytes / (G * hw.mem_bw), flops / (G * hw.gemm_flops));
  r.decode_step_s = t + ep_decode_latency(hw, r.devices) * moe_layers * (1 - kEpOverlap);
  r.decode_tokens_per_s = B / r.decode_step_s;
  return r;
}

std::string human(double v, const char* unit = "") {  // 2.78T, 104.2B, 12.3M
  char buf[64];
  const double a = std::fabs(v);
  if (a >= 1e12)
    std::snprintf(buf, sizeof buf, "%.3fT%s", v / 1e12, unit);
  else if (a >= 1e9)
    std::snprintf(buf, sizeof buf, "%.2fB%s", v / 1e9, unit);
  else if (a >= 1e6)
    std::snprintf(buf, sizeof buf, "%.2fM%s", v / 1e6, unit);
  else if (a >= 1e3)
    std::snprintf(buf, sizeof buf, "%.1fK%s", v / 1e3, unit);
  else
    std::snprintf(buf, sizeof buf, "%.0f%s", v, unit);
  return buf;
}

std::string bytes_str(double b) {  // decimal units, as link bandwidths are quoted
  char buf[32];
  if (b >= 1e12)
    std::snprintf(buf, sizeof buf, "%.2f TB", b / 1e12);
  else if (b >= 1e9)
    std::snprintf(buf, sizeof buf, "%.2f GB", b / 1e9);
  else if (b >= 1e6)
    std::snprintf(buf, sizeof buf, "%.2f MB", b / 1e6);
  else
    std::snprintf(buf, sizeof buf, "%.1f KB", b / 1e3);
  return buf;
}

std::string sci(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", v);
  return buf;
}

std::string gib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, bytes >= 10 * GiB ? "%.0f GiB" : "%.2f GiB", bytes / GiB);
  return buf;
}

std::string secs(double s) {
  char buf[32];
  if (s >= 1)
    std::snprintf(buf, sizeof buf, "%.2f s", s);
  else if (s >= 1e-3)
    std::snprintf(buf, sizeof buf, "%.1f ms", s * 1e3);
  else
    std::snprintf(buf, sizeof buf, "%.0f us", s * 1e6);
  return buf;
}

const char* rc_name(Recompute r) {
  return r == Recompute::Full ? "full" : "none";
}

std::vector<std::string> assumptions(const Hardware& hw) {
  return {
      "hardware: " + hw.sources,
      "layout: world = dp*cp*pp; experts sharded over ep (ep divides dp*cp), non-expert weights "
      "replicated over dp*cp; no tensor parallelism; ranks placed cp, dp, pp (innermost first)",
      "precision (TRAINING.md §2): bf16 weights and activations, fp32 master, fp32 gradient "
      "accumulation; Muon keeps 4 B/param (momentum) for 2-D hidden matrices, AdamW 8 B for the "
      "rest; ZeRO shards master and optimiser states over each weight's replicas",
      "activations: the tensors the autograd tape keeps, counted op by op from src/model/ "
      "(see src/plan/memory.cpp); full recomputation keeps each layer's input and replays one "
      "layer at a time; 1F1B keeps pp - stage micro-batches in flight",
      "time: roofline per piece (GEMM rate, HBM bandwidth), attention at attn_eff and KDA at "
      "kda_eff of the GEMM rate, 1F1B bubble, Muon Newton-Schulz on one owner per matrix",
      "communication: DP reduce-scatter (fp32) + all-gather (bf16) hidden behind backward up to "
      "its length; EP dispatch in fp8 (+1/32 scales) and combine in bf16 (DeepEP), 50% overlapped; "
      "CP KDA scan exposed; uniform routing",
      "MFU: (6 x active matrix params + 3 x attention/KDA forward FLOPs) per token / peak bf16 "
      "(llm.c convention, ANCHORS.md)",
      "serving: weights sharded once over the devices; decode reads non-expert weights, the "
      "experts a batch touches and every cache once per step; KDA state bf16; DeepEP "
      "low-latency all-to-all per MoE layer, half hidden"};
}

}  // namespace

ServePlan serving_plan(const ModelConfig& c, const ParamCounts& pc, const Hardware& hw,
                       int64_t context, int64_t batch, const std::string& experts_format) {
  ServePlan sp;
  sp.context = context;
  sp.experts_format = experts_format;
  const double routed =
      static_cast<double>(pc.total_by_part[static_cast<int>(Part::RoutedExperts)]);
  sp.expert_weight_bytes = routed * expert_bytes_per_param(experts_format);
  sp.weight_bytes = (static_cast<double>(pc.total) - routed) * 2 + sp.expert_weight_bytes;
  const CacheFootprint cs = cache_footprint(c);
  sp.cache_mla_per_token = static_cast<double>(cs.mla_bytes_per_token);
  sp.cache_kda_per_seq = static_cast<double>(cs.kda_state_bytes + cs.kda_conv_bytes);
  sp.cache_per_seq = cs.per_sequence(context);
  sp.cache_all_mla_per_seq = static_cast<double>(c.num_hidden_layers) *
                             (c.kv_lora_rank + c.qk_rope_head_dim) * 2.0 *
                             static_cast<double>(context);
  sp.asked = serve_row(c, pc, hw, cs, sp, batch);
  for (int64_t b : {1, 4, 16, 64, 256}) sp.sweep.push_back(serve_row(c, pc, hw, cs, sp, b));
  // Prefill of one sequence over the asked deployment.
  const FlopCounts f = forward_flops_per_token(c, pc, context);
  const double T = static_cast<double>(context), G = static_cast<double>(sp.asked.devices);
  sp.prefill_flops = T * f.total();
  sp.prefill_s = T *
                 (f.matmul / hw.gemm_flops + f.attention / (hw.gemm_flops * hw.attn_eff) +
                  f.kda / (hw.gemm_flops * hw.kda_eff)) /
                 G;
  return sp;
}

Plan make_plan(const ModelConfig& c, const PlanRequest& r) {
  MYRIAD_CHECK(r.gpus >= 1, "plan: --gpus must be >= 1, got ", r.gpus);
  MYRIAD_CHECK(r.top >= 1, "plan: --top must be >= 1, got ", r.top);
  MYRIAD_CHECK(r.serve_context >= 1 && r.serve_batch >= 1,
               "plan: the serving context and batch must be >= 1");
  Plan p;
  p.request = r;
  p.hw = hardware(r.hardware);
  p.params = count_params(c);
  p.caches = cache_footprint(c);
  p.flops = forward_flops_per_token(c, p.params, r.seq);
  if (p.request.batch == 0) p.request.batch = r.gpus * r.micro_batch;
  const int64_t N = r.gpus;

  std::vector<LayoutPlan> fit;
  std::vector<std::pair<double, std::string>> misses;  // memory over capacity, description
  double closest = 1e300;
  for (int64_t pp : divisors(N)) {
    if (r.pp && pp != *r.pp) continue;
    for (int64_t cp : divisors(N / pp)) {
      if (r.cp && cp != *r.cp) continue;
      const int64_t dp = N / (pp * cp);
      if (r.dp && dp != *r.dp) continue;
      for (int64_t ep : divisors(dp * cp)) {
        if (r.ep && ep != *r.ep) continue;
        TrainSetup s;
        s.layout = {dp, ep, pp, cp};
        s.seq = r.seq, s.batch = p.request.batch, s.micro_batch = r.micro_batch;
        s.optimizer = r.optimizer, s.bf16 = r.bf16, s.zero = r.zero;
        ++p.considered;
        const std::string why = s.invalid_reason(c);
        if (!why.empty()) {
          if (p.rejected.size() < 3) p.rejected.push_back(s.layout.str() + ": " + why);
          continue;
        }
        LayoutPlan lp = evaluate(c, p.params, p.hw, s, r.recompute);
        if (!lp.memory.fits()) {
          const double ratio = lp.memory.total / lp.memory.capacity;
          if (ratio < closest) closest = ratio, p.smallest_miss = lp;
          misses.emplace_back(ratio, s.layout.str() + ": needs " + gib(lp.memory.total) + " of " +
                                         gib(lp.memory.capacity) + " per device");
          continue;
        }
        fit.push_back(std::move(lp));
      }
    }
  }
  MYRIAD_CHECK(p.considered > 0, "plan: no layout matches the fixed degrees for ", N,
               " devices (dp*cp*pp must equal --gpus)");
  p.feasible = static_cast<int64_t>(fit.size());
  std::sort(misses.begin(), misses.end());  // the nearest misses are the informative ones
  for (size_t i = 0; i < misses.size() && i < 5; ++i) p.rejected.push_back(misses[i].second);
  std::stable_sort(fit.begin(), fit.end(), [](const LayoutPlan& a, const LayoutPlan& b) {
    return a.step.step < b.step.step;
  });
  if (static_cast<int64_t>(fit.size()) > r.top) fit.resize(r.top);
  p.ranked = std::move(fit);
  p.serve = serving_plan(c, p.params, p.hw, r.serve_context, r.serve_batch, r.serve_experts);

  if (p.params.mtp_layers_not_built > 0)
    p.notes.push_back(cat("the config has ", p.params.mtp_layers_not_built,
                          " multi-token-prediction layer(s); the engine does not build them and "
                          "no count includes them"));
  if (p.caches.admission_window >= 0)
    p.notes.push_back(
        cat("MLA admission gate on: the serving cache keeps W = ", p.caches.admission_window,
            " latents plus ", p.caches.admission_rate * 100,
            "% of older ones (the regulariser's target rate; the learned rate may "
            "differ)"));
  if (p.ranked.empty()) p.notes.push_back("no layout fits in device memory; the closest is shown");
  return p;
}

std::string format_plan(const Plan& p) {
  std::ostringstream o;
  const auto& r = p.request;
  const auto& pc = p.params;
  char line[512];
  o << "Myriad plan: " << r.model_name << " on " << r.gpus << " x " << p.hw.name << " ("
    << p.hw.description << ")\n\n";
  o << "Parameters (from the config, " << pc.num_tensors << " tensors)\n";
  std::snprintf(line, sizeof line, "  %-16s %12s %14s\n", "part", "total", "active/token");
  o << line;
  for (int i = 0; i < kNumParts; ++i) {
    if (pc.total_by_part[i] == 0) continue;
    std::snprintf(line, sizeof line, "  %-16s %12s %14s%s\n", part_name(static_cast<Part>(i)),
                  human(static_cast<double>(pc.total_by_part[i])).c_str(),
                  human(static_cast<double>(pc.active_by_part[i])).c_str(),
                  i == static_cast<int>(Part::Embedding) ? "  (a lookup: not in active)" : "");
    o << line;
  }
  std::snprintf(line, sizeof line, "  %-16s %12s %14s  (%s with the embedding)\n", "total",
                human(static_cast<double>(pc.total)).c_str(),
                human(static_cast<double>(pc.active)).c_str(),
                human(static_cast<double>(pc.active_with_embedding)).c_str());
  o << line;
  std::snprintf(line, sizeof line, "  Muon group %s, AdamW %s; one routed expert %s\n\n",
                human(static_cast<double>(pc.muon)).c_str(),
                human(static_cast<double>(pc.trainable - pc.muon)).c_str(),
                human(static_cast<double>(pc.expert_size)).c_str());
  o << line;

  const double tokens = static_cast<double>(r.seq) * static_cast<double>(p.request.batch);
  std::snprintf(line, sizeof line,
                "Training: seq %lld, batch %lld sequences (%s tokens/step), micro-batch %lld, "
                "%s, %s, ZeRO-%d\n",
                static_cast<long long>(r.seq), static_cast<long long>(p.request.batch),
                human(tokens).c_str(), static_cast<long long>(r.micro_batch),
                r.bf16 ? "bf16 + fp32 master" : "f32",
                r.optimizer == Optimizer::Muon ? "Muon" : "AdamW", r.zero);
  o << line;
  std::snprintf(line, sizeof line,
                "  forward FLOPs/token: matmul %s, MLA attention %s, KDA %s; model FLOPs/token "
                "(x3) %s\n",
                human(p.flops.matmul).c_str(), human(p.flops.attention).c_str(),
                human(p.flops.kda).c_str(), human(3 * p.flops.total()).c_str());
  o << line;
  std::snprintf(line, sizeof line, "  layouts considered %lld, fitting %lld\n\n",
                static_cast<long long>(p.considered), static_cast<long long>(p.feasible));
  o << line;

  auto table_row = [&](int rank, const LayoutPlan& lp) {
    const auto& l = lp.setup.layout;
    std::snprintf(
        line, sizeof line,
        "  %3d %5lld %5lld %4lld %4lld %5s %11s %10s %6.1f%% %10.0f %9s %9s %8.0f\n", rank,
        static_cast<long long>(l.dp), static_cast<long long>(l.ep), static_cast<long long>(l.pp),
        static_cast<long long>(l.cp), rc_name(lp.setup.recompute), gib(lp.memory.total).c_str(),
        secs(lp.step.step).c_str(), 100 * lp.step.mfu, lp.step.tokens_per_s_per_device,
        secs(lp.step.comm_exposed).c_str(), secs(lp.step.bubble).c_str(), lp.step.expert_tokens);
    o << line;
  };
  const char* header = "    # %5s %5s %4s %4s %5s %11s %10s %7s %10s %9s %9s %8s\n";
  std::snprintf(line, sizeof line, header, "dp", "ep", "pp", "cp", "recmp", "mem/device", "step",
                "MFU", "tok/s/dev", "exp.comm", "bubble", "tok/exp");
  if (!p.ranked.empty()) {
    o << "Layouts ranked by estimated step time\n" << line;
    for (size_t i = 0; i < p.ranked.size(); ++i) table_row(static_cast<int>(i + 1), p.ranked[i]);
    o << "\n";
  }
  const LayoutPlan* best = !p.ranked.empty()             ? &p.ranked.front()
                           : p.smallest_miss.has_value() ? &*p.smallest_miss
                                                         : nullptr;
  if (best) {
    const auto& m = best->memory;
    o << (p.ranked.empty() ? "Nothing fits; the closest layout: " : "Best layout: ")
      << best->setup.layout.str() << ", recompute " << rc_name(best->setup.recompute)
      << ", pipeline stage " << m.stage << "\n";
    std::snprintf(line, sizeof line,
                  "  memory/device: weights %s, grads %s, master %s, optimizer %s, activations "
                  "%s (none %s, full recompute %s), workspace %s = %s of %s usable\n",
                  gib(m.weights).c_str(), gib(m.grads).c_str(), gib(m.master).c_str(),
                  gib(m.optimizer).c_str(), gib(m.activations).c_str(),
                  gib(m.activations_none).c_str(), gib(m.activations_full).c_str(),
                  gib(m.workspace).c_str(), gib(m.total).c_str(), gib(m.capacity).c_str());
    o << line;
    const auto& st = best->step;
    std::snprintf(
        line, sizeof line,
        "  step: compute %s (per micro-batch on the slowest stage: GEMM %s, experts %s, "
        "attention %s, KDA %s, memory-bound %s), bubble %s, optimizer %s, exposed "
        "comm %s -> %s, MFU %.1f%%, %s tokens/s\n",
        secs(st.compute).c_str(), secs(st.stage.gemm).c_str(), secs(st.stage.experts).c_str(),
        secs(st.stage.attention).c_str(), secs(st.stage.kda).c_str(), secs(st.stage.memory).c_str(),
        secs(st.bubble).c_str(), secs(st.optimizer).c_str(), secs(st.comm_exposed).c_str(),
        secs(st.step).c_str(), 100 * st.mfu, human(st.tokens_per_s).c_str());
    o << line;
    o << "  communication per device and step:\n";
    for (const auto& it : best->comm.items) {
      std::snprintf(line, sizeof line, "    %-22s %10s  group %5lld %-8s %9s (exposed %s)  %s\n",
                    it.name.c_str(), bytes_str(it.bytes).c_str(), static_cast<long long>(it.group),
                    it.network ? "network" : "NVLink", secs(it.seconds).c_str(),
                    secs(it.exposed).c_str(), it.what.c_str());
      o << line;
    }
    o << "\n";
  }
  if (!p.rejected.empty()) {
    o << "Rejected (invalid ones first, then the nearest memory misses):\n";
    for (const auto& s : p.rejected) o << "  " << s << "\n";
    o << "\n";
  }

  const auto& sp = p.serve;
  std::snprintf(line, sizeof line,
                "Serving at %lld tokens of context (experts %s): weights %s; cache per sequence "
                "%s = MLA %s/token x %lld + KDA state and conv %s (all-MLA at this depth: %s)\n",
                static_cast<long long>(sp.context), sp.experts_format.c_str(),
                gib(sp.weight_bytes).c_str(), gib(sp.cache_per_seq).c_str(),
                bytes_str(sp.cache_mla_per_token).c_str(), static_cast<long long>(sp.context),
                gib(sp.cache_kda_per_seq).c_str(), gib(sp.cache_all_mla_per_seq).c_str());
  o << line;
  std::snprintf(line, sizeof line, "  %6s %12s %12s %9s %12s %12s\n", "batch", "cache",
                "devices(min)", "devices", "decode step", "tokens/s");
  o << line;
  std::vector<ServeRow> rows = sp.sweep;
  if (std::none_of(rows.begin(), rows.end(),
                   [&](const ServeRow& s) { return s.batch == sp.asked.batch; }))
    rows.push_back(sp.asked);
  std::sort(rows.begin(), rows.end(),
            [](const ServeRow& a, const ServeRow& b) { return a.batch < b.batch; });
  for (const auto& s : rows) {
    std::snprintf(line, sizeof line, "  %6lld %12s %12lld %9lld %12s %12.1f%s\n",
                  static_cast<long long>(s.batch), gib(s.cache_bytes).c_str(),
                  static_cast<long long>(s.devices_min), static_cast<long long>(s.devices),
                  secs(s.decode_step_s).c_str(), s.decode_tokens_per_s,
                  s.batch == sp.asked.batch ? "  <- asked" : "");
    o << line;
  }
  std::snprintf(line, sizeof line,
                "  prefill of one %lld-token sequence on %lld devices: %s (%s FLOPs)\n\n",
                static_cast<long long>(sp.context), static_cast<long long>(sp.asked.devices),
                secs(sp.prefill_s).c_str(), sci(sp.prefill_flops).c_str());
  o << line;
  o << "Assumptions:\n";
  for (const auto& a : assumptions(p.hw)) o << "  - " << a << "\n";
  for (const auto& n : p.notes) o << "  - " << n << "\n";
  return o.str();
}

nlohmann::json plan_json(const Plan& p) {
  using nlohmann::json;
  const auto& pc = p.params;
  json j;
  const auto& r = p.request;
  j["model"] = r.model_name;
  j["hardware"] = {{"name", p.hw.name},
                   {"description", p.hw.description},
                   {"peak_flops", p.hw.peak_flops},
                   {"gemm_flops", p.hw.gemm_flops},
                   {"mem_bytes", p.hw.mem_bytes},
                   {"usable", p.hw.usable},
                   {"mem_bw", p.hw.mem_bw},
                   {"node_size", p.hw.node_size},
                   {"link_bw", p.hw.link_bw},
                   {"net_bw", p.hw.net_bw},
                   {"a2a_link_bw", p.hw.a2a_link_bw},
                   {"a2a_net_bw", p.hw.a2a_net_bw},
                   {"attn_eff", p.hw.attn_eff},
                   {"kda_eff", p.hw.kda_eff},
                   {"sources", p.hw.sources}};
  json parts = json::object();
  for (int i = 0; i < kNumParts; ++i)
    parts[part_name(static_cast<Part>(i))] = {{"total", pc.total_by_part[i]},
                                              {"active", pc.active_by_part[i]}};
  j["params"] = {{"total", pc.total},
                 {"active", pc.active},
                 {"active_with_embedding", pc.active_with_embedding},
                 {"matmul_active", pc.matmul_active},
                 {"muon", pc.muon},
                 {"trainable", pc.trainable},
                 {"expert_size", pc.expert_size},
                 {"tensors", pc.num_tensors},
                 {"mtp_layers_not_built", pc.mtp_layers_not_built},
                 {"parts", parts}};
  j["caches"] = {{"mla_layers", p.caches.mla_layers},
                 {"kda_layers", p.caches.kda_layers},
                 {"mla_bytes_per_token", p.caches.mla_bytes_per_token},
                 {"kda_state_bytes", p.caches.kda_state_bytes},
                 {"kda_conv_bytes", p.caches.kda_conv_bytes}};
  j["training"] = {
      {"gpus", r.gpus},
      {"seq", r.seq},
      {"batch", p.request.batch},
      {"micro_batch", r.micro_batch},
      {"precision", r.bf16 ? "bf16" : "f32"},
      {"optimizer", r.optimizer == Optimizer::Muon ? "muon" : "adamw"},
      {"zero", r.zero},
      {"forward_flops_per_token",
       {{"matmul", p.flops.matmul}, {"attention", p.flops.attention}, {"kda", p.flops.kda}}},
      {"considered", p.considered},
      {"feasible", p.feasible},
      {"rejected", p.rejected}};
  auto layout_json = [](const LayoutPlan& lp) {
    const auto& l = lp.setup.layout;
    const auto& m = lp.memory;
    const auto& s = lp.step;
    json comm = json::array();
    for (const auto& it : lp.comm.items)
      comm.push_back({{"name", it.name},
                      {"what", it.what},
                      {"group", it.group},
                      {"network", it.network},
                      {"bytes", it.bytes},
                      {"seconds", it.seconds},
                      {"exposed", it.exposed}});
    return json{{"dp", l.dp},
                {"ep", l.ep},
                {"pp", l.pp},
                {"cp", l.cp},
                {"recompute", rc_name(lp.setup.recompute)},
                {"micro_batches", lp.setup.micro_batches()},
                {"memory",
                 {{"stage", m.stage},
                  {"params_local", m.params_local},
                  {"weights", m.weights},
                  {"grads", m.grads},
                  {"master", m.master},
                  {"optimizer", m.optimizer},
                  {"activations", m.activations},
                  {"activations_no_recompute", m.activations_none},
                  {"activations_full_recompute", m.activations_full},
                  {"workspace", m.workspace},
                  {"total", m.total},
                  {"capacity", m.capacity}}},
                {"step",
                 {{"tokens", s.tokens},
                  {"compute", s.compute},
                  {"bubble", s.bubble},
                  {"optimizer", s.optimizer},
                  {"comm_exposed", s.comm_exposed},
                  {"step", s.step},
                  {"mfu", s.mfu},
                  {"tokens_per_s", s.tokens_per_s},
                  {"tokens_per_s_per_device", s.tokens_per_s_per_device},
                  {"model_flops_per_token", s.model_flops_per_token},
                  {"hw_flops_per_token", s.hw_flops_per_token},
                  {"expert_tokens", s.expert_tokens},
                  {"stage_micro_batch",
                   {{"gemm", s.stage.gemm},
                    {"experts", s.stage.experts},
                    {"attention", s.stage.attention},
                    {"kda", s.stage.kda},
                    {"memory", s.stage.memory}}}}},
                {"comm", comm},
                {"comm_bytes", lp.comm.bytes}};
  };
  j["layouts"] = json::array();
  for (const auto& lp : p.ranked) j["layouts"].push_back(layout_json(lp));
  if (p.smallest_miss) j["closest_miss"] = layout_json(*p.smallest_miss);
  const auto& sp = p.serve;
  auto row = [](const ServeRow& s) {
    return json{{"batch", s.batch},
                {"cache_bytes", s.cache_bytes},
                {"devices_min", s.devices_min},
                {"devices", s.devices},
                {"decode_step_s", s.decode_step_s},
                {"decode_tokens_per_s", s.decode_tokens_per_s}};
  };
  json sweep = json::array();
  for (const auto& s : sp.sweep) sweep.push_back(row(s));
  j["serving"] = {{"context", sp.context},
                  {"experts_format", sp.experts_format},
                  {"weight_bytes", sp.weight_bytes},
                  {"expert_weight_bytes", sp.expert_weight_bytes},
                  {"cache_mla_bytes_per_token", sp.cache_mla_per_token},
                  {"cache_kda_bytes_per_sequence", sp.cache_kda_per_seq},
                  {"cache_bytes_per_sequence", sp.cache_per_seq},
                  {"cache_all_mla_bytes_per_sequence", sp.cache_all_mla_per_seq},
                  {"prefill_flops", sp.prefill_flops},
                  {"prefill_s", sp.prefill_s},
                  {"asked", row(sp.asked)},
                  {"sweep", sweep}};
  j["assumptions"] = assumptions(p.hw);
  j["notes"] = p.notes;
  return j;
}

}  // namespace myriad::plan
