// "dictionary": the chat task of the main job's post-training. The user asks "What does <word>
// mean?" about a WordNet noun (read at run time from wordnet-base); the single assistant message
// is the answer, scored against the gloss: R = the word-level F1 of answer and gloss, solved when
// they match exactly (case and surrounding space aside). No tools. The pool is a fixed set of
// 2000 nouns (a seeded draw among the synsets whose first word is one lowercase word of at most
// 10 letters and whose gloss has at most 60 characters, one synset per word), small enough for a
// tiny model to learn by heart; a hash of the word holds one in ten out, so SFT on training seeds
// never sees the words held-out evaluation asks. The expert answers the gloss.
#include <algorithm>
#include <map>
#include <set>
#include <sstream>

#include "agent/environment.h"
#include "core/error.h"
#include "data/corpus.h"

namespace myriad::agent {
namespace {

struct Entry {
  std::string word, gloss;
};

uint64_t fnv(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

// Training and held-out pools, each in file order.
const std::vector<Entry>& pool(bool heldout) {
  static const std::pair<std::vector<Entry>, std::vector<Entry>> p = [] {
    std::vector<Entry> all;
    std::set<std::string> seen;
    for (const data::Synset& s : data::read_wordnet_data("/usr/share/wordnet/data.noun")) {
      if (s.words.empty() || s.gloss.empty() || s.gloss.size() > 60) continue;
      const std::string& w = s.words.front();
      if (w.size() > 10 ||
          !std::all_of(w.begin(), w.end(), [](char c) { return c >= 'a' && c <= 'z'; }))
        continue;
      if (seen.insert(w).second) all.push_back({w, s.gloss});
    }
    data::Rng rng(0xd1c7);
    rng.shuffle(all);
    if (all.size() > 2000) all.resize(2000);
    std::pair<std::vector<Entry>, std::vector<Entry>> out;
    for (const Entry& e : all) (fnv(e.word) % 10 == 0 ? out.second : out.first).push_back(e);
    return out;
  }();
  return heldout ? p.second : p.first;
}

std::string norm(std::string_view s) {
  std::string o;
  for (char c : s) o += static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
  const auto b = o.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return {};
  return o.substr(b, o.find_last_not_of(" \t\r\n") - b + 1);
}

std::vector<std::string> words(const std::string& s) {
  std::vector<std::string> w;
  std::string cur;
  for (char c : norm(s)) {
    if (std::isalnum(static_cast<unsigned char>(c))) {
      cur += c;
    } else if (!cur.empty()) {
      w.push_back(cur);
      cur.clear();
    }
  }
  if (!cur.empty()) w.push_back(cur);
  return w;
}

double f1(const std::string& answer, const std::string& gloss) {
  const std::vector<std::string> a = words(answer), g = words(gloss);
  if (a.empty() || g.empty()) return 0;
  std::map<std::string, int> count;
  for (const auto& x : g) ++count[x];
  int common = 0;
  for (const auto& x : a)
    if (count[x]-- > 0) ++common;
  if (common == 0) return 0;
  const double p = static_cast<double>(common) / static_cast<double>(a.size());
  const double r = static_cast<double>(common) / static_cast<double>(g.size());
  return 2 * p * r / (p + r);
}

class Dictionary final : public Environment {
 public:
  std::string name() const override { return "dictionary"; }
  std::string reset(uint64_t seed) override {
    const bool heldout = seed >= kHeldoutSeedBase;
    const std::vector<Entry>& p = pool(heldout);
    MYRIAD_CHECK(!p.empty(), "dictionary: no WordNet nouns (install wordnet-base)");
    const uint64_t i = heldout ? seed - kHeldoutSeedBase : seed;
    entry_ = p[data::Rng(i * 0x9e3779b97f4a7c15ull + 1).next() % p.size()];
    done_ = false, R_ = 0, solved_ = false;
    return "What does " + entry_.word + " mean?";
  }
  StepResult step(const std::string& message) override {
    MYRIAD_CHECK(!done_, "dictionary: step after the episode ended");
    done_ = true;
    R_ = f1(message, entry_.gloss);
    solved_ = norm(message) == norm(entry_.gloss);
    StepResult r;
    r.done = true;
    return r;
  }
  bool done() const override { return done_; }
  double terminal_reward() const override { return done_ ? R_ : 0.0; }
  bool solved() const override { return solved_; }
  std::vector<ToolSpec> tools() const override { return {}; }
  std::string expert(data::Rng&, double) const override { return entry_.gloss; }
  int max_turns() const override { return 1; }

 private:
  Entry entry_;
  bool done_ = false, solved_ = false;
  double R_ = 0;
};

}  // namespace

MYRIAD_REGISTER_ENVIRONMENT("dictionary", Dictionary);

}  // namespace myriad::agent
