// Chat SFT data: see sft.h.
#include "agent/sft.h"

#include <algorithm>

#include "core/error.h"

namespace myriad::agent {

const char* const kAgentTemplateText =
    "# Myriad agent chat template: no text between a role marker and the message, so a whole\n"
    "# conversation tokenises as its messages do one by one (rollouts, SFT and the server agree).\n"
    "bos = false\n"
    "system = <|system|>{content}<|end|>\n"
    "user = <|user|>{content}<|end|>\n"
    "assistant = <|assistant|>{content}<|end|>\n"
    "tool = <|tool|>{content}<|end|>\n"
    "generation = <|assistant|>\n"
    "tools = <|system|>{tools}<|end|>\n"
    "stop = <|end|>\n"
    "stop = <|user|>\n";

namespace {

void check_source(const SftSource& s) {
  (void)make_environment(s.name);  // throws naming the known environments
  MYRIAD_CHECK(s.noise >= 0 && s.noise <= 1, "sft source ", s.name, ": noise must be in [0, 1]");
}

// The (source index, example index) pairs in a seeded interleaved order.
std::vector<std::pair<size_t, int64_t>> order(const std::vector<SftSource>& sources,
                                              uint64_t seed) {
  std::vector<std::pair<size_t, int64_t>> o;
  for (size_t s = 0; s < sources.size(); ++s)
    for (int64_t i = 0; i < sources[s].examples; ++i) o.emplace_back(s, i);
  data::Rng rng(seed);
  rng.shuffle(o);
  return o;
}

}  // namespace

std::vector<std::string> sft_text(const std::vector<SftSource>& sources, uint64_t seed) {
  std::vector<std::string> docs;
  for (const SftSource& s : sources) check_source(s);
  for (const auto& [si, i] : order(sources, seed)) {
    const SftSource& s = sources[si];
    docs.push_back(expert_text(s.name, static_cast<uint64_t>(i) + seed * 0x10000, s.noise));
  }
  return docs;
}

SftDocs sft_documents(const std::vector<SftSource>& sources, const data::Tokenizer& tok,
                      uint64_t seed, const EpisodeLimits& limits) {
  SftDocs out;
  for (const SftSource& s : sources) check_source(s);
  for (const auto& [si, i] : order(sources, seed)) {
    const SftSource& s = sources[si];
    const Trajectory t =
        expert_trajectory(tok, s.name, static_cast<uint64_t>(i) + seed * 0x10000, s.noise, limits);
    std::vector<int32_t> ids = t.tokens;
    std::vector<uint8_t> w = t.loss_mask;
    // A document's weight list gives the weight of predicting each of its tokens.
    out.tokens.push_back(std::move(ids));
    out.weights.push_back(std::move(w));
    out.source.push_back(s.name);
  }
  return out;
}

}  // namespace myriad::agent
