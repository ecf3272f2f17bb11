// The inference engine (inference issue items 1-3): requests come in from any thread, one engine
// thread runs continuous batching: chunked prefill of new sequences, then decode steps that all
// running sequences share. KDA layers keep their constant-size state per sequence; MLA layers keep
// their latents in a paged cache (fixed-size blocks from one pool, a block table per sequence)
// under a memory budget; requests wait (fair, first come first served) until the budget admits
// them. Sampling per request (see SamplingParams). Tokens stream back through a callback.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "data/tokenizer.h"
#include "model/decoder.h"

namespace myriad::infer {

struct SamplingParams {
  double temperature = 1.0;  // 0: greedy
  int top_k = 0;             // 0: off
  double top_p = 1.0;        // 1: off
  double min_p = 0.0;        // 0: off
  double repetition_penalty = 1.0;  // 1: off (CTRL-style: divide positive logits, multiply negative)
  double presence_penalty = 0.0;    // OpenAI semantics, over generated tokens
  double frequency_penalty = 0.0;
  std::optional<uint64_t> seed;     // none: a fresh seed per request
  int64_t max_tokens = 256;         // new tokens
  std::vector<std::string> stop;    // stop sequences (text); the matched text is not returned
  bool ignore_eos = false;
  int top_logprobs = -1;            // -1: no logprobs; 0..20: logprob of the pick + that many alternatives
};

struct Request {
  std::vector<int32_t> prompt;  // token ids (the caller applies any chat template)
  SamplingParams params;
};

struct TokenEvent {
  uint64_t request = 0;
  int32_t token = -1;         // -1 on the final event when it carries no token
  std::string text;           // newly decodable text (UTF-8 complete; held back text for stops)
  double logprob = 0;         // when requested
  std::vector<std::pair<int32_t, double>> top;  // when requested: alternatives, best first
  bool finished = false;
  std::string finish_reason;  // on the final event: "stop", "length", "cancelled", "error"
  std::string error;          // finish_reason "error": what went wrong
};

struct EngineConfig {
  int64_t max_batch = 16;                  // sequences decoded together
  int64_t cache_budget_bytes = 1ll << 30;  // MLA pages + KDA states of all running sequences
  int64_t block_tokens = 256;              // tokens per MLA cache page
  int64_t prefill_chunk = 2048;            // prompt tokens per prefill forward
  int64_t max_context = 1 << 20;           // prompt + max_tokens limit per request
};

struct EngineStats {
  int64_t waiting = 0, running = 0;
  int64_t cache_bytes_used = 0, cache_bytes_budget = 0;
  int64_t requests_finished = 0, prompt_tokens = 0, generated_tokens = 0;
  double decode_tokens_per_s = 0;  // over the recent window
};

// Callback: called on the engine thread for every event; return false to cancel the request
// (e.g. the client disconnected). It must not block for long.
using TokenCallback = std::function<bool(const TokenEvent&)>;

class Engine {
 public:
  Engine(const model::Decoder& model, const data::Tokenizer& tokenizer, EngineConfig config = {});
  ~Engine();  // stops the thread; pending requests finish with "cancelled"
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Thread-safe. Throws std::invalid_argument for a request that can never run (empty prompt,
  // prompt + max_tokens over max_context, a prompt larger than the whole cache budget ...).
  uint64_t submit(Request request, TokenCallback on_event);
  void cancel(uint64_t request);  // thread-safe; the final event says "cancelled"
  EngineStats stats() const;      // thread-safe
  const EngineConfig& config() const;

  struct Completion {
    std::vector<int32_t> tokens;
    std::string text;
    std::vector<double> logprobs;
    std::string finish_reason;
  };
  // Submit and wait.
  Completion generate(Request request);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace myriad::infer
