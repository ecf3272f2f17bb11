// Inference-engine figures (docs/PERFORMANCE.md "Inference engine"), printed, not asserted:
//  1. decode tokens/s through the Engine at batch 1 and 16 (greedy, context --ctx tokens of
//     prompt) for the hybrid preset and the same model with every layer MLA, side by side;
//  2. cache bytes per sequence at 1K, 16K and 128K tokens for both (computed from the config, as
//     the engine reserves them: KDA state f32 + whole MLA pages; measured after prefill where
//     --measure_ctx allows);
//  3. peak RSS while a small model reads a long input segment by segment through the engine:
//     a KDA-only model up to --long tokens (RSS at every doubling from 64K), and the hybrid
//     with a sliding MLA window (a small budget) up to --long_mla tokens.
//
//   OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE bench_decode [--medium=1] [--ctx=1024] [--new=32]
//   [--measure_ctx=16384]
//                                  [--long=1048576] [--long_mla=262144] [--chunk=4096]
//
// With a model directory (scripts/bench_decode_vs_torch.sh, scripts/bench_vs_llamacpp.sh): only
// 1., for that model, at batch 1 and 16 (--batch16=0 skips 16), plus the prefill rate of one
// --ctx-token prompt (to its first token), printing each request's first --show greedy tokens and
// RESULT lines. A directory with only config.json first gets random weights (--seed) saved into it,
// so transformers can load the same checkpoint.
// --int8=1 (--int8=4: int4) instead runs the directory's model in f32 and with weight-only int8
// (int4) projections (ops/quant.h) side by side: top-1 agreement of the two over 256 positions,
// then decode tokens/s of both, alternately, over 3 rounds. --quantize=8 (or 4) runs the figures
// of 1. on the int8 (int4) model alone (the CLI's --quantize int8 / int4;
// scripts/bench_vs_llamacpp.sh's q8_0 and q4_0 rows). --act=8 with int8 quantizes decode's
// activations to int8 too (the CLI's --quantize w8a8). --bf16=1 loads the model as bf16 (the
// CLI's --dtype bf16; scripts/bench_vs_llamacpp.sh's bf16 rows).
// --heldout=SHARDS (with --int8): the comparison's positions from that held-out split, with the
// next-token loss of both models.
//   bench_decode DIR [--ctx=1024] [--new=32] [--show=8] [--seed=1] [--batch16=1] [--int8=0]
//                    [--quantize=0] [--act=0] [--bf16=0] [--heldout=]
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <future>
#include <mutex>
#include <string>
#include <vector>

#include "bench_util.h"
#include "core/autograd.h"
#include "data/corpus.h"
#include "data/shards.h"
#include "infer/engine.h"
#include "model/decoder.h"

namespace myriad::bench {
namespace {

using Clock = std::chrono::steady_clock;

// VmRSS and VmHWM (peak) of this process, in MiB.
std::pair<double, double> rss_mib() {
  std::ifstream f("/proc/self/status");
  std::string k;
  double rss = 0, hwm = 0;
  while (f >> k) {
    if (k == "VmRSS:") f >> rss;
    if (k == "VmHWM:") f >> hwm;
  }
  return {rss / 1024, hwm / 1024};
}

model::ModelConfig all_mla(model::ModelConfig c) {
  c.linear_attn_config.kda_layers.clear();
  c.linear_attn_config.full_attn_layers.clear();
  for (int64_t l = 1; l <= c.num_hidden_layers; ++l)
    c.linear_attn_config.full_attn_layers.push_back(l);
  c.validate();
  return c;
}

model::ModelConfig all_kda(model::ModelConfig c) {
  c.linear_attn_config.full_attn_layers.clear();
  c.linear_attn_config.kda_layers.clear();
  for (int64_t l = 1; l <= c.num_hidden_layers; ++l) c.linear_attn_config.kda_layers.push_back(l);
  c.validate();
  return c;
}

std::vector<int32_t> prompt(int64_t n, int64_t V, int salt) {
  std::vector<int32_t> p;
  for (int64_t i = 0; i < n; ++i)
    p.push_back(static_cast<int32_t>(4 + (i * 7919 + salt * 131) % (V - 4)));
  return p;
}

// Decode tokens/s of `batch` concurrent greedy requests, timed after every one has its first
// token (so only decode steps are in the window). `out`, when given, gets each request's tokens.
double decode_rate(infer::Engine& e, int64_t V, int64_t ctx, int64_t batch, int64_t new_tokens,
                   std::vector<std::vector<int32_t>>* out = nullptr) {
  if (out) out->assign(batch, {});
  std::mutex mu;
  int64_t started = 0, tokens = 0, at_t1 = 0, finished = 0;
  Clock::time_point t1, t2;
  std::promise<void> done;
  for (int64_t b = 0; b < batch; ++b) {
    infer::Request r;
    r.prompt = prompt(ctx, V, static_cast<int>(b));
    r.params.temperature = 0, r.params.ignore_eos = true, r.params.max_tokens = new_tokens;
    auto first = std::make_shared<bool>(true);
    e.submit(r, [&, first, b](const infer::TokenEvent& ev) {
      std::lock_guard lk(mu);
      if (ev.token >= 0) ++tokens;
      if (ev.token >= 0 && out) (*out)[b].push_back(ev.token);
      if (*first) {
        *first = false;
        if (++started == batch) t1 = Clock::now(), at_t1 = tokens;
      }
      if (ev.finished && ++finished == batch) {
        t2 = Clock::now();
        done.set_value();
      }
      return true;
    });
  }
  done.get_future().wait();
  return static_cast<double>(tokens - at_t1) / std::chrono::duration<double>(t2 - t1).count();
}

// Reads a `total`-token input through the engine (one new token), printing RSS at every
// doubling from 64K; returns the seconds it took.
double read_long(const model::Decoder& m, const data::Tokenizer& tok, infer::EngineConfig cfg,
                 int64_t total, const char* label) {
  infer::Engine e(m, tok, cfg);
  infer::Request r;
  r.prompt = prompt(total, m.config().vocab_size, 1);
  r.params.temperature = 0, r.params.ignore_eos = true, r.params.max_tokens = 1;
  const infer::CachePlan plan = e.plan(r);
  std::printf("%s: %lld tokens, chunk %lld, plan %.1f MiB%s\n", label,
              static_cast<long long>(total), static_cast<long long>(cfg.prefill_chunk),
              plan.bytes / 1048576.0,
              plan.sliding ? (" (sliding MLA window of " +
                              std::to_string(plan.pages_per_layer * cfg.block_tokens) + " tokens)")
                                 .c_str()
                           : "");
  const auto t0 = Clock::now();
  auto fut = std::async(std::launch::async, [&] { return e.generate(r); });
  int64_t next = 65536;
  double rss0 = -1;
  while (fut.wait_for(std::chrono::milliseconds(20)) != std::future_status::ready) {
    const infer::EngineStats st = e.stats();
    const int64_t pos = st.prefilled_tokens;
    if (pos >= next) {
      auto [rss, hwm] = rss_mib();
      if (rss0 < 0) rss0 = rss;
      std::printf("  %8lld tokens: RSS %7.1f MiB (peak %7.1f)  cache %7.2f MiB  %.1f s\n",
                  static_cast<long long>(pos), rss, hwm, st.cache_bytes_used / 1048576.0,
                  std::chrono::duration<double>(Clock::now() - t0).count());
      std::fflush(stdout);
      while (next <= pos) next *= 2;
    }
  }
  const auto c = fut.get();
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  auto [rss, hwm] = rss_mib();
  std::printf("  %8lld tokens: RSS %7.1f MiB (peak %7.1f)  done in %.1f s (%.0f tokens/s), %s\n",
              static_cast<long long>(total), rss, hwm, s, total / s, c.finish_reason.c_str());
  if (rss0 > 0) std::printf("  RSS growth from 64K to the end: %+.1f%%\n", 100 * (rss / rss0 - 1));
  return s;
}

// Decode rates of one saved model (the Myriad side of scripts/bench_decode_vs_torch.sh).
// The logits [T, V] of ids [1, T] one position at a time through a decode cache: decode's path,
// where the quantized products stream their codes (and int8 activations apply).
std::vector<float> step_logits(const model::Decoder& m, const std::vector<int64_t>& ids) {
  model::DecodeCache cache = m.new_cache();
  std::vector<float> out;
  for (const int64_t id : ids) {
    const std::vector<float> l =
        m.forward(Tensor::from_ints(std::vector<int64_t>{id}, {1, 1}, DType::I64), &cache)
            .logits_BTV.to_floats();
    out.insert(out.end(), l.begin(), l.end());
  }
  return out;
}

// Mean cross-entropy of ids[t + 1] under logits row t (t < T - 1).
double next_token_loss(const std::vector<float>& logits, const std::vector<int64_t>& ids,
                       int64_t V) {
  double sum = 0;
  for (size_t t = 0; t + 1 < ids.size(); ++t) {
    const float* l = logits.data() + static_cast<int64_t>(t) * V;
    const double mx = *std::max_element(l, l + V);
    double z = 0;
    for (int64_t v = 0; v < V; ++v) z += std::exp(l[v] - mx);
    sum += mx + std::log(z) - l[ids[t + 1]];
  }
  return sum / static_cast<double>(ids.size() - 1);
}

// The model in f32 and with int8 (bits 8) or int4 (4) projections (ops/quant.h), side by side in
// this process: what the quantized weights change (256 positions through decode steps: top-1
// agreement, the logit difference and, on held-out text, the next-token loss of both), then
// decode tokens/s of both, alternating which goes first, over 3 rounds. heldout: a shard
// directory whose held-out split gives the positions (else random ids).
int quant_side_by_side(const std::string& dir, const model::Decoder& m, const data::Tokenizer& tok,
                       int64_t ctx, int64_t new_tokens, int64_t chunk, bool batch16, int bits,
                       int act, const std::string& heldout) {
  model::Decoder q = model::Decoder::load(dir);
  const int64_t n = q.quantize(bits, act), V = m.config().vocab_size, T = 256;
  std::printf("int%d weights%s: %lld tensors, %.1f MB of codes and scales\n", bits,
              act ? ", int8 activations" : "", static_cast<long long>(n),
              q.weights().quant_bytes() / 1e6);
  std::vector<int64_t> ids;
  if (heldout.empty()) {
    for (const int32_t id : prompt(T, V, 7)) ids.push_back(id);
  } else {
    data::TokenStream s(heldout, "heldout", 7);
    ids = s.next(1, T).input_ids.to_ints();
  }
  const std::vector<float> f32 = step_logits(m, ids), qz = step_logits(q, ids);
  int64_t agree = 0;
  double diff = 0, mag = 0, worst = 0, top = 0;
  for (int64_t t = 0; t < T; ++t) {
    const float* a = f32.data() + t * V;
    const float* b = qz.data() + t * V;
    agree += std::max_element(a, a + V) - a == std::max_element(b, b + V) - b;
    for (int64_t v = 0; v < V; ++v) {
      diff += std::fabs(a[v] - b[v]), mag += std::fabs(a[v]);
      worst = std::max<double>(worst, std::fabs(a[v] - b[v]));
      top = std::max<double>(top, std::fabs(a[v]));
    }
  }
  std::printf(
      "RESULT int%d%s_vs_f32 decode_positions=%lld top1_agree=%lld "
      "mean_abs_diff_over_mean_abs=%.3g max_abs_diff_over_max_abs=%.3g",
      bits, act ? "_act8" : "", static_cast<long long>(T), static_cast<long long>(agree),
      diff / mag, worst / top);
  if (!heldout.empty())
    std::printf(" heldout_loss_f32=%.4f heldout_loss_quantized=%.4f", next_token_loss(f32, ids, V),
                next_token_loss(qz, ids, V));
  std::printf("\n");
  infer::EngineConfig cfg;
  cfg.cache_budget_bytes = 8ll << 30;
  cfg.prefill_chunk = chunk;
  for (const int64_t batch : {int64_t{1}, int64_t{16}}) {
    if (batch == 16 && !batch16) continue;
    for (int r = 0; r < 3; ++r) {
      double rate[2];
      for (int j = 0; j < 2; ++j) {
        const int w = (j + r) % 2;
        // One engine at a time: an idle engine's thread still takes a share of the cores.
        infer::Engine e(w == 0 ? m : q, tok, cfg);
        decode_rate(e, V, ctx, batch, 4);  // warm-up
        rate[w] = decode_rate(e, V, ctx, batch, new_tokens);
      }
      std::printf(
          "RESULT round=%d batch=%lld ctx=%lld f32_tokens_per_s=%.2f int%d_tokens_per_s=%.2f "
          "int%d_over_f32=%.3f\n",
          r, static_cast<long long>(batch), static_cast<long long>(ctx), rate[0], bits, rate[1],
          bits, rate[1] / rate[0]);
      std::fflush(stdout);
    }
  }
  return 0;
}

int run_dir(const std::string& dir, const data::Tokenizer& tok, int64_t ctx, int64_t new_tokens,
            int64_t chunk, int64_t show, uint64_t seed, bool batch16, int int8, int quantize,
            int act, bool bf16, const std::string& heldout) {
  namespace fs = std::filesystem;
  if (!fs::exists(fs::path(dir) / "model.safetensors")) {
    const model::Decoder r =
        model::Decoder::random(model::ModelConfig::load(dir + "/config.json"), seed);
    r.config().save(dir + "/config.json");
    r.weights().save(dir + "/model.safetensors");
    std::printf("saved random weights (seed %llu) to %s\n", static_cast<unsigned long long>(seed),
                dir.c_str());
  }
  model::Decoder m = model::Decoder::load(dir, bf16 ? DType::BF16 : DType::F32);
  if (int8)
    return quant_side_by_side(dir, m, tok, ctx, new_tokens, chunk, batch16, int8 == 4 ? 4 : 8, act,
                              heldout);
  if (quantize) {
    const int64_t n = m.quantize(quantize, act);
    std::printf("int%d weights%s: %lld tensors, %.1f MB of codes and scales\n", quantize,
                act ? ", int8 activations" : "", static_cast<long long>(n),
                m.weights().quant_bytes() / 1e6);
  }
  const model::ModelConfig& c = m.config();
  std::printf("model %s: %lld layers (%lld MLA), d %lld, V %lld; %lld-token prompts, %lld new\n",
              dir.c_str(), static_cast<long long>(c.num_hidden_layers),
              static_cast<long long>(c.num_mla_layers()), static_cast<long long>(c.hidden_size),
              static_cast<long long>(c.vocab_size), static_cast<long long>(ctx),
              static_cast<long long>(new_tokens));
  infer::EngineConfig cfg;
  cfg.cache_budget_bytes = 8ll << 30;
  cfg.prefill_chunk = chunk;
  for (const int64_t batch : {int64_t{1}, int64_t{16}}) {
    if (batch == 16 && !batch16) continue;
    infer::Engine e(m, tok, cfg);
    decode_rate(e, c.vocab_size, ctx, batch, 4);  // warm-up
    if (batch == 1) {  // prefill: one request's prompt, to its first token, in a fresh engine
      infer::Engine fresh(m, tok, cfg);  // (e's prefix cache holds this prompt by now)
      infer::Request r;
      r.prompt = prompt(ctx, c.vocab_size, 0);
      r.params.temperature = 0, r.params.ignore_eos = true, r.params.max_tokens = 1;
      const auto t0 = Clock::now();
      fresh.generate(r);
      const double s = std::chrono::duration<double>(Clock::now() - t0).count();
      std::printf("RESULT myriad prefill ctx=%lld tokens_per_s=%.2f\n", static_cast<long long>(ctx),
                  ctx / s);
    }
    std::vector<std::vector<int32_t>> ids;
    const double rate = decode_rate(e, c.vocab_size, ctx, batch, new_tokens, &ids);
    const model::CacheSizes z = model::cache_sizes(c, 4, 4);  // f32, whole 256-token pages
    const int64_t cache = z.kda_bytes + z.mla_bytes_per_token * ((ctx + 255) / 256 * 256);
    std::printf("RESULT myriad batch=%lld ctx=%lld tokens_per_s=%.2f cache_bytes_per_seq=%lld\n",
                static_cast<long long>(batch), static_cast<long long>(ctx), rate,
                static_cast<long long>(cache));
    for (int64_t b = 0; b < batch; ++b) {
      std::printf("TOKENS batch=%lld seq=%lld", static_cast<long long>(batch),
                  static_cast<long long>(b));
      for (int64_t i = 0; i < std::min<int64_t>(show, std::ssize(ids[b])); ++i)
        std::printf(" %d", ids[b][i]);
      std::printf("\n");
    }
    std::fflush(stdout);
  }
  return 0;
}

int run(int argc, char** argv) {
  const std::string preset =
      take_flag(argc, argv, "medium", "MYRIAD_BENCH_MEDIUM", 0) > 0 ? "medium" : "tiny";
  const auto ctx = static_cast<int64_t>(take_flag(argc, argv, "ctx", "MYRIAD_BENCH_CTX", 1024));
  const auto new_tokens =
      static_cast<int64_t>(take_flag(argc, argv, "new", "MYRIAD_BENCH_NEW", 32));
  const auto measure_ctx =
      static_cast<int64_t>(take_flag(argc, argv, "measure_ctx", "MYRIAD_BENCH_MCTX", 16384));
  const auto long_kda =
      static_cast<int64_t>(take_flag(argc, argv, "long", "MYRIAD_BENCH_LONG", 1 << 20));
  const auto long_mla =
      static_cast<int64_t>(take_flag(argc, argv, "long_mla", "MYRIAD_BENCH_LONG_MLA", 1 << 18));
  const auto chunk =
      static_cast<int64_t>(take_flag(argc, argv, "chunk", "MYRIAD_BENCH_CHUNK", 4096));
  const auto show = static_cast<int64_t>(take_flag(argc, argv, "show", "MYRIAD_BENCH_SHOW", 8));
  const auto seed = static_cast<uint64_t>(take_flag(argc, argv, "seed", "MYRIAD_BENCH_SEED", 1));
  const bool batch16 = take_flag(argc, argv, "batch16", "MYRIAD_BENCH_BATCH16", 1) != 0;
  const int int8 = static_cast<int>(take_flag(argc, argv, "int8", "MYRIAD_BENCH_INT8", 0));
  const int quantize =
      static_cast<int>(take_flag(argc, argv, "quantize", "MYRIAD_BENCH_QUANTIZE", 0));
  if (quantize != 0 && quantize != 8 && quantize != 4) {
    std::fprintf(stderr, "bench_decode: --quantize takes 0 (f32), 8 (int8) or 4 (int4), not %d\n",
                 quantize);
    return 2;
  }
  const int act = static_cast<int>(take_flag(argc, argv, "act", "MYRIAD_BENCH_ACT", 0));
  const bool bf16 = take_flag(argc, argv, "bf16", "MYRIAD_BENCH_BF16", 0) != 0;
  const std::string heldout = take_string(argc, argv, "heldout", "MYRIAD_BENCH_HELDOUT", "");
  if (bf16 && (int8 || quantize)) {
    std::fprintf(stderr,
                 "bench_decode: --bf16=1 loads bf16 weights; it does not go with --int8 or "
                 "--quantize (their models start from f32)\n");
    return 2;
  }
  if (act != 0 && !(act == 8 && (quantize == 8 || int8 == 1 || int8 == 8))) {
    std::fprintf(stderr, "bench_decode: --act=8 (int8 activations) goes with int8 weights\n");
    return 2;
  }
  NoGradGuard ng;
  std::printf("bench_decode: %s, %s, OMP threads %d\n",
              argc == 2 ? argv[1] : ("preset " + preset).c_str(),
              argc != 2       ? "f32"
              : int8          ? "f32 and quantized weights"
              : quantize == 8 ? (act ? "int8 weights and activations" : "int8 weights")
              : quantize == 4 ? "int4 weights"
              : bf16          ? "bf16"
                              : "f32",
              omp_get_max_threads());
  const std::string dir = "/tmp/myriad_bench_decode_" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  const data::Tokenizer tok =
      data::Tokenizer::train(data::synthetic_fallback_corpus(7, 200000), 512, dir + "/t.model");
  std::filesystem::remove_all(dir);
  if (argc == 2)
    return run_dir(argv[1], tok, ctx, new_tokens, chunk, show, seed, batch16, int8, quantize, act,
                   bf16, heldout);

  const model::ModelConfig hybrid = model::preset(preset);
  const model::ModelConfig mla = all_mla(hybrid);
  struct Row {
    std::string name;
    model::ModelConfig c;
  };
  const std::vector<Row> rows = {{"hybrid (" + std::to_string(hybrid.num_mla_layers()) + " MLA / " +
                                      std::to_string(hybrid.num_hidden_layers) + ")",
                                  hybrid},
                                 {"all MLA", mla}};
  // 2. Cache bytes per sequence.
  std::printf("\ncache bytes per sequence (f32 values, KDA state f32, pages of 256 tokens):\n");
  std::printf("%-22s %14s %14s %14s\n", "model", "1K", "16K", "128K");
  for (const Row& r : rows) {
    const model::CacheSizes z = model::cache_sizes(r.c, 4, 4);
    auto paged = [&](int64_t t) {
      return z.kda_bytes + z.mla_bytes_per_token * ((t + 255) / 256 * 256);
    };
    std::printf("%-22s %14lld %14lld %14lld\n", r.name.c_str(), static_cast<long long>(paged(1024)),
                static_cast<long long>(paged(16384)), static_cast<long long>(paged(131072)));
  }
  // 1. Decode throughput, and the measured cache after a prefill of measure_ctx tokens.
  std::printf("\ndecode tokens/s (greedy, %lld-token prompts, %lld new tokens each):\n",
              static_cast<long long>(ctx), static_cast<long long>(new_tokens));
  std::printf("%-22s %12s %12s %22s\n", "model", "batch 1", "batch 16",
              ("measured cache @" + std::to_string(measure_ctx)).c_str());
  for (const Row& r : rows) {
    model::Decoder m = model::Decoder::random(r.c, 1);
    infer::EngineConfig cfg;
    cfg.cache_budget_bytes = 8ll << 30;
    cfg.prefill_chunk = chunk;
    double rate[2];
    const int64_t batches[2] = {1, 16};
    for (int i = 0; i < 2; ++i) {
      infer::Engine e(m, tok, cfg);
      decode_rate(e, r.c.vocab_size, ctx, batches[i], 4);  // warm-up
      rate[i] = decode_rate(e, r.c.vocab_size, ctx, batches[i], new_tokens);
    }
    int64_t measured = -1;
    if (measure_ctx > 0) {
      infer::Engine e(m, tok, cfg);
      infer::Request q;
      q.prompt = prompt(measure_ctx - 1, r.c.vocab_size, 3);
      q.params.temperature = 0, q.params.ignore_eos = true, q.params.max_tokens = 1;
      std::promise<int64_t> used;
      e.submit(q, [&](const infer::TokenEvent& ev) {
        if (ev.finished) used.set_value(e.stats().cache_bytes_peak);
        return true;
      });
      measured = used.get_future().get();
    }
    std::printf("%-22s %12.1f %12.1f %22lld\n", r.name.c_str(), rate[0], rate[1],
                static_cast<long long>(measured));
    std::fflush(stdout);
  }
  // 3. Long inputs, segment by segment.
  std::printf("\nlong input, segment by segment (peak RSS of the process):\n");
  model::ModelConfig small = model::tiny();
  if (long_kda > 0) {
    model::Decoder m = model::Decoder::random(all_kda(small), 2);
    infer::EngineConfig cfg;
    cfg.prefill_chunk = chunk, cfg.max_context = long_kda + 1;
    read_long(m, tok, cfg, long_kda, "tiny, every layer KDA");
  }
  if (long_mla > 0) {
    model::Decoder m = model::Decoder::random(small, 2);
    infer::EngineConfig cfg;
    cfg.prefill_chunk = chunk, cfg.max_context = long_mla + 1;
    const model::CacheSizes z = model::cache_sizes(small, 4, 4);
    cfg.cache_budget_bytes = z.kda_bytes + z.mla_bytes_per_token * 8192;  // an 8K-token window
    read_long(m, tok, cfg, long_mla, "tiny hybrid, sliding MLA window");
    cfg.cache_budget_bytes = 1ll << 30;
    const int64_t full = std::min<int64_t>(long_mla, 65536);
    cfg.max_context = full + 1;
    read_long(m, tok, cfg, full, "tiny hybrid, whole MLA cache (paged)");
  }
  return 0;
}

}  // namespace
}  // namespace myriad::bench

int main(int argc, char** argv) {
  return myriad::bench::run(argc, argv);
}
