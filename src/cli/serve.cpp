#include "cli/serve.h"

#include <pthread.h>
#include <sys/resource.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <mutex>
#include <stdexcept>

#include "core/dtype.h"
#include "core/error.h"
#include "data/tokenizer.h"
#include "infer/engine.h"
#include "infer/generation_config.h"
#include "model/decoder.h"
#include "ops/shape.h"
#include "serve/protocol.h"
#include "serve/server.h"
#include "vision/image.h"

namespace myriad::cli {

bool InferArgs::selected() const {
  return (serve && *serve) || (generate && *generate) || (chat && *chat);
}

int64_t parse_bytes(const std::string& text) {
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    throw std::invalid_argument("not a size: '" + text + "'");
  }
  const std::string unit = text.substr(used);
  double scale = 1;
  if (unit == "K" || unit == "KiB")
    scale = 1 << 10;
  else if (unit == "M" || unit == "MiB")
    scale = 1 << 20;
  else if (unit == "G" || unit == "GiB")
    scale = 1 << 30;
  else if (!unit.empty())
    throw std::invalid_argument("unknown size unit in '" + text + "'");
  if (!(v > 0)) throw std::invalid_argument("size must be positive: '" + text + "'");
  return static_cast<int64_t>(v * scale);
}

void add_infer_commands(CLI::App& app, InferArgs& a) {
  const auto common = [&](CLI::App* c) {
    c->add_option(
         "model_dir", a.model_dir,
         "model directory: config.json, safetensors weights, a tokenizer (tokenizer.model, "
         "tiktoken.model or tokenizer.json)")
        ->required()
        ->check(CLI::ExistingDirectory);
    c->add_option("--dtype", a.dtype, "weights dtype: f32 or bf16")
        ->check(CLI::IsMember({"f32", "bf16"}));
    c->add_option("--quantize", a.quantize,
                  "quantization of the projections and LM head for decoding: none, int8 or int4 "
                  "(weight-only: 8- or 4-bit codes, one f32 scale per 32 weights), or w8a8 (int8 "
                  "weights, and decode's products quantize their activations to int8 per 32 too, "
                  "as llama.cpp's q8_0 does)")
        ->check(CLI::IsMember({"none", "int8", "int4", "w8a8"}));
    c->add_option("--max-batch", a.max_batch, "sequences decoded together")
        ->check(CLI::Range(1, 4096));
    c->add_option("--cache-budget", a.cache_budget,
                  "cache memory for all sequences (e.g. 512M, 4G)");
    c->add_option("--block-tokens", a.block_tokens, "tokens per MLA cache page")
        ->check(CLI::Range(1, 1 << 20));
    c->add_option("--prefill-chunk", a.prefill_chunk, "prompt tokens per prefill forward")
        ->check(CLI::Range(1, 1 << 24));
    c->add_option("--context", a.context, "max prompt + completion tokens (0: the model's)")
        ->check(CLI::Range(0, 1 << 30));
  };
  const auto sampling = [&](CLI::App* c) {
    c->add_option("--temperature", a.temperature, "0: greedy")->check(CLI::Range(0.0, 2.0));
    c->add_option("--top-k", a.top_k, "0: off")->check(CLI::Range(0, 1 << 30));
    c->add_option("--top-p", a.top_p, "nucleus mass (1: off)")->check(CLI::Range(1e-9, 1.0));
    c->add_option("--min-p", a.min_p, "0: off")->check(CLI::Range(0.0, 1.0));
    c->add_option("--repetition-penalty", a.repetition_penalty, "1: off")
        ->check(CLI::Range(1e-6, 10.0));
    c->add_option("--presence-penalty", a.presence_penalty)->check(CLI::Range(-2.0, 2.0));
    c->add_option("--frequency-penalty", a.frequency_penalty)->check(CLI::Range(-2.0, 2.0));
    c->add_option("--max-tokens", a.max_tokens, "new tokens per reply")
        ->check(CLI::Range(1, 1 << 30));
    c->add_option("--seed", a.seed, "sampling seed (-1: random)");
    c->add_option("--stop", a.stop, "stop sequence (repeatable)");
    c->add_flag("--ignore-eos", a.ignore_eos, "keep going past the end-of-text token");
  };
  a.serve = app.add_subcommand("serve", "OpenAI-compatible HTTP server (docs/SERVING.md)");
  common(a.serve);
  a.serve->add_option("--host", a.host, "address to listen on");
  a.serve->add_option("--port", a.port, "port (0: any free one)")->check(CLI::Range(0, 65535));
  a.serve->add_option("--model-name", a.model_name,
                      "model id clients send (default: directory name)");
  a.serve->add_option("--threads", a.threads, "HTTP worker threads (requests served at once)")
      ->check(CLI::Range(1, 4096));
  a.serve
      ->add_option("--max-connections", a.max_connections,
                   "open client connections in total (over: 503)")
      ->check(CLI::Range(1, 1 << 20));
  a.serve
      ->add_option("--max-connections-per-client", a.max_connections_per_client,
                   "open connections per client address (over: 429)")
      ->check(CLI::Range(1, 1 << 20));
  a.serve
      ->add_option("--header-timeout", a.header_timeout,
                   "seconds a request's headers may take to arrive (then 408)")
      ->check(CLI::Range(0.1, 3600.0));
  a.serve
      ->add_option("--body-timeout", a.body_timeout,
                   "seconds a request's body may take after its headers (then 408)")
      ->check(CLI::Range(0.1, 3600.0));
  a.serve
      ->add_option("--keep-alive-timeout", a.keep_alive_timeout,
                   "seconds an idle keep-alive connection is kept")
      ->check(CLI::Range(1.0, 3600.0));
  a.serve->add_option("--max-body", a.max_body, "largest request body in bytes")
      ->check(CLI::Range(1, 1 << 30));
  a.serve
      ->add_option("--max-tokens-limit", a.max_tokens_limit, "largest max_tokens a request may ask")
      ->check(CLI::Range(1, 1 << 30));
  a.serve->add_option("--api-key", a.api_key, "require Authorization: Bearer KEY on /v1/*");
  a.serve->add_option("--shutdown-grace", a.grace, "seconds running requests get on SIGINT/SIGTERM")
      ->check(CLI::Range(0.0, 3600.0));
  a.generate = app.add_subcommand("generate", "continue a prompt (raw text, no chat template)");
  common(a.generate);
  sampling(a.generate);
  a.generate->add_option("--prompt", a.prompt, "the text to continue")->required();
  a.generate
      ->add_option("--image", a.images,
                   "PNG or JPEG read before the prompt (repeatable; a model with a vision "
                   "tower)")
      ->check(CLI::ExistingFile);
  a.chat = app.add_subcommand("chat", "interactive chat on stdin/stdout (keeps the conversation)");
  common(a.chat);
  sampling(a.chat);
  a.chat->add_option("--system", a.system, "system message");
}

namespace {

struct Loaded {
  model::Decoder model;
  data::Tokenizer tok;
  serve::ChatTemplate tmpl;
  infer::EngineConfig cfg;
  infer::GenerationConfig gen{};
};

Loaded load(const InferArgs& a) {
  namespace fs = std::filesystem;
  const fs::path dir(a.model_dir);
  Loaded l{model::Decoder::load(a.model_dir, dtype_from_name(a.dtype)),
           data::Tokenizer::from_dir(a.model_dir),
           serve::ChatTemplate::from_model_dir(a.model_dir),
           {},
           infer::GenerationConfig::from_model_dir(a.model_dir)};
  if (const auto& sk = l.model.weights().skipped(); !sk.empty())
    std::fprintf(stderr,
                 "note: %zu tensor(s) (%s, ...) skipped: vision tensors without a vision_config "
                 "(the text model runs without image input) or multi-token-prediction layers\n",
                 sk.size(), sk.front().c_str());
  for (const int32_t id : l.gen.eos_token_ids)
    if (id >= l.tok.vocab_size())
      throw std::invalid_argument(cat(a.model_dir, "/generation_config.json: eos_token_id ", id,
                                      " is outside the tokenizer's vocabulary of ",
                                      l.tok.vocab_size()));
  if (a.quantize != "none") {
    const int64_t n = l.model.quantize(a.quantize == "int4" ? 4 : 8, a.quantize == "w8a8" ? 8 : 0);
    std::fprintf(stderr, "%s: %lld weights quantized (%.1f MB of codes and scales)\n",
                 a.quantize.c_str(), static_cast<long long>(n),
                 l.model.weights().quant_bytes() / 1e6);
  }
  if (l.tok.vocab_size() > l.model.config().vocab_size)
    throw std::invalid_argument("tokenizer vocabulary (" + std::to_string(l.tok.vocab_size()) +
                                ") is larger than the model's (" +
                                std::to_string(l.model.config().vocab_size) + ")");
  {
    // A tokenizer without control tokens for the template's markers (one trained before they
    // were added) reads them as plain text, which a client can write too.
    serve::ChatRequest probe;
    probe.messages.push_back({"user", "x", "", "", {}});
    const auto ids = serve::prompt_ids(l.tok, serve::render_chat(l.tmpl, probe));
    if (std::none_of(ids.begin(), ids.end(),
                     [&](int32_t t) { return t != l.tok.bos() && l.tok.is_special(t); }))
      std::fprintf(stderr,
                   "warning: the chat template's markers are not special tokens of %s's tokenizer: "
                   "they are plain text, and a client could write them into its messages\n",
                   a.model_dir.c_str());
  }
  l.cfg.max_batch = a.max_batch;
  l.cfg.cache_budget_bytes = parse_bytes(a.cache_budget);
  l.cfg.block_tokens = a.block_tokens;
  l.cfg.prefill_chunk = a.prefill_chunk;
  const int64_t model_ctx = l.model.config().model_max_length;
  l.cfg.max_context = a.context > 0 ? a.context : model_ctx > 0 ? model_ctx : 4096;
  return l;
}

// Flags first, then generation_config.json, then the command's defaults.
infer::SamplingParams sampling(const InferArgs& a, const infer::GenerationConfig& g) {
  infer::SamplingParams s;
  s.temperature = a.temperature.value_or(g.present ? g.default_temperature() : 0.7);
  s.top_k = a.top_k.value_or(g.top_k.value_or(0));
  s.top_p = a.top_p.value_or(g.top_p.value_or(1.0));
  s.min_p = a.min_p.value_or(g.min_p.value_or(0.0));
  s.repetition_penalty = a.repetition_penalty.value_or(g.repetition_penalty.value_or(1.0));
  s.presence_penalty = a.presence_penalty;
  s.frequency_penalty = a.frequency_penalty;
  if (a.seed >= 0) s.seed = static_cast<uint64_t>(a.seed);
  s.max_tokens = a.max_tokens.value_or(g.max_new_tokens.value_or(256));
  s.stop = a.stop;
  s.ignore_eos = a.ignore_eos;
  if (!a.ignore_eos) s.stop_tokens = g.eos_token_ids;
  return s;
}

// Streams one reply to stdout; returns its text.
std::string stream_reply(infer::Engine& engine, infer::Request req) {
  infer::SamplingParams& sp = req.params;
  const int64_t budget = engine.config().max_context - static_cast<int64_t>(req.prompt.size());
  if (budget < 1) throw std::invalid_argument("the conversation no longer fits the context");
  sp.max_tokens = std::min(sp.max_tokens, budget);
  const auto t0 = std::chrono::steady_clock::now();
  infer::TokenEvent last;
  int64_t n = 0;
  std::string text;
  // The callback prints on the engine thread; generate() waits for the end.
  std::mutex m;
  std::condition_variable cv;
  bool done = false;
  engine.submit(std::move(req), [&](const infer::TokenEvent& e) {
    std::fwrite(e.text.data(), 1, e.text.size(), stdout);
    std::fflush(stdout);
    std::lock_guard lock(m);
    text += e.text;
    n += e.token >= 0;
    if (e.finished) last = e, done = true, cv.notify_one();
    return true;
  });
  std::unique_lock lock(m);
  cv.wait(lock, [&] { return done; });
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::fprintf(stderr, "\n[%lld tokens, %.1f tokens/s, finish: %s%s%s]\n",
               static_cast<long long>(n), n / std::max(s, 1e-9), last.finish_reason.c_str(),
               last.error.empty() ? "" : ": ", last.error.c_str());
  return text;
}

int serve_command(const InferArgs& a) {
  // Signals go to sigwait below, not to whichever thread the engine or the server runs.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  Loaded l = load(a);
  infer::Engine engine(l.model, l.tok, l.cfg);
  serve::ServeConfig cfg;
  cfg.host = a.host;
  cfg.port = a.port;
  cfg.threads = a.threads;
  cfg.connections.max_connections = a.max_connections;
  cfg.connections.max_per_client = a.max_connections_per_client;
  cfg.connections.header_timeout = a.header_timeout;
  cfg.connections.body_timeout = a.body_timeout;
  cfg.connections.idle_timeout = a.keep_alive_timeout;
  // Each connection is a descriptor: lift the soft limit (often 1024) to the hard one.
  rlimit files{};
  if (getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur < files.rlim_max) {
    files.rlim_cur = files.rlim_max;
    setrlimit(RLIMIT_NOFILE, &files);
  }
  cfg.api_key = a.api_key;
  cfg.limits.model =
      a.model_name.empty()
          ? std::filesystem::absolute(a.model_dir).lexically_normal().filename().string()
          : a.model_name;
  if (cfg.limits.model.empty()) cfg.limits.model = "myriad";
  cfg.limits.max_body_bytes = static_cast<size_t>(a.max_body);
  cfg.limits.context = l.cfg.max_context;
  cfg.limits.max_tokens = std::min(a.max_tokens_limit, l.cfg.max_context);
  // generation_config.json: the defaults of fields a request leaves out, and its end tokens.
  const infer::GenerationConfig& g = l.gen;
  cfg.limits.defaults.temperature = std::min(g.default_temperature(), 2.0);
  cfg.limits.defaults.top_p = g.top_p.value_or(1.0);
  cfg.limits.defaults.min_p = g.min_p.value_or(0.0);
  cfg.limits.defaults.top_k = g.top_k.value_or(0);
  cfg.limits.defaults.repetition_penalty = g.repetition_penalty.value_or(1.0);
  cfg.stop_tokens = g.eos_token_ids;
  serve::Server server(engine, l.tok, l.tmpl, cfg);
  const int port = server.start();
  std::printf("myriad serve: model '%s' on http://%s:%d (context %lld, max batch %lld)\n",
              cfg.limits.model.c_str(), a.host.c_str(), port,
              static_cast<long long>(cfg.limits.context), static_cast<long long>(a.max_batch));
  std::fflush(stdout);
  int sig = 0;
  sigwait(&sigs, &sig);
  std::printf("myriad serve: signal %d, shutting down (grace %.0f s)\n", sig, a.grace);
  std::fflush(stdout);
  server.shutdown(a.grace);
  return 0;
}

// Images for the model's tower: the file read, decoded and preprocessed like the server does it
// (vision/image.h), appended to the request; returns its placeholder block for the prompt.
std::string add_image(const model::Decoder& m, const std::string& path, infer::Request& req) {
  MYRIAD_CHECK(m.config().vision.has_value(), "--image: ", path,
               ": the model has no vision tower (config.json lacks vision_config)");
  std::ifstream f(path, std::ios::binary);
  MYRIAD_CHECK(f.good(), "--image: cannot read ", path);
  const std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  vision::Processed p;
  try {
    p = vision::preprocess(vision::decode_image(bytes),
                           vision::PreprocessOptions::from(*m.config().vision));
  } catch (const Error& e) {
    throw Error(cat(path, ": ", e.what()));
  }
  req.pixel_values = req.pixel_values.defined() ? ops::concat({req.pixel_values, p.pixel_values}, 0)
                                                : p.pixel_values;
  req.grids.push_back(p.grid);
  return vision::image_block(p.tokens);
}

int generate_command(const InferArgs& a) {
  Loaded l = load(a);
  infer::Engine engine(l.model, l.tok, l.cfg);
  infer::Request req;
  std::string blocks;
  for (const std::string& im : a.images) blocks += add_image(l.model, im, req);
  req.prompt = l.tok.encode_parts({{blocks, true}, {a.prompt, false}});
  if (req.prompt.empty() && std::max(l.tok.eos(), l.tok.bos()) >= 0)
    req.prompt = {l.tok.eos() >= 0 ? l.tok.eos() : l.tok.bos()};
  if (req.prompt.empty()) throw std::invalid_argument("--prompt is empty");
  std::fputs(a.prompt.c_str(), stdout);
  req.params = sampling(a, l.gen);
  stream_reply(engine, std::move(req));
  return 0;
}

int chat_command(const InferArgs& a) {
  Loaded l = load(a);
  infer::Engine engine(l.model, l.tok, l.cfg);
  serve::ChatRequest conv;
  if (!a.system.empty()) conv.messages.push_back({"system", a.system, "", "", {}});
  std::fprintf(stderr,
               "myriad chat: one message per line; /image FILE attaches a PNG or JPEG to the "
               "next message; /reset clears, /exit or EOF quits\n");
  // The conversation's images (every turn re-reads the whole conversation) and the ones waiting
  // for the next message.
  infer::Request images;
  std::vector<std::string> blocks;
  size_t pending = 0;
  std::string line;
  while (std::fprintf(stderr, "> "), std::getline(std::cin, line)) {
    if (line == "/exit") break;
    if (line == "/reset") {
      conv.messages.resize(a.system.empty() ? 0 : 1);
      images = {}, blocks.clear(), pending = 0;
      continue;
    }
    if (line.rfind("/image ", 0) == 0) {
      try {
        infer::Request one = images;
        blocks.push_back(add_image(l.model, line.substr(7), one));
        images = std::move(one);
        ++pending;
        std::fprintf(stderr, "myriad chat: image attached to your next message\n");
      } catch (const Error& e) {
        std::fprintf(stderr, "myriad chat: %s\n", e.what());
      }
      continue;
    }
    if (line.empty()) continue;
    serve::Message msg{"user", line, "", "", {}};
    msg.images.resize(pending);  // at the start of the message, in the order attached
    conv.messages.push_back(msg);
    const serve::Prompt p = serve::render_chat(l.tmpl, conv, blocks);
    infer::Request req = images;
    req.prompt = serve::prompt_ids(l.tok, p);
    req.params = sampling(a, l.gen);
    req.params.stop.insert(req.params.stop.end(), p.stop.begin(), p.stop.end());
    try {
      conv.messages.push_back({"assistant", stream_reply(engine, std::move(req)), "", "", {}});
      pending = 0;
    } catch (const std::invalid_argument& e) {
      std::fprintf(stderr, "myriad chat: %s (try /reset)\n", e.what());
      conv.messages.pop_back();
    }
  }
  return 0;
}

}  // namespace

int infer_command(const InferArgs& a) {
  try {
    if (*a.serve) return serve_command(a);
    if (*a.generate) return generate_command(a);
    return chat_command(a);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "myriad: error: %s\n", e.what());
    return 1;
  }
}

}  // namespace myriad::cli
