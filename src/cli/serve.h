// `myriad serve MODEL_DIR`, `myriad generate MODEL_DIR --prompt ...` and `myriad chat MODEL_DIR`:
// the OpenAI-compatible server (docs/SERVING.md) and two terminal front ends of the same engine.
// A model directory holds config.json, the safetensors weights and a tokenizer (tokenizer.model,
// tiktoken.model or tokenizer.json), and optionally a chat template and generation_config.json
// (docs/CHECKPOINTS.md).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace myriad::cli {

struct InferArgs {
  std::string model_dir, dtype = "f32", quantize = "none";
  // Engine.
  int64_t max_batch = 16, block_tokens = 256, prefill_chunk = 2048;
  int64_t context = 0;  // prompt + completion; 0: config.json's model_max_length (or 4096)
  std::string cache_budget = "1G";
  // Sampling (generate and chat). Unset: generation_config.json's value, else temperature 0.7,
  // top_p 1, min_p 0, repetition_penalty 1, top_k 0 (off), max_tokens 256.
  std::optional<double> temperature, top_p, min_p, repetition_penalty;
  double presence_penalty = 0.0, frequency_penalty = 0.0;
  std::optional<int> top_k;
  std::optional<int64_t> max_tokens;
  int64_t seed = -1;  // -1: a fresh one
  std::vector<std::string> stop;
  bool ignore_eos = false;
  std::string prompt, system;
  std::vector<std::string> images;  // generate --image
  // Server.
  std::string host = "127.0.0.1", model_name, api_key;
  int port = 8000, threads = 64;
  int64_t max_body = 1 << 20, max_tokens_limit = 4096;
  double grace = 10;
  // The connection front (serve/connections.h).
  int max_connections = 2048, max_connections_per_client = 256;
  double header_timeout = 10, body_timeout = 30, keep_alive_timeout = 5;

  CLI::App *serve = nullptr, *generate = nullptr, *chat = nullptr;
  bool selected() const;
};

// Registers `serve`, `generate` and `chat` on app.
void add_infer_commands(CLI::App& app, InferArgs& args);
int infer_command(const InferArgs& args);

// "1073741824", "512M", "2G", "64K" -> bytes; throws std::invalid_argument.
int64_t parse_bytes(const std::string& text);

}  // namespace myriad::cli
