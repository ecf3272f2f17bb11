// Agentic RL post-training: see rl.h.
#include "train/rl.h"

#include <unistd.h>

#include <toml++/toml.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>

#include "core/autograd.h"
#include "core/error.h"
#include "ops/cross_entropy.h"
#include "ops/elementwise.h"
#include "ops/matmul.h"
#include "ops/reduce.h"
#include "ops/shape.h"
#include "ops/softmax.h"
#include "train/checkpoint.h"
#include "train/events.h"
#include "train/report.h"
#include "train/signals.h"
#include "train/toml_section.h"
#include "train/trainer.h"

namespace myriad::train {
namespace fs = std::filesystem;
using json = nlohmann::json;
using agent::Trajectory;
using Clock = std::chrono::steady_clock;

namespace {

using agent::mix_seed;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// The longest trajectory of batch[b0, b1).
size_t longest(const std::vector<Trajectory>& batch, size_t b0, size_t b1) {
  size_t T = 0;
  for (size_t i = b0; i < b1; ++i) T = std::max(T, batch[i].tokens.size());
  return T;
}

// batch[b0, b1) as [b1 - b0, T] token ids, padded with <pad>.
std::vector<int64_t> padded_ids(const std::vector<Trajectory>& batch, size_t b0, size_t b1,
                                size_t T) {
  std::vector<int64_t> ids((b1 - b0) * T, 3);
  for (size_t i = b0; i < b1; ++i)
    std::copy(batch[i].tokens.begin(), batch[i].tokens.end(), ids.begin() + (i - b0) * T);
  return ids;
}

}  // namespace

// ---- Recipe ----

RlRecipe RlRecipe::parse(std::string_view text, std::string_view source) {
  using namespace toml_recipe;  // NOLINT
  toml::table root;
  try {
    root = toml::parse(text, source);
  } catch (const toml::parse_error& e) {
    std::ostringstream os;
    os << e;
    throw Error(cat("rl recipe: ", os.str()));
  }
  RlRecipe r;
  r.text = std::string(text);
  r.optimizer.matrix_optimizer = "adamw";
  r.optimizer.lr = 1e-4;
  r.optimizer.weight_decay = 0.0;
  Section top(&root, "");
  for (const char* t :
       {"model", "task", "advantage", "loss", "optimizer", "train", "eval", "checkpoint", "log"})
    top.node(t);
  top.get("seed", r.seed);
  top.finish();

  Section m(subtable(root, "model"), "model.");
  m.get("init", r.init);
  m.finish();

  Section t(subtable(root, "task"), "task.");
  t.get("envs", r.envs);
  t.get("tasks_per_step", r.tasks_per_step);
  t.get("group_size", r.group_size);
  t.get("temperature", r.temperature);
  t.get("max_new_tokens_per_turn", r.limits.max_new_tokens_per_turn);
  t.get("max_total_tokens", r.limits.max_total_tokens);
  t.get("max_tool_tokens", r.limits.max_tool_tokens);
  t.finish();
  MYRIAD_CHECK(!r.envs.empty(), "task.envs: name at least one environment");
  for (const std::string& e : r.envs) {
    try {
      (void)agent::make_environment(e);
    } catch (const std::invalid_argument& ex) {
      throw Error(cat("task.envs: ", ex.what()));
    }
  }
  t.check_positive("tasks_per_step", static_cast<double>(r.tasks_per_step));
  MYRIAD_CHECK(r.group_size >= 2, "task.group_size: must be at least 2, got ", r.group_size);
  MYRIAD_CHECK(r.temperature > 0, "task.temperature: must be positive, got ", r.temperature);
  t.check_positive("max_new_tokens_per_turn",
                   static_cast<double>(r.limits.max_new_tokens_per_turn));
  t.check_positive("max_total_tokens", static_cast<double>(r.limits.max_total_tokens));
  t.check_positive("max_tool_tokens", static_cast<double>(r.limits.max_tool_tokens));

  Section a(subtable(root, "advantage"), "advantage.");
  a.get("std_norm", r.advantage.std_norm);
  a.get("lambda_process", r.advantage.lambda_process);
  a.get("gamma_turn", r.advantage.gamma_turn);
  a.get("estimator", r.estimator);
  a.get("gae_gamma", r.gae_gamma);
  a.get("gae_lambda", r.gae_lambda);
  a.get("value_lr_scale", r.value_lr_scale);
  a.get("value_clip", r.value_clip);
  a.finish();
  MYRIAD_CHECK(r.advantage.lambda_process >= 0, "advantage.lambda_process: must be >= 0");
  one_of("advantage.estimator", r.estimator, {"group", "gae"});
  MYRIAD_CHECK(r.gae_gamma > 0 && r.gae_gamma <= 1, "advantage.gae_gamma: must be in (0, 1]");
  MYRIAD_CHECK(r.gae_lambda >= 0 && r.gae_lambda <= 1, "advantage.gae_lambda: must be in [0, 1]");
  MYRIAD_CHECK(r.value_lr_scale > 0, "advantage.value_lr_scale: must be positive");
  MYRIAD_CHECK(r.value_clip > 0, "advantage.value_clip: must be positive");

  Section l(subtable(root, "loss"), "loss.");
  l.get("ratio_level", r.loss.ratio_level);
  l.get("eps_low", r.loss.eps_low);
  l.get("eps_high", r.loss.eps_high);
  l.get("dual_clip", r.loss.dual_clip);
  l.get("tis_cap", r.loss.tis_cap);
  l.get("tis_mode", r.loss.tis_mode);
  l.get("kl_beta", r.loss.kl_beta);
  l.get("loss_agg", r.loss.loss_agg);
  l.get("truncation", r.truncation);
  l.get("truncation_reward", r.truncation_reward);
  l.get("max_staleness", r.max_staleness);
  l.get("staleness_mode", r.staleness_mode);
  l.finish();
  one_of("loss.ratio_level", r.loss.ratio_level, {"token", "sequence"});
  one_of("loss.tis_mode", r.loss.tis_mode, {"truncate", "mask"});
  one_of("loss.loss_agg", r.loss.loss_agg, {"token_mean", "constant", "seq_mean"});
  one_of("loss.truncation", r.truncation, {"mask", "penalty"});
  one_of("loss.staleness_mode", r.staleness_mode, {"reject", "downweight"});
  MYRIAD_CHECK(r.loss.eps_low > 0 && r.loss.eps_low < 1, "loss.eps_low: must be in (0, 1)");
  MYRIAD_CHECK(r.loss.eps_high > 0, "loss.eps_high: must be positive");
  MYRIAD_CHECK(r.loss.dual_clip == 0 || r.loss.dual_clip > 1,
               "loss.dual_clip: 0 (off) or greater than 1");
  MYRIAD_CHECK(r.loss.tis_cap >= 0, "loss.tis_cap: must be >= 0 (0: off)");
  MYRIAD_CHECK(r.loss.kl_beta >= 0, "loss.kl_beta: must be >= 0");
  MYRIAD_CHECK(r.max_staleness >= 0, "loss.max_staleness: must be >= 0");

  read_optimizer(root, r.optimizer);

  Section tr(subtable(root, "train"), "train.");
  tr.get("steps", r.steps);
  tr.get("minibatches", r.minibatches);
  tr.get("dynamic_sampling", r.dynamic_sampling);
  tr.get("max_sampling_rounds", r.max_sampling_rounds);
  tr.get("micro_batch", r.micro_batch);
  tr.get("engine_batch", r.engine_batch);
  tr.get("segment_len", r.segment_len);
  tr.get("recompute", r.recompute);
  tr.finish();
  tr.check_positive("steps", static_cast<double>(r.steps));
  tr.check_positive("minibatches", static_cast<double>(r.minibatches));
  tr.check_positive("max_sampling_rounds", static_cast<double>(r.max_sampling_rounds));
  tr.check_positive("micro_batch", static_cast<double>(r.micro_batch));
  tr.check_positive("engine_batch", static_cast<double>(r.engine_batch));
  MYRIAD_CHECK(r.segment_len >= 0, "train.segment_len: must be >= 0 (0: one pass)");

  Section e(subtable(root, "eval"), "eval.");
  e.get("every", r.eval_every);
  e.get("tasks", r.eval_tasks);
  e.get("k", r.eval_k);
  e.get("split", r.eval_split);
  e.finish();
  MYRIAD_CHECK(r.eval_every >= 0, "eval.every: must be >= 0 (0: only at the start and end)");
  e.check_positive("tasks", static_cast<double>(r.eval_tasks));
  e.check_positive("k", static_cast<double>(r.eval_k));
  one_of("eval.split", r.eval_split, {"heldout", "train"});

  Section c(subtable(root, "checkpoint"), "checkpoint.");
  c.get("dir", r.checkpoint_dir);
  c.get("every", r.checkpoint_every);
  c.get("keep_last", r.keep_last);
  c.finish();
  Section lg(subtable(root, "log"), "log.");
  lg.get("jsonl", r.log_jsonl);
  lg.get("tensorboard", r.log_tensorboard);
  lg.get("html", r.log_html);
  lg.finish();
  return r;
}

RlRecipe RlRecipe::load(const std::string& path) {
  std::ifstream f(path);
  MYRIAD_CHECK(f, "cannot read RL recipe ", path);
  std::stringstream ss;
  ss << f.rdbuf();
  return parse(ss.str(), path);
}

// ---- Log-probs ----

std::vector<std::vector<double>> token_logprobs(const model::Decoder& dec,
                                                const std::vector<Trajectory>& batch,
                                                int64_t micro_batch, std::vector<double>* entropy,
                                                std::vector<std::vector<float>>* hidden) {
  NoGradGuard ng;
  std::vector<std::vector<double>> out(batch.size());
  if (entropy) entropy->assign(batch.size(), 0.0);
  if (hidden) hidden->assign(batch.size(), {});
  for (size_t b0 = 0; b0 < batch.size(); b0 += static_cast<size_t>(micro_batch)) {
    const size_t b1 = std::min(batch.size(), b0 + static_cast<size_t>(micro_batch));
    const size_t T = longest(batch, b0, b1);
    const auto M = static_cast<int64_t>(b1 - b0);
    const Tensor x = Tensor::from_ints(padded_ids(batch, b0, b1, T), {M, static_cast<int64_t>(T)});
    const model::ForwardOutput f = dec.forward(x, nullptr, {.logits = true});
    const std::vector<double> lp = ops::log_softmax(f.logits_BTV, -1).to_doubles();
    const auto V = static_cast<size_t>(f.logits_BTV.size(-1));
    if (hidden) {
      const std::vector<double> h = f.normed_BTD.to_doubles();
      const auto d = static_cast<size_t>(f.normed_BTD.size(-1));
      for (size_t i = b0; i < b1; ++i) {
        const size_t n = batch[i].tokens.size() * d;
        const double* src = &h[(i - b0) * T * d];
        (*hidden)[i].assign(src, src + n);
      }
    }
    for (size_t i = b0; i < b1; ++i) {
      const Trajectory& tr = batch[i];
      std::vector<double>& o = out[i];
      o.assign(tr.tokens.size(), std::nan(""));
      double ent = 0;
      int64_t n = 0;
      for (size_t t = 1; t < tr.tokens.size(); ++t) {
        const double* row = &lp[((i - b0) * T + t - 1) * V];
        o[t] = row[static_cast<size_t>(tr.tokens[t])];
        if (entropy && tr.loss_mask[t]) {
          for (size_t v = 0; v < V; ++v) ent -= std::exp(row[v]) * row[v];
          ++n;
        }
      }
      if (entropy) (*entropy)[i] = n ? ent / static_cast<double>(n) : 0.0;
    }
  }
  return out;
}

void policy_backward(const model::Decoder& dec, const std::vector<Trajectory>& batch,
                     const std::vector<std::vector<double>>& grad, double weight,
                     int64_t micro_batch, int64_t segment_len, bool recompute) {
  const Tensor& head = dec.weights().get(
      dec.weights().contains("lm_head.weight") ? "lm_head.weight" : "model.embed_tokens.weight");
  const int64_t d = dec.config().hidden_size;
  for (size_t b0 = 0; b0 < batch.size(); b0 += static_cast<size_t>(micro_batch)) {
    const size_t b1 = std::min(batch.size(), b0 + static_cast<size_t>(micro_batch));
    size_t T = longest(batch, b0, b1);
    // Segments need T to be a multiple of the segment length: pad (weight 0).
    const bool seg = segment_len > 0 && static_cast<int64_t>(T) > segment_len;
    if (seg)
      T = (T + static_cast<size_t>(segment_len) - 1) / static_cast<size_t>(segment_len) *
          static_cast<size_t>(segment_len);
    const auto M = static_cast<int64_t>(b1 - b0);
    const size_t N = static_cast<size_t>(M) * T;
    const std::vector<int64_t> ids = padded_ids(batch, b0, b1, T);
    std::vector<int64_t> labels(N, ops::kIgnoreIndex);
    std::vector<double> pos(N, 0.0), neg(N, 0.0);
    double sp = 0, sn = 0;
    for (size_t i = b0; i < b1; ++i)
      for (size_t t = 0; t + 1 < batch[i].tokens.size(); ++t) {
        const size_t at = (i - b0) * T + t;
        labels[at] = batch[i].tokens[t + 1];
        const double c = -grad[i][t + 1] * weight;
        if (c > 0) pos[at] = c, sp += c;
        if (c < 0) neg[at] = -c, sn += -c;
      }
    if (sp == 0 && sn == 0) continue;
    const Shape BT = {M, static_cast<int64_t>(T)};
    const Tensor x = Tensor::from_ints(ids, BT);
    const Tensor y = Tensor::from_ints(labels, BT);
    if (seg) {
      // Through the segment carry (KDA state and MLA latents, exact gradients), segment by
      // segment (the memory of one), one sign at a time.
      if (sp > 0)
        Trainer::segmented_backward(dec, x, y, segment_len, Tensor::from_doubles(pos, BT), sp,
                                    recompute);
      if (sn > 0)
        Trainer::segmented_backward(dec, x, y, segment_len, Tensor::from_doubles(neg, BT), -sn,
                                    recompute);
      continue;
    }
    const model::ForwardOutput f =
        dec.forward(x, nullptr, {.logits = false, .recompute = recompute});
    const Tensor h = ops::reshape(f.normed_BTD, {static_cast<int64_t>(N), d});
    const Tensor yN = ops::reshape(y, {static_cast<int64_t>(N)});
    Tensor loss;
    if (sp > 0)
      loss = ops::mul(ops::linear_cross_entropy(
                          h, head, yN, 1024, Tensor::from_doubles(pos, {static_cast<int64_t>(N)})),
                      sp);
    if (sn > 0) {
      const Tensor l =
          ops::mul(ops::linear_cross_entropy(h, head, yN, 1024,
                                             Tensor::from_doubles(neg, {static_cast<int64_t>(N)})),
                   -sn);
      loss = loss.defined() ? ops::add(loss, l) : l;
    }
    loss.backward();
  }
}

// ---- Evaluation ----

json AgentEval::to_json() const {
  return {{"env", env},
          {"tasks", tasks},
          {"k", k},
          {"pass@1", pass1},
          {"pass@1_ci95", pass1_ci},
          {"pass@k", passk},
          {"pass@k_lo", passk_lo},
          {"pass@k_hi", passk_hi},
          {"greedy_pass@1", greedy},
          {"greedy_solved", greedy_solved},
          {"mean_reward", mean_reward},
          {"tool_call_rate", tool_call_rate},
          {"tool_error_rate", tool_error_rate},
          {"mean_turns", mean_turns},
          {"response_tokens", response_tokens},
          {"truncated", truncated}};
}

AgentEval evaluate_agent(infer::Engine& engine, const data::Tokenizer& tok,
                         const serve::ChatTemplate& tmpl, const std::string& env, int64_t tasks,
                         int64_t k, double temperature, const agent::EpisodeLimits& limits,
                         uint64_t seed, bool greedy, std::vector<Trajectory>* samples,
                         bool train_split) {
  const uint64_t base = train_split ? 0 : agent::kHeldoutSeedBase;
  AgentEval ev;
  ev.env = env, ev.tasks = tasks, ev.k = k;
  std::vector<agent::RolloutTask> rt;
  for (int64_t i = 0; i < tasks; ++i)
    for (int64_t j = 0; j < k; ++j)
      rt.push_back({env, base + static_cast<uint64_t>(i), static_cast<uint64_t>(i),
                    static_cast<uint64_t>(i)});
  agent::RolloutConfig rc;
  rc.limits = limits, rc.temperature = temperature, rc.seed = mix_seed(seed, 0xe7a1);
  const std::vector<Trajectory> all = agent::rollout(engine, tok, tmpl, rt, rc);
  double p1 = 0, p1sq = 0, calls = 0, errors = 0, episodes_with_call = 0;
  int64_t any_n = 0;
  for (int64_t i = 0; i < tasks; ++i) {
    int64_t c = 0;
    for (int64_t j = 0; j < k; ++j) {
      const Trajectory& t = all[static_cast<size_t>(i * k + j)];
      c += t.solved ? 1 : 0;
      ev.mean_reward += t.R;
      calls += static_cast<double>(t.tool_calls);
      errors += static_cast<double>(t.tool_errors);
      episodes_with_call += t.tool_calls > 0 ? 1 : 0;
      ev.mean_turns += static_cast<double>(t.assistant_turns());
      for (uint8_t m : t.loss_mask) ev.response_tokens += m;
      ev.truncated += t.truncated ? 1 : 0;
    }
    const double p = static_cast<double>(c) / static_cast<double>(k);
    p1 += p, p1sq += p * p;
    any_n += c > 0 ? 1 : 0;
  }
  const auto n = static_cast<double>(tasks), nk = n * static_cast<double>(k);
  ev.pass1 = p1 / n;
  const double var = tasks > 1 ? (p1sq - n * ev.pass1 * ev.pass1) / (n - 1) : 0;
  ev.pass1_ci = 1.96 * std::sqrt(std::max(0.0, var) / n);
  ev.passk = static_cast<double>(any_n) / n;
  const double z = 1.96, den = 1 + z * z / n;
  const double centre = (ev.passk + z * z / (2 * n)) / den;
  const double half = z * std::sqrt(ev.passk * (1 - ev.passk) / n + z * z / (4 * n * n)) / den;
  ev.passk_lo = std::max(0.0, centre - half), ev.passk_hi = std::min(1.0, centre + half);
  ev.mean_reward /= nk;
  ev.tool_call_rate = episodes_with_call / nk;
  ev.tool_error_rate = calls > 0 ? errors / calls : 0.0;
  ev.mean_turns /= nk;
  ev.response_tokens /= nk;
  ev.truncated /= nk;
  if (greedy) {
    std::vector<agent::RolloutTask> g;
    for (int64_t i = 0; i < tasks; ++i)
      g.push_back({env, base + static_cast<uint64_t>(i), static_cast<uint64_t>(i),
                   static_cast<uint64_t>(i)});
    rc.temperature = 0;
    int64_t solved = 0;
    for (const Trajectory& t : agent::rollout(engine, tok, tmpl, g, rc)) {
      solved += t.solved;
      ev.greedy_solved.push_back(t.solved ? 1 : 0);
      std::vector<std::string> texts;
      for (const agent::TurnSpan& sp : t.turns)
        if (sp.role == "assistant") {
          std::vector<int32_t> ids(t.tokens.begin() + sp.start, t.tokens.begin() + sp.end);
          if (!ids.empty() && ids.back() == t.tokens[static_cast<size_t>(sp.end - 1)] &&
              !sp.truncated)
            ids.pop_back();  // the end marker
          texts.push_back(tok.decode(ids));
        }
      ev.greedy_texts.push_back(std::move(texts));
    }
    ev.greedy = static_cast<double>(solved) / n;
  }
  if (samples) *samples = all;
  return ev;
}

// ---- Trainer ----

struct RlTrainer::Impl {
  RlRecipe r;
  fs::path out;
  std::optional<data::Tokenizer> tok;
  std::optional<model::Decoder> dec, ref;
  std::optional<Optimizer> opt;
  // PPO + GAE: the value head and its optimiser.
  Tensor value_w, value_b;  // [1, d], [1]
  std::optional<Optimizer> value_opt;
  std::unique_ptr<infer::Engine> engine;
  serve::ChatTemplate tmpl;
  std::optional<CheckpointManager> ckpt;
  std::optional<RunReport> report;
  std::optional<EventWriter> events;
  std::vector<RlStepRecord> hist;
  std::vector<AgentEval> evs;
  int64_t step = 0, last_saved = -1, stop_at = -1;
  uint64_t version = 0;  // optimiser steps taken: the policy version
  bool quiet = false, tty = false;
  double wall_base = 0;
  Clock::time_point t_start = Clock::now();

  double wall() const { return wall_base + seconds_since(t_start); }

  void setup() {
    fs::create_directories(out);
    tok.emplace(data::Tokenizer::load((fs::path(r.init) / "tokenizer.model").string()));
    tmpl = serve::ChatTemplate::from_model_dir(r.init);
    dec.emplace(model::Decoder::load(r.init));
    dec->weights().requires_grad_(true);  // replaces the tensors: before the engine and optimiser
    opt.emplace(Trainer::optimizer_params(*dec), r.optimizer);
    if (r.loss.kl_beta > 0) ref.emplace(model::Decoder::load(r.init));
    if (r.estimator == "gae") {
      value_w = Tensor::zeros({1, dec->config().hidden_size}).requires_grad_();
      value_b = Tensor::zeros({1}).requires_grad_();
      OptimConfig vc = r.optimizer;
      vc.matrix_optimizer = "adamw", vc.weight_decay = 0;
      value_opt.emplace(NamedParams{{"value_head.weight", value_w}, {"value_head.bias", value_b}},
                        vc);
    }
    infer::EngineConfig ec;
    ec.max_batch = r.engine_batch;
    ec.prefix_cache_entries = 0;  // cached prefix states would outlive the weights they came from
    ec.max_context = r.limits.max_total_tokens + 1;
    ec.block_tokens = 64;
    engine = std::make_unique<infer::Engine>(*dec, *tok, ec);
    ckpt.emplace((out / r.checkpoint_dir).string(), r.keep_last);
    if (r.log_jsonl || r.log_html) report.emplace(out.string());
    if (r.log_tensorboard) events.emplace((out / "tensorboard").string());
    fs::create_directories(out / "rollouts");
    tty = isatty(fileno(stdout)) != 0;
    // The model directory the RL run exports carries the same template and tokenizer.
    const fs::path t = fs::path(r.init) / "chat_template.txt";
    if (fs::exists(t))
      fs::copy_file(t, out / "chat_template.txt", fs::copy_options::overwrite_existing);
    fs::copy_file(fs::path(r.init) / "tokenizer.model", out / "tokenizer.model",
                  fs::copy_options::overwrite_existing);
  }

  void log(int64_t s, const std::map<std::string, double>& v) {
    if (report) report->scalars(s, v);
    if (events) events->scalars(s, v);
  }

  uint64_t weights_hash() const {
    uint64_t h = 0xcbf29ce484222325ull;
    for (const auto& [name, t] : dec->weights().tensors()) {
      const std::vector<double> v = t.to_doubles();
      for (double x : v) {
        const auto f = static_cast<float>(x);
        uint32_t u;
        std::memcpy(&u, &f, 4);
        for (int b = 0; b < 4; ++b) h = (h ^ ((u >> (8 * b)) & 0xff)) * 0x100000001b3ull;
      }
    }
    return h;
  }

  TrainState state() const {
    TrainState s;
    s.step = step;
    s.model = dec->weights().tensors();
    s.optimizer = opt->state_dict();
    if (value_opt) {
      s.optimizer["value/head.weight"] = value_w.detach().clone();
      s.optimizer["value/head.bias"] = value_b.detach().clone();
      for (const auto& [k, v] : value_opt->state_dict()) s.optimizer["value/opt/" + k] = v;
    }
    s.rng_seed = r.seed;
    s.rng_offset = static_cast<uint64_t>(step);
    s.recipe = r.text;
    s.extra["config"] = dec->config().to_json();
    s.extra["version"] = version;
    s.extra["wall_seconds"] = wall();
    json e = json::array();
    for (const AgentEval& x : evs) e.push_back(x.to_json());
    s.extra["evals"] = e;
    json h = json::array();
    for (const RlStepRecord& x : hist)
      h.push_back({x.step, x.mean_reward, x.solved, x.loss, x.grad_norm, x.clip_fraction, x.kl,
                   x.groups_kept, x.groups_dropped, x.weights_hash});
    s.extra["history"] = h;
    return s;
  }

  void save() {
    if (last_saved == step) return;
    ckpt->save(state());
    last_saved = step;
  }

  void restore(const TrainState& s) {
    NoGradGuard ng;
    for (const auto& [name, t] : s.model) {
      Tensor dst = dec->weights().get(dec->weights().canonical(name));
      dst.copy_(t);
    }
    std::map<std::string, Tensor> actor, critic;
    for (const auto& [k, v] : s.optimizer) {
      if (k.rfind("value/opt/", 0) == 0)
        critic[k.substr(10)] = v;
      else if (k.rfind("value/", 0) != 0)
        actor[k] = v;
    }
    opt->load_state_dict(actor);
    if (value_opt) {
      value_w.copy_(s.optimizer.at("value/head.weight"));
      value_b.copy_(s.optimizer.at("value/head.bias"));
      value_opt->load_state_dict(critic);
    }
    step = s.step;
    last_saved = s.step;
    version = s.extra.at("version").get<uint64_t>();
    wall_base = s.extra.value("wall_seconds", 0.0);
    evs.clear();
    for (const json& x : s.extra.at("evals")) {
      AgentEval a;
      const auto d = [&](const char* k) { return x.at(k).get<double>(); };
      a.env = x.at("env").get<std::string>();
      a.tasks = x.at("tasks").get<int64_t>(), a.k = x.at("k").get<int64_t>();
      a.pass1 = d("pass@1"), a.pass1_ci = d("pass@1_ci95"), a.passk = d("pass@k");
      a.passk_lo = d("pass@k_lo"), a.passk_hi = d("pass@k_hi");
      a.greedy = d("greedy_pass@1"), a.mean_reward = d("mean_reward");
      a.tool_call_rate = d("tool_call_rate"), a.tool_error_rate = d("tool_error_rate");
      a.mean_turns = d("mean_turns"), a.response_tokens = d("response_tokens");
      a.truncated = d("truncated");
      evs.push_back(a);
    }
    hist.clear();
    for (const json& x : s.extra.at("history"))
      hist.push_back({x[0].get<int64_t>(), x[1].get<double>(), x[2].get<double>(),
                      x[3].get<double>(), x[4].get<double>(), x[5].get<double>(),
                      x[6].get<double>(), x[7].get<int64_t>(), x[8].get<int64_t>(),
                      x[9].get<uint64_t>()});
  }

  // Held-out evaluation of every environment at the current step.
  void evaluate() {
    for (const std::string& env : r.envs) {
      const auto t0 = Clock::now();
      std::vector<Trajectory> samples;
      AgentEval ev = evaluate_agent(*engine, *tok, tmpl, env, r.eval_tasks, r.eval_k, r.temperature,
                                    r.limits, r.seed, true, &samples, r.eval_split == "train");
      evs.push_back(ev);
      const std::string p = "eval/" + env + "/";
      log(step, {{p + "pass@1", ev.pass1},
                 {p + "pass@" + std::to_string(r.eval_k), ev.passk},
                 {p + "greedy_pass@1", ev.greedy},
                 {p + "mean_reward", ev.mean_reward},
                 {p + "tool_call_rate", ev.tool_call_rate},
                 {p + "tool_error_rate", ev.tool_error_rate},
                 {p + "mean_turns", ev.mean_turns},
                 {p + "response_tokens", ev.response_tokens}});
      if (!quiet)
        std::printf(
            "%s[eval step %lld] %s: pass@1 %.3f ± %.3f  pass@%lld %.3f [%.3f, %.3f]  greedy %.3f  "
            "reward %.3f  tool calls %.2f  tool errors %.2f  turns %.2f  (%.0f s)\n",
            tty ? "\n" : "", static_cast<long long>(step), env.c_str(), ev.pass1, ev.pass1_ci,
            static_cast<long long>(r.eval_k), ev.passk, ev.passk_lo, ev.passk_hi, ev.greedy,
            ev.mean_reward, ev.tool_call_rate, ev.tool_error_rate, ev.mean_turns,
            seconds_since(t0));
      write_trajectories_html(env, samples);
    }
    std::ofstream f(out / "eval.json", std::ios::trunc);
    json all = json::array();
    for (const AgentEval& e : evs) all.push_back(e.to_json());
    f << all.dump(1) << "\n";
  }

  // A few held-out episodes, tokens coloured by who wrote them, turn rewards beside them.
  void write_trajectories_html(const std::string& env, const std::vector<Trajectory>& samples) {
    std::ofstream f(out / ("trajectories-" + env + ".html"), std::ios::trunc);
    f << "<!doctype html><meta charset=utf-8><title>" << env << " trajectories, step " << step
      << "</title><style>body{font-family:sans-serif;max-width:70em;margin:auto}"
         "pre{white-space:pre-wrap;border:1px solid #ccc;padding:.5em}"
         ".p{color:#888}.a{background:#cfc}.t{background:#ddf}.e{background:#ffd}"
         ".x{background:#fcc}</style><h1>"
      << env << ": held-out episodes at step " << step
      << "</h1><p>Green: sampled by the policy (loss mask 1); blue: tool result; yellow: "
         "environment observation; grey: prompt and template tokens (mask 0). Red: an assistant "
         "turn cut by its budget.</p>";
    const size_t n = std::min<size_t>(samples.size(), 8);
    for (size_t i = 0; i < n; ++i) {
      const Trajectory& t = samples[i * std::max<size_t>(1, samples.size() / n)];
      f << "<h3>task " << t.task_id << ": R = " << t.R << (t.solved ? " (solved)" : "")
        << ", turn rewards [";
      for (size_t k = 0; k < t.r_turn.size(); ++k) f << (k ? ", " : "") << t.r_turn[k];
      f << "]" << (t.truncated ? ", truncated (" + t.truncation_reason + ")" : "") << "</h3><pre>";
      for (const agent::TurnSpan& s : t.turns) {
        const char* cls = s.role == "assistant" ? (s.truncated ? "x" : "a")
                          : s.role == "tool"    ? "t"
                          : s.role == "env"     ? "e"
                                                : "p";
        const std::vector<int32_t> ids(t.tokens.begin() + s.start, t.tokens.begin() + s.end);
        f << "<span class=" << cls << ">" << html_escape(tok->decode(ids)) << "</span>";
      }
      f << "</pre>";
    }
  }

  // V(t) = w · h_{t-1} + b: the value of the state in which token t is chosen.
  std::vector<double> values(const std::vector<float>& h, size_t T) const {
    const std::vector<double> w = value_w.to_doubles();
    const double b = value_b.item();
    const size_t d = w.size();
    std::vector<double> v(T, 0.0);
    for (size_t t = 1; t < T; ++t) {
      double acc = b;
      for (size_t j = 0; j < d; ++j) acc += w[j] * static_cast<double>(h[(t - 1) * d + j]);
      v[t] = acc;
    }
    return v;
  }

  // §7.5: GAE over each sample's mask-1 tokens, then whitened over the batch's mask-1 tokens.
  void gae_advantages(const std::vector<rl::Sample>& samples,
                      const std::vector<std::vector<float>>& hid,
                      std::vector<std::vector<double>>& adv,
                      std::vector<std::vector<double>>& v_old,
                      std::vector<std::vector<double>>& returns) const {
    double sum = 0, sq = 0, n = 0;
    for (size_t i = 0; i < samples.size(); ++i) {
      v_old.push_back(values(hid[i], samples[i].mask.size()));
      rl::Sample s = samples[i];
      s.mask[0] = 0;
      const rl::Gae g = rl::gae(s, v_old.back(), r.gae_gamma, r.gae_lambda);
      adv[i] = g.advantages;
      returns.push_back(g.returns);
      for (size_t t = 0; t < s.mask.size(); ++t)
        if (s.mask[t]) sum += adv[i][t], sq += adv[i][t] * adv[i][t], n += 1;
    }
    if (n == 0) return;
    const double mean = sum / n, sd = std::sqrt(std::max(0.0, sq / n - mean * mean)) + 1e-6;
    for (size_t i = 0; i < samples.size(); ++i)
      for (size_t t = 0; t < adv[i].size(); ++t)
        adv[i][t] = samples[i].mask[t] && t > 0 ? (adv[i][t] - mean) / sd : 0.0;
  }

  // One critic step on the clipped value loss 0.5 max((V - R)^2, (V_clip - R)^2), mean over
  // mask-1 tokens; the head sees the hidden states as fixed features. Returns the loss.
  double critic_step(const std::vector<rl::Sample>& samples,
                     const std::vector<std::vector<float>>& hid,
                     const std::vector<std::vector<double>>& v_old,
                     const std::vector<std::vector<double>>& returns) {
    const auto d = static_cast<size_t>(dec->config().hidden_size);
    std::vector<double> rows, coef;
    double loss = 0, n = 0;
    for (size_t i = 0; i < samples.size(); ++i) {
      const std::vector<double> v = values(hid[i], samples[i].mask.size());
      for (size_t t = 1; t < samples[i].mask.size(); ++t) {
        if (!samples[i].mask[t]) continue;
        const double R = returns[i][t], vo = v_old[i][t];
        const double vc = vo + std::clamp(v[t] - vo, -r.value_clip, r.value_clip);
        const double a = (v[t] - R) * (v[t] - R), c = (vc - R) * (vc - R);
        const bool inside = std::abs(v[t] - vo) < r.value_clip;
        loss += 0.5 * std::max(a, c);
        coef.push_back(a >= c ? v[t] - R : (inside ? vc - R : 0.0));
        rows.insert(rows.end(), hid[i].begin() + static_cast<std::ptrdiff_t>((t - 1) * d),
                    hid[i].begin() + static_cast<std::ptrdiff_t>(t * d));
        n += 1;
      }
    }
    if (n == 0) return 0;
    for (double& c : coef) c /= n;
    const auto N = static_cast<int64_t>(coef.size());
    const Tensor H = Tensor::from_doubles(rows, {N, static_cast<int64_t>(d)});
    const Tensor V = ops::linear(H, value_w, value_b);  // [N, 1]
    value_opt->zero_grad();
    ops::sum(ops::mul(ops::reshape(V, {N}), Tensor::from_doubles(coef, {N}))).backward();
    value_opt->step(r.optimizer.lr * r.value_lr_scale);
    return loss / n;
  }

  // The training tasks of round `round` of step `s`: tasks_per_step groups of group_size.
  std::vector<agent::RolloutTask> tasks(int64_t s, int64_t round) const {
    std::vector<agent::RolloutTask> out;
    for (int64_t g = 0; g < r.tasks_per_step; ++g) {
      const uint64_t id = mix_seed(mix_seed(r.seed, static_cast<uint64_t>(s)),
                                   static_cast<uint64_t>(round * r.tasks_per_step + g)) >>
                          1;  // below 2^63: the training split
      const std::string& env = r.envs[static_cast<size_t>(g) % r.envs.size()];
      for (int64_t j = 0; j < r.group_size; ++j)
        out.push_back({env, id, id, static_cast<uint64_t>(round * r.tasks_per_step + g)});
    }
    return out;
  }

  void train_step() {
    const auto t0 = Clock::now();
    std::vector<Trajectory> batch;
    std::vector<rl::Sample> samples;
    std::vector<std::vector<double>> adv;
    int64_t kept = 0, dropped = 0, rounds = 0;
    double reward = 0, solved = 0, calls = 0, errors = 0, call_eps = 0, turns = 0, resp = 0,
           trunc = 0, n_all = 0;
    for (int64_t round = 0; round < r.max_sampling_rounds && kept < r.tasks_per_step; ++round) {
      ++rounds;
      agent::RolloutConfig rc;
      rc.limits = r.limits, rc.temperature = r.temperature;
      rc.seed =
          mix_seed(mix_seed(r.seed, static_cast<uint64_t>(step)), static_cast<uint64_t>(round));
      rc.policy_version = version;
      std::vector<Trajectory> got = agent::rollout(*engine, *tok, tmpl, tasks(step, round), rc);
      std::ofstream log_f(out / "rollouts" / ("step-" + std::to_string(step + 1) + ".jsonl"),
                          round == 0 ? std::ios::trunc : std::ios::app);
      for (const Trajectory& t : got) {
        log_f << t.to_json().dump() << "\n";
        reward += t.R, solved += t.solved, calls += static_cast<double>(t.tool_calls);
        errors += static_cast<double>(t.tool_errors), call_eps += t.tool_calls > 0;
        turns += static_cast<double>(t.assistant_turns()), trunc += t.truncated, n_all += 1;
        for (uint8_t m : t.loss_mask) resp += m;
      }
      for (size_t g0 = 0; g0 < got.size(); g0 += static_cast<size_t>(r.group_size)) {
        std::vector<rl::Sample> group;
        for (size_t i = g0; i < g0 + static_cast<size_t>(r.group_size); ++i) {
          Trajectory& t = got[i];
          rl::Sample s;
          s.mask = t.loss_mask;
          s.turn = t.token_turns();
          // λ_p = 0: process rewards play no part (nor in deciding that a group is all-equal).
          s.r_turn =
              r.advantage.lambda_process > 0 ? t.r_turn : std::vector<double>(t.r_turn.size(), 0.0);
          s.R = t.R;
          s.truncated = t.truncated;
          if (t.truncated && r.truncation == "penalty") s.R = r.truncation_reward;
          if (t.truncated && r.truncation == "mask") std::fill(s.mask.begin(), s.mask.end(), 0);
          group.push_back(std::move(s));
        }
        const bool gae = r.estimator == "gae";
        const rl::GroupAdvantages ga =
            gae ? rl::GroupAdvantages{} : rl::group_advantages(group, r.advantage);
        if ((!gae && ga.all_equal) || kept >= r.tasks_per_step) {
          ++dropped;
          continue;
        }
        ++kept;
        for (size_t i = 0; i < group.size(); ++i) {
          batch.push_back(std::move(got[g0 + i]));
          samples.push_back(std::move(group[i]));
          adv.push_back(gae ? std::vector<double>() : ga.A[i]);
        }
      }
      if (!r.dynamic_sampling) break;
    }
    const double t_roll = seconds_since(t0);

    RlStepRecord rec;
    rec.step = step + 1;
    rec.mean_reward = n_all ? reward / n_all : 0;
    rec.solved = n_all ? solved / n_all : 0;
    rec.groups_kept = kept, rec.groups_dropped = dropped;
    double entropy = 0, staleness = 0, loss_sum = 0, gn_sum = 0, clip_sum = 0, kl_sum = 0,
           tis_sum = 0, value_loss = 0;
    const auto t1 = Clock::now();
    if (!batch.empty()) {
      std::vector<double> ent;
      std::vector<std::vector<float>> hid;
      const std::vector<std::vector<double>> logp_old =
          token_logprobs(*dec, batch, r.micro_batch, &ent, r.estimator == "gae" ? &hid : nullptr);
      std::vector<std::vector<double>> v_old, returns;
      if (r.estimator == "gae") gae_advantages(samples, hid, adv, v_old, returns);
      for (double e : ent) entropy += e / static_cast<double>(ent.size());
      std::vector<std::vector<double>> logp_ref;
      if (ref) logp_ref = token_logprobs(*ref, batch, r.micro_batch);
      // Minibatches: whole groups, in order.
      const size_t G = static_cast<size_t>(r.group_size), groups = batch.size() / G;
      const size_t per = std::max<size_t>(1, (groups + static_cast<size_t>(r.minibatches) - 1) /
                                                 static_cast<size_t>(r.minibatches));
      int64_t updates = 0;
      for (size_t g0 = 0; g0 < groups; g0 += per) {
        const size_t i0 = g0 * G, i1 = std::min(groups, g0 + per) * G;
        const int64_t stale = static_cast<int64_t>(version - batch[i0].policy_version);
        const double sw = rl::staleness_weight(stale, r.max_staleness, r.staleness_mode);
        staleness += static_cast<double>(stale);
        if (sw == 0) continue;
        std::vector<Trajectory> mb(batch.begin() + static_cast<std::ptrdiff_t>(i0),
                                   batch.begin() + static_cast<std::ptrdiff_t>(i1));
        const std::vector<std::vector<double>> logp =
            updates == 0 ? std::vector<std::vector<double>>(
                               logp_old.begin() + static_cast<std::ptrdiff_t>(i0),
                               logp_old.begin() + static_cast<std::ptrdiff_t>(i1))
                         : token_logprobs(*dec, mb, r.micro_batch);
        std::vector<rl::LossInput> in;
        for (size_t i = i0; i < i1; ++i) {
          rl::LossInput li;
          li.mask = samples[i].mask;
          li.mask[0] = 0;  // the first token has no prediction
          li.A = adv[i];
          li.logp = logp[i - i0];
          li.logp_old = logp_old[i];
          li.logp_behavior.resize(batch[i].logp_behavior.size());
          for (size_t t = 0; t < li.logp_behavior.size(); ++t)
            li.logp_behavior[t] = std::isnan(batch[i].logp_behavior[t])
                                      ? li.logp_old[t]
                                      : static_cast<double>(batch[i].logp_behavior[t]);
          if (ref) li.logp_ref = logp_ref[i];
          for (size_t t = 0; t < li.mask.size(); ++t)
            if (!li.mask[t]) li.logp[t] = li.logp_old[t] = li.logp_behavior[t] = 0;
          if (ref)
            for (size_t t = 0; t < li.mask.size(); ++t)
              if (!li.mask[t]) li.logp_ref[t] = 0;
          in.push_back(std::move(li));
        }
        const rl::LossResult lr = rl::policy_loss(in, r.loss);
        opt->zero_grad();
        policy_backward(*dec, mb, lr.grad, sw, r.micro_batch, r.segment_len, r.recompute);
        const double gn = opt->clip_grad_norm();
        if (std::isfinite(gn)) {
          opt->step(r.optimizer.lr);
          ++version;
        }
        ++updates;
        loss_sum += lr.loss, gn_sum += gn, clip_sum += lr.clip_fraction, kl_sum += lr.kl,
            tis_sum += lr.tis_mean;
      }
      if (r.estimator == "gae") value_loss = critic_step(samples, hid, v_old, returns);
      if (updates > 0) {
        const auto u = static_cast<double>(updates);
        rec.loss = loss_sum / u, rec.grad_norm = gn_sum / u, rec.clip_fraction = clip_sum / u,
        rec.kl = kl_sum / u;
        tis_sum /= u;
        staleness /= u;
      }
    }
    const double t_update = seconds_since(t1);
    ++step;
    rec.weights_hash = weights_hash();
    hist.push_back(rec);
    log(step, {{"rl/mean_reward", rec.mean_reward},
               {"rl/solved", rec.solved},
               {"rl/loss", rec.loss},
               {"rl/grad_norm", rec.grad_norm},
               {"rl/clip_fraction", rec.clip_fraction},
               {"rl/kl", rec.kl},
               {"rl/tis_mean", tis_sum},
               {"rl/entropy", entropy},
               {"rl/value_loss", value_loss},
               {"rl/staleness", staleness},
               {"rl/groups_kept", static_cast<double>(kept)},
               {"rl/groups_dropped", static_cast<double>(dropped)},
               {"rl/sampling_rounds", static_cast<double>(rounds)},
               {"rl/tool_call_rate", n_all ? call_eps / n_all : 0},
               {"rl/tool_error_rate", calls > 0 ? errors / calls : 0},
               {"rl/mean_turns", n_all ? turns / n_all : 0},
               {"rl/response_tokens", n_all ? resp / n_all : 0},
               {"rl/truncated", n_all ? trunc / n_all : 0},
               {"rl/rollout_seconds", t_roll},
               {"rl/update_seconds", t_update}});
    if (!quiet) {
      std::printf(
          "%s[rl] step %lld/%lld  reward %.3f  solved %.3f  groups %lld kept / %lld dropped  "
          "loss %+.4f  gnorm %.3f  clip %.3f  entropy %.3f  tools %.2f  (%.1f s rollout, %.1f s "
          "update)%s",
          tty ? "\r" : "", static_cast<long long>(step), static_cast<long long>(r.steps),
          rec.mean_reward, rec.solved, static_cast<long long>(kept),
          static_cast<long long>(dropped), rec.loss, rec.grad_norm, rec.clip_fraction, entropy,
          n_all ? call_eps / n_all : 0, t_roll, t_update, tty ? "   " : "\n");
      std::fflush(stdout);
    }
  }

  void export_model() {
    const fs::path dir = out / "model";
    fs::create_directories(dir);
    dec->config().save((dir / "config.json").string());
    dec->weights().save((dir / "model.safetensors").string());
    fs::copy_file(out / "tokenizer.model", dir / "tokenizer.model",
                  fs::copy_options::overwrite_existing);
    if (fs::exists(out / "chat_template.txt"))
      fs::copy_file(out / "chat_template.txt", dir / "chat_template.txt",
                    fs::copy_options::overwrite_existing);
  }
};

RlTrainer::RlTrainer(RlRecipe recipe, std::string out_dir) : impl_(std::make_unique<Impl>()) {
  MYRIAD_CHECK(!recipe.init.empty(),
               "model.init: the RL recipe needs the model to start from (or myriad rl --init)");
  impl_->r = std::move(recipe);
  impl_->out = out_dir;
}
RlTrainer::~RlTrainer() = default;
void RlTrainer::set_quiet(bool q) {
  impl_->quiet = q;
}
void RlTrainer::stop_after(int64_t s) {
  impl_->stop_at = s;
}
const std::vector<RlStepRecord>& RlTrainer::history() const {
  return impl_->hist;
}
const std::vector<AgentEval>& RlTrainer::evals() const {
  return impl_->evs;
}
const model::Decoder& RlTrainer::decoder() const {
  return *impl_->dec;
}
bool RlTrainer::finished() const {
  return impl_->step >= impl_->r.steps;
}

void RlTrainer::run(bool resume) {
  Impl& m = *impl_;
  m.setup();
  if (resume)
    if (std::optional<TrainState> s = m.ckpt->load_latest(true)) {
      m.restore(*s);
      if (!m.quiet) std::printf("resumed from step %lld\n", static_cast<long long>(m.step));
    }
  StopSignal stop;
  if (m.step == 0 && m.evs.empty()) m.evaluate();
  while (m.step < m.r.steps) {
    m.train_step();
    const bool at_eval = m.r.eval_every > 0 && m.step % m.r.eval_every == 0;
    if (at_eval || m.step == m.r.steps) m.evaluate();
    if ((m.r.checkpoint_every > 0 && m.step % m.r.checkpoint_every == 0) || m.step == m.r.steps)
      m.save();
    if (stop.requested() || m.step == m.stop_at) {
      m.save();
      if (!m.quiet)
        std::printf("\nstopped (signal %d) at step %lld; checkpoint saved\n", stop.signal_number(),
                    static_cast<long long>(m.step));
      return;
    }
  }
  m.export_model();
  if (m.report && m.r.log_html) m.report->write_html();
}

}  // namespace myriad::train
