#include "train/evals.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <filesystem>
#include <functional>
#include <limits>
#include <mutex>
#include <set>
#include <sstream>

#include "core/autograd.h"
#include "core/error.h"
#include "data/corpus.h"
#include "infer/engine.h"
#include "ops/ops.h"

namespace myriad::train {
namespace {

// Item seeds: a splitmix64 hash of (run seed, task, cell, index) with the top bit cleared, so
// evaluation never meets the training mix's seeds (those have the top bit set).
uint64_t mix(uint64_t h, uint64_t v) {
  uint64_t z = h ^ (v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2));
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}
uint64_t item_seed(uint64_t seed, const std::string& task, size_t li, size_t di, int s) {
  uint64_t h = mix(seed, std::hash<std::string>{}(task));
  h = mix(mix(mix(h, li), di), static_cast<uint64_t>(s));
  return h & ~(1ULL << 63);
}

// Text before the first '.' or newline, for non-numeric answers.
std::set<std::string> upper_words(const std::string& out) {
  const std::string head = out.substr(0, out.find_first_of(".\n"));
  std::set<std::string> words;
  std::istringstream in(head);
  for (std::string w; in >> w;) {
    while (!w.empty() && !std::isalnum(static_cast<unsigned char>(w.back()))) w.pop_back();
    if (!w.empty() && std::all_of(w.begin(), w.end(), [](char c) { return c >= 'A' && c <= 'Z'; }))
      words.insert(w);
  }
  return words;
}
std::set<std::string> answer_words(const std::string& answer) {
  std::set<std::string> s;
  std::istringstream in(answer);
  for (std::string w; in >> w;) s.insert(w);
  return s;
}
bool is_number(const std::string& s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

using Make = std::function<data::SyntheticItem(uint64_t seed, int64_t length, double depth)>;

// Runs cfg.seeds items per (length, depth) cell; depths empty means one random-depth column.
EvalGrid run_grid(const model::Decoder& m, const data::Tokenizer& tok, const EvalConfig& cfg,
                  uint64_t seed, const std::string& task, std::vector<double> depths,
                  const Make& make, bool track_recovered) {
  MYRIAD_CHECK(cfg.seeds >= 1 && cfg.segment >= 1 && cfg.max_new_tokens >= 1, "eval ", task,
               ": seeds, segment and max_new_tokens must be positive");
  EvalGrid g;
  g.task = task;
  g.lengths = cfg.lengths;
  g.depths = depths;
  const size_t nd = std::max<size_t>(depths.size(), 1);
  std::vector<data::SyntheticItem> items;
  std::vector<std::vector<int32_t>> prompts;
  for (size_t li = 0; li < cfg.lengths.size(); ++li)
    for (size_t di = 0; di < nd; ++di)
      for (int s = 0; s < cfg.seeds; ++s) {
        items.push_back(make(item_seed(seed, task, li, di, s), cfg.lengths[li],
                             depths.empty() ? 0.0 : depths[di]));
        prompts.push_back(items.back().tokens);
      }
  const auto t0 = std::chrono::steady_clock::now();
  const auto done = shared_completions(m, tok, prompts, cfg);
  g.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  g.cache_bytes_peak = done.cache_bytes_peak;
  for (const auto& p : prompts) g.prompt_tokens += static_cast<int64_t>(p.size());
  const auto& outs = done.tokens;
  double total = 0;
  size_t k = 0;
  for (size_t li = 0; li < cfg.lengths.size(); ++li) {
    std::vector<double> acc(nd), rec(nd);
    for (size_t di = 0; di < nd; ++di) {
      int hits = 0;
      double found = 0;
      for (int s = 0; s < cfg.seeds; ++s, ++k) {
        const std::string out = tok.decode(outs[k]);
        hits += exact_match(out, items[k].answer);
        if (track_recovered) found += recovered_fraction(out, items[k].answer);
      }
      acc[di] = static_cast<double>(hits) / cfg.seeds;
      rec[di] = found / cfg.seeds;
      total += acc[di];
    }
    g.accuracy.push_back(acc);
    if (track_recovered) g.recovered.push_back(rec);
  }
  g.mean = cfg.lengths.empty() ? 0.0 : total / static_cast<double>(cfg.lengths.size() * nd);
  return g;
}

}  // namespace

double EvalGrid::at(size_t i) const {
  const auto& row = accuracy.at(i);
  double s = 0;
  for (double a : row) s += a;
  return row.empty() ? 0.0 : s / static_cast<double>(row.size());
}

EvalConfig grid_for_stage(int64_t stage_len) {
  MYRIAD_CHECK(stage_len >= 8, "grid_for_stage: stage length ", stage_len, " is below 8");
  EvalConfig c;
  c.lengths = {stage_len / 8, stage_len / 4, stage_len / 2, stage_len, 2 * stage_len};
  return c;
}

const data::Filler& eval_filler(bool wordnet) {
  static const data::Filler fixed = data::Filler::fixed();
  if (!wordnet || !std::filesystem::exists("/usr/share/wordnet/data.noun")) return fixed;
  static const data::Filler wn = data::Filler::wordnet(/*eval=*/true);
  return wn;
}

Tensor segmented_prefill(const model::Decoder& m, const std::vector<int32_t>& ids, int64_t segment,
                         model::DecodeCache& cache, bool all_logits) {
  MYRIAD_CHECK(!ids.empty() && segment >= 1, "segmented_prefill: ", ids.size(),
               " prompt tokens, segment ", segment);
  NoGradGuard ng;
  const int64_t T = static_cast<int64_t>(ids.size());
  std::vector<Tensor> parts;
  Tensor last;
  for (int64_t t0 = 0; t0 < T; t0 += segment) {
    const int64_t t1 = std::min(T, t0 + segment);
    std::vector<int64_t> seg(ids.begin() + t0, ids.begin() + t1);
    model::ForwardOptions opt;
    opt.logits = all_logits || t1 == T;
    Tensor logits = m.forward(Tensor::from_ints(seg, {1, t1 - t0}), &cache, opt).logits_BTV;
    if (all_logits) parts.push_back(logits);
    if (t1 == T)
      last = ops::contiguous(ops::reshape(ops::slice(logits, 1, t1 - t0 - 1, t1 - t0), {-1}));
  }
  return all_logits ? ops::concat(parts, 1) : last;
}

Completions greedy_completions(const model::Decoder& m, const data::Tokenizer& tok,
                               const std::vector<std::vector<int32_t>>& prompts, int64_t segment,
                               int max_new, int64_t cache_budget_bytes, bool allow_sliding) {
  MYRIAD_CHECK(segment >= 1 && max_new >= 1, "greedy_completions: segment ", segment, ", max_new ",
               max_new);
  infer::EngineConfig ec;
  ec.prefill_chunk = segment;
  ec.cache_budget_bytes = cache_budget_bytes;
  ec.allow_sliding_mla = allow_sliding;
  ec.prefix_cache_entries = 0;
  infer::Engine engine(m, tok, ec);
  Completions c;
  auto& out = c.tokens;
  out.resize(prompts.size());
  std::vector<std::string> errors(prompts.size());
  std::mutex mu;
  std::condition_variable cv;
  size_t left = prompts.size();
  for (size_t i = 0; i < prompts.size(); ++i) {
    infer::Request req;
    req.prompt = prompts[i];
    req.params.temperature = 0;
    req.params.max_tokens = max_new;
    engine.submit(std::move(req), [&, i](const infer::TokenEvent& e) {
      std::lock_guard lock(mu);
      if (e.token >= 0 && e.token != tok.eos()) out[i].push_back(e.token);
      if (e.finished) {
        if (e.finish_reason == "error" || e.finish_reason == "cancelled")
          errors[i] = e.finish_reason + ": " + e.error;
        if (--left == 0) cv.notify_all();
      }
      return true;
    });
  }
  std::unique_lock lock(mu);
  cv.wait(lock, [&] { return left == 0; });
  for (size_t i = 0; i < prompts.size(); ++i)
    MYRIAD_CHECK(errors[i].empty(), "greedy_completions: prompt ", i, " (", prompts[i].size(),
                 " tokens) ended with ", errors[i]);
  c.cache_bytes_peak = engine.stats().cache_bytes_peak;
  return c;
}

// The others' answers come as a table of rows (count, token + 1, ...), exact in doubles.
Completions shared_completions(const model::Decoder& m, const data::Tokenizer& tok,
                               const std::vector<std::vector<int32_t>>& prompts,
                               const EvalConfig& cfg) {
  if (cfg.shards <= 1)
    return greedy_completions(m, tok, prompts, cfg.segment, cfg.max_new_tokens,
                              cfg.cache_budget_bytes, cfg.allow_sliding);
  MYRIAD_CHECK(cfg.sum && cfg.shard >= 0 && cfg.shard < cfg.shards, "eval: shard ", cfg.shard,
               " of ", cfg.shards, " needs a sum over the processes");
  std::vector<std::vector<int32_t>> mine;
  for (size_t i = static_cast<size_t>(cfg.shard); i < prompts.size();
       i += static_cast<size_t>(cfg.shards))
    mine.push_back(prompts[i]);
  Completions done;
  if (!mine.empty())
    done = greedy_completions(m, tok, mine, cfg.segment, cfg.max_new_tokens, cfg.cache_budget_bytes,
                              cfg.allow_sliding);
  const size_t row = static_cast<size_t>(cfg.max_new_tokens) + 1;  // count, then the tokens
  std::vector<double> table(prompts.size() * row, 0.0);
  for (size_t j = 0; j < mine.size(); ++j) {
    double* r =
        table.data() + (static_cast<size_t>(cfg.shard) + j * static_cast<size_t>(cfg.shards)) * row;
    r[0] = static_cast<double>(done.tokens[j].size());
    for (size_t k = 0; k < done.tokens[j].size(); ++k) r[1 + k] = done.tokens[j][k] + 1.0;
  }
  // Then one cache peak per process; the largest is taken.
  std::vector<double> peaks(static_cast<size_t>(cfg.shards), 0.0);
  peaks[static_cast<size_t>(cfg.shard)] = static_cast<double>(done.cache_bytes_peak);
  table.insert(table.end(), peaks.begin(), peaks.end());
  cfg.sum(table);
  Completions all;
  all.tokens.resize(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    const double* r = table.data() + i * row;
    for (size_t k = 0; k < static_cast<size_t>(r[0]); ++k)
      all.tokens[i].push_back(static_cast<int32_t>(r[1 + k] - 1.0));
  }
  all.cache_bytes_peak =
      static_cast<int64_t>(*std::max_element(table.end() - cfg.shards, table.end()));
  return all;
}

CopyLosses induction_probe(const model::Decoder& m, const std::vector<int32_t>& alphabet, int64_t n,
                           int64_t rows, uint64_t seed) {
  MYRIAD_CHECK(!alphabet.empty() && n >= 2 && rows >= 1, "induction_probe: alphabet of ",
               alphabet.size(), " tokens, n = ", n, ", rows = ", rows);
  NoGradGuard ng;
  data::Rng rng(seed);
  const int64_t T = 2 * n;
  std::vector<int64_t> ids, first, second;
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<int64_t> row;
    for (int64_t i = 0; i < n; ++i) row.push_back(alphabet[rng.below(alphabet.size())]);
    row.insert(row.end(), row.begin(), row.end());
    for (int64_t t = 0; t < T; ++t) {
      ids.push_back(row[t]);
      // Position t predicts token t + 1: first copy for t + 1 in [1, n), second for (n, 2n).
      const bool in_first = t + 1 < n, in_second = t + 1 > n && t + 1 < T;
      first.push_back(in_first ? row[t + 1] : ops::kIgnoreIndex);
      second.push_back(in_second ? row[t + 1] : ops::kIgnoreIndex);
    }
  }
  const Tensor logits =
      ops::reshape(m.forward(Tensor::from_ints(ids, {rows, T})).logits_BTV, {rows * T, -1});
  return {ops::cross_entropy(logits, Tensor::from_ints(first, {rows * T})).item(),
          ops::cross_entropy(logits, Tensor::from_ints(second, {rows * T})).item()};
}

bool exact_match(const std::string& output, const std::string& answer) {
  if (is_number(answer)) {
    const size_t a = output.find_first_of("0123456789");
    if (a == std::string::npos) return false;
    const size_t b = output.find_first_not_of("0123456789", a);
    return output.substr(a, b == std::string::npos ? std::string::npos : b - a) == answer;
  }
  return !answer.empty() && upper_words(output) == answer_words(answer);
}

double recovered_fraction(const std::string& output, const std::string& answer) {
  const auto want = answer_words(answer), got = upper_words(output);
  if (want.empty()) return 0;
  size_t n = 0;
  for (const auto& w : want) n += got.count(w);
  return static_cast<double>(n) / static_cast<double>(want.size());
}

EvalGrid eval_passkey(const model::Decoder& m, const data::Tokenizer& tok, const EvalConfig& cfg,
                      uint64_t seed) {
  const auto& filler = eval_filler(cfg.wordnet_filler);
  return run_grid(
      m, tok, cfg, seed, "passkey", cfg.depths,
      [&](uint64_t s, int64_t len, double d) { return data::passkey(s, len, d, tok, filler); },
      false);
}

EvalGrid eval_mk_niah(const model::Decoder& m, const data::Tokenizer& tok, const EvalConfig& cfg,
                      uint64_t seed, int K) {
  const auto& filler = eval_filler(cfg.wordnet_filler);
  return run_grid(
      m, tok, cfg, seed, cat("mk_niah_k", K), {},
      [&](uint64_t s, int64_t len, double) { return data::mk_niah(s, K, len, tok, filler); },
      false);
}

EvalGrid eval_variable_tracking(const model::Decoder& m, const data::Tokenizer& tok,
                                const EvalConfig& cfg, uint64_t seed, int hops) {
  const auto& filler = eval_filler(cfg.wordnet_filler);
  return run_grid(
      m, tok, cfg, seed, cat("vt_h", hops), {},
      [&](uint64_t s, int64_t len, double) {
        return data::variable_tracking(s, hops, len, tok, filler);
      },
      true);
}

double effective_length(const std::vector<EvalGrid>& grids) {
  if (grids.empty()) return 0;
  double best = 0;
  for (int64_t len : grids[0].lengths) {
    double sum = 0;
    bool everywhere = true;
    for (const auto& g : grids) {
      const auto it = std::find(g.lengths.begin(), g.lengths.end(), len);
      if (it == g.lengths.end()) {
        everywhere = false;
        break;
      }
      sum += g.at(static_cast<size_t>(it - g.lengths.begin()));
    }
    if (everywhere && sum / static_cast<double>(grids.size()) >= 0.90)
      best = std::max(best, static_cast<double>(len));
  }
  return best;
}

GateResult stage_gate(const std::vector<EvalGrid>& now, const std::vector<EvalGrid>& previous,
                      double short_val_loss, double stage0_val_loss, bool unresolved_spike,
                      int64_t stage_len) {
  GateResult r;
  auto fail = [&](std::string why) {
    r.pass = false;
    r.reasons.push_back(std::move(why));
  };
  // (1) Passkey at every grid length up to the stage length; 2L is reported only.
  const auto pk =
      std::find_if(now.begin(), now.end(), [](const EvalGrid& g) { return g.task == "passkey"; });
  if (pk == now.end()) {
    fail("no passkey grid was evaluated");
  } else {
    for (size_t i = 0; i < pk->lengths.size(); ++i) {
      const int64_t len = pk->lengths[i];
      const double a = pk->at(i);
      if (len <= stage_len && a < 0.95)
        fail(cat("passkey accuracy ", a, " < 0.95 at length ", len));
      else if (len > stage_len)
        r.notes.push_back(cat("passkey accuracy ", a, " at length ", len, " (extrapolation)"));
    }
  }
  // (2) MK-NIAH and VT hold their previous accuracy at the previous stage's gated lengths.
  for (const auto& p : previous) {
    if (p.task.rfind("mk_niah", 0) != 0 && p.task.rfind("vt", 0) != 0) continue;
    if (p.lengths.empty()) continue;
    const auto cur =
        std::find_if(now.begin(), now.end(), [&](const EvalGrid& g) { return g.task == p.task; });
    if (cur == now.end()) {
      fail(cat(p.task, " was evaluated in the previous stage but not now"));
      continue;
    }
    const int64_t prev_len = *std::max_element(p.lengths.begin(), p.lengths.end()) / 2;
    for (size_t i = 0; i < p.lengths.size(); ++i) {
      if (p.lengths[i] > prev_len) continue;
      const auto it = std::find(cur->lengths.begin(), cur->lengths.end(), p.lengths[i]);
      if (it == cur->lengths.end()) continue;  // the new grid starts higher
      const double a = cur->at(static_cast<size_t>(it - cur->lengths.begin())), b = p.at(i);
      if (a < b - 0.02 - 1e-12)
        fail(cat(p.task, " accuracy ", a, " at length ", p.lengths[i],
                 " is more than 2 points below the previous stage's ", b));
    }
  }
  // (3) Short-context validation loss within 2% of its stage-0 final value.
  if (!std::isfinite(short_val_loss) || !(short_val_loss <= 1.02 * stage0_val_loss))
    fail(cat("short-context validation loss ", short_val_loss, " exceeds 1.02 × stage-0's ",
             stage0_val_loss));
  // (4) No unresolved loss spike in the last 10% of the stage.
  if (unresolved_spike) fail("unresolved loss spike in the last 10% of the stage");
  return r;
}

EvalConfig StageEvaluator::config_for(int64_t stage_len) const {
  EvalConfig c;
  for (double f : r_.length_factors) {
    const auto len = std::max<int64_t>(16, std::llround(f * static_cast<double>(stage_len)));
    if (len <= r_.max_length &&
        std::find(c.lengths.begin(), c.lengths.end(), len) == c.lengths.end())
      c.lengths.push_back(len);
  }
  std::sort(c.lengths.begin(), c.lengths.end());
  c.depths = r_.depths;
  c.seeds = static_cast<int>(r_.seeds);
  c.segment = r_.segment;
  c.shard = shard_, c.shards = shards_, c.sum = sum_;
  return c;
}

StageOutcome StageEvaluator::evaluate(const model::Decoder& m, const data::Tokenizer& tok,
                                      const std::string& stage, int64_t seq_len, int64_t step,
                                      double heldout_loss, bool unresolved_spike) {
  const auto t0 = std::chrono::steady_clock::now();
  StageOutcome o{stage, seq_len, step, heldout_loss, {}, 0, {}, 0};
  const EvalConfig cfg = config_for(seq_len);
  // A seed per stage, so stages see fresh items; disjoint from training's by construction (§6).
  const uint64_t seed = seed_ + 7919 * done_.size();
  for (const std::string& t : r_.tasks) {
    if (cfg.lengths.empty()) break;
    if (t == "passkey") o.grids.push_back(eval_passkey(m, tok, cfg, seed));
    if (t == "mk_niah")
      o.grids.push_back(eval_mk_niah(m, tok, cfg, seed, static_cast<int>(r_.mk_niah_keys)));
    if (t == "vt")
      o.grids.push_back(eval_variable_tracking(m, tok, cfg, seed, static_cast<int>(r_.vt_hops)));
  }
  o.effective_length = effective_length(o.grids);
  const double stage0 = done_.empty() ? heldout_loss : done_.front().heldout_loss;
  o.gate = stage_gate(o.grids, done_.empty() ? std::vector<EvalGrid>{} : done_.back().grids,
                      heldout_loss, stage0, unresolved_spike, seq_len);
  o.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  done_.push_back(o);
  return o;
}

namespace {
// JSON has no NaN or infinity: those go as strings ("nan", "inf", "-inf").
nlohmann::json real(double v) {
  if (std::isfinite(v)) return v;
  return std::isnan(v) ? "nan" : v > 0 ? "inf" : "-inf";
}
double real(const nlohmann::json& j) {
  if (j.is_number()) return j.get<double>();
  const std::string s = j.get<std::string>();
  return s == "inf"    ? std::numeric_limits<double>::infinity()
         : s == "-inf" ? -std::numeric_limits<double>::infinity()
                       : std::numeric_limits<double>::quiet_NaN();
}
nlohmann::json reals(const std::vector<std::vector<double>>& m) {
  nlohmann::json a = nlohmann::json::array();
  for (const auto& row : m) {
    nlohmann::json r = nlohmann::json::array();
    for (double v : row) r.push_back(real(v));
    a.push_back(std::move(r));
  }
  return a;
}
std::vector<std::vector<double>> reals(const nlohmann::json& a) {
  std::vector<std::vector<double>> m;
  for (const auto& row : a) {
    m.emplace_back();
    for (const auto& v : row) m.back().push_back(real(v));
  }
  return m;
}
}  // namespace

nlohmann::json StageEvaluator::state() const {
  nlohmann::json out = nlohmann::json::array();
  for (const StageOutcome& o : done_) {
    nlohmann::json grids = nlohmann::json::array();
    for (const EvalGrid& g : o.grids)
      grids.push_back({{"task", g.task},
                       {"lengths", g.lengths},
                       {"depths", g.depths},
                       {"accuracy", reals(g.accuracy)},
                       {"recovered", reals(g.recovered)},
                       {"mean", real(g.mean)}});
    out.push_back(
        {{"stage", o.stage},
         {"seq_len", o.seq_len},
         {"step", o.step},
         {"heldout_loss", real(o.heldout_loss)},
         {"grids", grids},
         {"effective_length", real(o.effective_length)},
         {"gate", {{"pass", o.gate.pass}, {"reasons", o.gate.reasons}, {"notes", o.gate.notes}}},
         {"seconds", real(o.seconds)}});
  }
  return {{"outcomes", out}};
}

void StageEvaluator::load_state(const nlohmann::json& j) {
  std::vector<StageOutcome> done;
  for (const auto& o : j.at("outcomes")) {
    StageOutcome s;
    s.stage = o.at("stage").get<std::string>();
    s.seq_len = o.at("seq_len").get<int64_t>();
    s.step = o.at("step").get<int64_t>();
    s.heldout_loss = real(o.at("heldout_loss"));
    for (const auto& g : o.at("grids")) {
      EvalGrid e;
      e.task = g.at("task").get<std::string>();
      e.lengths = g.at("lengths").get<std::vector<int64_t>>();
      e.depths = g.at("depths").get<std::vector<double>>();
      e.accuracy = reals(g.at("accuracy"));
      e.recovered = reals(g.at("recovered"));
      e.mean = real(g.at("mean"));
      s.grids.push_back(std::move(e));
    }
    s.effective_length = real(o.at("effective_length"));
    s.gate.pass = o.at("gate").at("pass").get<bool>();
    s.gate.reasons = o.at("gate").at("reasons").get<std::vector<std::string>>();
    s.gate.notes = o.at("gate").at("notes").get<std::vector<std::string>>();
    s.seconds = real(o.at("seconds"));
    done.push_back(std::move(s));
  }
  done_ = std::move(done);
}

void StageEvaluator::forget_after(int64_t step) {
  std::erase_if(done_, [&](const StageOutcome& o) { return o.step > step; });
}

}  // namespace myriad::train
