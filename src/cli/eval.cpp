#include "cli/eval.h"

#include <sys/resource.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cli/serve.h"
#include "core/autograd.h"
#include "data/shards.h"
#include "data/tokenizer.h"
#include "model/decoder.h"
#include "train/evals.h"
#include "train/trainer.h"

namespace myriad::cli {

void add_eval_command(CLI::App& app, EvalArgs& a) {
  auto* c = app.add_subcommand(
      "eval", "long-context grids (passkey, MK-NIAH, VT) on a saved model through the engine");
  c->add_option("model_dir", a.model_dir,
                "model directory: config.json, model.safetensors, tokenizer.model")
      ->required()
      ->check(CLI::ExistingDirectory);
  c->add_option("--tasks", a.tasks, "passkey, mk_niah, vt")
      ->delimiter(',')
      ->check(CLI::IsMember({"passkey", "mk_niah", "vt"}));
  c->add_option("--lengths", a.lengths, "prompt lengths in tokens, e.g. 32768,65536")
      ->delimiter(',')
      ->required()
      ->check(CLI::Range(int64_t{16}, int64_t{1} << 24));
  c->add_option("--depths", a.depths, "passkey depths in [0, 1]")
      ->delimiter(',')
      ->check(CLI::Range(0.0, 1.0));
  c->add_option("--seeds", a.seeds, "items per cell")->check(CLI::Range(1, 10000));
  c->add_option("--seed", a.seed, "evaluation seed (items are disjoint from training's)");
  c->add_option("--segment", a.segment, "prefill chunk in tokens")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 24));
  c->add_option("--mk-niah-keys", a.mk_niah_keys, "K of MK-NIAH")->check(CLI::Range(1, 64));
  c->add_option("--vt-hops", a.vt_hops, "hops of VT")->check(CLI::Range(1, 64));
  c->add_option("--cache-budget", a.cache_budget, "engine cache memory (e.g. 64M, 4G)");
  c->add_flag("--sliding", a.sliding,
              "past the budget, slide the MLA cache window (constant memory) instead of failing");
  c->add_option("--heldout", a.heldout_dir, "shard directory whose held-out split gives the loss")
      ->check(CLI::ExistingDirectory);
  c->add_option("--loss-lengths", a.loss_lengths, "lengths of the held-out loss, e.g. 256,4096")
      ->delimiter(',')
      ->check(CLI::Range(int64_t{2}, int64_t{1} << 24));
  c->add_option("--loss-tokens", a.loss_tokens, "held-out tokens per loss length")
      ->check(CLI::Range(int64_t{2}, int64_t{1} << 30));
  c->add_option("--induction", a.induction,
                "induction probe: N random tokens repeated once; loss on each copy (0: off)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 16));
  c->add_option("--json", a.json, "write the grids, times, cache peaks and peak RSS here");
  a.cmd = c;
}

int eval_command(const EvalArgs& a) {
  namespace fs = std::filesystem;
  const model::Decoder m = model::Decoder::load(a.model_dir);
  const data::Tokenizer tok = data::Tokenizer::from_dir(a.model_dir);
  train::EvalConfig cfg;
  cfg.lengths = a.lengths;
  cfg.depths = a.depths;
  cfg.seeds = a.seeds;
  cfg.segment = a.segment;
  cfg.cache_budget_bytes = parse_bytes(a.cache_budget);
  cfg.allow_sliding = a.sliding;
  nlohmann::json out = {{"model", a.model_dir}, {"grids", nlohmann::json::array()}};
  for (const std::string& t : a.tasks) {
    const train::EvalGrid g =
        t == "passkey" ? train::eval_passkey(m, tok, cfg, a.seed)
        : t == "mk_niah"
            ? train::eval_mk_niah(m, tok, cfg, a.seed, static_cast<int>(a.mk_niah_keys))
            : train::eval_variable_tracking(m, tok, cfg, a.seed, static_cast<int>(a.vt_hops));
    std::printf("%-12s", g.task.c_str());
    for (size_t i = 0; i < g.lengths.size(); ++i)
      std::printf("  %lld: %.2f", static_cast<long long>(g.lengths[i]), g.at(i));
    std::printf("   (%.1f s, %.0f prompt tokens/s, cache peak %.1f MiB)\n", g.seconds,
                static_cast<double>(g.prompt_tokens) / std::max(g.seconds, 1e-9),
                static_cast<double>(g.cache_bytes_peak) / (1 << 20));
    std::fflush(stdout);
    out["grids"].push_back({{"task", g.task},
                            {"lengths", g.lengths},
                            {"depths", g.depths},
                            {"accuracy", g.accuracy},
                            {"mean", g.mean},
                            {"seconds", g.seconds},
                            {"prompt_tokens", g.prompt_tokens},
                            {"cache_bytes_peak", g.cache_bytes_peak}});
  }
  if (!a.loss_lengths.empty()) {
    if (a.heldout_dir.empty()) throw std::invalid_argument("--loss-lengths needs --heldout DIR");
    NoGradGuard ng;
    std::printf("held-out loss");
    nlohmann::json losses = nlohmann::json::object();
    for (int64_t L : a.loss_lengths) {
      data::TokenStream hs(a.heldout_dir, "heldout", a.seed);
      const int64_t rows = std::max<int64_t>(1, a.loss_tokens / L);
      double sum = 0;
      for (int64_t i = 0; i < rows; ++i) {
        const data::Batch b = hs.next(1, L);
        sum += train::Trainer::sequence_loss(m, b.input_ids, b.labels,
                                             L > a.segment && L % a.segment == 0 ? a.segment : 0)
                   .item();
      }
      std::printf("  %lld: %.4f", static_cast<long long>(L), sum / static_cast<double>(rows));
      std::fflush(stdout);
      losses[std::to_string(L)] = sum / static_cast<double>(rows);
    }
    std::printf("\n");
    out["heldout_loss"] = losses;
  }
  if (a.induction > 0) {
    // Ordinary pieces only: no control tokens, byte-fallback pieces or <unk>.
    std::vector<int32_t> alphabet;
    for (int32_t t = 1; t < tok.vocab_size(); ++t)
      if (!tok.is_special(t) && !tok.is_byte(t)) alphabet.push_back(t);
    const train::CopyLosses p = train::induction_probe(m, alphabet, a.induction, 8, a.seed);
    std::printf(
        "induction probe (%lld random tokens, repeated): loss %.3f on the first copy, "
        "%.3f on the second\n",
        static_cast<long long>(a.induction), p.first, p.second);
    out["induction"] = {
        {"tokens", a.induction}, {"first_copy_loss", p.first}, {"second_copy_loss", p.second}};
  }
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  const double rss_mib = static_cast<double>(ru.ru_maxrss) / 1024.0;  // ru_maxrss is in KiB
  std::printf("peak RSS %.1f MiB\n", rss_mib);
  out["peak_rss_mib"] = rss_mib;
  out["sliding"] = a.sliding;
  out["cache_budget_bytes"] = cfg.cache_budget_bytes;
  if (!a.json.empty()) {
    std::ofstream f(a.json);
    f << out.dump(1) << "\n";
    if (!f) throw std::runtime_error("cannot write " + a.json);
  }
  return 0;
}

}  // namespace myriad::cli
