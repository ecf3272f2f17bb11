#include "data/synthetic.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <unordered_map>

#include "core/error.h"
#include "data/corpus.h"

namespace myriad::data {
namespace {

struct Needle {
  std::string text;
  double depth;
};

// Lays filler sentences (cycled from a seeded start) around the needles so the prompt has about
// length_tokens tokens, each needle after the sentence where its depth of filler is reached.
SyntheticItem build(const char* task, Rng& rng, int64_t length_tokens, const Tokenizer& tok,
                    const Filler& filler, const std::string& intro, std::vector<Needle> needles,
                    const std::string& question) {
  MYRIAD_CHECK(!filler.sentences.empty(), task, ": empty filler");
  auto count = [&](const std::string& s) { return static_cast<int64_t>(tok.encode(s).size()); };
  int64_t budget = length_tokens - count(intro) - count(question);
  for (const auto& n : needles) budget -= count(n.text);
  std::vector<std::string> picked;
  std::vector<int64_t> cum{0};  // filler tokens before sentence i
  std::unordered_map<size_t, int64_t> cache;
  for (size_t i = rng.below(filler.sentences.size());; i = (i + 1) % filler.sentences.size()) {
    auto it = cache.find(i);
    const int64_t n = it != cache.end() ? it->second : (cache[i] = count(filler.sentences[i]));
    if (cum.back() + n > budget) break;
    picked.push_back(filler.sentences[i]);
    cum.push_back(cum.back() + n);
  }
  std::stable_sort(needles.begin(), needles.end(),
                   [](const Needle& a, const Needle& b) { return a.depth < b.depth; });
  SyntheticItem item;
  item.task = task;
  std::string body = intro;
  size_t next = 0;
  const double total = static_cast<double>(cum.back());
  auto put_needles = [&](size_t sentence) {
    for (; next < needles.size() &&
           (sentence == picked.size() ||
            static_cast<double>(cum[sentence]) >= needles[next].depth * total);
         ++next) {
      body += " " + needles[next].text;
      item.depths.push_back(total > 0 ? static_cast<double>(cum[sentence]) / total : 0.0);
    }
  };
  for (size_t s = 0; s < picked.size(); ++s) {
    put_needles(s);
    body += " " + picked[s];
  }
  put_needles(picked.size());
  item.prompt = body + " " + question;
  item.tokens = tok.encode(item.prompt);
  return item;
}

const char* const kWords[] = {
    "apple",   "river",    "candle", "mirror",  "garden", "violin", "anchor",  "pepper",
    "castle",  "pillow",   "rocket", "saddle",  "tunnel", "walnut", "falcon",  "harbor",
    "jacket",  "ladder",   "marble", "needle",  "orange", "parrot", "quartz",  "ribbon",
    "silver",  "teapot",   "velvet", "wagon",   "yogurt", "zipper", "bamboo",  "cactus",
    "dragon",  "engine",   "forest", "glacier", "hammer", "island", "jungle",  "kettle",
    "lantern", "meadow",   "nickel", "oyster",  "pebble", "quiver", "raven",   "spider",
    "tomato",  "umbrella", "valley", "window",  "canyon", "copper", "dolphin", "feather",
    "helmet",  "lemon",    "magnet", "noodle",  "planet", "rabbit", "sponge",  "thunder"};
constexpr size_t kNumWords = sizeof(kWords) / sizeof(kWords[0]);

}  // namespace

Filler Filler::fixed() {
  return {{"The grass is green.", "The sky is blue.", "The sun is yellow.", "Here we go.",
           "There and back again.", "The river runs slowly past the old mill.",
           "A light rain fell on the quiet town all afternoon.",
           "The baker opened the shop before dawn.", "Children played in the park after school.",
           "The train left the station on time.", "A cat slept on the warm windowsill.",
           "The library was full of students reading in silence.",
           "Leaves turned red and gold in the autumn wind.",
           "The fisherman mended his nets by the harbour.",
           "Clouds gathered over the hills in the evening.",
           "The market sold bread, cheese and fresh fruit."}};
}

Filler Filler::wordnet(bool eval, size_t max_sentences, const std::string& dir) {
  const auto synsets = read_wordnet_data(dir + "/data.noun");
  Filler f;
  for (size_t i = eval ? 1 : 0; i < synsets.size(); i += 2) {
    std::string s = synsets[i].gloss;
    if (s.empty()) continue;
    s[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(s[0])));
    if (std::string_view(".!?").find(s.back()) == std::string_view::npos) s += '.';
    f.sentences.push_back(std::move(s));
    if (max_sentences && f.sentences.size() >= max_sentences) break;
  }
  return f;
}

SyntheticItem passkey(uint64_t seed, int64_t length_tokens, double depth,
                      const Tokenizer& tokenizer, const Filler& filler) {
  MYRIAD_CHECK(depth >= 0 && depth <= 1, "passkey: depth ", depth, " not in [0, 1]");
  Rng rng(seed);
  const std::string n = std::to_string(10000 + rng.below(90000));
  auto item = build("passkey", rng, length_tokens, tokenizer, filler,
                    "There is an important piece of information hidden inside a lot of irrelevant "
                    "text. Find it and memorize it. I will quiz you about it.",
                    {{"The pass key is " + n + ". Remember it. " + n + " is the pass key.", depth}},
                    "What is the pass key? The pass key is");
  item.answer = n;
  return item;
}

SyntheticItem mk_niah(uint64_t seed, int K, int64_t length_tokens, const Tokenizer& tokenizer,
                      const Filler& filler) {
  MYRIAD_CHECK(K >= 1 && static_cast<size_t>(K) <= kNumWords, "mk_niah: K=", K, " not in [1, ",
               kNumWords, "]");
  Rng rng(seed);
  std::vector<size_t> words(kNumWords);
  for (size_t i = 0; i < kNumWords; ++i) words[i] = i;
  rng.shuffle(words);
  std::vector<Needle> needles;
  std::vector<std::string> values;
  for (int k = 0; k < K; ++k) {
    values.push_back(std::to_string(1000000 + rng.below(9000000)));
    needles.push_back({std::string("One of the special magic numbers for ") + kWords[words[k]] +
                           " is: " + values.back() + ".",
                       rng.uniform()});
  }
  const size_t q = rng.below(static_cast<uint64_t>(K));
  const std::string w = kWords[words[q]];
  auto item = build("mk_niah", rng, length_tokens, tokenizer, filler,
                    "Some special magic numbers are hidden within the following text. Make sure "
                    "to memorize them. I will quiz you about the numbers afterwards.",
                    std::move(needles),
                    "What is the special magic number for " + w +
                        " mentioned in the provided text? The special magic number for " + w +
                        " mentioned in the provided text is");
  item.answer = values[q];
  return item;
}

SyntheticItem variable_tracking(uint64_t seed, int hops, int64_t length_tokens,
                                const Tokenizer& tokenizer, const Filler& filler) {
  MYRIAD_CHECK(hops >= 1 && hops <= 64, "variable_tracking: hops=", hops, " not in [1, 64]");
  Rng rng(seed);
  std::vector<std::string> names;
  auto fresh_name = [&] {
    for (;;) {
      std::string s(5, 'A');
      for (char& c : s) c = static_cast<char>('A' + rng.below(26));
      if (std::find(names.begin(), names.end(), s) == names.end()) return names.emplace_back(s);
    }
  };
  std::vector<Needle> needles;
  std::vector<std::string> values, answer;
  for (int chain = 0; chain < 3; ++chain) {  // chain 0 is asked about, 1 and 2 are distractors
    std::string v;
    do v = std::to_string(10000 + rng.below(90000));
    while (std::find(values.begin(), values.end(), v) != values.end());
    values.push_back(v);
    std::vector<double> depths(static_cast<size_t>(hops) + 1);
    for (double& d : depths) d = rng.uniform();
    std::sort(depths.begin(), depths.end());
    std::string prev = v;
    for (double d : depths) {
      const std::string name = fresh_name();
      needles.push_back({"VAR " + name + " = " + prev + ".", d});
      if (chain == 0) answer.push_back(name);
      prev = name;
    }
  }
  auto item = build("vt", rng, length_tokens, tokenizer, filler,
                    "Memorize and track the chain(s) of variable assignment hidden in the "
                    "following text.",
                    std::move(needles),
                    "Question: Find all variables that are assigned the value " + values[0] +
                        " in the text above. Answer: According to the chain(s) of variable "
                        "assignment in the text above, the variables assigned the value " +
                        values[0] + " are:");
  for (size_t i = 0; i < answer.size(); ++i) item.answer += (i ? " " : "") + answer[i];
  return item;
}

SyntheticItem mqar(uint64_t seed, int N, int64_t length_tokens, const Tokenizer& tokenizer,
                   const Filler& filler, int queries) {
  MYRIAD_CHECK(N >= 1 && N <= 4096, "mqar: N=", N, " not in [1, 4096]");
  MYRIAD_CHECK(queries >= 1 && queries <= N, "mqar: queries=", queries, " not in [1, N=", N, "]");
  Rng rng(seed);
  std::vector<std::string> keys, values;
  std::vector<Needle> needles;
  while (static_cast<int>(keys.size()) < N) {
    std::string k(4, 'a');
    for (char& c : k) c = static_cast<char>('a' + rng.below(26));
    if (std::find(keys.begin(), keys.end(), k) != keys.end()) continue;
    keys.push_back(k);
    values.push_back(std::to_string(1000 + rng.below(9000)));
    needles.push_back({"Key " + k + " maps to " + values.back() + ".", rng.uniform()});
  }
  const size_t q = rng.below(static_cast<uint64_t>(N));
  auto item =
      build("mqar", rng, length_tokens, tokenizer, filler,
            "Remember which value each key maps to in the following text.", std::move(needles),
            "Which value does key " + keys[q] + " map to? Key " + keys[q] + " maps to");
  item.answer = values[q];
  std::vector<size_t> order(static_cast<size_t>(N));
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  rng.shuffle(order);
  int more = queries - 1;
  for (size_t i : order) {
    if (more == 0) break;
    if (i == q) continue;
    item.followup.emplace_back("Key " + keys[i] + " maps to", values[i]);
    --more;
  }
  return item;
}

LongContextMix mix_long_context(uint64_t seed, const std::vector<std::string>& source,
                                int64_t stage_length, int64_t prev_stage_length,
                                int64_t total_tokens, const Tokenizer& tokenizer,
                                const Filler& filler, double synthetic_fraction,
                                int answer_weight) {
  MYRIAD_CHECK(!source.empty(), "mix_long_context: no source documents");
  MYRIAD_CHECK(stage_length > 0 && prev_stage_length > 0 && prev_stage_length <= stage_length,
               "mix_long_context: need 0 < prev_stage_length (", prev_stage_length,
               ") <= stage_length (", stage_length, ")");
  MYRIAD_CHECK(synthetic_fraction >= 0 && synthetic_fraction <= kMaxSyntheticFraction,
               "mix_long_context: synthetic_fraction ", synthetic_fraction, " not in [0, ",
               kMaxSyntheticFraction, "]");
  MYRIAD_CHECK(answer_weight >= 1 && answer_weight <= 255, "mix_long_context: answer_weight ",
               answer_weight, " not in [1, 255]");
  const double f = synthetic_fraction;
  const double share[3] = {0.75 - f, 0.25, f};  // long, short, synthetic
  Rng rng(seed);
  LongContextMix out;
  int64_t* made[3] = {&out.long_tokens, &out.short_tokens, &out.synthetic_tokens};
  auto clip = [&](std::vector<int32_t>& t, int64_t n) {
    if (static_cast<int64_t>(t.size()) > n) t.resize(static_cast<size_t>(n));
  };
  for (int64_t total = 0; total < total_tokens;) {
    int cat = 0;
    double best = -1e300;
    for (int c = 0; c < 3; ++c) {
      const double deficit =
          share[c] * static_cast<double>(total + 1) - static_cast<double>(*made[c]);
      if (deficit > best) best = deficit, cat = c;
    }
    std::vector<int32_t> toks;
    if (cat == 0) {  // concatenated documents up to the stage length
      while (static_cast<int64_t>(toks.size()) < stage_length) {
        auto t = tokenizer.encode(source[rng.below(source.size())] + "\n\n");
        toks.insert(toks.end(), t.begin(), t.end());
      }
      clip(toks, stage_length);
      out.weights.emplace_back();
    } else if (cat == 1) {  // the previous stages' short documents
      toks = tokenizer.encode(source[rng.below(source.size())]);
      clip(toks, prev_stage_length);
      out.weights.emplace_back();
    } else {  // retrieval items; seeds with the top bit set stay disjoint from evaluation's
      const uint64_t s = rng.next() | (1ull << 63);
      const int64_t len =
          stage_length / 4 +
          static_cast<int64_t>(rng.below(static_cast<uint64_t>(stage_length * 3 / 4 + 1)));
      SyntheticItem item;
      // Task shares: passkey 20%, MK-NIAH 10%, VT 10%, MQAR 60%. MQAR items ask every key (up to
      // 32) after the pairs, with a random amount of filler among them: the densest lookup signal,
      // each answer a copy from context, the skill (induction) every retrieval task rests on.
      const uint64_t pick = rng.below(10);
      if (pick < 2) {
        item = passkey(s, len, rng.uniform(), tokenizer, filler);
      } else if (pick < 3) {
        item = mk_niah(s, std::array{2, 4, 16}[rng.below(3)], len, tokenizer, filler);
      } else if (pick < 4) {
        item = variable_tracking(s, std::array{1, 2, 4}[rng.below(3)], len, tokenizer, filler);
      } else {
        const int N = std::array{8, 16, 32, 128}[rng.below(4)], Q = std::min(N, 32);
        const int64_t room = std::max<int64_t>(16, len - 11 * (Q - 1));
        item = mqar(s, N, 16 + static_cast<int64_t>(rng.below(static_cast<uint64_t>(room - 15))),
                    tokenizer, filler, Q);
      }
      // Many needles may not fit a short stage: fall back to one passkey.
      if (static_cast<int64_t>(item.tokens.size()) > stage_length)
        item = passkey(s, len, rng.uniform(), tokenizer, filler);
      MYRIAD_CHECK(static_cast<int64_t>(item.tokens.size()) <= stage_length,
                   "mix_long_context: stage_length ", stage_length,
                   " is too short for a passkey item (", item.tokens.size(), " tokens)");
      // The prompt, then each answer (weighted) and the follow-up questions with theirs; the last
      // follow-ups go while the item is longer than the stage.
      std::vector<uint8_t> w;
      auto render = [&] {
        toks = tokenizer.encode(item.prompt);
        w.assign(toks.size(), 1);
        auto answer = [&](const std::string& a) {  // "{a}." with the weight on a's tokens
          const auto t = tokenizer.encode(a + ".");
          const size_t n = std::min(tokenizer.encode(a).size(), t.size());
          toks.insert(toks.end(), t.begin(), t.end());
          w.insert(w.end(), n, static_cast<uint8_t>(answer_weight));
          w.insert(w.end(), t.size() - n, 1);
        };
        answer(item.answer);
        for (const auto& [question, a] : item.followup) {
          const auto t = tokenizer.encode(question);
          toks.insert(toks.end(), t.begin(), t.end());
          w.insert(w.end(), t.size(), 1);
          answer(a);
        }
      };
      render();
      while (static_cast<int64_t>(toks.size()) > stage_length && !item.followup.empty()) {
        item.followup.pop_back();
        render();
      }
      clip(toks, stage_length);
      w.resize(toks.size());
      out.weights.push_back(answer_weight > 1 ? std::move(w) : std::vector<uint8_t>{});
    }
    out.docs.push_back(toks);
    *made[cat] += static_cast<int64_t>(toks.size());
    total += static_cast<int64_t>(toks.size());
  }
  return out;
}

}  // namespace myriad::data
