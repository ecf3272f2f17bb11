// Text corpora read at run time from the Debian packages wordnet-base and dict-gcide (TRAINING.md
// §10). Nothing read here is ever written into the repository (GCIDE is GPL-2+).
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace myriad::data {

// One WordNet synset from a data.{noun,verb,adj,adv} line.
struct Synset {
  int64_t offset = 0;
  char pos = 'n';                  // n, v, a, s (satellite adjective), r
  std::vector<std::string> words;  // underscores turned into spaces, adjective markers removed
  std::string gloss;               // the definition
  std::vector<std::string> examples;
};

// Parses one data.* file; licence header lines (two leading spaces) are skipped, every other line
// is validated (its offset must equal its byte position) and a malformed one throws with file:line.
std::vector<Synset> read_wordnet_data(const std::string& path);
// "word, word: gloss. Example: ...".
std::string synset_document(const Synset& s);
// One document per synset over noun, verb, adj and adv, in that order.
std::vector<std::string> wordnet_documents(const std::string& dir = "/usr/share/wordnet");

// Decodes a GCIDE index numeral (base 64 over A-Z a-z 0-9 + /, most significant digit first).
uint64_t gcide_b64(std::string_view s);
// One document per distinct GCIDE entry in file order, markup stripped and whitespace collapsed;
// 00-database-* entries are skipped. max_docs = 0: all.
std::vector<std::string> gcide_documents(const std::string& dir = "/usr/share/dictd",
                                         size_t max_docs = 0);

// WordNet and GCIDE documents in a fixed shuffled order, truncated to max_bytes (0: all).
std::vector<std::string> builtin_corpus(size_t max_bytes);

// English-like generated documents for tests on machines without the packages.
std::vector<std::string> synthetic_fallback_corpus(uint64_t seed, size_t bytes);

// Deterministic, platform-independent randomness for the data pipeline (std:: distributions are
// implementation-defined).
struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed) : s(seed) {}
  uint64_t next() {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  uint64_t below(uint64_t n) { return n ? next() % n : 0; }
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
  template <class V>
  void shuffle(V& v) {
    for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[below(i)]);
  }
};

}  // namespace myriad::data
