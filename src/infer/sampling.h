// Sampling of the next token from one row of logits (per request, see SamplingParams), and the
// streamed text with stop sequences. Order of the logit processors:
//   1. penalties on the raw logits: repetition (CTRL / transformers: a seen token's logit is
//      divided by the penalty when positive, multiplied when negative; "seen" = prompt and
//      generated tokens), then presence and frequency (OpenAI: minus presence·[count > 0] minus
//      frequency·count, counts over generated tokens only);
//   2. temperature 0: the argmax (lowest id on ties); else divide by the temperature,
//   3. top-k (the k largest), softmax, top-p (the smallest most-probable set whose mass reaches
//      p), min-p (tokens with p >= min_p · p_max), renormalise, draw.
// Logprobs are the log-softmax of the raw model logits (before penalties and temperature), as
// the OpenAI API reports them; the alternatives are the most probable tokens, best first.
#pragma once
#include <cstdint>
#include <functional>
#include <random>
#include <span>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "infer/engine.h"

namespace myriad::infer {

// Throws std::invalid_argument naming the field when a parameter is out of range.
void validate_sampling(const SamplingParams& p);

// Step 1 in place. `seen`: prompt and generated tokens; `counts`: generated tokens.
void apply_penalties(std::vector<double>& logits, const SamplingParams& p,
                     const std::unordered_set<int32_t>& seen,
                     const std::unordered_map<int32_t, int64_t>& counts);
// Steps 2-3 up to the draw for temperature > 0: the probabilities of the allowed tokens (the
// others exactly 0), summing to 1.
std::vector<double> sampling_probs(const std::vector<double>& logits, const SamplingParams& p);
std::vector<double> log_softmax(std::span<const float> logits);

struct Pick {
  int32_t token = -1;
  double logprob = 0;                           // of the pick (when requested)
  std::vector<std::pair<int32_t, double>> top;  // alternatives, best first (when requested)
};

class Sampler {
 public:
  // seed: the request's, or a fresh one when it has none.
  Sampler(SamplingParams p, std::span<const int32_t> prompt, uint64_t seed);
  Pick sample(std::span<const float> logits);  // and remembers the pick for the penalties

 private:
  SamplingParams p_;
  std::mt19937_64 rng_;
  std::unordered_set<int32_t> seen_;
  std::unordered_map<int32_t, int64_t> counts_;
};

// Incremental detokenisation (cost per token independent of the length) with stop sequences: text
// is released only when it is complete UTF-8 and no suffix of it could still grow into a stop
// string; a completed stop string ends the text just before it.
class TextStream {
 public:
  using Decode = std::function<std::string(const std::vector<int32_t>&)>;
  TextStream(std::vector<std::string> stop, Decode decode);
  struct Step {
    std::string text;  // newly released text
    bool stopped = false;
  };
  Step push(int32_t token);
  std::string flush();  // at the end (no stop): everything held back
  const std::string& text() const { return released_; }

 private:
  std::vector<std::string> stop_;
  Decode decode_;
  std::string current();  // the text of every token so far
  std::vector<int32_t> tokens_;
  std::string stable_;            // the text of tokens_[0, read_)
  size_t prefix_ = 0, read_ = 0;  // the decode window starts at prefix_
  std::string released_;
};

}  // namespace myriad::infer
