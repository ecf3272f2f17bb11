// Chat SFT data (post-training issue item 1): conversations rendered through the agent chat
// template exactly as rollouts render them, with the loss mask as per-token weights (1 on the
// assistant's tokens, 0 on the prompt, tool results and template tokens), ready for weighted
// token shards. A source is a registered environment: its scripted expert's episodes with the §8
// noise (the "dictionary" environment's are WordNet dialogues: "What does X mean?" -> the gloss).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "agent/trajectory.h"
#include "data/tokenizer.h"
#include "serve/protocol.h"

namespace myriad::agent {

// The agent template in chat_template.txt form (serve::ChatTemplate::parse reads it); trained
// models carry it so the server renders conversations as training did.
extern const char* const kAgentTemplateText;

struct SftSource {
  std::string name;  // an environment
  double noise = 0;  // the expert's §8 noise
  int64_t examples = 0;
};

// The text of `examples` conversations of each source (markers left out), for tokenizer training.
std::vector<std::string> sft_text(const std::vector<SftSource>& sources, uint64_t seed);

struct SftDocs {
  std::vector<std::vector<int32_t>> tokens;
  std::vector<std::vector<uint8_t>> weights;  // the loss mask
  std::vector<std::string> source;            // per document
};
// The conversations as token documents with their loss masks, sources interleaved in a seeded
// order. Trajectories above limits.max_total_tokens are cut by the episode budget as in rollouts.
SftDocs sft_documents(const std::vector<SftSource>& sources, const data::Tokenizer& tok,
                      uint64_t seed, const EpisodeLimits& limits = {});

}  // namespace myriad::agent
