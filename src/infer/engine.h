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
#include "vision/tower.h"

namespace myriad::infer {

struct SamplingParams {
  double temperature = 1.0;  // 0: greedy
  int top_k = 0;             // 0: off
  double top_p = 1.0;        // 1: off
  double min_p = 0.0;        // 0: off
  // 1: off (CTRL-style: divide positive logits, multiply negative; over prompt and generated)
  double repetition_penalty = 1.0;
  double presence_penalty = 0.0;  // OpenAI semantics, over generated tokens
  double frequency_penalty = 0.0;
  std::optional<uint64_t> seed;   // none: a fresh seed per request
  int64_t max_tokens = 256;       // new tokens
  std::vector<std::string> stop;  // stop sequences (text); the matched text is not returned
  // Token ids that end the request ("stop") like EOS: the final event carries the token (its
  // text is not returned). Agent rollouts stop on the chat template's end marker this way.
  std::vector<int32_t> stop_tokens;
  bool ignore_eos = false;
  int top_logprobs = -1;  // -1: no logprobs; 0..20: logprob of the pick + that many alternatives
};

struct Request {
  std::vector<int32_t> prompt;  // token ids (the caller applies any chat template)
  SamplingParams params;
  // Images (a model with a vision tower, MODEL.md §10): processed pixels [Σ t·h·w, 3·p·p] and
  // one grid per image, whose merged tokens fill the prompt's <|media_pad|> placeholders in
  // order (their count must match). Encoded once when the prefill starts; such a prompt neither
  // uses nor leaves a shared prefix (equal placeholder tokens may stand for other pixels).
  Tensor pixel_values{};
  std::vector<vision::Grid> grids{};
};

struct TokenEvent {
  uint64_t request = 0;
  // -1 on the final event when it carries no token (cancelled, error). An EOS that ends the
  // request ("stop") comes as the final event's token, with no text of its own.
  int32_t token = -1;
  std::string text;    // newly decodable text (UTF-8 complete; held back text for stops)
  double logprob = 0;  // when requested
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
  // A request whose full MLA cache exceeds the budget runs with a sliding MLA window of as many
  // pages per layer as the budget allows (KDA state carried whole; at least 2 pages); false:
  // such a request is rejected. Not with the admission gate, whose cache is unpaged.
  bool allow_sliding_mla = true;
  // Prefix sharing: up to this many page-aligned prompt prefixes are kept (KDA states + the MLA
  // pages, counted in the budget, least recently used dropped first, and whenever a waiting
  // request needs their room); a request whose prompt starts with one skips reading it. 0: off.
  int64_t prefix_cache_entries = 8;
};

// What a request reserves from the budget at admission (its worst case: prompt + max_tokens).
struct CachePlan {
  int64_t bytes = 0;            // KDA states + MLA pages (or the unpaged admission-gate bound)
  int64_t pages_per_layer = 0;  // MLA pages per MLA layer (0 when unpaged)
  bool sliding = false;         // the MLA cache is a sliding window of pages_per_layer pages
};

struct EngineStats {
  int64_t waiting = 0, running = 0;
  int64_t cache_bytes_used = 0, cache_bytes_budget = 0;
  int64_t requests_finished = 0, prompt_tokens = 0, generated_tokens = 0;
  double decode_tokens_per_s = 0;    // over the recent window
  int64_t cache_bytes_reserved = 0;  // the admitted requests' worst-case plans
  int64_t cache_bytes_peak = 0;      // high-water mark of cache_bytes_used
  int64_t prefilled_tokens = 0;      // prompt tokens read so far (counted per prefill chunk)
  int64_t pool_bytes = 0;            // pages the pool has made (kept for reuse)
  int64_t prefix_cache_bytes = 0;    // held by cached prefixes (also part of the budget)
};

// Callback: called on the engine thread for every event; return false to cancel the request
// (e.g. the client disconnected). It must not block for long.
using TokenCallback = std::function<bool(const TokenEvent&)>;

class Engine {
 public:
  Engine(const model::Decoder& model, const data::Tokenizer& tokenizer, EngineConfig config = {});
  const model::Decoder& model() const;
  ~Engine();  // stops the thread; pending requests finish with "cancelled"
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Thread-safe. Throws std::invalid_argument for a request that can never run (empty prompt,
  // prompt + max_tokens over max_context, a prompt larger than the whole cache budget ...).
  uint64_t submit(Request request, TokenCallback on_event);
  void cancel(uint64_t request);  // thread-safe; the final event says "cancelled"
  EngineStats stats() const;      // thread-safe
  const EngineConfig& config() const;
  CachePlan plan(const Request& request) const;  // what the request would reserve

  struct Completion {
    std::vector<int32_t> tokens;
    std::string text;
    std::vector<double> logprobs;
    std::string finish_reason;
    std::string error;  // finish_reason "error"
  };
  // Submit and wait.
  Completion generate(Request request);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace myriad::infer
