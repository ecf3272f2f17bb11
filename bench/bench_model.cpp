// Whole-model training-step throughput on the CPU: a Kimi-Linear-form decoder (MODEL.md §2-§6)
// runs forward + loss (the decoder's fused linear cross-entropy) + backward on random tokens
// [B, T]; the figure is tokens per second, B*T / the median step time after the warm-up steps.
// scripts/bench_model.sh runs it side by side with tools/reference/bench_torch_cpu.py.
//
//   OMP_NUM_THREADS=2 bench_model <config.json | model dir> [--B=2] [--T=512] [--steps=8]
//                     [--warmup=2] [--seed=1] [--profile=0]
// A directory holding model.safetensors (or an index) is loaded; a config alone gets the
// MODEL.md random init. --profile=1 then times each layer type's forward + backward on its own
// (same B, T) to show where a step's time goes, with its GFLOP/s (projections counted as 6 x
// params x tokens, plus the attention core below) as a fraction of the measured peak;
// --profile=2 times the MoE FFN alone, --profile=3 the KDA attention layer alone, --profile=4 the
// MLA attention layer alone, --profile=5 the embedding, head and loss, --profile=6 the norms and
// residual additions (each over 50
// repetitions instead of 5, long enough to sample with perf).
//
// Model FLOPs per step (printed, and the basis of "fraction of peak"), forward + backward = 3x
// the forward:
//   matmuls   6 * (active params - V*d embedding table) * B*T
//   MLA       3 * B * H * 2 (d_qk + d_v) * T(T+1)/2          (causal scores and values)
//   KDA       3 * B * H * (6 T d^2 + 3 T C d + T C^2), C = 64 (MODEL.md §4.4)
// --adamw=1 makes every step a full optimiser step: zero_grad, forward + loss + backward, global
// gradient-norm clipping to 1 and AdamW (train::Optimizer with matrix_optimizer = "adamw": lr
// 1e-3, betas 0.9 / 0.95, eps 1e-8, weight decay 0.1) on every trainable tensor, as torch's
// clip_grad_norm_ + AdamW does on the other side; the FLOP count stays the model's (the
// optimiser's O(params) work is not counted). The printed loss is then the first step's (before
// any update), which both sides must agree on; loss_last is the last step's.
// --bf16=1 runs forward and backward on a bf16 working copy with fp32 master weights and
// optimiser state, as a recipe's precision = "bf16" does (train::Bf16Copy); the loss then
// differs from torch's f32 one by bf16 rounding.
// The last line is machine-readable: RESULT myriad tokens_per_s=<x> ...
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "bench_util.h"
#include "core/autograd.h"
#include "core/random.h"
#include "model/commands.h"
#include "model/decoder.h"
#include "ops/ops.h"
#include "train/mixed_precision.h"
#include "train/optim.h"

namespace myriad::bench {
namespace {

using model::Decoder;
using model::ModelConfig;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Token i of the flattened [B, T] batch: splitmix64(seed * 2^32 + i) mod V, the same in
// tools/reference/bench_torch_cpu.py, so both sides see the same batch (and, with the same
// weights, print the same loss).
Tensor tokens(int64_t B, int64_t T, int64_t V, uint64_t seed) {
  std::vector<int64_t> ids(B * T);
  for (size_t i = 0; i < ids.size(); ++i) {
    uint64_t z = (seed << 32) + i + 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    ids[i] = static_cast<int64_t>((z ^ (z >> 31)) % static_cast<uint64_t>(V));
  }
  return Tensor::from_ints(ids, {B, T});
}

bool has_weights(const std::string& path) {
  namespace fs = std::filesystem;
  return fs::is_directory(path) && (fs::exists(fs::path(path) / "model.safetensors") ||
                                    fs::exists(fs::path(path) / "model.safetensors.index.json"));
}

// Matmul parameters (2-D and up) of layer i whose names start with `part`.
double matrix_params(const ModelConfig& c, int64_t i, const std::string& part) {
  const std::string p = model::layer_prefix(i) + part;
  double n = 0;
  for (const model::ParamSpec& s : Decoder::param_specs(c))
    if (s.name.rfind(p, 0) == 0 && s.shape.size() >= 2)
      n += static_cast<double>(shape_numel(s.shape));
  return n;
}
// Forward + backward FLOPs (3x the forward) of the attention core of layer i on [B, T].
double core_flops(const ModelConfig& c, int64_t i, int64_t B, int64_t T) {
  const double Tt = static_cast<double>(T), C = 64;
  if (c.is_mla_layer(i)) {
    const double dqk = static_cast<double>(c.qk_head_dim()), dv = static_cast<double>(c.v_head_dim);
    return 3.0 * B * c.num_attention_heads * 2 * (dqk + dv) * Tt * (Tt + 1) / 2;
  }
  const double d = static_cast<double>(c.linear_attn_config.head_dim);
  return 3.0 * B * c.linear_attn_config.num_heads * (6 * Tt * d * d + 3 * Tt * C * d + Tt * C * C);
}
// Layer i's attention sublayer: projections + core.
double attn_flops(const ModelConfig& c, int64_t i, int64_t B, int64_t T) {
  return 6 * matrix_params(c, i, "self_attn.") * static_cast<double>(B * T) +
         core_flops(c, i, B, T);
}
// Layer i's FFN: the dense MLP, or router + top-k routed experts + shared experts.
double ffn_flops(const ModelConfig& c, int64_t i, int64_t B, int64_t T) {
  const double d = static_cast<double>(c.hidden_size), tokens = static_cast<double>(B * T);
  if (!c.is_moe_layer(i)) return 6 * 3 * d * static_cast<double>(c.intermediate_size) * tokens;
  const double l = static_cast<double>(c.routed_expert_hidden_size.value_or(c.hidden_size));
  const double experts = static_cast<double>(c.num_experts_per_token + c.num_shared_experts);
  return 6 *
         (d * static_cast<double>(c.num_experts) +
          experts * 3 * l * static_cast<double>(c.moe_intermediate_size)) *
         tokens;
}
// The whole step: 6 x (active params - the V x d embedding table) x tokens + every core.
double model_flops_per_step(const ModelConfig& c, int64_t B, int64_t T) {
  const double mm = static_cast<double>(model::count_params(c).active) -
                    static_cast<double>(c.vocab_size) * static_cast<double>(c.hidden_size);
  double f = 6 * mm * static_cast<double>(B * T);
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) f += core_flops(c, i, B, T);
  return f;
}

// Median seconds of `reps` calls of fn after one warm-up call.
template <class F>
double time_median(int reps, F&& fn) {
  fn();
  std::vector<double> s;
  for (int r = 0; r < reps; ++r) {
    auto t0 = Clock::now();
    fn();
    s.push_back(seconds_since(t0));
  }
  return median(s);
}

// Each layer type's forward + backward on its own, against the whole step's median time.
// only: "" for every part, else the one part to time.
void profile(Decoder& m, const Tensor& ids, double step_s, double peak, const std::string& only) {
  const ModelConfig& c = m.config();
  model::Weights& w = m.weights();
  const int64_t B = ids.size(0), T = ids.size(1), d = c.hidden_size, L = c.num_hidden_layers;
  Generator gen(7);
  // In the decoder's precision (the bf16 working copy with --bf16=1).
  const DType dt = w.get("model.norm.weight").dtype();
  const Tensor x0 = gen.normal({B, T, d}, 0, 1).to(dt), r = gen.normal({B, T, d}, 0, 1).to(dt);
  // One sublayer: fresh leaves, forward, a random projection of the output as the loss, backward.
  auto fwd_bwd = [&](auto&& forward) {
    return [&, forward] {
      w.requires_grad_(true);
      Tensor x = x0.detach().requires_grad_();
      ops::sum(ops::mul(forward(x), r)).backward();
    };
  };
  auto first = [&](auto&& pred) {
    for (int64_t i = 0; i < L; ++i)
      if (pred(i)) return i;
    return int64_t{-1};
  };
  struct Row {
    std::string name;
    int64_t count;
    double ms, flops;  // flops: forward + backward of one, 0 when not counted
  };
  std::vector<Row> rows;
  const int reps = only.empty() ? 5 : only == "norms + residuals" ? 500 : 50;
  auto add = [&](const std::string& name, int64_t count, double flops, auto&& forward) {
    if (!only.empty() && name != only) return;
    if (count > 0) rows.push_back({name, count, 1e3 * time_median(reps, fwd_bwd(forward)), flops});
  };
  auto count = [&](auto&& pred) {
    int64_t n = 0;
    for (int64_t i = 0; i < L; ++i) n += pred(i) ? 1 : 0;
    return n;
  };
  auto kda_p = [&](int64_t i) { return c.is_kda_layer(i); };
  auto mla_p = [&](int64_t i) { return c.is_mla_layer(i); };
  auto moe_p = [&](int64_t i) { return c.is_moe_layer(i); };
  auto dense_p = [&](int64_t i) { return !c.is_moe_layer(i); };
  if (int64_t i = first(kda_p); i >= 0) {
    model::KdaLayer l(c, &w, i);
    add("KDA attention", count(kda_p), attn_flops(c, i, B, T),
        [&l](const Tensor& x) { return l.forward(x); });
  }
  if (int64_t i = first(mla_p); i >= 0) {
    model::MlaLayer l(c, &w, i);
    add("MLA attention", count(mla_p), attn_flops(c, i, B, T),
        [&l](const Tensor& x) { return l.forward(x); });
  }
  if (int64_t i = first(dense_p); i >= 0) {
    model::DenseFfn l(c, &w, i);
    add("dense FFN", count(dense_p), ffn_flops(c, i, B, T),
        [&l](const Tensor& x) { return l.forward(x); });
  }
  if (int64_t i = first(moe_p); i >= 0) {
    model::Moe l(c, &w, i);
    add("MoE FFN", count(moe_p), ffn_flops(c, i, B, T),
        [&l](const Tensor& x) { return l.forward(x); });
  }
  // Per layer: the two pre-norms and residual additions.
  const Tensor& nw = w.get("model.norm.weight");
  add("norms + residuals", L, 0.0, [&](const Tensor& x) {
    Tensor h = ops::add(x, ops::rms_norm(x, nw, c.rms_norm_eps));
    return ops::add(h, ops::rms_norm(h, nw, c.rms_norm_eps));
  });
  // Embedding, final norm and the fused LM head + cross-entropy (the step's loss).
  std::vector<int64_t> tgt = ids.to_ints();
  const Tensor targets = Tensor::from_ints(tgt, {B * T});
  if (only.empty() || only == "embedding + head + loss") {
    const int64_t Bc = B, Tc = T;
    auto head = [&, Bc, Tc] {
      w.requires_grad_(true);
      Tensor h = ops::embedding(w.get("model.embed_tokens.weight"), ids);
      h = ops::rms_norm(h, nw, c.rms_norm_eps);
      ops::linear_cross_entropy(ops::reshape(h, {Bc * Tc, d}), w.get("lm_head.weight"), targets)
          .backward();
    };
    const double head_flops = 6.0 * static_cast<double>(c.vocab_size * d * B * T);
    rows.push_back({"embedding + head + loss", 1, 1e3 * time_median(reps, head), head_flops});
  }
  std::printf("\nProfile: each part's forward + backward alone (median of %d), B=%lld T=%lld\n",
              reps, static_cast<long long>(B), static_cast<long long>(T));
  std::printf("  %-26s %6s %10s %10s %7s %9s %7s\n", "part", "count", "ms each", "ms total",
              "share", "GFLOP/s", "of peak");
  double sum = 0;
  for (const Row& row : rows) {
    const double tot = row.ms * static_cast<double>(row.count);
    sum += tot;
    std::printf("  %-26s %6lld %10.2f %10.2f %6.1f%%", row.name.c_str(),
                static_cast<long long>(row.count), row.ms, tot, 100 * tot / (1e3 * step_s));
    const double gflops = row.flops / row.ms * 1e-6;
    if (row.flops > 0) std::printf(" %9.2f %6.1f%%", gflops, peak > 0 ? 100 * gflops / peak : 0.0);
    std::printf("\n");
  }
  std::printf("  %-26s %6s %10s %10.2f %6.1f%%\n", "sum of parts", "", "", sum,
              100 * sum / (1e3 * step_s));
  std::printf("  %-26s %6s %10s %10.2f\n", "whole step (median)", "", "", 1e3 * step_s);
}

}  // namespace
}  // namespace myriad::bench

int main(int argc, char** argv) {
  using namespace myriad;
  using namespace myriad::bench;
  const auto B = static_cast<int64_t>(take_flag(argc, argv, "B", "MYRIAD_BENCH_MODEL_B", 2));
  const auto T = static_cast<int64_t>(take_flag(argc, argv, "T", "MYRIAD_BENCH_MODEL_T", 512));
  const int steps = static_cast<int>(take_flag(argc, argv, "steps", "MYRIAD_BENCH_MODEL_STEPS", 8));
  const int warmup =
      static_cast<int>(take_flag(argc, argv, "warmup", "MYRIAD_BENCH_MODEL_WARMUP", 2));
  const auto seed = static_cast<uint64_t>(take_flag(argc, argv, "seed", "MYRIAD_BENCH_SEED", 1));
  const int prof =
      static_cast<int>(take_flag(argc, argv, "profile", "MYRIAD_BENCH_MODEL_PROFILE", 0));
  const bool adamw = take_flag(argc, argv, "adamw", "MYRIAD_BENCH_MODEL_ADAMW", 0) != 0;
  const bool bf16 = take_flag(argc, argv, "bf16", "MYRIAD_BENCH_MODEL_BF16", 0) != 0;
  if (argc != 2 || steps < 1) {
    std::fprintf(stderr,
                 "usage: bench_model <config.json | model dir> [--B=2] [--T=512] [--steps=8] "
                 "[--warmup=2] [--seed=1] [--profile=0] [--adamw=0] [--bf16=0]\n");
    return 2;
  }
  const std::string path = argv[1];
  try {
    const bool load = has_weights(path);
    model::Decoder m = load ? model::Decoder::load(path)
                            : model::Decoder::random(model::ModelConfig::load(path), seed);
    const model::ModelConfig& c = m.config();
    const Tensor ids = tokens(B, T, c.vocab_size, seed);
    const model::ParamCounts pc = model::count_params(c);
    std::printf(
        "bench_model: %s (%s), %lld layers (%lld MLA), d=%lld, V=%lld, %lld experts top-%lld\n",
        path.c_str(), load ? "loaded weights" : "random init",
        static_cast<long long>(c.num_hidden_layers), static_cast<long long>(c.num_mla_layers()),
        static_cast<long long>(c.hidden_size), static_cast<long long>(c.vocab_size),
        static_cast<long long>(c.num_experts), static_cast<long long>(c.num_experts_per_token));
    std::printf("  params %.2fM total, %.2fM active per token; B=%lld T=%lld, %d threads\n",
                pc.total * 1e-6, pc.active * 1e-6, static_cast<long long>(B),
                static_cast<long long>(T), omp_get_max_threads());

    std::optional<train::Optimizer> opt;  // with bf16 alone: only for zero_grad
    std::optional<train::Bf16Copy> copy;
    if (adamw || bf16) {
      m.weights().requires_grad_(true);
      train::NamedParams params;
      for (const auto& sp : m.weights().specs())
        if (sp.trainable) params.emplace_back(sp.name, m.weights().get(sp.name));
      train::OptimConfig oc;
      oc.matrix_optimizer = "adamw";
      oc.lr = 1e-3;
      opt.emplace(std::move(params), oc);
      if (bf16) copy.emplace(m), copy->attach(*opt);
    }
    double loss = 0, first_loss = 0;
    std::vector<double> times, opt_times;  // opt_times: gradient hand-over, clip, AdamW, refresh
    for (int s = 0; s < warmup + steps; ++s) {
      auto t0 = Clock::now();
      if (opt)
        opt->zero_grad();
      else
        m.weights().requires_grad_(true);  // fresh leaves, last step's gradients dropped
      Tensor l = (copy ? copy->decoder() : m).loss(ids);
      l.backward();
      const auto t1 = Clock::now();
      if (copy) copy->accumulate_grads();
      if (adamw) {
        opt->clip_grad_norm();
        opt->step(opt->config().lr);
        if (copy) copy->refresh_buffers();  // the optimizer wrote the copy's weights
      }
      loss = l.item();
      if (s == 0) first_loss = loss;
      const double dt = seconds_since(t0);
      if (s >= warmup) times.push_back(dt), opt_times.push_back(seconds_since(t1));
      std::printf("  step %2d%s %8.1f ms  loss %.6f\n", s, s < warmup ? " (warm-up)" : "          ",
                  1e3 * dt, loss);
    }
    const double step_s = median(times);
    const double tokens = static_cast<double>(B * T);
    const double tps = tokens / step_s;
    const double flops = model_flops_per_step(c, B, T);
    const double gflops = flops / step_s * 1e-9;
    const double peak = measured_peak_gflops(bf16);
    std::printf("  median step %.1f ms (min %.1f, max %.1f) -> %.0f tokens/s\n", 1e3 * step_s,
                1e3 * *std::min_element(times.begin(), times.end()),
                1e3 * *std::max_element(times.begin(), times.end()), tps);
    std::printf(
        "  model %.2f GFLOP/step -> %.2f GFLOP/s; measured %s peak (%s) %.1f GFLOP/s (%.1f%%)\n",
        flops * 1e-9, gflops, bf16 ? "bf16" : "f32", peak_method(bf16), peak,
        peak > 0 ? 100 * gflops / peak : 0.0);
    if (copy || adamw)
      std::printf("  of which after the backward (%s%s): median %.1f ms\n",
                  copy ? "bf16 gradients to the master" : "",
                  adamw ? (copy ? ", clip, AdamW writing the copy, buffers" : "clip, AdamW") : "",
                  1e3 * median(opt_times));
    if (prof)
      profile(copy ? copy->decoder() : m, ids, step_s, peak,
              prof == 2   ? "MoE FFN"
              : prof == 3 ? "KDA attention"
              : prof == 4 ? "MLA attention"
              : prof == 5 ? "embedding + head + loss"
              : prof == 6 ? "norms + residuals"
                          : "");
    std::printf(
        "RESULT myriad tokens_per_s=%.1f step_ms=%.2f step_min_ms=%.2f B=%lld T=%lld steps=%d "
        "threads=%d loss=%.6f loss_last=%.6f optimizer=%s precision=%s flop_per_token=%.6g "
        "gflops=%.3f "
        "peak_gflops=%.2f frac_peak=%.4f\n",
        tps, 1e3 * step_s, 1e3 * *std::min_element(times.begin(), times.end()),
        static_cast<long long>(B), static_cast<long long>(T), steps, omp_get_max_threads(),
        adamw ? first_loss : loss, loss, adamw ? "adamw" : "none", bf16 ? "bf16" : "f32",
        flops / tokens, gflops, peak, peak > 0 ? gflops / peak : 0.0);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_model: %s\n", e.what());
    return 1;
  }
  return 0;
}
