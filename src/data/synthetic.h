// Seeded long-context retrieval tasks (TRAINING.md §6 wording) and the per-stage training mix
// that blends them into ordinary documents (§5.2).
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "data/tokenizer.h"

namespace myriad::data {

// Filler sentences placed around the needles.
struct Filler {
  std::vector<std::string> sentences;
  static Filler fixed();  // a fixed neutral sentence set
  // WordNet noun glosses read at run time; the training half (even synsets) and the evaluation
  // half (odd synsets) are disjoint, as §5.2 requires. max_sentences = 0: all.
  static Filler wordnet(bool eval, size_t max_sentences = 20000,
                        const std::string& dir = "/usr/share/wordnet");
};

struct SyntheticItem {
  std::string task;             // "passkey", "mk_niah", "vt", "mqar"
  std::string prompt;           // ends where the model must continue with the answer
  std::vector<int32_t> tokens;  // tokenizer.encode(prompt)
  std::string answer;           // exact-match target (VT: variable names separated by spaces)
  std::vector<double> depths;   // where each needle landed, as a fraction of the filler
  // Training documents only: questions that follow the answer, each with its answer (MQAR's
  // further queries: "Key {k} maps to", "{v}"), so one item teaches several lookups.
  std::vector<std::pair<std::string, std::string>> followup;
};

// Passkey: needle "The pass key is N. Remember it. N is the pass key." at depth (0..1) of about
// length_tokens tokens; N is a uniform 5-digit number.
SyntheticItem passkey(uint64_t seed, int64_t length_tokens, double depth,
                      const Tokenizer& tokenizer, const Filler& filler);
// MK-NIAH with K needles "One of the special magic numbers for {word} is: {7-digit}." at random
// depths; one word is asked for.
SyntheticItem mk_niah(uint64_t seed, int K, int64_t length_tokens, const Tokenizer& tokenizer,
                      const Filler& filler);
// Variable tracking: a chain "VAR X1 = N", "VAR X2 = X1", ... with `hops` hops plus 2 distractor
// chains, in order at random depths; asks which variables equal N.
SyntheticItem variable_tracking(uint64_t seed, int hops, int64_t length_tokens,
                                const Tokenizer& tokenizer, const Filler& filler);

// Associative recall: N pairs "Key {k} maps to {4-digit}." spread over the filler, then one key is
// queried (the evaluation harness asks several seeds for per-query accuracy). queries > 1 (at most
// N) fills `followup` with that many - 1 further distinct keys ("Key {k} maps to", "{v}").
SyntheticItem mqar(uint64_t seed, int N, int64_t length_tokens, const Tokenizer& tokenizer,
                   const Filler& filler, int queries = 1);

// The largest synthetic share of a long mix: text stays the majority of every stage's tokens.
constexpr double kMaxSyntheticFraction = 0.45;

struct LongContextMix {
  std::vector<std::vector<int32_t>> docs;  // tokenised training documents for write_token_shards
  // Per document: empty (every token weighs 1), or one loss weight per token: answer_weight on
  // the answers of retrieval items, 1 elsewhere.
  std::vector<std::vector<uint8_t>> weights;
  int64_t long_tokens = 0, short_tokens = 0, synthetic_tokens = 0;
};
// Training documents for a curriculum stage of stage_length tokens, about total_tokens in all:
// (0.75 - synthetic_fraction) of tokens from concatenations of source documents reaching the stage
// length, 0.25 from single documents of at most prev_stage_length tokens, and synthetic_fraction
// (in [0, kMaxSyntheticFraction]; §5.2 asks 0.1-0.3, a small CPU model learns retrieval faster with
// more) from passkey / MK-NIAH / VT / MQAR items (20 / 10 / 10 / 60%) of random length and depth;
// MQAR items ask up to 32 of their keys, as many as fit the stage length. answer_weight (in
// [1, 255]) is the loss weight of the answer tokens of retrieval items (their "answer" and
// follow-up answers): a CPU-sized model sees few of them, and > 1 makes them count more without
// changing what text the stage trains on.
LongContextMix mix_long_context(uint64_t seed, const std::vector<std::string>& source,
                                int64_t stage_length, int64_t prev_stage_length,
                                int64_t total_tokens, const Tokenizer& tokenizer,
                                const Filler& filler, double synthetic_fraction = 0.2,
                                int answer_weight = 1);

}  // namespace myriad::data
